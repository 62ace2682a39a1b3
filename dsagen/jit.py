"""Build rendered sources into a torch extension with ninja, cached by content.

The cache key (:func:`key_inputs`) is a SHA-256 of the rendered sources (the templates are
inlined into them, so a template edit changes the key), the compiler flags (no absolute
paths), the target archs, and the torch / dsagen / CUTLASS / nvcc / Python versions; never
file times or locations, so a cache built in one checkout or image serves another. A
``manifest.json`` beside each library records the key inputs and the library's SHA-256, checked
on every load (a mismatch rebuilds). A build runs under one OS file lock per key (``filelock``:
released by the kernel when the holder dies), in a private temporary directory that is renamed
into place when complete; a process that waited on the lock uses the winner's build.
Configuration: :mod:`dsagen.config`.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import __version__, config
from .codegen import CPU_SOURCES, CUDA_SOURCES, HEADERS

ARCH_GENCODE = {
    "sm_90a": "-gencode=arch=compute_90a,code=sm_90a",
    "sm_100a": "-gencode=arch=compute_100a,code=sm_100a",
}
CXX_FLAGS = ["-O3"]
NVCC_FLAGS = ["-O3", "--expt-relaxed-constexpr"]
NVCC_STD = ["-std=c++17"]   # torch adds its own standard flag when it builds the extension


class BuildError(RuntimeError):
    """A generated source failed to compile, or nothing may be built; the message says why and
    where the kept sources, build file and command lines are."""


class JitDisabledError(BuildError):
    """``DSAGEN_DISABLE_JIT`` is set and a variant is not in the cache."""


class CaptureError(RuntimeError):
    """A load was attempted while a CUDA graph is being captured."""


def cache_root() -> Path:
    """The build cache root (:func:`dsagen.config.cache_root`)."""
    return config.cache_root()


def verbose() -> bool:
    """Whether loads log to stderr (``DSAGEN_JIT_VERBOSE``)."""
    return config.jit_verbose()


def _log(msg: str) -> None:
    print(f"[dsagen] {msg}", file=sys.stderr, flush=True)


@functools.lru_cache(maxsize=None)
def cutlass_include_dir() -> Path:
    """``cutlass_library/source/include`` of the installed nvidia-cutlass wheel, found without
    importing the package (importing it pulls in heavy modules). Raises BuildError where the
    wheel or its CuTe headers are missing."""
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        raise BuildError("nvidia-cutlass is not installed (pip install nvidia-cutlass): its wheel "
                         "ships the CuTe headers the CUDA kernels include")
    inc = Path(list(spec.submodule_search_locations)[0]) / "source" / "include"
    if not (inc / "cute").is_dir():
        raise BuildError(f"CuTe headers not found under {inc}")
    return inc


@functools.lru_cache(maxsize=None)
def cutlass_version() -> str:
    """The installed nvidia-cutlass wheel's version, or ``"unknown"``."""
    try:
        return importlib.metadata.version("nvidia-cutlass")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def find_nvcc() -> str | None:
    """nvcc on PATH, else under ``$CUDA_HOME`` or ``/usr/local/cuda``."""
    p = shutil.which("nvcc")
    if p:
        return p
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").exists():
            return str(Path(home) / "bin" / "nvcc")
    return None


@functools.lru_cache(maxsize=None)
def nvcc_version(nvcc: str | None = None) -> str:
    """``nvcc --version``'s build version (e.g. ``12.8.93``) of ``nvcc`` (default
    :func:`find_nvcc`), or ``"none"`` without one."""
    nvcc = nvcc or find_nvcc()
    if not nvcc:
        return "none"
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return m.group(2) if m else out.strip().splitlines()[-1]


def extra_nvcc_flags() -> list[str]:
    """``DSAGEN_NVCC_FLAGS`` plus ``-G`` / ``-lineinfo`` where ``DSAGEN_JIT_DEBUG`` /
    ``DSAGEN_JIT_LINEINFO`` are set (part of the cache key)."""
    flags = list(config.extra_nvcc_flags())
    if config.jit_debug():
        flags.append("-G")
    if config.jit_lineinfo():
        flags.append("-lineinfo")
    return flags


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def variant_files(with_cuda: bool) -> list[str]:
    """The rendered files a build compiles: headers and CPU sources, and the ``.cu`` sources
    ``with_cuda``."""
    return list(HEADERS) + list(CPU_SOURCES) + (list(CUDA_SOURCES) if with_cuda else [])


def key_inputs(sources: dict[str, str], archs: list[str], with_cuda: bool) -> dict:
    """Everything a build depends on, without paths or times (recorded in the manifest)."""
    import torch

    files = variant_files(with_cuda)
    cflags = CXX_FLAGS + (["-DDSAGEN_WITH_CUDA"] if with_cuda else [])
    cuda_flags = NVCC_FLAGS + [ARCH_GENCODE[a] for a in archs] + extra_nvcc_flags() if with_cuda else []
    return {
        "sources": {f: hashlib.sha256(sources[f].encode()).hexdigest() for f in files},
        "cflags": cflags, "cuda_flags": cuda_flags, "archs": list(archs) if with_cuda else [],
        "torch": torch.__version__, "torch_cuda": torch.version.cuda, "dsagen": __version__,
        "cutlass": cutlass_version() if with_cuda else None,
        "nvcc": nvcc_version() if with_cuda else None, "python": list(sys.version_info[:2]),
        "platform": sys.platform,
    }


def cache_key(inputs: dict) -> str:
    """SHA-256 of :func:`key_inputs`."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


@dataclass
class Built:
    """What :func:`build_extension` found or built: the shared ``library``'s path, the cache
    ``key`` (SHA-256 hex), whether it was ``cached``, the build's wall ``seconds`` (0 for a hit)
    and whether the build already ``loaded`` it into this process."""
    library: Path
    key: str
    cached: bool
    seconds: float
    loaded: bool = False   # the build already loaded the library into this process


def entry_dir(root: Path, name: str, key: str) -> Path:
    """The cache entry folder of a build: ``root/<name>-<first 16 hex digits of key>``."""
    return root / f"{name}-{key[:16]}"


# the folders build_extension makes in the cache root: entries (entry_dir: `<module name>-<16 hex
# of the key>`) and temporary ones (`.<module name>-<random>` for a build, `.probe-<random>` for
# the writability probe); `dsagen cache` touches nothing else there
ENTRY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*-[0-9a-f]{16}")
TMP_NAME = re.compile(r"\.(probe|[A-Za-z_][A-Za-z0-9_]*)-[A-Za-z0-9_]+")


def check_entry(d: Path, key: str | None = None) -> str | None:
    """None when ``d`` holds a complete build (manifest present, key matching ``key`` if given,
    library SHA-256 matching the manifest); else the reason it does not."""
    man = d / "manifest.json"
    try:
        m = json.loads(man.read_text())
    except FileNotFoundError:
        return "no manifest"
    except (OSError, ValueError) as e:
        return f"unreadable manifest ({e})"
    lib = d / f"{m.get('name')}.so"
    if key is not None and m.get("key") != key:
        return "key mismatch"
    if not lib.exists():
        return "library missing"
    if m.get("sha256") != _sha256(lib):
        return "library SHA-256 differs from the manifest (corrupted or modified)"
    return None


def _reason(e: OSError) -> str:
    """An OSError as ``strerror: path`` (the path that failed, which may be below the one tried)."""
    return f"{e.strerror}: {e.filename}" if e.filename else f"{e.strerror or e}"


def build_extension(name: str, sources: dict[str, str], archs: list[str], with_cuda: bool) -> Built:
    """Find in the cache, or build, the torch extension of rendered ``sources``.

    Args:
        name: module name (an identifier; also the torch.library namespace).
        sources: ``{file name: text}`` from :func:`dsagen.codegen.render`.
        archs: CUDA targets (``sm_90a``...) when ``with_cuda``.
        with_cuda: compile the ``.cu`` files and register CUDA kernels.
    Returns:
        :class:`Built` with the path of the shared library.
    Raises:
        JitDisabledError: ``DSAGEN_DISABLE_JIT`` is set and the variant is not cached.
        BuildError: compilation failed (the message has the compiler output and the kept
            sources), the cache is not writable, or the build lock timed out.
    """
    t0 = time.time()
    inputs = key_inputs(sources, archs, with_cuda)
    key = cache_key(inputs)
    root = cache_root()
    final = entry_dir(root, name, key)
    lib = final / f"{name}.so"
    what = f"{name} ({'CPU+CUDA ' + ','.join(archs) if with_cuda else 'CPU'})"
    reason = check_entry(final, key)
    if reason is not None and with_cuda and inputs["nvcc"] == "none":
        # no nvcc here (a serving image): accept a build that differs only in the nvcc it was
        # built with; the manifest records which one.
        alt = _find_without_nvcc(root, name, inputs)
        if alt is not None:
            final, lib, key, reason = alt, alt / f"{name}.so", json.loads((alt / "manifest.json").read_text())["key"], None
    if reason is None:
        if verbose():
            _log(f"{what} key={key[:16]} cache hit ({(time.time() - t0) * 1e3:.1f} ms)")
        return Built(lib, key, True, 0.0)
    if config.jit_disabled():
        raise JitDisabledError(f"DSAGEN_DISABLE_JIT is set and {what} is not in the cache {root} "
                               f"(expected {final.name}: {reason}); run `dsagen precompile` first")
    locks = config.lock_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = tempfile.mkdtemp(prefix=".probe-", dir=root)
        os.rmdir(probe)
    except OSError as e:
        # precompiling into the root elsewhere helps only where it is a folder (read-only to
        # this user); is_dir itself fails where the user cannot search the parent
        try:
            folder = root.is_dir()
        except OSError:
            folder = False
        hint = f", or precompile into this one with `dsagen precompile --out {root}`" if folder else ""
        raise BuildError(f"{what} must be built but the cache root {root} is not writable "
                         f"({_reason(e)}): set DSAGEN_CACHE_DIR to a writable directory{hint}") from None
    try:
        locks.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BuildError(f"{what} must be built but its lock folder {locks} cannot be made ({_reason(e)}): "
                         "set DSAGEN_LOCK_DIR (by default under DSAGEN_CACHE_DIR) to a writable "
                         "directory") from None
    import filelock   # only builds need it

    lock_path = locks / f"{name}-{key[:32]}.lock"
    try:
        lock = filelock.FileLock(str(lock_path), timeout=config.lock_timeout())
        lock.acquire()
    except filelock.Timeout:
        raise BuildError(f"waited {config.lock_timeout():.0f} s for another process building {what}; "
                         f"its lock file is {lock_path} (DSAGEN_LOCK_TIMEOUT to wait longer)") from None
    try:
        if check_entry(final, key) is None:      # another process built it meanwhile
            if verbose():
                _log(f"{what} key={key[:16]} built by another process")
            return Built(lib, key, True, time.time() - t0)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
        for f in variant_files(with_cuda):
            (tmp / f).write_text(sources[f])
        _log(f"building {what} in {tmp} ...")
        built = _compile(name, tmp, archs, with_cuda, inputs)
        (tmp / "manifest.json").write_text(json.dumps(
            {"key": key, "name": name, "inputs": inputs, "sha256": _sha256(built),
             "built": time.strftime("%Y-%m-%dT%H:%M:%S"), "seconds": round(time.time() - t0, 2)},
            indent=1))
        # readable by every user (mkdtemp makes 0700): a cache built by root serves others
        for dirpath, _dirs, _files in os.walk(tmp):
            os.chmod(dirpath, 0o755)
        for f in tmp.iterdir():
            if f.is_file():
                os.chmod(f, 0o644 if f.suffix != ".so" else 0o755)
        if final.exists():
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.replace(tmp, final)
        except OSError as e:
            raise BuildError(f"built {what} in {tmp} but could not publish it as {final}: {e}") from None
    finally:
        lock.release()
    dt = time.time() - t0
    _log(f"built {what} key={key[:16]} in {dt:.1f} s")
    return Built(lib, key, False, dt, loaded=True)


def _find_without_nvcc(root: Path, name: str, inputs: dict) -> Path | None:
    want = {k: v for k, v in inputs.items() if k != "nvcc"}
    for d in sorted(root.glob(f"{name}-*")):
        try:
            m = json.loads((d / "manifest.json").read_text())
        except (OSError, ValueError):
            continue
        got = {k: v for k, v in m.get("inputs", {}).items() if k != "nvcc"}
        if got == want and check_entry(d, m.get("key")) is None:
            return d
    return None


def _compile(name: str, tmp: Path, archs: list[str], with_cuda: bool, inputs: dict) -> Path:
    from torch.utils import cpp_extension

    src_paths = [str(tmp / f) for f in CPU_SOURCES] + (
        [str(tmp / f) for f in CUDA_SOURCES] if with_cuda else [])
    env_jobs = config.max_jobs()
    old_jobs = os.environ.get("MAX_JOBS")
    if env_jobs:
        os.environ["MAX_JOBS"] = str(env_jobs)
    try:
        cpp_extension.load(
            name=name, sources=src_paths, build_directory=str(tmp), is_python_module=False,
            extra_cflags=inputs["cflags"], extra_cuda_cflags=inputs["cuda_flags"],
            extra_include_paths=[str(tmp)] + ([str(cutlass_include_dir())] if with_cuda else []),
            with_cuda=with_cuda, verbose=verbose(),
        )
    except Exception as e:  # noqa: BLE001 - re-raised with context
        msg = str(e)
        m = re.search(r"(/\S+\.(?:cu|cpp|h))[:(](\d+)", msg)
        where = f"first error at {m.group(1)}:{m.group(2)}\n" if m else ""
        raise BuildError(f"building {name} failed. {where}Kept sources and build file: "
                         f"{tmp} (build.ninja holds the exact command lines)\n{msg}") from None
    finally:
        if env_jobs:
            if old_jobs is None:
                os.environ.pop("MAX_JOBS", None)
            else:
                os.environ["MAX_JOBS"] = old_jobs
    return tmp / f"{name}.so"


@dataclass
class NvccResult:
    """One compile of :func:`nvcc_compile_only`: ``arch`` (``sm_90a``...), ``source`` (a ``.cu``
    file name), ``ok`` (nvcc exited 0), wall ``seconds``, ``log`` (the command line and
    nvcc's output) and ``output`` (the object file, or the cubin of a device-only compile)."""
    arch: str
    source: str
    ok: bool
    seconds: float
    log: str
    output: Path | None = None


def nvcc_compile_only(sources: dict[str, str], archs: list[str], workdir: Path | None = None,
                      jobs: int = 2, only: list[str] | None = None) -> list[NvccResult]:
    """Compile every ``.cu`` source (or the ones named in ``only``, a subset of
    ``CUDA_SOURCES``) for each arch with nvcc (nothing is run), ``jobs`` compiles at a time, in
    ``workdir`` (default a new temporary folder, kept). The first arch compiles host and device
    code (``-c``, ``<source>.<arch>.o``); each further arch compiles its device code alone
    (``-cubin``, ``<source>.<arch>.cubin``): the host code is the same for every arch, and its
    pass is more than half of a compile's time. Where ``DSAGEN_NVCC_FLAGS`` names GPU targets
    of its own (``-gencode``, ``-arch``, ``-code``), which ``-cubin`` refuses, every arch is
    compiled with ``-c``.

    Returns:
        one :class:`NvccResult` per (arch, source); a failed compile is ``ok`` False, not raised.
    Raises:
        BuildError: nvcc is not found, or the nvidia-cutlass headers are missing.
        ValueError: ``only`` names a file that is not one of ``CUDA_SOURCES``.
    """
    from concurrent.futures import ThreadPoolExecutor

    names = list(CUDA_SOURCES) if only is None else list(only)
    if not set(names) <= set(CUDA_SOURCES):
        raise ValueError(f"only: {sorted(set(names) - set(CUDA_SOURCES))} not among {list(CUDA_SOURCES)}")
    nvcc = find_nvcc()
    if not nvcc:
        raise BuildError("nvcc not found (not on PATH, CUDA_HOME or /usr/local/cuda)")
    wd = Path(workdir or tempfile.mkdtemp(prefix="dsagen-nvcc-"))
    wd.mkdir(parents=True, exist_ok=True)
    for f in HEADERS + CUDA_SOURCES:
        (wd / f).write_text(sources[f])
    inc = str(cutlass_include_dir())

    # nvcc refuses -cubin for several GPU targets: extra flags that add one get -c everywhere
    extra = extra_nvcc_flags()
    more_targets = any(f.split("=")[0] in ("-gencode", "--generate-code", "-arch", "--gpu-architecture",
                                           "-code", "--gpu-code") for f in extra)

    def one(arch_src):
        arch, src = arch_src
        device_only = arch != archs[0] and not more_targets
        mode, out = ("-cubin", wd / f"{src}.{arch}.cubin") if device_only else ("-c", wd / f"{src}.{arch}.o")
        cmd = [nvcc, *NVCC_STD, *NVCC_FLAGS, *extra, ARCH_GENCODE[arch], "-I", str(wd), "-I", inc,
               mode, str(wd / src), "-o", str(out)]
        t0 = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True)
        return NvccResult(arch, src, p.returncode == 0, time.time() - t0,
                          (" ".join(cmd) + "\n" + p.stdout + p.stderr).strip(), out)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        return list(ex.map(one, [(a, s) for a in archs for s in names]))
