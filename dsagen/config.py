"""Every ``DSAGEN_*`` environment variable, read in one place.

| variable | default | meaning |
|---|---|---|
| ``DSAGEN_CACHE_DIR`` | ``$XDG_CACHE_HOME/dsagen`` or ``~/.cache/dsagen`` | build cache root |
| ``DSAGEN_LOCK_DIR`` | ``<cache root>/locks`` | where the per-build lock files live (keep it on local disk) |
| ``DSAGEN_LOCK_TIMEOUT`` | ``1800`` | seconds to wait for another process's build |
| ``DSAGEN_ARCH_LIST`` | the spec's targets | comma list (``sm_90a,sm_100a``) that narrows the targets |
| ``DSAGEN_JIT_VERBOSE`` | off | log one line per load (key, time, hit/miss) and show ninja's output |
| ``DSAGEN_JIT_DEBUG`` | off | nvcc ``-G`` (device debug) |
| ``DSAGEN_JIT_LINEINFO`` | off | nvcc ``-lineinfo`` |
| ``DSAGEN_NVCC_FLAGS`` | none | extra nvcc flags |
| ``DSAGEN_MAX_JOBS`` | ninja's default | parallel compile jobs of one build (``MAX_JOBS`` for torch) |
| ``DSAGEN_DISABLE_JIT`` | off | never compile: a variant missing from the cache is an error |
| ``DSAGEN_BENCH_METHOD`` | ``spin`` | ``dsagen bench``'s timing: ``spin`` (launch hidden behind a GPU spin) or ``graph`` |
| ``DSAGEN_BENCH_PARTIAL`` | none | a JSON file that ``dsagen bench`` rewrites with the rows so far after each row |
| ``DSAGEN_BENCH_GIT`` | the checkout's ``git rev-parse`` | the bench rows' ``git`` field, for a tree copied without its ``.git`` |

Flags, debug options and the arch list are part of the cache key.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV_VARS = ("DSAGEN_CACHE_DIR", "DSAGEN_LOCK_DIR", "DSAGEN_LOCK_TIMEOUT", "DSAGEN_ARCH_LIST",
            "DSAGEN_JIT_VERBOSE", "DSAGEN_JIT_DEBUG", "DSAGEN_JIT_LINEINFO", "DSAGEN_NVCC_FLAGS",
            "DSAGEN_MAX_JOBS", "DSAGEN_DISABLE_JIT", "DSAGEN_BENCH_METHOD", "DSAGEN_BENCH_PARTIAL",
            "DSAGEN_BENCH_GIT")


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def cache_root() -> Path:
    env = os.environ.get("DSAGEN_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dsagen"


def lock_dir() -> Path:
    env = os.environ.get("DSAGEN_LOCK_DIR")
    return Path(env).expanduser() if env else cache_root() / "locks"


def lock_timeout() -> float:
    return float(os.environ.get("DSAGEN_LOCK_TIMEOUT", "1800"))


def arch_list() -> list[str] | None:
    env = os.environ.get("DSAGEN_ARCH_LIST", "").strip()
    return [a.strip() for a in env.split(",") if a.strip()] if env else None


def jit_verbose() -> bool:
    return _flag("DSAGEN_JIT_VERBOSE")


def jit_debug() -> bool:
    return _flag("DSAGEN_JIT_DEBUG")


def jit_lineinfo() -> bool:
    return _flag("DSAGEN_JIT_LINEINFO")


def extra_nvcc_flags() -> list[str]:
    return os.environ.get("DSAGEN_NVCC_FLAGS", "").split()


def max_jobs() -> int | None:
    env = os.environ.get("DSAGEN_MAX_JOBS", "").strip()
    return int(env) if env else None


def jit_disabled() -> bool:
    return _flag("DSAGEN_DISABLE_JIT")


def settings() -> dict[str, str]:
    """The ``DSAGEN_*`` variables that are set, for reports."""
    return {k: os.environ[k] for k in ENV_VARS if k in os.environ}


def bench_method() -> str:
    """``dsagen bench``'s default timing method (``DSAGEN_BENCH_METHOD``, default ``"spin"``)."""
    return os.environ.get("DSAGEN_BENCH_METHOD") or "spin"


def bench_partial() -> str | None:
    """The file ``dsagen bench`` rewrites with its rows so far (``DSAGEN_BENCH_PARTIAL``), or None."""
    return os.environ.get("DSAGEN_BENCH_PARTIAL") or None


def bench_git() -> str | None:
    """The commit the bench rows name where the tree was copied without its ``.git``
    (``DSAGEN_BENCH_GIT``), or None."""
    return os.environ.get("DSAGEN_BENCH_GIT") or None
