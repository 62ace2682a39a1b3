"""Timeline of one paged_logits_ws launch on the GPU: where a short call's time goes.

    python benchmarks/timeline.py SPEC 'json-tuning' BxCTX[xNEXT_N] ...   (default 32x8192x1 32x8192x2)
    python benchmarks/timeline.py --build-only SPEC ['json-tuning']      (build, do not run: no GPU needed)

Renders SPEC with the tuning, builds benchmarks/timeline.cu around the rendered
paged_logits.cu (and paged_logits_small.cu) with -DDSAGEN_TIMELINE (the template's
DSAGEN_MARK points record %globaltimer per CTA; the dsagen build never sets it), and runs it per
shape: CUDA-event time of a spin-hidden launch, then per mark the min / median / max over CTAs
of the time since the earliest CTA start, and whether the same SMs finish late in every run (env
TIMELINE_REPS: runs per shape, default 30). A development probe (sm_90a, specs with the ws kernel),
not a test.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import dsagen
from dsagen import codegen, jit


def main(argv: list[str]) -> int:
    build_only = bool(argv) and argv[0] == "--build-only"
    if build_only:
        argv = argv[1:]
    spec = dsagen.load_spec(argv[0])
    tuning = json.loads(argv[1]) if len(argv) > 1 else {}
    shapes = argv[2:] or ["32x8192x1", "32x8192x2"]
    out = Path(tempfile.mkdtemp(prefix="dsagen-timeline-"))
    for name, text in codegen.render(spec, tuning).items():
        (out / name).write_text(text)
    has_small = codegen.small_tuning(spec, tuning) is not None
    exe = out / "timeline"
    cmd = [jit.find_nvcc() or "nvcc", *jit.NVCC_STD, *jit.NVCC_FLAGS, jit.ARCH_GENCODE["sm_90a"],
           "-DDSAGEN_TIMELINE", f"-DDSAGEN_NS={codegen.namespace(spec, tuning)}",
           *(["-DDSAGEN_HAS_SMALL"] if has_small else []), f"-I{out}", f"-I{jit.cutlass_include_dir()}",
           str(Path(__file__).with_name("timeline.cu")), "-o", str(exe)]
    print("build:", " ".join(cmd[-3:]), flush=True)
    subprocess.run(cmd, check=True)
    if build_only:
        print("built", exe)
        return 0
    for shape in shapes:
        parts = [int(v) for v in shape.split("x")]
        b, ctx, nn = (parts + [1])[:3]
        print(f"\n== {spec.name} {json.dumps(tuning)} B={b} ctx={ctx} next_n={nn}", flush=True)
        subprocess.run([str(exe), str(b), str(ctx), str(nn), os.environ.get("TIMELINE_REPS", "30")], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
