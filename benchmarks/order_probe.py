"""Does a short paged-logits row read slower right after a long one? (forty-fourth session)

Runs ``dsagen.bench.run`` on fp8_e4m3_page64 over a shape list in which B=32 ctx 8192 rows come
after short rows and after long ones (B=128 ctx 65536, the mixed batch), with DeepGEMM side by
side when ``import deep_gemm`` works (``gpu_run.sh``'s ``dgbench`` environment), and prints the
sequential and paired figures of each row.

Usage (on the GPU machine): python3 benchmarks/order_probe.py OUT.json
Environment: ORDER "a" (default) or "b" (the two shape lists below); WARMUP (untimed calls per
series, default 10); DSAGEN_BENCH_SETTLE (seconds idle before each row; this probe's default 0,
the state before the bench had a pause: the H100 measurements of RESULTS.md used 0 and 2).
"""
import json
import os
import sys

os.environ.setdefault("DSAGEN_BENCH_SETTLE", "0")

import dsagen  # noqa: E402
import dsagen.bench as Bn  # noqa: E402

W = int(os.environ.get("WARMUP", "10"))
_init = Bn.Bench.__init__


def _init_warmup(self, *a, **k):
    k["warmup"] = W
    _init(self, *a, **k)


Bn.Bench.__init__ = _init_warmup


def S(nn, ctx, B=32):
    return {"op": "paged_logits", "B": B, "next_n": nn, "ctx": ctx}


ORDERS = {
    "a": [S(1, 8192), S(2, 8192), S(2, 8192), S(1, "mixed", 128), S(2, 8192), S(1, 8192)],
    "b": [S(1, 65536, 128), S(2, 8192), S(1, "mixed", 128), S(2, 8192), S(2, 8192), S(2, "mixed", 128),
          S(2, 8192)],
}

if __name__ == "__main__":
    order = os.environ.get("ORDER", "a")
    print("warmup", W, "settle", os.environ["DSAGEN_BENCH_SETTLE"], "order", order)
    spec = dsagen.load_spec(os.path.join(os.path.dirname(__file__), "..", "specs", "fp8_e4m3_page64.yaml"))
    rows = Bn.run([spec], shapes=ORDERS[order])
    for r in rows[1:]:
        print(r.get("B"), r.get("next_n"), r.get("ctx"), "us", r.get("us"), "sched", r.get("us_scheduled"),
              "dg", r.get("deepgemm_us"), "x_dg_s", r.get("speedup_vs_deepgemm_scheduled"),
              "x_dg_p", r.get("speedup_vs_deepgemm_paired"), r.get("error") or "")
    json.dump(rows, open(sys.argv[1], "w"), indent=1)
