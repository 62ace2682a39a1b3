#!/bin/bash
# One device call: install, build + verify both shipped specs on the GPU, GPU tests, timing.
# Usage on the device machine: bash benchmarks/gpu_run.sh [steps...]
# .whl (git-ignored, carried to the device, which reaches no registry) is made here:
#   pip download --no-deps nvidia-cutlass==4.2.0.0 -d .whl
#   and for abdg, or dgbench with DG_PATH=benchmarks/dg_harness: pip download --no-deps sgl-kernel==0.3.21 -d /tmp/sk &&
#   unzip /tmp/sk/sgl_kernel-*.whl 'deep_gemm/include/*' -d .whl/dg
#   steps: dgbench (DG_DIR, DG_PATH, DG_SPECS, BENCH_TIMEOUT) abdg (AB_SHAPES, AB_ROUNDS, AB_TIMEOUT) precompile compile (SPECS, default all; COMPILE_ARGS) variants (VARIANT_SPECS) tests gputests quick bench benchall
#          orderprobe (DG_PATH, PROBE_TIMEOUT) graphprobe (DG_PATH, PROBE_ROUNDS, PROBE_SHAPES, PROBE_NEXT_N) doctor startup compat recall launchprobe storeprobe (PROBE_N, PROBE_TIMEOUT) storetime (STORE_SPECS, STORE_TUNINGS: quoted JSON tunings) dataprobe (PROBE_SHAPES) powerprobe (POWER_SHAPE) timeline (TIMELINE_SHAPES) mma (MMA_SPECS, MMA_TUNINGS, MMA_TEST_TIMEOUT, MMA_TIMEOUT) treeab (TREE_REV, TREE_SPECS, TREE_TIMEOUT); gputests takes GPUTEST_ARGS / GPUTEST_TIMEOUT / GPUTEST_RANGE (a sed range of the collected tests, e.g. 1,90); TUNE_FP8 / TUNE_BF16: quoted JSON tunings for benchmarks/tune.py
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CXX=/usr/bin/g++ DSAGEN_CACHE_DIR=/tmp/dsagen-cache
export PATH=/usr/local/cuda/bin:$PATH
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || true
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $OUT/gpu.txt
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a $OUT/gpu.txt
# the card's short name (h200, h100, ...) names the bench outputs, so an H100 run is not filed as h200
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oiE '\b[a-z]{1,2}[0-9]{2,3}\b' | head -1 | tr 'A-Z' 'a-z')
CARD=${CARD:-gpu}
steps=${@:-compile quick}
# the environment of a deep_gemm provider (dgbench, abdg): headers and libraries from DG_DIR
# (default .whl/dg), the provider's package directory ($1) on PYTHONPATH
dg_env() {
  local dg_dir=${DG_DIR:-$PWD/.whl/dg}
  export DG_INCLUDE=$dg_dir/deep_gemm/include PYTHONPATH=$PYTHONPATH:$(realpath $1) \
         LD_LIBRARY_PATH=$dg_dir/lib:${LD_LIBRARY_PATH:-} CUDA_HOME=/usr/local/cuda DG_JIT_CACHE_DIR=/tmp/dgcache
}
for s in $steps; do
  case $s in
    precompile) python3 benchmarks/variants.py /tmp/variants ${VARIANT_SPECS:-} > $OUT/variants.txt
      t0=$SECONDS; python3 -m dsagen.cli precompile ${SPECS:-specs/*.yaml} --arch sm_90a -j 16 2>&1 | tee $OUT/precompile.log
      echo "precompile of the shipped specs: wall $((SECONDS-t0)) s" | tee -a $OUT/precompile.log
      t0=$SECONDS; python3 -m dsagen.cli precompile /tmp/variants/*.yaml --arch sm_90a -j 16 >> $OUT/precompile.log 2>&1
      echo "precompile of the variants: exit $? wall $((SECONDS-t0)) s" | tee -a $OUT/precompile.log ;;
    prespecs) python3 -m dsagen.cli precompile ${SPECS:-specs/*.yaml} --arch sm_90a -j 16 2>&1 | tail -3 | tee $OUT/precompile.log ;;
    variants) [ -d /tmp/variants ] || python3 benchmarks/variants.py /tmp/variants ${VARIANT_SPECS:-} > $OUT/variants.txt
      python3 -m dsagen.cli compile /tmp/variants/*.yaml --no-nvcc --json $OUT/variants.json > $OUT/variants.log 2>&1
      echo "variants exit $?"; grep -E "PASSED|FAILED|FAIL " $OUT/variants.log | tail -60 ;;
    compile) python3 -m dsagen.cli compile ${SPECS:-specs/*.yaml} ${COMPILE_ARGS:-} --json $OUT/compile.json 2>&1 | tee $OUT/compile.log ;;
    doctor) python3 -m dsagen.cli doctor 2>&1 | tee $OUT/doctor.log ;;
    startup) python3 benchmarks/startup.py ${SPECS:-specs/*.yaml} --runs ${STARTUP_RUNS:-5} ${STARTUP_ARGS:-} --json $OUT/startup.json 2>&1 | tee $OUT/startup.log ;;
    benchall) DSAGEN_BENCH_PARTIAL=$OUT/${CARD}_partial.json python3 -m dsagen.cli bench ${SPECS:-specs/*.yaml} --json $OUT/${CARD}.json 2>&1 | tee $OUT/bench.log ;;
    compat) timeout ${COMPAT_TIMEOUT:-300} python3 -m pytest -q -rs tests/test_compat.py 2>&1 | tee $OUT/compat.log ;;
    recall) timeout ${RECALL_TIMEOUT:-400} python3 -m dsagen.cli recall specs/fp8_e4m3_page64.yaml specs/bf16_page64.yaml \
              --device cuda --out $OUT/recall 2>&1 | tee $OUT/recall.log ;;
    tests) python3 -m pytest -q tests 2>&1 | tee $OUT/tests.log ;;
    gputests) if [ -n "${GPUTEST_RANGE:-}" ]; then
        # a slice of the collected GPU tests (sed addresses, e.g. 1,90 then 91,$), for a suite
        # that a fresh machine's builds make longer than one call; the ids go to $OUT/gpu_test_ids.txt
        eval python3 -m pytest -q -m gpu --collect-only ${GPUTEST_ARGS:-tests/} 2>/dev/null | grep '::' > $OUT/gpu_test_ids.txt
        echo "GPU tests $GPUTEST_RANGE of $(wc -l < $OUT/gpu_test_ids.txt)" | tee $OUT/tests_gpu.log
        sed -n "${GPUTEST_RANGE}p" $OUT/gpu_test_ids.txt | tr '\n' '\0' \
          | xargs -0 -r timeout ${GPUTEST_TIMEOUT:-550} python3 -m pytest -q -rs -p no:cacheprovider 2>&1 | tee -a $OUT/tests_gpu.log
      else eval timeout ${GPUTEST_TIMEOUT:-550} python3 -m pytest -q -rs -m gpu ${GPUTEST_ARGS:-tests/} 2>&1 | tee $OUT/tests_gpu.log; fi ;;
    overhead) (cd benchmarks && eval python3 overhead.py ../specs/fp8_e4m3_page64.yaml ${OVERHEAD_TUNINGS:-}) 2>&1 | tee $OUT/overhead.log ;;
    gpustore) python3 -m pytest -q -rs -m gpu tests/ -k "store" 2>&1 | tee $OUT/tests_gpu_store.log ;;
    storeprobe) (cd benchmarks && timeout ${PROBE_TIMEOUT:-200} python3 store_probe.py ${PROBE_N:-}) 2>&1 | tee $OUT/store_probe.log ;;
    storetime) tn=${STORE_TUNINGS:-"'{}'"}
      for sp in ${STORE_SPECS:-specs/fp8_e4m3_page64.yaml}; do
        (cd benchmarks && eval "timeout ${PROBE_TIMEOUT:-300} python3 store_time.py ../$sp $tn") 2>&1 | tee $OUT/store_time_$(basename $sp .yaml).log
      done ;;
    dataprobe) (cd benchmarks && timeout ${PROBE_TIMEOUT:-200} python3 data_probe.py ${PROBE_SHAPES:-}) 2>&1 | tee $OUT/data_probe.log ;;
    powerprobe) (cd benchmarks && timeout ${PROBE_TIMEOUT:-200} python3 power_probe.py ${POWER_SHAPE:-}) 2>&1 | tee $OUT/power_probe.log ;;
    launchprobe) (cd benchmarks && timeout 200 python3 launch_probe.py) 2>&1 | tee $OUT/launch_probe.log ;;
    timeline) timeout 300 python3 benchmarks/timeline.py specs/fp8_e4m3_page64.yaml ${TIMELINE_SHAPES:-32x8192 128x32768x2} 2>&1 | tee $OUT/timeline.log ;;
    treeab) # benchmarks/tree_ab.py: this tree's paged-logits kernels against git revision TREE_REV's
      # templates (default HEAD~1), bit for bit then timed, for each of TREE_SPECS (default fp8_e4m3_page64)
      rm -rf /tmp/tree_ab_other && mkdir -p /tmp/tree_ab_other && git archive ${TREE_REV:-HEAD~1} templates | tar -x -C /tmp/tree_ab_other
      for sp in ${TREE_SPECS:-specs/fp8_e4m3_page64.yaml}; do
        (cd benchmarks && timeout ${TREE_TIMEOUT:-250} python3 tree_ab.py ../$sp /tmp/tree_ab_other) 2>&1 | tee $OUT/tree_ab_$(basename $sp .yaml).log
      done ;;
    mma) # the portable path (what sm_100a runs): its GPU tests on every shipped spec (the tensor-core
      # kernel paged_logits_mma, the default, and the CUDA-core kernel), then timed against the default
      # sm_90a kernel (MMA_SPECS; MMA_TUNINGS adds tunings, e.g. "'{\"kernel\": \"simt\", \"portable\": \"simt\"}'")
      timeout ${MMA_TEST_TIMEOUT:-450} python3 -m pytest -q -rs -m gpu tests/test_gpu.py -k portable_kernels 2>&1 | tee $OUT/tests_gpu_mma.log
      for sp in ${MMA_SPECS:-specs/fp8_e4m3_page64.yaml specs/bf16_page64.yaml}; do
        (cd benchmarks && eval "timeout ${MMA_TIMEOUT:-240} python3 paged_time.py ../$sp '{}' '{\"kernel\": \"simt\"}' ${MMA_TUNINGS:-}") \
           2>&1 | tee $OUT/paged_mma_$(basename $sp .yaml).log
      done ;;
    quick) python3 benchmarks/quick_time.py specs/fp8_e4m3_page64.yaml specs/bf16_page64.yaml 2>&1 | tee $OUT/quick.log ;;
    abdg) # benchmarks/ab_dg.py: dsagen vs DeepGEMM's sm90 kernel in both orders (AB_SHAPES, AB_ROUNDS)
      ( dg_env benchmarks/dg_harness
        timeout ${AB_TIMEOUT:-300} python3 benchmarks/ab_dg.py 2>&1 | tee $OUT/ab_dg.log ) ;;
    dgbench) # DeepGEMM side by side: dsagen bench of DG_SPECS (default fp8_e4m3_page64 and bf16_page64: one
      # run with every figure of h200.json; written to $OUT/${CARD}_dg.json, e.g. h100_dg.json on an
      # H100) with a deep_gemm provider on PYTHONPATH.
      # DG_DIR (default .whl/dg, carried with .whl) holds deep_gemm/ (e.g. unzipped from the sgl-kernel wheel)
      # and lib/ (libraries it lacks: libcudart.so.12, a stand-in libnvrtc.so.12). DG_PATH (default DG_DIR)
      # goes on PYTHONPATH; DG_PATH=benchmarks/dg_harness runs DeepGEMM's sm90 kernel from DG_DIR's headers
      # through benchmarks/dg_harness/deep_gemm, for builds whose binary does not match this torch.
      ( dg_env ${DG_PATH:-${DG_DIR:-$PWD/.whl/dg}}
        timeout 240 python3 -c "import deep_gemm as dg, torch; cl = torch.full((4,), 4096, dtype=torch.int32, device='cuda'); \
print(dg.__file__, dg.get_num_sms(), tuple(dg.get_paged_mqa_logits_metadata(cl, 64, dg.get_num_sms()).shape))" 2>&1 | tee $OUT/dg_probe.log
        DSAGEN_BENCH_PARTIAL=$OUT/${CARD}_partial.json timeout ${BENCH_TIMEOUT:-420} python3 -m dsagen.cli bench \
          ${DG_SPECS:-specs/fp8_e4m3_page64.yaml specs/bf16_page64.yaml} --json $OUT/${CARD}_dg.json > $OUT/bench_dg.log 2>&1; echo "bench rc $?"; tail -40 $OUT/bench_dg.log ) ;;
    orderprobe) # benchmarks/order_probe.py (a short row after long ones) with DeepGEMM, ORDER a and b,
      # without and with the bench's pause (DSAGEN_BENCH_SETTLE 0, then 2)
      ( dg_env ${DG_PATH:-benchmarks/dg_harness}
        for o in a b; do for st in 0 2; do
          ORDER=$o DSAGEN_BENCH_SETTLE=$st timeout ${PROBE_TIMEOUT:-200} python3 benchmarks/order_probe.py $OUT/order_${o}_settle$st.json 2>&1 \
            | grep -E "^warmup|^32 |^128 " | tee $OUT/order_${o}_settle$st.log
        done; done ) ;;
    graphprobe) # benchmarks/graph_probe.py: spin-hidden eager launch against CUDA-graph replay, per kernel
      ( dg_env ${DG_PATH:-benchmarks/dg_harness}
        timeout ${PROBE_TIMEOUT:-300} python3 benchmarks/graph_probe.py ${PROBE_ROUNDS:-4} 2>&1 | tee $OUT/graph_probe.log ) ;;
    bench) DSAGEN_BENCH_PARTIAL=$OUT/${CARD}_partial.json python3 -m dsagen.cli bench specs/fp8_e4m3_page64.yaml specs/bf16_page64.yaml --json $OUT/${CARD}.json 2>&1 | tee $OUT/bench.log ;;
  esac
done
if [ -n "${TUNE_FP8:-}" ]; then
  (cd benchmarks && eval timeout ${TUNE_TIMEOUT:-300} python3 tune.py ../specs/fp8_e4m3_page64.yaml $TUNE_FP8) 2>&1 | tee $OUT/tune_fp8.log
fi
if [ -n "${TUNE_BF16:-}" ]; then
  (cd benchmarks && eval timeout ${TUNE_TIMEOUT:-300} python3 tune.py ../specs/bf16_page64.yaml $TUNE_BF16) 2>&1 | tee $OUT/tune_bf16.log
fi
# PAGED_FP8 / PAGED_BF16: quoted JSON tunings for benchmarks/paged_time.py (interleaved paged-logits timing)
if [ -n "${PAGED_FP8:-}" ]; then
  (cd benchmarks && eval timeout ${TUNE_TIMEOUT:-300} python3 paged_time.py ../specs/fp8_e4m3_page64.yaml $PAGED_FP8) 2>&1 | tee $OUT/paged_fp8.log
fi
if [ -n "${PAGED_BF16:-}" ]; then
  (cd benchmarks && eval timeout ${TUNE_TIMEOUT:-300} python3 paged_time.py ../specs/bf16_page64.yaml $PAGED_BF16) 2>&1 | tee $OUT/paged_bf16.log
fi
# STORE_FP8 / STORE_BF16: quoted JSON tunings for benchmarks/store_time.py (interleaved store timing)
if [ -n "${STORE_FP8:-}" ]; then
  (cd benchmarks && eval timeout ${TUNE_TIMEOUT:-300} python3 store_time.py ../specs/fp8_e4m3_page64.yaml $STORE_FP8) 2>&1 | tee $OUT/store_fp8.log
fi
if [ -n "${STORE_BF16:-}" ]; then
  (cd benchmarks && eval timeout ${TUNE_TIMEOUT:-300} python3 store_time.py ../specs/bf16_page64.yaml $STORE_BF16) 2>&1 | tee $OUT/store_bf16.log
fi
if [ -n "${PROFILE:-}" ]; then
  NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
  for p in $PROFILE; do
    IFS=: read sp b n c <<< "$p"
    $NCU --clock-control none --kernel-name regex:paged_logits_ws --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats --section ComputeWorkloadAnalysis ${NCU_SECTIONS:-} \
      --print-details all -f -o /tmp/ncu_${sp}_${n} \
      python3 benchmarks/profile_one.py specs/$sp.yaml $b $n $c ${PROFILE_TUNING:-} 2>&1 | grep -v "^==PROF==" | tee -a $OUT/ncu.log
    $NCU --import /tmp/ncu_${sp}_${n}.ncu-rep --print-details all 2>&1 | tee -a $OUT/ncu.log
    # per-SASS-instruction stall samples (with NCU_SECTIONS="--section SourceCounters")
    [ -n "${NCU_SOURCE:-}" ] && $NCU --import /tmp/ncu_${sp}_${n}.ncu-rep --page source --csv --print-source sass > $OUT/ncu_source_${sp}_$n.csv 2>&1
  done
fi
