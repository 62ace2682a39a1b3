"""Every ``DSAGEN_*`` environment variable, read in one place.

| variable | default | meaning |
|---|---|---|
| ``DSAGEN_CACHE_DIR`` | ``$XDG_CACHE_HOME/dsagen`` or ``~/.cache/dsagen`` | build cache root |
| ``DSAGEN_LOCK_DIR`` | ``<cache root>/locks`` | where the per-build lock files live (keep it on local disk) |
| ``DSAGEN_LOCK_TIMEOUT`` | ``1800`` | seconds to wait for another process's build (negative or ``inf``: forever) |
| ``DSAGEN_ARCH_LIST`` | the spec's targets | comma list (``sm_90a,sm_100a``) that narrows the targets (another name: an error) |
| ``DSAGEN_JIT_VERBOSE`` | off | log one line per load (key, time, hit/miss) and show ninja's output |
| ``DSAGEN_JIT_DEBUG`` | off | nvcc ``-G`` (device debug) |
| ``DSAGEN_JIT_LINEINFO`` | off | nvcc ``-lineinfo`` |
| ``DSAGEN_NVCC_FLAGS`` | none | extra nvcc flags |
| ``DSAGEN_MAX_JOBS`` | ninja's default | parallel compile jobs of one build (``MAX_JOBS`` for torch) |
| ``DSAGEN_DISABLE_JIT`` | off | never compile: a variant missing from the cache is an error |
| ``DSAGEN_BENCH_METHOD`` | ``spin`` | ``dsagen bench``'s timing: ``spin`` (launch hidden behind a GPU spin) or ``graph`` |
| ``DSAGEN_BENCH_SETTLE`` | ``2`` | seconds (0-600) the GPU idles before each ``dsagen bench`` row |
| ``DSAGEN_BENCH_PARTIAL`` | none | a JSON file that ``dsagen bench`` rewrites with the rows so far after each row |
| ``DSAGEN_BENCH_GIT`` | the checkout's ``git rev-parse`` | the bench rows' ``git`` field, for a tree copied without its ``.git`` |

Flags, debug options and the arch list are part of the cache key.
"""
from __future__ import annotations

import os
from pathlib import Path


class ConfigError(ValueError):
    """A malformed ``DSAGEN_*`` variable; the message names it and says what it must be. A
    ValueError, so ``except ValueError`` still catches it."""


ENV_VARS = ("DSAGEN_CACHE_DIR", "DSAGEN_LOCK_DIR", "DSAGEN_LOCK_TIMEOUT", "DSAGEN_ARCH_LIST",
            "DSAGEN_JIT_VERBOSE", "DSAGEN_JIT_DEBUG", "DSAGEN_JIT_LINEINFO", "DSAGEN_NVCC_FLAGS",
            "DSAGEN_MAX_JOBS", "DSAGEN_DISABLE_JIT", "DSAGEN_BENCH_METHOD", "DSAGEN_BENCH_PARTIAL",
            "DSAGEN_BENCH_GIT", "DSAGEN_BENCH_SETTLE")


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def cache_root() -> Path:
    """The build cache root: ``DSAGEN_CACHE_DIR`` (``~`` expanded), else
    ``$XDG_CACHE_HOME/dsagen`` or ``~/.cache/dsagen``. Not created here."""
    env = os.environ.get("DSAGEN_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dsagen"


def lock_dir() -> Path:
    """Where the per-build lock files live: ``DSAGEN_LOCK_DIR``, else ``<cache root>/locks``."""
    env = os.environ.get("DSAGEN_LOCK_DIR")
    return Path(env).expanduser() if env else cache_root() / "locks"


def lock_timeout() -> float:
    """``DSAGEN_LOCK_TIMEOUT`` in seconds (default 1800; a negative value or ``inf``: wait
    forever, as filelock takes it). :class:`ConfigError` naming the variable where it is not a
    number."""
    env = os.environ.get("DSAGEN_LOCK_TIMEOUT", "").strip()
    if not env:
        return 1800.0
    try:
        v = float(env)
    except ValueError:
        v = float("nan")
    if v != v:
        raise ConfigError(f"DSAGEN_LOCK_TIMEOUT={env!r}: must be a number of seconds "
                          f"(negative or inf: wait forever)")
    return -1.0 if v == float("inf") else v


def arch_list() -> list[str] | None:
    """``DSAGEN_ARCH_LIST`` as a list (``"sm_90a,sm_100a"`` -> ``["sm_90a", "sm_100a"]``), or
    None when unset or empty (every target of the spec). :class:`ConfigError` naming the
    variable where it names no arch or one that is not in :data:`dsagen.spec.ARCHS`."""
    from .spec import ARCHS
    raw = os.environ.get("DSAGEN_ARCH_LIST", "")
    env = raw.strip()
    if not env:
        return None
    names = [a.strip() for a in env.split(",") if a.strip()]
    bad = [a for a in names if a not in ARCHS]
    if bad or not names:
        raise ConfigError(f"DSAGEN_ARCH_LIST={raw!r}: must be a comma list of {', '.join(ARCHS)}"
                          + (f" ({', '.join(map(repr, bad))} {'is not one' if len(bad) == 1 else 'are not'})"
                             if bad else ""))
    return names


def jit_verbose() -> bool:
    """``DSAGEN_JIT_VERBOSE`` set (to anything but empty, 0, false, no, off)."""
    return _flag("DSAGEN_JIT_VERBOSE")


def jit_debug() -> bool:
    """``DSAGEN_JIT_DEBUG`` set: nvcc ``-G``."""
    return _flag("DSAGEN_JIT_DEBUG")


def jit_lineinfo() -> bool:
    """``DSAGEN_JIT_LINEINFO`` set: nvcc ``-lineinfo``."""
    return _flag("DSAGEN_JIT_LINEINFO")


def extra_nvcc_flags() -> list[str]:
    """``DSAGEN_NVCC_FLAGS`` split on whitespace (no shell quoting); empty when unset."""
    return os.environ.get("DSAGEN_NVCC_FLAGS", "").split()


def max_jobs() -> int | None:
    """``DSAGEN_MAX_JOBS`` (None: unset). :class:`ConfigError` naming the variable where it is
    not an integer >= 1."""
    env = os.environ.get("DSAGEN_MAX_JOBS", "").strip()
    if not env:
        return None
    try:
        v = int(env)
    except ValueError:
        v = 0
    if v < 1:
        raise ConfigError(f"DSAGEN_MAX_JOBS={env!r}: must be an integer >= 1")
    return v


def check() -> list[str]:
    """The problems of the set ``DSAGEN_*`` variables that have a format (``DSAGEN_LOCK_TIMEOUT``,
    ``DSAGEN_ARCH_LIST``, ``DSAGEN_MAX_JOBS``, ``DSAGEN_BENCH_METHOD``, ``DSAGEN_BENCH_SETTLE``),
    one message each; empty when all are good. The CLI refuses to start with any (exit status
    2); ``dsagen doctor`` lists them."""
    out = []
    for fn in (lock_timeout, arch_list, max_jobs, bench_method, lambda: bench_settle_s(0.0)):
        try:
            fn()
        except ValueError as e:
            out.append(str(e))
    return out


def jit_disabled() -> bool:
    """``DSAGEN_DISABLE_JIT`` set: a variant missing from the cache is a
    :class:`dsagen.jit.JitDisabledError` instead of a build."""
    return _flag("DSAGEN_DISABLE_JIT")


def settings() -> dict[str, str]:
    """The ``DSAGEN_*`` variables that are set, for reports."""
    return {k: os.environ[k] for k in ENV_VARS if k in os.environ}


BENCH_METHODS = ("spin", "graph")


def bench_method() -> str:
    """``dsagen bench``'s default timing method (``DSAGEN_BENCH_METHOD``, default ``"spin"``).
    :class:`ConfigError` naming the variable where it is not one of :data:`BENCH_METHODS`."""
    m = os.environ.get("DSAGEN_BENCH_METHOD") or "spin"
    if m not in BENCH_METHODS:
        raise ConfigError(f"DSAGEN_BENCH_METHOD={m!r}: must be 'spin' or 'graph'")
    return m


def bench_settle_s(default: float) -> float:
    """Seconds ``dsagen bench`` waits, the GPU idle, before each row (``DSAGEN_BENCH_SETTLE``,
    else ``default``). :class:`ConfigError` naming the variable where it is not a number in
    [0, 600]."""
    v = os.environ.get("DSAGEN_BENCH_SETTLE")
    if not v:
        return default
    try:
        s = float(v)
    except ValueError:
        s = -1.0
    if not 0 <= s <= 600:
        raise ConfigError(f"DSAGEN_BENCH_SETTLE={v!r}: must be a number of seconds in [0, 600]")
    return s


def bench_partial() -> str | None:
    """The file ``dsagen bench`` rewrites with its rows so far (``DSAGEN_BENCH_PARTIAL``), or None."""
    return os.environ.get("DSAGEN_BENCH_PARTIAL") or None


def bench_git() -> str | None:
    """The commit the bench rows name where the tree was copied without its ``.git``
    (``DSAGEN_BENCH_GIT``), or None."""
    return os.environ.get("DSAGEN_BENCH_GIT") or None
