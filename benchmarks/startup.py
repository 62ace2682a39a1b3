"""Start-up cost of dsagen (issue 6): cold build of each spec into an empty cache, then the
warm load in fresh processes (median of N), then `dsagen precompile` of all specs into another
empty cache. Prints a table and writes JSON.

    python benchmarks/startup.py specs/*.yaml [--runs 5] [--json out.json] [--no-precompile]
        [--arch sm_90a,sm_100a]

Each warm figure is one fresh process: `import torch`, `import dsagen`, the CUDA context
(when there is a GPU: a serving engine has one before it loads kernels; timed apart), then the
timed `dsagen.load(spec path)` (YAML parse, render memo lookup, cache check, library load).
`--profile` prints a cProfile of one warm load of the first spec.

The device (CUDA build or CPU-only) is whatever `dsagen.load` picks on this machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import os, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import dsagen
t2 = time.perf_counter()
if torch.cuda.is_available():   # a serving process has its CUDA context before it loads kernels
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
t3 = time.perf_counter()
if os.environ.get("STARTUP_PROFILE"):
    import cProfile, pstats
    prof = cProfile.Profile()
    prof.enable()
ops = dsagen.load(sys.argv[1])
t4 = time.perf_counter()
if os.environ.get("STARTUP_PROFILE"):
    prof.disable()
    pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
print("TIMES", t1 - t0, t2 - t1, t4 - t3, int(ops.has_cuda), int("jinja2" in sys.modules), t3 - t2)
"""


def child(spec: str, cache: str, profile: bool = False) -> tuple[float, float, float, bool, bool, float]:
    """(import torch s, import dsagen s, dsagen.load(spec path) s, CUDA build?, Jinja imported?,
    CUDA context creation s) of one fresh process. The load is timed after the CUDA context
    exists (as in a serving engine); the context's creation is reported apart."""
    env = dict(os.environ, DSAGEN_CACHE_DIR=cache)
    env.pop("DSAGEN_DISABLE_JIT", None)
    if profile:
        env["STARTUP_PROFILE"] = "1"
    r = subprocess.run([sys.executable, "-c", CHILD, spec], env=env, capture_output=True, text=True)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("TIMES")]
    if r.returncode or not line:
        raise SystemExit(f"{spec}: load failed\n{r.stderr[-3000:]}")
    if profile:
        print(r.stderr[-6000:], flush=True)
    _, t_torch, t_import, t_load, cuda, jinja, t_ctx = line[0].split()
    return float(t_torch), float(t_import), float(t_load), cuda == "1", jinja == "1", float(t_ctx)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("specs", nargs="+")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--no-precompile", action="store_true")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--profile", action="store_true", help="cProfile one warm load of the first spec")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.path.join(tmp, "cache")
        for spec in a.specs:
            t = time.perf_counter()
            _, _, cold_load, cuda, _, _ = child(spec, cache)
            cold_wall = time.perf_counter() - t
            warm = [child(spec, cache) for _ in range(a.runs)]
            if a.profile and spec == a.specs[0]:
                child(spec, cache, profile=True)
            row = {"spec": os.path.basename(spec).removesuffix(".yaml"), "cuda": cuda,
                   "cold_load_s": round(cold_load, 2), "cold_process_s": round(cold_wall, 2),
                   "warm_load_ms_median": round(1e3 * statistics.median(w[2] for w in warm), 1),
                   "warm_load_ms_all": [round(1e3 * w[2], 1) for w in warm],
                   "import_dsagen_ms_median": round(1e3 * statistics.median(w[1] for w in warm), 1),
                   "import_torch_ms_median": round(1e3 * statistics.median(w[0] for w in warm), 1),
                   "cuda_context_ms_median": round(1e3 * statistics.median(w[5] for w in warm), 1),
                   "warm_imports_jinja": any(w[4] for w in warm)}
            rows.append(row)
            print(f"{row['spec']:<30} cuda={int(cuda)} cold load {cold_load:7.1f} s   warm dsagen.load median "
                  f"{row['warm_load_ms_median']:6.1f} ms {row['warm_load_ms_all']}   (import dsagen "
                  f"{row['import_dsagen_ms_median']:.0f} ms, import torch {row['import_torch_ms_median']:.0f} ms, "
                  f"CUDA context {row['cuda_context_ms_median']:.0f} ms, not counted; Jinja imported: {row['warm_imports_jinja']})", flush=True)
        result = {"rows": rows}
        if not a.no_precompile:
            out = os.path.join(tmp, "pre")
            env = dict(os.environ)
            env.pop("DSAGEN_DISABLE_JIT", None)
            t = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "dsagen.cli", "precompile", *a.specs, "--arch", a.arch,
                                "--out", out], env=env, capture_output=True, text=True)
            result["precompile_s"] = round(time.perf_counter() - t, 1)
            result["precompile_rc"] = r.returncode
            print(f"precompile of {len(a.specs)} specs (--arch {a.arch}): {result['precompile_s']} s, "
                  f"exit {r.returncode}", flush=True)
            print(r.stdout[-2000:], r.stderr[-2000:])
    result["cpu_count"] = os.cpu_count()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
