"""Does the order of measurement move dsagen's ratio over DeepGEMM? (development aid)

`dsagen bench` times, per row: dsagen's call, dsagen's call from a schedule, the schedule, the
PyTorch fallback, then DeepGEMM: always in that order. At the shapes where the card runs at its
power cap the time of a series can depend on what ran before it. This script times dsagen's
scheduled call (A) and DeepGEMM's (B) on the same input sets (built as `dsagen bench` builds
them) three ways, with the bench's timer (spin-hidden launch, CUDA events, 10 warm-ups, median
of 100):
  * ROUNDS rounds of whole series, A then B in even rounds and B then A in odd ones;
  * AB_AFTER_FB times: the PyTorch fallback's series (as the bench runs it before DeepGEMM),
    then B then A in even repeats, A then B in odd ones;
  * per call alternating: each of 200 iterations times one A call then one B call (spin before
    each, B on another input set), medians of each;
and prints every series and the ratio B/A of each way.
Needs deep_gemm importable (benchmarks/dg_harness with DG_INCLUDE, as gpu_run.sh's dgbench).
Usage: python benchmarks/ab_dg.py   env: AB_SHAPES="32x2x8192,128x2x32768" (BxNEXT_NxCTX), AB_ROUNDS=6 AB_AFTER_FB=6
"""
import os
import statistics

import torch

import dsagen
from dsagen import bench as Bm
from dsagen import reference as R

SHAPES = [tuple(map(int, s.split("x"))) for s in
          os.environ.get("AB_SHAPES", "32x1x8192,32x2x8192,128x1x32768,128x2x32768").split(",")]
ROUNDS = int(os.environ.get("AB_ROUNDS", "6"))
AFTER_FB = int(os.environ.get("AB_AFTER_FB", "6"))
RUNS, WARMUP = 100, 10


def per_call(timer, fa, fb, n, iters, spin_us):
    """Alternate one A call and one B call per iteration, each after a spin, B on the input set
    half a rotation away from A's (so neither finds the other's keys in the L2); medians (us)."""
    spin = timer.cycles(spin_us)
    h = n // 2
    for i in range(WARMUP):
        fa(i % n), fb((i + h) % n)
    ev = [[torch.cuda.Event(enable_timing=True) for _ in range(4)] for _ in range(iters)]
    torch.cuda.synchronize()
    for i in range(iters):
        k = (WARMUP + i) % n
        torch.cuda._sleep(spin)
        ev[i][0].record(); fa(k); ev[i][1].record()
        torch.cuda._sleep(spin)
        ev[i][2].record(); fb((k + h) % n); ev[i][3].record()
    torch.cuda.synchronize()
    a = statistics.median(e[0].elapsed_time(e[1]) * 1e3 for e in ev)
    b = statistics.median(e[2].elapsed_time(e[3]) * 1e3 for e in ev)
    return a, b


def main():
    dg = Bm._deep_gemm()
    assert dg is not None, "deep_gemm is not importable"
    spec = dsagen.load_spec("specs/fp8_e4m3_page64.yaml")
    ops = dsagen.load(spec)
    timer = Bm.CudaTimer("spin")
    dev = torch.device("cuda")
    for B, nn, ctx in SHAPES:
        lens = [ctx] * B
        set_bytes = Bm._logits_set_bytes(spec, B, nn, lens)
        n = Bm.num_sets(set_bytes, Bm.L2_TARGET_BYTES, Bm.MIN_SETS, Bm.MAX_SETS)
        sets = [Bm.make_logits_inputs(spec, ops.store, lens, nn, 17 * i + 1, dev) for i in range(n)]
        max_len = sets[0]["max_context_len"]
        args = [(s["q"], s["kv_cache"], s["weights"], s["context_lens"], s["block_table"]) for s in sets]
        scheds = [ops.paged_logits_schedule(s["context_lens"], s["block_table"], nn, max_len) for s in sets]
        fa, _ = Bm._scheduled_calls(ops, args, [{}] * n, scheds, max_len)    # as the bench calls it
        fb, note, clean = Bm._deepgemm_caller(dg, sets, nn, max_len, dev)
        # dsagen's visible logits against DeepGEMM's (a sanity check, not a test)
        mask = torch.isfinite(fa(0))
        err = (fa(0)[mask].double() - fb(0)[mask].double()).abs().max().item()
        print(f"== B={B} next_n={nn} ctx={ctx}: {n} sets, DeepGEMM {note}, max |diff| {err:.3g}", flush=True)
        # whole series, A then B in even rounds and B then A in odd ones (the bench's paired rounds)
        seq = Bm.paired_times(timer, {"A": fa, "B": fb}, n, RUNS, WARMUP, None, ROUNDS)
        for r in range(ROUNDS):
            first, second = ("A", "B") if r % 2 == 0 else ("B", "A")
            print(f"  round {r}: {first} {seq[first][r]:7.2f}  {second} {seq[second][r]:7.2f}", flush=True)
        ab = [b / a for a, b in zip(seq["A"][0::2], seq["B"][0::2])]
        ba = [b / a for a, b in zip(seq["A"][1::2], seq["B"][1::2])]
        # the bench's sequential order: the PyTorch fallback (10 timed calls), then DeepGEMM, here
        # then A; and the same with A first (does the state the fallback leaves favour whichever
        # runs next?)
        for r in range(AFTER_FB):
            timer.time(lambda k: R.fallback_paged_logits(*args[k], max_len, spec), n, 10, 2)
            order = ("B", "A") if r % 2 == 0 else ("A", "B")
            got = {w: timer.time(fb if w == "B" else fa, n, RUNS, WARMUP).us for w in order}
            print(f"  after the fallback {r}: {order[0]} first: A {got['A']:7.2f}  B {got['B']:7.2f}"
                  f"  ratio {got['B'] / got['A']:.3f}", flush=True)
        spin_us = 5.0 + 1.5 * statistics.median(seq["A"])
        pa, pb = per_call(timer, fa, fb, n, 200, max(80.0, spin_us))   # outlasts DeepGEMM's host launch too
        print(f"  series A then B: ratio {' '.join(f'{x:.3f}' for x in ab)}; B then A: "
              f"{' '.join(f'{x:.3f}' for x in ba)}; medians A {statistics.median(seq['A']):.2f} "
              f"B {statistics.median(seq['B']):.2f} ratio {statistics.median(seq['B']) / statistics.median(seq['A']):.3f}")
        print(f"  per call alternating: A {pa:.2f} B {pb:.2f} ratio {pb / pa:.3f}", flush=True)
        del sets, args, scheds
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
