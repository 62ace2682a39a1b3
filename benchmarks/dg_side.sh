#!/bin/bash
# DeepGEMM side by side on the device machine: `dsagen bench` of fp8_e4m3_page64 with a deep_gemm
# package on PYTHONPATH, so its rows carry DeepGEMM's time on the same inputs (or the error it gave).
#
# DG_DIR (default .whl/dg, carried with `carry: [".whl"]`) holds:
#   deep_gemm/   a deep_gemm Python package (for example the one inside the sgl-kernel wheel:
#                `pip download --no-deps sgl-kernel` then `unzip WHEEL 'deep_gemm/*' -d .whl/dg`)
#   lib/         shared libraries it needs that the machine lacks; sgl-kernel 0.3.21's build wants
#                libcudart.so.12 (from nvidia-cuda-runtime-cu12) and libnvrtc.so.12. DeepGEMM
#                compiles its kernels with nvcc by default, so a small stand-in libnvrtc.so.12
#                (the nine nvrtc* entry points returning an error) is enough to load it.
# DG_PATH (default DG_DIR) is what goes on PYTHONPATH as the deep_gemm provider. With
# DG_PATH=benchmarks/dg_harness the bench calls DeepGEMM's sm90 kernel from DG_DIR's headers through
# this repository's launcher (benchmarks/dg_harness/deep_gemm), for builds whose binary does not
# match the machine's torch.
# Usage (device): DSAGEN_BENCH_GIT=REV [DG_PATH=benchmarks/dg_harness] bash benchmarks/dg_side.sh; logs under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
DG_DIR=${DG_DIR:-$PWD/.whl/dg}
DG_PATH=$(realpath ${DG_PATH:-$DG_DIR})
export DG_INCLUDE=$DG_DIR/deep_gemm/include
export LD_LIBRARY_PATH=$DG_DIR/lib:${LD_LIBRARY_PATH:-} CUDA_HOME=/usr/local/cuda DG_JIT_CACHE_DIR=/tmp/dgcache
SPECS=specs/fp8_e4m3_page64.yaml bash benchmarks/gpu_run.sh prespecs > $OUT/pre.log 2>&1
export PYTHONPATH=/tmp/site:$PWD:$DG_PATH PYTHONUNBUFFERED=1 CXX=/usr/bin/g++ DSAGEN_CACHE_DIR=/tmp/dsagen-cache PATH=/usr/local/cuda/bin:$PATH
timeout 240 python3 - > $OUT/dg_probe.log 2>&1 <<'PY'
import time, traceback
import torch
try:
    import deep_gemm as dg
    print("imported", dg.__file__, "num_sms", dg.get_num_sms())
    print([n for n in dir(dg) if "mqa" in n])
    t0 = time.time()
    context_lens = torch.full((4,), 4096, dtype=torch.int32, device="cuda")
    meta = dg.get_paged_mqa_logits_metadata(context_lens, 64, dg.get_num_sms())
    print("metadata ok", tuple(meta.shape), f"{time.time() - t0:.1f} s")
except Exception:
    traceback.print_exc()
PY
cat $OUT/dg_probe.log
DSAGEN_BENCH_PARTIAL=$OUT/partial.json timeout ${BENCH_TIMEOUT:-420} python3 -m dsagen.cli bench specs/fp8_e4m3_page64.yaml --json $OUT/h200_dg.json > $OUT/bench_dg.log 2>&1
echo "bench rc $?"; tail -40 $OUT/bench_dg.log
