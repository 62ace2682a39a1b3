"""Whether this tree's templates give the same device code as another git revision's
(development aid, no GPU needed): renders every shipped spec (and, with --variants, the
verification variants of benchmarks/variants.py) with both trees' dsagen and templates, compiles
each rendered .cu file to PTX with nvcc for each arch, and compares the PTX byte for byte after
normalizing the hashes nvcc derives from the source path (`_INTERNAL_xxxxxxxx`, `__N__xxxxxxxx`).
Identical PTX means identical SASS (ptxas is deterministic), so kernels measured on REV stay
measured. Exit status 0 when every file is identical, 1 otherwise.
Usage: python benchmarks/ptx_same.py REV [--arch compute_90a] [--arch compute_100a] [--variants] [-j N]"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HASHES = re.compile(rb"(_INTERNAL_|__N__)[0-9a-f]{8}")


def export_tree(rev: str, dest: Path) -> Path:
    """The dsagen package and templates of git revision ``rev`` under ``dest``."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "dsagen", "templates"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def render(tree: Path, specs: list[Path], out: Path) -> None:
    """``dsagen render`` of ``specs`` by the package in ``tree`` (its own templates) into ``out``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, "-m", "dsagen.cli", "render", *map(str, specs), "--out", str(out)],
                   cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)


def ptx(nvcc: str, flags: list[str], cu: Path, arch: str, include: str) -> bytes:
    out = cu.with_suffix(f".{arch}.ptx")
    r = subprocess.run([nvcc, *flags, f"-gencode=arch={arch},code={arch}", "-I", str(cu.parent), "-I", include,
                        "-ptx", str(cu), "-o", str(out)], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"nvcc failed on {cu}:\n{r.stderr[-2000:]}")
    return HASHES.sub(rb"\1HASH", out.read_bytes())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rev", help="git revision to compare against (e.g. HEAD~1)")
    ap.add_argument("--arch", action="append", help="virtual arch (default compute_90a and compute_100a)")
    ap.add_argument("--variants", action="store_true", help="also the benchmarks/variants.py variants")
    ap.add_argument("-j", type=int, default=os.cpu_count() or 2, help="parallel nvcc processes")
    a = ap.parse_args()
    archs = a.arch or ["compute_90a", "compute_100a"]

    sys.path.insert(0, str(ROOT))
    from dsagen.jit import NVCC_FLAGS, NVCC_STD, cutlass_include_dir, find_nvcc
    from dsagen.spec import shipped_spec_paths
    nvcc = find_nvcc()
    if not nvcc:
        print("nvcc not found (PATH, CUDA_HOME or /usr/local/cuda)", file=sys.stderr)
        return 2
    include = str(cutlass_include_dir())
    flags = NVCC_STD + NVCC_FLAGS

    with tempfile.TemporaryDirectory(prefix="ptx-same-") as tmp:
        tmp = Path(tmp)
        specs = [Path(p) for p in shipped_spec_paths()]
        if a.variants:
            vdir = tmp / "variants"
            subprocess.run([sys.executable, str(ROOT / "benchmarks" / "variants.py"), str(vdir)], cwd=ROOT,
                           check=True, stdout=subprocess.DEVNULL)
            specs += sorted(vdir.glob("*.yaml"))
        other = export_tree(a.rev, tmp / "other")
        render(ROOT, specs, tmp / "this_src")
        render(other, specs, tmp / "other_src")
        pairs = []
        for cu in sorted((tmp / "this_src").glob("*/*.cu")):
            twin = tmp / "other_src" / cu.parent.name / cu.name
            if not twin.exists():
                print(f"only in this tree: {cu.parent.name}/{cu.name}")
                continue
            pairs += [(cu, twin, arch) for arch in archs]
        print(f"{len(specs)} specs, {len(pairs)} (file, arch) pairs against {a.rev}", flush=True)
        differ = 0
        with cf.ThreadPoolExecutor(max(1, a.j)) as pool:
            jobs = [(cu, twin, arch, pool.submit(ptx, nvcc, flags, cu, arch, include),
                     pool.submit(ptx, nvcc, flags, twin, arch, include)) for cu, twin, arch in pairs]
            for cu, twin, arch, mine, theirs in jobs:
                same_src = cu.read_bytes() == twin.read_bytes()
                same = mine.result() == theirs.result()
                differ += not same
                if not same or not same_src:
                    print(f"{'same PTX ' if same else 'PTX DIFFERS'} {arch} {cu.parent.name}/{cu.name}"
                          f"{'' if same_src else ' (source changed)'}", flush=True)
        print(f"{len(pairs) - differ} identical, {differ} differ")
        return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
