"""Spin-hidden eager launch against CUDA-graph replay, per kernel (fifty-third session).

`dsagen bench` under DSAGEN_BENCH_METHOD=graph read dsagen's paged logits about 0.5 us faster at
B=32 ctx 8192 than the spin timing, and DeepGEMM's 0.2-0.3 us slower (H100). This probe times,
in one process and in interleaved rounds, each of: an empty kernel (``torch.cuda._sleep(0)``),
dsagen's scheduled paged-logits call, the same without a schedule, and DeepGEMM's
``fp8_paged_mqa_logits`` (when ``import deep_gemm`` works), each by ``dsagen.bench.CudaTimer``
"spin" and "graph", on the bench's input sets (rotated over more than the L2).

With PROBE_SEQ (a comma list of name:method, e.g. "empty:spin,dsagen_sched:spin,dsagen_sched:spin")
it runs that sequence of series ROUNDS times instead and prints every series' median, to see what a
series' time depends on (the series before it). "dsagen_noevict" is the scheduled call of a build
with tuning ``{"kv_evict_first": false}`` (key copies without the L2 evict-first hint).

Usage (on the GPU machine): python3 benchmarks/graph_probe.py [ROUNDS]
Environment: PROBE_SHAPES="32x8192" (BxCTX, comma list), PROBE_NEXT_N="1,2", PROBE_SEQ.
"""
import os
import statistics
import sys

import torch

import dsagen
import dsagen.bench as Bn


def main(rounds: int) -> None:
    dev = torch.device("cuda")
    spec = dsagen.load_spec(os.path.join(os.path.dirname(__file__), "..", "specs", "fp8_e4m3_page64.yaml"))
    ops = dsagen.load(spec)
    seq = [tuple(x.split(":")) for x in os.environ.get("PROBE_SEQ", "").split(",") if x]
    noevict = dsagen.load(spec, tuning={"kv_evict_first": False}) if any(n == "dsagen_noevict" for n, _ in seq) else None
    try:
        import deep_gemm as dg
    except Exception as e:  # noqa: BLE001
        dg = None
        print("no deep_gemm:", type(e).__name__, e)
    timers = {"spin": Bn.CudaTimer("spin"), "graph": Bn.CudaTimer("graph")}
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "rounds", rounds, flush=True)
    shapes = [tuple(map(int, s.split("x"))) for s in os.environ.get("PROBE_SHAPES", "32x8192").split(",")]
    for B, ctx in shapes:
        for nn in map(int, os.environ.get("PROBE_NEXT_N", "1,2").split(",")):
            lens = [ctx] * B
            set_bytes = Bn._logits_set_bytes(spec, B, nn, lens)
            n = Bn.num_sets(set_bytes)          # (at least MIN_SETS)
            sets = [Bn.make_logits_inputs(spec, ops.store, lens, nn, 17 * i + 1, dev) for i in range(n)]
            max_len = sets[0]["max_context_len"]
            args = [(s["q"], s["kv_cache"], s["weights"], s["context_lens"], s["block_table"]) for s in sets]
            scheds = [ops.paged_logits_schedule(s["context_lens"], s["block_table"], nn, max_len) for s in sets]
            skw = [{}] * n                     # (fp8_e4m3_page64 has no separate scales)
            fns = {
                "empty": lambda k: torch.cuda._sleep(0),
                "dsagen_sched": Bn._scheduled_calls(ops, args, skw, scheds, max_len)[0],
                "dsagen_own": lambda k: ops.paged_logits(*args[k], max_len, True),
            }
            if noevict is not None:
                fns["dsagen_noevict"] = Bn._scheduled_calls(noevict, args, skw, scheds, max_len)[0]
            if dg is not None:
                fns["deepgemm"] = Bn._deepgemm_caller(dg, sets, nn, max_len, dev)[0]
            if seq:
                print(f"B={B} ctx={ctx} next_n={nn} sets={n}: the sequence, median us of each series", flush=True)
                for r in range(rounds):
                    ts = [timers[m].time(fns[name], n, 100, 10).us for name, m in seq]
                    print(f"  round {r}: " + "  ".join(f"{name}:{m} {t:.2f}" for (name, m), t in zip(seq, ts)),
                          flush=True)
                continue
            res: dict[tuple[str, str], list[float]] = {}
            for r in range(rounds):
                names = list(fns) if r % 2 == 0 else list(reversed(fns))
                for name in names:
                    for m in (("spin", "graph") if r % 2 == 0 else ("graph", "spin")):
                        t = timers[m].time(fns[name], n, 100, 10)
                        res.setdefault((name, m), []).append(t.us)
            print(f"B={B} ctx={ctx} next_n={nn} sets={n}: median over {rounds} rounds, us (spin / graph / diff)")
            for name in fns:
                s, g = statistics.median(res[(name, "spin")]), statistics.median(res[(name, "graph")])
                print(f"  {name:13s} {s:8.2f} {g:8.2f} {g - s:+7.2f}   spin rounds "
                      + " ".join(f"{x:.2f}" for x in res[(name, "spin")]) + "   graph rounds "
                      + " ".join(f"{x:.2f}" for x in res[(name, "graph")]), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
