"""CPU checks of the pure parts of ``dsagen bench`` (shapes, byte counts, inputs, table, rows).

The GPU timing itself needs a CUDA device; here :class:`dsagen.bench.Bench` runs with a host timer
and ops backed by the PyTorch reference.
"""
import json

import pytest
import torch

from dsagen import bench as Bn
from dsagen import reference as R
from dsagen.spec import Spec, load_spec, shipped_spec_paths

from conftest import VARIANTS

SPECS = {p.stem: load_spec(p) for p in shipped_spec_paths()}
FP8 = SPECS["fp8_e4m3_page64"]
BF16 = SPECS["bf16_page64"]
# scales in their own tensor (kv_scales): no shipped spec has them
SEP = Spec.from_dict(VARIANTS["fp8_separate_page32"])
WITH_SEP = {**SPECS, SEP.name: SEP}


class RefOps:
    """Stand-in for ``dsagen.load(spec)``: the reference implementations."""

    def __init__(self, spec):
        self.spec = spec

    def store(self, k, kv_cache, loc, kv_scales=None):
        R.store(k, kv_cache, loc, self.spec, kv_scales=kv_scales)

    def paged_logits(self, q, kv_cache, weights, context_lens, block_table, max_context_len,
                     clean_logits=True, kv_scales=None):
        return R.paged_logits(q, kv_cache, weights, context_lens, block_table, max_context_len,
                              clean_logits, self.spec, kv_scales=kv_scales)

    def ragged_logits(self, q, k, k_scale, weights, ks, ke, clean_logits=True):
        return R.ragged_logits(q, k, k_scale, weights, ks, ke, clean_logits, self.spec)


def test_default_shapes():
    full = Bn.default_shapes(FP8)
    logits = [s for s in full if s.op == "paged_logits"]
    stores = [s for s in full if s.op == "store"]
    ragged = [s for s in full if s.op == "ragged_logits"]
    assert {(s.B, s.ctx) for s in ragged} == {(4096, 4096), (2048, 16384)}
    assert len(logits) == 2 * (2 * 3 + 1)
    assert {(s.B, s.next_n, s.ctx) for s in logits} >= {(32, 1, 8192), (128, 2, 65536), (128, 1, "mixed")}
    assert [(s.N, s.slots) for s in stores] == [(1, None), (128, None), (16384, None), (65536, None),
                                                (65536, "pages")]
    assert stores[-1].label() == "store N=65536 pages"
    with pytest.raises(ValueError, match="slots"):
        Bn.Shape("store", N=4, slots="sorted")
    with pytest.raises(ValueError, match="slots"):
        Bn.Shape("paged_logits", B=1, next_n=1, ctx=8, slots="pages")
    assert Bn.Shape("store", N=8, slots="random") == Bn.Shape("store", N=8)
    page1 = Bn.default_shapes(FP8.with_(page_size=1))      # whole pages = random slots there
    assert [s.N for s in page1 if s.op == "store"] == [1, 128, 16384, 65536]
    only1 = Bn.default_shapes(FP8.with_(next_n=[1]))
    assert all(s.next_n in (None, 1) for s in only1)
    # a spec with neither next_n 1 nor 2 is timed at its smallest next_n (not left without rows)
    only34 = [s for s in Bn.default_shapes(FP8.with_(next_n=[3, 4])) if s.op == "paged_logits"]
    assert len(only34) == 2 * 3 + 1 and {s.next_n for s in only34} == {3}
    quick = Bn.default_shapes(FP8, quick=True)
    assert [(s.op, s.B, s.next_n, s.ctx, s.N) for s in quick] == [
        ("paged_logits", 32, 1, 8192, None), ("store", None, None, None, 128),
        ("store", None, None, None, 65536)]
    assert Bn.default_shapes(FP8.with_(next_n=[2]), quick=True)[0].next_n == 2


def test_mixed_context_lens_are_seeded():
    s = Bn.Shape("paged_logits", B=128, next_n=1, ctx="mixed")
    a, b = Bn.context_lens_for(s), Bn.context_lens_for(s)
    assert a == b and len(a) == 128
    assert 1 <= min(a) and max(a) <= 65536 and len(set(a)) > 100
    assert Bn.context_lens_for(Bn.Shape("paged_logits", B=3, next_n=1, ctx=100)) == [100] * 3


def test_byte_counts():
    # fp8 page-tail: 132 B/token; q e4m3 (1 B), weights and logits fp32
    assert FP8.bytes_per_token == 132 and BF16.bytes_per_token == 256
    B, nn, ctx = 32, 1, 8192
    want = B * ctx * 132 + B * nn * 64 * 128 * 1 + B * nn * 64 * 4 + B * nn * ctx * 4
    assert Bn.paged_logits_bytes(FP8, B, nn, B * ctx, ctx) == want == 35_921_920
    # bf16: q is bf16 (2 B)
    B, nn, ctx = 128, 2, 65536
    want = B * ctx * 256 + B * nn * 64 * 128 * 2 + B * nn * 64 * 4 + B * nn * ctx * 4
    assert Bn.paged_logits_bytes(BF16, B, nn, B * ctx, ctx) == want
    # mixed: keys by the sum of lengths, logits by the max
    assert Bn.paged_logits_bytes(FP8, 2, 1, 100 + 7, 100) == 107 * 132 + 2 * 64 * 128 + 2 * 64 * 4 + 2 * 100 * 4
    assert Bn.store_bytes(FP8, 128) == 128 * 256 + 128 * 132 + 128 * 8
    assert Bn.store_bytes(BF16, 1) == 256 + 256 + 8


def test_num_sets_and_fallback_estimate():
    assert Bn.num_sets(10**9) == 4
    assert Bn.num_sets(35_000_000) == 8                     # 8 * 35 MB > 256 MB
    assert Bn.num_sets(1000) == Bn.MAX_SETS
    assert Bn.num_sets(35_000_000) * 35_000_000 > Bn.L2_TARGET_BYTES
    # the largest default shape's fallback still fits the 40 GB cap (so it is timed)
    for spec in (FP8, BF16):
        est = Bn.fallback_peak_bytes(spec, 128, 2, 65536)
        assert 10e9 < est < Bn.FALLBACK_MAX_BYTES


def test_deepgemm_applies():
    assert Bn.deepgemm_applies(FP8)
    assert not Bn.deepgemm_applies(BF16)
    assert not Bn.deepgemm_applies(FP8.with_(scale_placement="interleaved"))
    assert not Bn.deepgemm_applies(FP8.with_(page_size=32))


@pytest.mark.parametrize("name", sorted(WITH_SEP))
def test_make_logits_inputs_cpu(name):
    spec = WITH_SEP[name]
    lens = [100, 1, 64, 300]
    inp = Bn.make_logits_inputs(spec, RefOps(spec).store, lens, 2, seed=5, device="cpu",
                                chunk_tokens=100)
    B = len(lens)
    assert inp["q"].shape == (B, 2, spec.num_heads, spec.head_dim)
    assert inp["q"].dtype == spec.query.torch_dtype
    assert inp["weights"].shape == (B * 2, spec.num_heads) and inp["weights"].dtype == torch.float32
    assert inp["context_lens"].dtype == torch.int32 and inp["context_lens"].tolist() == lens
    bt = inp["block_table"]
    assert bt.dtype == torch.int32 and bt.shape[0] == B and bt.shape[1] % 32 == 0
    pages = [max(1, -(-c // spec.page_size)) for c in lens]
    used = torch.cat([bt[b, :n] for b, n in enumerate(pages)])
    assert sorted(used.tolist()) == list(range(sum(pages)))      # a permutation of the pages
    assert int(bt.min()) >= 0 and int(bt.max()) < sum(pages)
    cache, scales = inp["kv_cache"], inp["kv_scales"]
    assert cache.shape == (sum(pages), spec.page_bytes) and cache.dtype == torch.uint8
    if spec.separate_scales:
        assert scales.shape == (sum(pages), spec.scale_page_bytes) and scales.dtype == torch.uint8
    else:
        assert scales is None
    assert inp["cache_bytes"] == sum(pages) * (spec.page_bytes + spec.scale_page_bytes)
    assert inp["max_context_len"] == 300 and inp["sum_context_lens"] == sum(lens)
    # every slot holds a stored random key: finite, not zero, positive scales
    slots = torch.arange(sum(pages) * spec.page_size)
    k = R.dequantize(cache, slots, spec, kv_scales=scales)
    assert torch.isfinite(k).all() and (k.abs().amax(1) > 0).all()
    kq, sc = R.read_tokens(cache, slots, spec, kv_scales=scales)
    if sc is not None:
        assert (sc > 0).all()
    assert float(inp["q"].float().abs().max()) > 0
    # a different seed gives different data
    other = Bn.make_logits_inputs(spec, RefOps(spec).store, lens, 2, seed=6, device="cpu")
    assert not torch.equal(other["kv_cache"], cache)


def test_make_store_inputs_cpu():
    inp = Bn.make_store_inputs(FP8, 100, seed=1, device="cpu")
    assert inp["k"].shape == (100, 128) and inp["k"].dtype == torch.bfloat16
    assert inp["loc"].dtype == torch.int64 and len(set(inp["loc"].tolist())) == 100
    assert int(inp["loc"].max()) < inp["kv_cache"].shape[0] * 64
    assert inp["kv_scales"] is None
    sep = Bn.make_store_inputs(SEP, 100, seed=1, device="cpu")
    assert sep["kv_scales"].shape == (sep["kv_cache"].shape[0], SEP.scale_page_bytes)
    # a prefill's slots: page_size consecutive tokens per page, distinct pages in a random order
    for spec in (FP8, FP8.with_(page_size=1)):
        ps = spec.page_size
        for n in (1, 63, 64, 65, 200):
            inp = Bn.make_store_inputs(spec, n, seed=2, device="cpu", slots="pages")
            pre = inp["loc"]
            assert pre.dtype == torch.int64 and len(set(pre.tolist())) == n
            assert 0 <= int(pre.min()) and int(pre.max()) < inp["kv_cache"].shape[0] * ps
            assert torch.equal(pre % ps, torch.arange(n) % ps)
            pages = pre[::ps] // ps
            assert len(set(pages.tolist())) == -(-n // ps)
            assert torch.equal(pre // ps, pages.repeat_interleave(ps)[:n])
    with pytest.raises(ValueError, match="slots"):
        Bn.make_store_inputs(FP8, 10, seed=1, device="cpu", slots="sorted")


def test_bench_settles_before_each_row(monkeypatch):
    """With ``settle_s`` the bench idles that long before every row (the module docstring says
    why), and not at all with 0."""
    slept = []
    monkeypatch.setattr(Bn.time, "sleep", slept.append)
    shapes = (Bn.Shape("store", N=5), Bn.Shape("paged_logits", B=2, next_n=1, ctx=70))
    for settle, want in ((0.25, [0.25, 0.25]), (0.0, [])):
        slept.clear()
        b = Bn.Bench("cpu", Bn.HostTimer(), copy_GBps=100.0, runs=3, warmup=1, fallback_runs=2, reruns=2,
                     l2_target=1, max_sets=4, log=lambda s: None, settle_s=settle)
        rows = [b.bench(RefOps(FP8), FP8, s) for s in shapes]
        assert all(r["error"] is None for r in rows) and slept == want


def test_store_rows_catch_a_store_that_differs_between_runs(gen):
    # a store whose bytes change from one run to the next (as a race would make them) is
    # reported as not bitwise reproducible; a store that writes the same wrong bytes each time
    # is deterministic (correctness is dsagen verify's job, not the bench's)
    class Racy(RefOps):
        def store(self, k, kv_cache, loc, kv_scales=None):
            super().store(k, kv_cache, loc, kv_scales)
            kv_cache.view(-1)[int(loc[0]) * self.spec.layout.key_token_stride] ^= int(
                torch.randint(1, 256, (1,), generator=gen))

    b = Bn.Bench("cpu", Bn.HostTimer(), copy_GBps=100.0, runs=3, warmup=1, fallback_runs=2,
                 reruns=3, l2_target=1, max_sets=4, log=lambda s: None, settle_s=0)
    for shape in (Bn.Shape("store", N=5), Bn.Shape("store", N=70, slots="pages")):
        assert b.bench(Racy(FP8), FP8, shape)["bitwise_20_reruns"] is False
        assert b.bench(RefOps(FP8), FP8, shape)["bitwise_20_reruns"] is True


def test_bench_rows_cpu():
    """The whole row pipeline with a host timer and reference ops on tiny shapes."""
    logs = []
    b = Bn.Bench("cpu", Bn.HostTimer(), copy_GBps=100.0, runs=3, warmup=1, fallback_runs=2,
                 reruns=2, l2_target=1, max_sets=4, log=logs.append)
    rows = []
    for spec in (FP8, BF16, SEP):
        ops = RefOps(spec)
        for shape in (Bn.Shape("paged_logits", B=2, next_n=2, ctx=130),
                      Bn.Shape("store", N=5), Bn.Shape("store", N=70, slots="pages")):
            rows.append(b.bench(ops, spec, shape))
    assert logs and all(r["error"] is None for r in rows), [r["error"] for r in rows]
    json.dumps(rows)                                       # serialisable
    for r in rows:
        spec = WITH_SEP[r["spec"]]
        assert r["us"] > 0 and r["runs"] == 3 and r["n_sets"] == 4
        if r["op"] == "paged_logits":
            assert r["bytes"] == Bn.paged_logits_bytes(spec, 2, 2, 260, 130)
            assert r["bitwise_20_reruns"] is True
            assert r["fallback_us"] > 0 and r["speedup_vs_fallback"] > 0
            assert r["fallback_calc_diff"] is not None and r["fallback_calc_diff"] < 1e-3
        else:
            assert r["bytes"] == Bn.store_bytes(spec, r["N"])
            assert r["slots"] == ("pages" if r["N"] == 70 else "random")
            assert r["bitwise_20_reruns"] is True
        assert r["GBps"] == pytest.approx(r["bytes"] / r["us"] / 1e3, rel=0.01, abs=0.1)
        # copy bandwidth 100 GB/s: the percentage equals the GB/s figure
        assert r["pct_copy_bw"] == pytest.approx(r["bytes"] / r["us"] / 1e3, rel=0.01, abs=0.01)
        assert r["deepgemm_us"] is None
        # every row carries the paired fields (None without DeepGEMM)
        assert all(k in r and r[k] is None for k in PAIRED_FIELDS)
    # prefill rows: TFLOP/s from 2*sum(ke-ks)*H*D and the same-run dense matmul rate
    r = b.bench(RefOps(FP8), FP8, Bn.Shape("ragged_logits", B=6, ctx=20))
    assert r["error"] is None, r["error"]
    assert r["flops"] == 2 * sum(20 - 6 + i + 1 for i in range(6)) * FP8.num_heads * FP8.head_dim
    # the row rounds TFLOP/s to 4 decimals: a slow host call (~24 ms seen) leaves 7e-5 -> 1e-4
    assert r["tflops"] == pytest.approx(r["flops"] / r["us"] / 1e6, rel=0.02, abs=5e-5)
    assert r["matmul_tflops"] > 0 and r["pct_matmul"] == pytest.approx(100 * r["tflops"] / r["matmul_tflops"], rel=0.02)
    assert r["bitwise_20_reruns"] is True
    assert "TF/s" in Bn.format_header() and Bn.format_row(r)
    # an unsupported next_n becomes an error row, not an exception
    bad = b.bench(RefOps(FP8), FP8.with_(next_n=[1]), Bn.Shape("paged_logits", B=1, next_n=2, ctx=10))
    assert bad["error"] and "next_n" in bad["error"]


def test_table_formatting():
    rows = [
        {"op": "meta", "card": "x"},
        {"spec": "fp8_e4m3_page64", "op": "paged_logits", "B": 128, "next_n": 2, "ctx": "mixed",
         "N": None, "us": 512.345, "bytes": 1946628096, "GBps": 3800.2, "pct_copy_bw": 90.48, "fallback_us": 12345.6,
         "speedup_vs_fallback": 24.1, "deepgemm_us": 600.0, "deepgemm_pct_copy_bw": 77.2,
         "speedup_vs_deepgemm": 1.17, "speedup_vs_deepgemm_paired": 1.093, "bitwise_20_reruns": True},
        {"spec": "bf16_page64", "op": "store", "B": None, "next_n": None, "ctx": None, "N": 65536,
         "us": 9.87, "bytes": 660, "GBps": 1200.0, "pct_copy_bw": 28.6, "fallback_us": None,
         "speedup_vs_fallback": None, "deepgemm_us": None, "bitwise_20_reruns": None},
        {"spec": "bf16_page64", "op": "paged_logits", "B": 32, "next_n": 1, "ctx": 8192,
         "bitwise_20_reruns": False, "error": "RuntimeError: boom"},
        {"spec": "bf16_page64", "op": "store", "N": 65536, "slots": "pages", "us": 9.0},
    ]
    head = Bn.format_header()
    lines = [Bn.format_row(r) for r in rows[1:]]
    assert head.split() == ["spec", "op", "B", "nn", "ctx/N", "us", "MB", "GB/s", "%copy", "us_sched", "%copy_s",
                            "fallback_us", "x_fb", "deepgemm_us", "dg%copy", "x_dg", "x_dg_s", "x_dg_u",
                            "x_dg_p", "bitwise", "TF/s", "%mm"]
    assert len(lines[0]) == len(head)                       # aligned columns
    assert lines[0].split() == ["fp8_e4m3_page64", "paged_logits", "128", "2", "mixed", "512.3",
                                "1947", "3800", "90.5", "-", "-", "12345.6", "24.1", "600.0", "77.2", "1.17", "-",
                                "-", "1.09", "yes", "-", "-"]
    assert lines[1].split()[:9] == ["bf16_page64", "store", "-", "-", "65536", "9.9", "0.00066", "1200", "28.6"]
    assert lines[1].split()[-1] == "-"
    assert lines[2].endswith("ERROR: RuntimeError: boom") and " NO " in lines[2]
    assert lines[3].split()[4] == "65536p"                  # a prefill's slots
    # the right edge of every numeric column lines up with its title
    for title in ("us", "GB/s", "%copy", "bitwise"):
        end = head.index(title) + len(title)
        assert lines[0][end - 1] != " "
    table = Bn.format_table(rows)
    assert table.splitlines()[0] == head and len(table.splitlines()) == 5


def test_paired_times_balances_the_order():
    """paired_times: each round times a whole series of every function, the orders cycle through
    the permutations (each function leads equally often), and the per-round medians come back
    in round order."""
    calls = []
    SCRUB = object()          # passed through to the timer

    class FakeTimer:
        method = "fake"

        def __init__(self):
            self.t = 0.0

        def time(self, fn, n_sets, runs, warmup, scrub=None):
            assert scrub is SCRUB
            for i in range(warmup + runs):
                fn(i % n_sets)
            self.t += 1.0
            return Bn.Timing(self.t, self.t - 100, self.t + 100, runs, self.method)   # median: .us

    def rec(name):
        return lambda k: calls.append((name, k))

    timer = FakeTimer()
    t = Bn.paired_times(timer, {"a": rec("a"), "b": rec("b")}, n_sets=3, runs=4, warmup=1, scrub=SCRUB,
                        rounds=4)
    series = [calls[i][0] for i in range(0, len(calls), 5)]   # one name per series of 5 calls
    assert series == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert all(len({c[0] for c in calls[i:i + 5]}) == 1 for i in range(0, len(calls), 5))
    assert sorted({k for _n, k in calls}) == [0, 1, 2]          # every input set is used
    assert t == {"a": [1.0, 4.0, 5.0, 8.0], "b": [2.0, 3.0, 6.0, 7.0]}
    calls.clear()
    t3 = Bn.paired_times(FakeTimer(), {"x": rec("x"), "y": rec("y"), "z": rec("z")}, 1, 1, 0, SCRUB, rounds=6)
    firsts = [calls[i][0] for i in range(0, 18, 3)]
    assert sorted(firsts) == ["x", "x", "y", "y", "z", "z"]
    assert all(len(v) == 6 for v in t3.values())
    # the host timer path: real timings, one per round
    th = Bn.paired_times(Bn.HostTimer(), {"a": lambda k: k + 1, "b": lambda k: k * 2}, 2, 3, 1, rounds=2)
    assert len(th["a"]) == len(th["b"]) == 2 and all(v > 0 for v in th["a"] + th["b"])
    with pytest.raises(ValueError, match="needs >= 1 round"):
        Bn.paired_times(timer, {"a": rec("a")}, 1, 1, 0, rounds=0)
    with pytest.raises(ValueError, match="needs >= 1 round"):
        Bn.paired_times(timer, {}, 1, 1, 0)


PAIRED_FIELDS = ("us_scheduled_paired", "deepgemm_us_paired", "speedup_vs_deepgemm_paired",
                 "speedup_vs_deepgemm_unclean_paired", "us_scheduled_unclean_paired",
                 "speedup_vs_deepgemm_paired_range", "paired_rounds", "paired_note")


@pytest.mark.parametrize("clean", [True, False])
def test_bench_paired_row(clean):
    """Bench._paired on the calls of _scheduled_calls (both run on CUDA with DeepGEMM only):
    which calls it times, the ratio's direction (DeepGEMM / dsagen), the median over the rounds
    (not the mean), the range, the unclean fields only where DeepGEMM ran without its clean
    pass, and a failure in paired_note."""
    class Ops:
        def __init__(self):
            self.last = None

        def paged_logits_schedule(self, context_lens, block_table, next_n, max_len):
            return ("sched", int(context_lens[0]))

        def paged_logits(self, q, kv, w, cl, bt, max_len, clean_logits, schedule=None):
            assert schedule == ("sched", int(cl[0])) and max_len == 77    # set k's own schedule
            self.last = "dsagen" if clean_logits else "dsagen_unclean"

    ops = Ops()
    sets = [{"context_lens": torch.tensor([k + 5]), "block_table": torch.zeros(1, 1)} for k in range(3)]
    args = [(None, None, None, s["context_lens"], s["block_table"]) for s in sets]

    def dg_call(k):
        ops.last = "deepgemm"

    class KindTimer:   # a series' time by what its function calls: dsagen 10 us but 40 in one round
        method = "fake"

        def __init__(self):
            self.n = {"dsagen": 0, "deepgemm": 0, "dsagen_unclean": 0}

        def time(self, fn, n_sets, runs, warmup, scrub=None):
            for k in range(n_sets):
                fn(k)
            kind = ops.last
            self.n[kind] += 1
            us = {"dsagen": 40.0 if self.n[kind] == 4 else 10.0, "deepgemm": 12.0, "dsagen_unclean": 9.0}[kind]
            return Bn.Timing(us, us - 5, us + 5, runs, self.method)

    timer = KindTimer()
    b = Bn.Bench("cpu", timer, copy_GBps=1.0, log=lambda s: None)
    row = {"spec": "x", **{k: None for k in PAIRED_FIELDS}}
    scheds = [ops.paged_logits_schedule(s["context_lens"], s["block_table"], 2, 77) for s in sets]
    kernel_scheduled, kernel_unclean = Bn._scheduled_calls(ops, args, [{}] * 3, scheds, 77)
    fns = {"dsagen": kernel_scheduled, "deepgemm": dg_call}
    if not clean:
        fns["dsagen_unclean"] = kernel_unclean
    b._paired(fns, 3, None, row)
    assert row["paired_note"] is None
    rounds = Bn.PAIRED_ROUNDS
    assert row["paired_rounds"] == rounds and timer.n["dsagen"] == timer.n["deepgemm"] == rounds
    assert timer.n["dsagen_unclean"] == (0 if clean else rounds)
    assert row["us_scheduled_paired"] == 10.0 and row["deepgemm_us_paired"] == 12.0
    assert row["speedup_vs_deepgemm_paired"] == 1.2                # median of 5 x 1.2 and 0.3
    assert row["speedup_vs_deepgemm_paired_range"] == [0.3, 1.2]
    if clean:
        assert row["us_scheduled_unclean_paired"] is None and row["speedup_vs_deepgemm_unclean_paired"] is None
    else:
        assert row["us_scheduled_unclean_paired"] == 9.0 and row["speedup_vs_deepgemm_unclean_paired"] == 1.333
    json.dumps(row)

    class Broken:
        method = "fake"

        def time(self, *a, **k):
            raise RuntimeError("timer broke")
    logs = []
    row2 = {"spec": "x", **{k: None for k in PAIRED_FIELDS}}
    Bn.Bench("cpu", Broken(), copy_GBps=1.0, log=logs.append)._paired(fns, 3, None, row2)
    assert "timer broke" in row2["paired_note"] and any("timer broke" in m for m in logs)
    assert all(row2[k] is None for k in PAIRED_FIELDS if k != "paired_note")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_run_needs_cuda():
    with pytest.raises(RuntimeError, match="dsagen bench needs a CUDA device"):
        Bn.run([FP8], quick=True)


def test_git_commit_override(monkeypatch):
    """DSAGEN_BENCH_GIT names the commit of a tree copied without its .git; unset, the field is
    the checkout's HEAD (or None outside a git checkout)."""
    monkeypatch.setenv("DSAGEN_BENCH_GIT", "abc1234")
    assert Bn._git_commit() == "abc1234 (DSAGEN_BENCH_GIT)"
    monkeypatch.delenv("DSAGEN_BENCH_GIT")
    got = Bn._git_commit()
    assert got is None or "DSAGEN_BENCH_GIT" not in got


def test_bench_env_settings(monkeypatch):
    """The bench's DSAGEN_* variables, read through dsagen.config (empty means unset)."""
    from dsagen import config
    for k in ("DSAGEN_BENCH_METHOD", "DSAGEN_BENCH_PARTIAL", "DSAGEN_BENCH_GIT"):
        monkeypatch.delenv(k, raising=False)
    assert (config.bench_method(), config.bench_partial(), config.bench_git()) == ("spin", None, None)
    monkeypatch.setenv("DSAGEN_BENCH_METHOD", "")
    assert config.bench_method() == "spin"
    monkeypatch.setenv("DSAGEN_BENCH_METHOD", "graph")
    monkeypatch.setenv("DSAGEN_BENCH_PARTIAL", "/tmp/rows.json")
    assert config.bench_method() == "graph" and config.bench_partial() == "/tmp/rows.json"
    monkeypatch.delenv("DSAGEN_BENCH_SETTLE", raising=False)
    assert config.bench_settle_s(2.0) == 2.0
    monkeypatch.setenv("DSAGEN_BENCH_SETTLE", "0")
    assert config.bench_settle_s(2.0) == 0.0
    monkeypatch.setenv("DSAGEN_BENCH_SETTLE", "0.5")
    assert config.bench_settle_s(2.0) == 0.5 and "DSAGEN_BENCH_SETTLE" in config.settings()
    assert {"DSAGEN_BENCH_METHOD", "DSAGEN_BENCH_PARTIAL"} <= set(config.settings())
