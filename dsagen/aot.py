"""Ahead-of-time builds (``dsagen precompile``), cache inspection (``dsagen cache``) and the
environment report (``dsagen doctor``)."""
from __future__ import annotations

import multiprocessing as mp
import os
import platform
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from . import __version__, config, jit
from .codegen import JINJA_CACHE, RENDER_MEMO
from .spec import Spec


@dataclass
class VariantResult:
    """One build of :func:`precompile` (a build failure is reported here, ``ok`` False with
    the error in ``note``, not raised). ``spec``: the spec's name, with its file where two
    different specs share the name (:func:`spec_labels`); ``seconds``: its wall time; ``key``:
    the cache key."""
    spec: str
    variant: str          # "cpu" or the CUDA arch
    ok: bool
    cached: bool = False
    seconds: float = 0.0
    key: str = ""
    note: str = ""


def spec_labels(specs: list[Spec]) -> list[str]:
    """How :func:`precompile` names each spec in its output and results: the spec's name, or,
    where two different specs share a name (e.g. a copy edited but not renamed), ``name
    (source file)``."""
    from collections import Counter
    count = Counter(s.name for s in specs)
    return [s.name if count[s.name] == 1 else f"{s.name} ({s.source})" for s in specs]


def _worker_spec(spec_dict: dict, source: str, cache_dir: str | None) -> Spec:
    # the start of a pool task (a fresh process: a build loads its library, and a namespace
    # registers once): the cache root is cache_dir, so the render memo, template bytecode,
    # locks and builds all go there
    if cache_dir:
        os.environ["DSAGEN_CACHE_DIR"] = cache_dir
    return Spec.from_dict(spec_dict, source=source)


def _build_variant(spec_dict: dict, source: str, archs: list[str], with_cuda: bool,
                   cache_dir: str | None) -> tuple[str, bool, float, str]:
    from .codegen import namespace, render
    spec = _worker_spec(spec_dict, source, cache_dir)
    built = jit.build_extension(namespace(spec), render(spec), archs, with_cuda)
    return built.key, built.cached, built.seconds, str(built.library)


def _compile_only_variant(spec_dict: dict, source: str, arch: str, cache_dir: str | None,
                          jobs: int) -> tuple[bool, float, str]:
    # (ok, wall seconds, nvcc's log of the failures)
    import tempfile
    from .codegen import render
    spec = _worker_spec(spec_dict, source, cache_dir)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="dsagen-nvcc-") as wd:
        rs = jit.nvcc_compile_only(render(spec), [arch], workdir=Path(wd), jobs=jobs)
    return all(x.ok for x in rs), time.time() - t0, "\n".join(x.log for x in rs if not x.ok)


class OutDirError(ValueError):
    """An output folder (``precompile --out``, ``recall --out``) that cannot be made writable."""


def out_folder(out: Path | str) -> Path:
    """``out`` made (with its parents) and checked to be a writable folder; its absolute path.

    Raises:
        OutDirError: it cannot be made, is not a folder, or is not writable (the message starts
            with ``out``).
    """
    try:
        p = Path(out).expanduser()
        if p.exists() and not p.is_dir():
            raise OutDirError(f"{out}: a file, not a folder")
        p.mkdir(parents=True, exist_ok=True)
        if not os.access(p, os.W_OK | os.X_OK):
            raise OutDirError(f"{out}: not writable")
        return p.resolve()
    except OSError as e:             # no permission to search a parent, a file on the way
        raise OutDirError(f"{out}: cannot create the folder ({e.strerror or e})") from None
    except RuntimeError as e:        # expanduser: ~user of no such user
        raise OutDirError(f"{out}: {e}") from None


def precompile(specs: list[Spec], archs: list[str], out: Path | None = None, jobs: int = 2,
               log=print) -> list[VariantResult]:
    """Build every variant of ``specs`` into the cache (or ``out``), ``jobs`` at a time.

    Variants: the CPU extension, and for each requested arch among a spec's targets the CUDA
    extension (it needs a CUDA build of torch and nvcc; otherwise the ``.cu`` sources are only
    compiled with nvcc, and the result says so). Every build and compile runs in a pool
    process whose cache root is ``out``, so nothing (render memo, template bytecode, locks)
    is written to the default cache; point ``DSAGEN_CACHE_DIR`` at ``out`` to use it. A spec
    given twice (the same content) is built once. A variant's ``seconds`` is its wall time.

    Raises:
        OutDirError: ``out`` cannot be made a writable folder. A failed build does not raise:
            its result has ``ok`` False.
    """
    import torch

    cache_dir = str(out_folder(out)) if out else None
    unique: list[Spec] = []
    seen: dict[str, Spec] = {}     # by content (Spec.digest)

    def same_file(a: Spec, b: Spec) -> bool:
        try:
            return a.source == b.source or Path(a.source).resolve() == Path(b.source).resolve()
        except (OSError, RuntimeError):
            return False

    for s in specs:
        k = s.digest
        if k in seen:
            first = seen[k]
            log(f"{s.source}: " + ("listed twice" if same_file(s, first) else f"the same spec as {first.source}")
                + ": built once")
            continue
        seen[k] = s
        unique.append(s)
    label = dict(zip(map(id, unique), spec_labels(unique)))
    cuda_torch = torch.version.cuda is not None
    nvcc = jit.find_nvcc()
    todo: list[tuple[Spec, str, list[str], bool]] = []
    results: list[VariantResult] = []
    for s in unique:
        todo.append((s, "cpu", [], False))
        for a in archs:
            if a not in s.targets:
                results.append(VariantResult(label[id(s)], a, True, note="not a target of this spec: skipped"))
            elif cuda_torch and nvcc:
                todo.append((s, a, [a], True))
            else:
                todo.append((s, a, [a], False))   # compile-only check
    n = len(todo)
    log(f"precompiling {n} variant(s) of {len(unique)} spec(s) into {cache_dir or config.cache_root()} "
        f"with {jobs} job(s)")
    compile_only = [t for t in todo if t[1] != "cpu" and not t[3]]
    why = "this torch has no CUDA" if not cuda_torch else "nvcc not found"
    # nvcc threads per compile-only variant, so that about `jobs` compilers run at once
    nvcc_jobs = max(1, jobs // max(1, min(jobs, len(compile_only))))
    done = 0
    ctx = mp.get_context("spawn")
    kw = {"max_tasks_per_child": 1} if sys.version_info >= (3, 11) else {}

    def report(r: VariantResult) -> None:
        nonlocal done
        done += 1
        log(f"[{done}/{n}] {r.spec} {r.variant}: {'ok' if r.ok else 'FAILED'} ({r.seconds:.1f} s) "
            f"{r.note.splitlines()[0] if r.note else ''}")
        results.append(r)

    with ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=ctx, **kw) as ex:
        futs = {}
        for s, variant, a, with_cuda in todo:
            if variant == "cpu" or with_cuda:
                futs[ex.submit(_build_variant, s.to_dict(), s.source, a, with_cuda, cache_dir)] = (s, variant, True)
            elif not nvcc:
                report(VariantResult(label[id(s)], variant, False, note="nvcc not found: CUDA not compiled"))
            else:
                futs[ex.submit(_compile_only_variant, s.to_dict(), s.source, variant, cache_dir,
                               nvcc_jobs)] = (s, variant, False)
        for f in as_completed(futs):
            s, variant, build = futs[f]
            try:
                if build:
                    key, cached, secs, _lib = f.result()
                    r = VariantResult(label[id(s)], variant, True, cached, secs, key,
                                      "already in the cache" if cached else "built")
                else:
                    ok, secs, failures = f.result()
                    r = VariantResult(label[id(s)], variant, ok, seconds=secs,
                                      note=f"compiled with nvcc only ({why}): not packaged" if ok else failures)
            except Exception as e:  # noqa: BLE001 - reported per variant
                r = VariantResult(label[id(s)], variant, False, note=f"{type(e).__name__}: {e}")
            report(r)
    return results


# ---- cache management ---------------------------------------------------------------------------

@dataclass
class Entry:
    """One build directory of the cache. ``size`` in bytes; ``status`` "ok" or why it is not
    usable; ``built`` the manifest's build time; ``variant`` "cpu" or "cuda ARCHS"."""
    path: Path
    name: str
    key: str
    size: int
    status: str          # "ok" or the reason it is not usable
    built: str
    variant: str


def _size(p: Path) -> int:
    """Bytes of the files under ``p``, skipping those that another process removes meanwhile."""
    return sum(st.st_size for _f, st in _files(p))


def root_is_a_file(root: Path | None = None) -> bool:
    """Whether the cache root (default :func:`dsagen.config.cache_root`) exists but is not a
    folder: no build can use it, and the cache commands would find it empty."""
    root = root or config.cache_root()
    return root.exists() and not root.is_dir()


def entries(root: Path | None = None) -> list[Entry]:
    """Every build directory in the cache (complete or not): the folders named as
    :mod:`dsagen.jit` names its entries and temporary build folders (``jit.ENTRY_NAME``,
    ``jit.TMP_NAME``), nothing else (another tool's files, a lock dir placed inside the root).
    A folder that another process removes while it is listed is left out."""
    import json
    root = root or config.cache_root()
    out = []
    if not root.is_dir():
        return out
    for d in sorted(root.iterdir()):
        try:
            if not d.is_dir() or d.is_symlink():
                continue
        except OSError:
            continue
        if jit.TMP_NAME.fullmatch(d.name):
            out.append(Entry(d, d.name, "", _size(d), "unfinished build directory", "", ""))
            continue
        if not jit.ENTRY_NAME.fullmatch(d.name):
            continue
        try:
            m = json.loads((d / "manifest.json").read_text())
        except (OSError, ValueError):
            m = {}
        status = jit.check_entry(d) or "ok"
        inp = m.get("inputs", {})
        variant = ("cuda " + ",".join(inp.get("archs", []))) if inp.get("archs") else "cpu"
        out.append(Entry(d, m.get("name", d.name), m.get("key", "")[:16], _size(d), status,
                         m.get("built", ""), variant))
    return out


def prune(root: Path | None = None, everything: bool = False, older_than_days: float | None = None) -> list[Entry]:
    """Remove unusable entries (and unfinished build directories older than an hour); with
    ``everything`` all entries, with ``older_than_days`` those whose directory was modified
    more than that many days ago (normally its build time). Returns what went."""
    gone = []
    now = time.time()
    for e in entries(root):
        try:
            age_days = (now - e.path.stat().st_mtime) / 86400
        except OSError:          # removed meanwhile (another prune)
            continue
        drop = everything or e.status != "ok"
        if e.status == "unfinished build directory":
            drop = everything or age_days > 1 / 24
        if older_than_days is not None and age_days > older_than_days:
            drop = True
        if drop:
            shutil.rmtree(e.path, ignore_errors=True)
            gone.append(e)
    return gone


_AUX = (("render memo", RENDER_MEMO), ("template bytecode", JINJA_CACHE))


def _files(d: Path):
    """``(path, stat)`` of each file under ``d`` (none if it is missing), skipping those that
    another process renames or removes while they are listed."""
    try:
        files = list(d.rglob("*")) if d.is_dir() else []
    except OSError:                 # the folder went while it was walked
        files = []
    for f in files:
        try:
            if f.is_file():
                yield f, f.stat()
        except OSError:
            continue


def aux_dirs(root: Path | None = None) -> list[tuple[str, Path, int, int]]:
    """The cache's two folders that are not build entries: ``(what, path, files, bytes)`` for
    the render memo (``rendered/``, bounded to ``codegen.RENDER_MEMO_MAX`` renders) and Jinja's
    template bytecode (``jinja-bytecode/``). Missing folders count 0."""
    root = root or config.cache_root()
    out = []
    for what, name in _AUX:
        sizes = [st.st_size for _f, st in _files(root / name)]
        out.append((what, root / name, len(sizes), sum(sizes)))
    return out


def prune_aux(root: Path | None = None, everything: bool = False,
              older_than_days: float | None = None) -> tuple[int, int]:
    """Remove files of the render memo and template bytecode: all with ``everything``, else
    those whose mtime is more than ``older_than_days`` old (a memo's mtime is its last use; a
    bytecode file's is when it was written, as Jinja does not touch it on reads). Nothing when
    both are unset. Both are rebuilt on demand. Returns ``(files, bytes)`` removed; files that
    another process removes or replaces meanwhile are skipped."""
    if not everything and older_than_days is None:
        return 0, 0
    root = root or config.cache_root()
    now = time.time()
    n = size = 0
    for _what, name in _AUX:
        for f, st in _files(root / name):
            if not (everything or (now - st.st_mtime) / 86400 > older_than_days):
                continue
            try:
                f.unlink()
            except OSError:
                continue
            n += 1
            size += st.st_size
    return n, size


# ---- doctor --------------------------------------------------------------------------------------

def _cmd_version(cmd: list[str], first: bool = False) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        lines = (out.stdout or out.stderr).strip().splitlines()
        return lines[0 if first else -1]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return "not found"


def doctor() -> list[tuple[str, str]]:
    """(item, value) lines describing this environment, for bug reports."""
    import torch
    rows: list[tuple[str, str]] = []
    rows.append(("dsagen", f"{__version__} ({Path(__file__).resolve().parent})"))
    rows.append(("python", f"{platform.python_version()} ({sys.executable})"))
    rows.append(("platform", platform.platform()))
    rows.append(("torch", f"{torch.__version__}, CUDA build {torch.version.cuda}"))
    nvcc = jit.find_nvcc()
    nv = jit.nvcc_version(nvcc) if nvcc else "not found"
    flag = ""
    if nvcc and torch.version.cuda and nv.split(".")[0] != torch.version.cuda.split(".")[0]:
        flag = f"  !! major version differs from torch's CUDA {torch.version.cuda}"
    rows.append(("nvcc", f"{nvcc or 'not found'} {nv}{flag}"))
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            rows.append((f"gpu {i}", f"{p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, "
                                     f"{p.total_memory / 2**30:.0f} GiB"))
    else:
        rows.append(("gpu", "none visible to torch (CUDA kernels are compiled, not run)"))
    ninja = shutil.which("ninja")
    rows.append(("ninja", f"{ninja or 'not found'} {_cmd_version([ninja, '--version']) if ninja else ''}"))
    cxx = os.environ.get("CXX") or shutil.which("c++") or "not found"
    rows.append(("c++", f"{cxx} ({_cmd_version([cxx, '--version'], first=True) if cxx != 'not found' else ''})"))
    try:
        rows.append(("cutlass headers", f"{jit.cutlass_include_dir()} (nvidia-cutlass {jit.cutlass_version()})"))
    except jit.BuildError as e:
        rows.append(("cutlass headers", str(e)))
    root = config.cache_root()
    es = entries(root)
    if root_is_a_file(root):
        rows.append(("cache root", f"{root} (NOT A FOLDER: a build will fail; set DSAGEN_CACHE_DIR to a folder)"))
    else:
        rows.append(("cache root", f"{root} ({'exists' if root.exists() else 'absent'}, "
                                   f"{'writable' if os.access(root if root.exists() else root.parent, os.W_OK) else 'read-only'})"))
    usable = len([e for e in es if e.status == 'ok'])
    rows.append(("cache", f"{usable} usable {'entry' if usable == 1 else 'entries'}, "
                          f"{sum(e.size for e in es) / 2**20:.1f} MiB, "
                          f"{len([e for e in es if e.status != 'ok'])} unusable"))
    rows.append(("lock dir", str(config.lock_dir())))
    env = config.settings()
    rows.append(("DSAGEN_* set", ", ".join(f"{k}={v}" for k, v in env.items()) or "none"))
    for problem in config.check():
        rows.append(("!! DSAGEN_*", problem))
    return rows
