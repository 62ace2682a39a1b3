"""Timeline of one paged_logits_ws launch on the GPU: where a short call's time goes.

    python benchmarks/timeline.py SPEC ['json-tuning'] [BxCTX[xNEXT_N] ...]   (default 32x8192x1 32x8192x2)
    python benchmarks/timeline.py --build-only SPEC ['json-tuning']          (build only: no GPU needed)

Renders SPEC with the tuning (default {}), builds benchmarks/timeline.cu around the rendered
paged_logits.cu (and paged_logits_small.cu) with -DDSAGEN_TIMELINE (the template's DSAGEN_MARK
points record %globaltimer and %smid per CTA; the dsagen build never sets it) and the JIT's
nvcc flags, and runs it per shape: CUDA-event time of a spin-hidden launch, then per mark the
min / median / max over CTAs of the time since the earliest CTA start, the SM clock while the
CTAs run (%clock64 over %globaltimer), the event time of the same launches back to back, and
whether the same SMs finish late in every run (env TIMELINE_REPS: runs per shape, default 30, at least 2;
env TIMELINE_NVCC_FLAGS: more nvcc flags, e.g. a probe's -D switch). The build
directory is printed and kept. A development probe (sm_90a, specs with the ws kernel), not a
test.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import dsagen
from dsagen import codegen, jit

SHAPE = re.compile(r"^(\d+)x(\d+)(?:x(\d+))?$")


def build(spec, tuning: dict) -> Path:
    """Render ``spec`` under ``tuning`` into a new temporary directory and build the probe there;
    returns the executable. CalledProcessError where nvcc fails."""
    out = Path(tempfile.mkdtemp(prefix="dsagen-timeline-"))
    for name, text in codegen.render(spec, tuning).items():
        (out / name).write_text(text)
    has_small = codegen.small_tuning(spec, tuning) is not None
    exe = out / "timeline"
    cmd = [jit.find_nvcc() or "nvcc", *jit.NVCC_STD, *jit.NVCC_FLAGS, jit.ARCH_GENCODE["sm_90a"],
           *jit.extra_nvcc_flags(), "-DDSAGEN_TIMELINE", f"-DDSAGEN_NS={codegen.namespace(spec, tuning)}",
           *(["-DDSAGEN_HAS_SMALL"] if has_small else []), f"-I{out}", f"-I{jit.cutlass_include_dir()}",
           *os.environ.get("TIMELINE_NVCC_FLAGS", "").split(),
           str(Path(__file__).with_name("timeline.cu")), "-o", str(exe)]
    print("build in", out, flush=True)
    subprocess.run(cmd, check=True)
    return exe


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-only", action="store_true", help="build the probe, do not run it")
    ap.add_argument("spec")
    ap.add_argument("rest", nargs="*", help="a JSON tuning (optional), then shapes BxCTX[xNEXT_N]")
    args = ap.parse_args(argv)
    rest = list(args.rest)
    try:
        tuning = json.loads(rest.pop(0)) if rest and rest[0].lstrip().startswith("{") else {}
    except ValueError as e:
        ap.error(f"the tuning is not JSON: {e}")
    if not isinstance(tuning, dict):
        ap.error(f"the tuning must be a JSON object, got {tuning!r}")
    shapes = []
    for s in rest or ["32x8192x1", "32x8192x2"]:
        m = SHAPE.match(s)
        if not m:
            ap.error(f"shape {s!r} is not BxCTX or BxCTXxNEXT_N")
        shapes.append((int(m[1]), int(m[2]), int(m[3] or 1)))
    reps = os.environ.get("TIMELINE_REPS", "30")
    if not reps.isdigit() or int(reps) < 2:
        ap.error(f"TIMELINE_REPS={reps!r}: must be an integer >= 2")
    spec = dsagen.load_spec(args.spec)
    exe = build(spec, tuning)
    if args.build_only:
        print("built", exe)
        return 0
    failed = 0
    for b, ctx, nn in shapes:
        print(f"\n== {spec.name} {json.dumps(tuning)} B={b} ctx={ctx} next_n={nn}", flush=True)
        failed += subprocess.run([str(exe), str(b), str(ctx), str(nn), reps]).returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
