"""Build rendered sources into a torch extension with ninja, cached by content.

The cache key is a SHA-256 of the rendered sources, the compiler flags (no absolute paths), the
target archs, and the torch / dsagen / CUTLASS / nvcc versions. A build happens under a file lock
per key (``filelock``: an OS lock, released when the holder dies), in a private temporary
directory that is renamed into place when complete, so concurrent processes never see a
half-written module. Environment (all optional):

* ``DSAGEN_CACHE_DIR``: cache root (default ``$XDG_CACHE_HOME/dsagen`` or ``~/.cache/dsagen``).
* ``DSAGEN_JIT_VERBOSE=1``: show the ninja build output.
* ``DSAGEN_NVCC_FLAGS``: extra nvcc flags (part of the key).
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

import filelock

from . import __version__
from .codegen import CPU_SOURCES, CUDA_SOURCES, HEADERS

ARCH_GENCODE = {
    "sm_90a": "-gencode=arch=compute_90a,code=sm_90a",
    "sm_100a": "-gencode=arch=compute_100a,code=sm_100a",
}
CXX_FLAGS = ["-O3"]
NVCC_FLAGS = ["-O3", "--expt-relaxed-constexpr"]
NVCC_STD = ["-std=c++17"]   # torch adds its own standard flag when it builds the extension


class BuildError(RuntimeError):
    """A generated source failed to compile; the message holds the compiler output and where the
    kept sources are."""


def cache_root() -> Path:
    env = os.environ.get("DSAGEN_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dsagen"


def verbose() -> bool:
    return os.environ.get("DSAGEN_JIT_VERBOSE", "") not in ("", "0")


@functools.lru_cache(maxsize=None)
def cutlass_include_dir() -> Path:
    """``cutlass_library/source/include`` of the installed nvidia-cutlass wheel, found without
    importing the package (importing it pulls in heavy modules)."""
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
    nvcc = nvcc or find_nvcc()
    if not nvcc:
        return "none"
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return m.group(2) if m else out.strip().splitlines()[-1]


def extra_nvcc_flags() -> list[str]:
    return os.environ.get("DSAGEN_NVCC_FLAGS", "").split()


def _key(sources: dict[str, str], parts: dict) -> str:
    h = hashlib.sha256()
    for name in sorted(sources):
        h.update(name.encode() + b"\0" + sources[name].encode() + b"\0")
    h.update(json.dumps(parts, sort_keys=True).encode())
    return h.hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Built:
    library: Path
    key: str
    cached: bool
    seconds: float
    loaded: bool = False   # the build already loaded the library into this process


def build_extension(name: str, sources: dict[str, str], archs: list[str], with_cuda: bool) -> Built:
    """Build (or find in the cache) the torch extension of rendered ``sources``.

    Args:
        name: module name (an identifier; also the torch.library namespace).
        sources: ``{file name: text}`` from :func:`dsagen.codegen.render`.
        archs: CUDA targets (``sm_90a``...) when ``with_cuda``.
        with_cuda: compile the ``.cu`` files and register CUDA kernels.
    Returns:
        :class:`Built` with the path of the shared library (not yet loaded).
    Raises:
        BuildError: compilation failed; the sources are kept and their path is in the message.
    """
    import torch
    from torch.utils import cpp_extension

    files = list(HEADERS) + list(CPU_SOURCES) + (list(CUDA_SOURCES) if with_cuda else [])
    srcs = {f: sources[f] for f in files}
    cflags = CXX_FLAGS + (["-DDSAGEN_WITH_CUDA"] if with_cuda else [])
    cuda_flags = NVCC_FLAGS + [ARCH_GENCODE[a] for a in archs] + extra_nvcc_flags() if with_cuda else []
    parts = {
        "cflags": cflags, "cuda_flags": cuda_flags, "archs": archs if with_cuda else [],
        "torch": torch.__version__, "torch_cuda": torch.version.cuda, "dsagen": __version__,
        "cutlass": cutlass_version() if with_cuda else None,
        "nvcc": nvcc_version() if with_cuda else None, "python": sys.version_info[:2],
    }
    key = _key(srcs, parts)
    root = cache_root()
    final = root / f"{name}-{key[:16]}"
    lib = final / f"{name}.so"
    manifest = final / "manifest.json"

    def cached_ok() -> bool:
        if not (lib.exists() and manifest.exists()):
            return False
        try:
            m = json.loads(manifest.read_text())
        except (OSError, ValueError):
            return False
        return m.get("key") == key and m.get("sha256") == _sha256(lib)

    if cached_ok():
        return Built(lib, key, True, 0.0)
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / "locks").mkdir(exist_ok=True)
    except OSError as e:
        raise BuildError(f"cache root {root} is not writable ({e.strerror}) and {name} is not built "
                         f"there: set DSAGEN_CACHE_DIR to a writable directory") from None
    t0 = time.time()
    with filelock.FileLock(str(root / "locks" / f"{key[:32]}.lock"), timeout=3600):
        if cached_ok():
            return Built(lib, key, True, 0.0)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
        for f, text in srcs.items():
            (tmp / f).write_text(text)
        src_paths = [str(tmp / f) for f in CPU_SOURCES] + (
            [str(tmp / f) for f in CUDA_SOURCES] if with_cuda else [])
        print(f"[dsagen] building {name} ({'CPU+CUDA ' + ','.join(archs) if with_cuda else 'CPU'}) "
              f"in {tmp} ...", file=sys.stderr, flush=True)
        try:
            cpp_extension.load(
                name=name, sources=src_paths, build_directory=str(tmp), is_python_module=False,
                extra_cflags=cflags, extra_cuda_cflags=cuda_flags,
                extra_include_paths=[str(tmp)] + ([str(cutlass_include_dir())] if with_cuda else []),
                with_cuda=with_cuda, verbose=verbose(),
            )
        except Exception as e:  # noqa: BLE001 - re-raised with context
            raise BuildError(f"building {name} failed; sources and build.ninja kept in {tmp}\n{e}") from None
        built = tmp / f"{name}.so"
        (tmp / "manifest.json").write_text(json.dumps(
            {"key": key, "name": name, "inputs": parts, "sha256": _sha256(built),
             "built": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=1))
        if final.exists():
            shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    dt = time.time() - t0
    print(f"[dsagen] built {name} in {dt:.1f} s", file=sys.stderr, flush=True)
    return Built(lib, key, False, dt, loaded=True)


@dataclass
class NvccResult:
    arch: str
    source: str
    ok: bool
    seconds: float
    log: str


def nvcc_compile_only(sources: dict[str, str], archs: list[str], workdir: Path | None = None,
                      jobs: int = 2) -> list[NvccResult]:
    """Compile every ``.cu`` source for each arch with nvcc (``-c``, nothing is run).

    Raises:
        BuildError: nvcc is not found.
    """
    from concurrent.futures import ThreadPoolExecutor

    nvcc = find_nvcc()
    if not nvcc:
        raise BuildError("nvcc not found (not on PATH, CUDA_HOME or /usr/local/cuda)")
    wd = Path(workdir or tempfile.mkdtemp(prefix="dsagen-nvcc-"))
    wd.mkdir(parents=True, exist_ok=True)
    for f in HEADERS + CUDA_SOURCES:
        (wd / f).write_text(sources[f])
    inc = str(cutlass_include_dir())

    def one(arch_src):
        arch, src = arch_src
        cmd = [nvcc, *NVCC_STD, *NVCC_FLAGS, *extra_nvcc_flags(), ARCH_GENCODE[arch], "-I", str(wd), "-I", inc,
               "-c", str(wd / src), "-o", str(wd / f"{src}.{arch}.o")]
        t0 = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True)
        return NvccResult(arch, src, p.returncode == 0, time.time() - t0,
                          (" ".join(cmd) + "\n" + p.stdout + p.stderr).strip())

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        return list(ex.map(one, [(a, s) for a in archs for s in CUDA_SOURCES]))
