"""`dsagen recall`: top-k recall of a layout against the exact float64 ranking.

Small contexts only (a few hundred to two thousand keys, 16 queries): every test runs in seconds
once the shipped fp8 / bf16 CPU extensions are built (other tests build them too).
"""
from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner

import dsagen
import dsagen.recall as RC
from dsagen import reference as R
from dsagen.cli import main
from dsagen.serving import topk

from conftest import REPO, SPECS

BF16, FP8 = SPECS["bf16_page64"], SPECS["fp8_e4m3_page64"]


@pytest.fixture(scope="module")
def bf16_ops():
    return dsagen.load(dsagen.load_spec(BF16), with_cuda=False)


@pytest.fixture(scope="module")
def fp8_ops():
    return dsagen.load(dsagen.load_spec(FP8), with_cuda=False)


def _inputs(spec, n, T, topk_, gen, margins=RC.DEFAULT_MARGINS):
    inp, model = RC.synthetic_inputs(n, spec.num_heads, spec.head_dim, T, gen)
    ex = RC.exact_logits(inp.q, inp.k, inp.weights)
    ex = RC.plant_needles(inp, model, ex, margins, topk_, gen)
    return inp, ex


def _per_query_keys(inp):
    """float64 [T, N, D]: each query's keys (its needle in place)."""
    k = inp.k.double()[None].repeat(inp.num_queries, 1, 1)
    k[torch.arange(inp.num_queries), inp.needle_pos] = inp.needle_k.double()
    return k


def _direct_logits(q, keys, w):
    """float64 [T, N] from per-query keys [T, N, D]."""
    return (torch.relu(torch.einsum("thd,tnd->thn", q.double(), keys)) * w.double()[:, :, None]).sum(1)


def test_hadamard_is_orthonormal_and_keeps_dot_products(gen):
    for n in (32, 128):
        h = RC.hadamard(n)
        assert torch.allclose(h @ h, torch.eye(n, dtype=torch.float64), atol=1e-12)
        assert set(torch.unique((h * math.sqrt(n)).round()).tolist()) == {-1.0, 1.0}
    with pytest.raises(ValueError, match="power of two"):
        RC.hadamard(96)
    a, b = torch.randn(5, 128, generator=gen, dtype=torch.float64), torch.randn(7, 128, generator=gen,
                                                                                dtype=torch.float64)
    h = RC.hadamard(128)
    assert torch.allclose((a @ h) @ (b @ h).T, a @ b.T, rtol=1e-10, atol=1e-10)


def test_synthetic_inputs_are_heavy_tailed_and_rotated(gen):
    inp, _ = RC.synthetic_inputs(2048, 16, 128, 4, gen, rotate=False)
    mag = inp.k.double().abs().mean(0)
    top = mag.topk(4).values
    assert float(top.min() / mag.median()) > 3, "a few outlier channels dominate before rotation"
    kurt = ((inp.k.double() - inp.k.double().mean(0)) / inp.k.double().std(0)).pow(4).mean(0)
    assert float(kurt.median()) > 4, "elements are heavier-tailed than a Gaussian (kurtosis 3)"
    assert float(inp.k.abs().min()) > 0 and float(inp.q.abs().min()) > 0
    # the same generator state with the rotation: the same keys, rotated
    g2 = torch.Generator().manual_seed(int(torch.randint(1, 2**31, (1,), generator=gen)))
    state = g2.get_state()
    plain, _ = RC.synthetic_inputs(512, 16, 128, 4, g2, rotate=False)
    g2.set_state(state)
    rot, _ = RC.synthetic_inputs(512, 16, 128, 4, g2, rotate=True)
    h = RC.hadamard(128).float()
    assert torch.allclose(rot.k, plain.k @ h, rtol=1e-5, atol=1e-4)
    assert torch.allclose(rot.q, plain.q @ h, rtol=1e-5, atol=1e-4)
    rmag = rot.k.double().abs().mean(0)
    assert float(rmag.max() / rmag.median()) < 2, "the rotation spreads the outlier channels"


def test_needles_sit_at_their_margin_and_the_exact_ranking_keeps_them(gen):
    spec = dsagen.load_spec(BF16)
    T, n, k = 24, 900, 64
    inp, ex = _inputs(spec, n, T, k, gen)
    direct = _direct_logits(inp.q, _per_query_keys(inp), inp.weights)
    assert torch.allclose(ex, direct, rtol=1e-9, atol=1e-9)
    rows = torch.arange(T)
    hay = direct.clone()
    hay[rows, inp.needle_pos] = float("-inf")
    thr = hay.topk(k, 1).values[:, -1]
    others = [torch.cat([direct[t, :inp.needle_pos[t]], direct[t, inp.needle_pos[t] + 1:]]) for t in range(T)]
    std = torch.stack([o.std() for o in others])
    got_margin = (direct[rows, inp.needle_pos] - thr) / std
    # the needle is a float32 key: its logit is the planted one up to rounding each of its
    # elements to float32 (relative 2^-24), at most 2^-24 * sum_h |w_h| (|q_h| . |k|); a fixed
    # bound failed once in CI (3.8e-6 margin units on a logit 30 standard deviations up)
    mag = _direct_logits(inp.q.abs(), _per_query_keys(inp).abs(), inp.weights.abs())[rows, inp.needle_pos]
    tol = 1e-9 + 2 * 2.0 ** -24 * mag / std
    assert bool(((got_margin - inp.margin).abs() <= tol).all()), (got_margin - inp.margin, tol)
    assert sorted(set(inp.margin.tolist())) == sorted(RC.DEFAULT_MARGINS)
    top = topk(ex, inp.lengths, k)
    assert bool((top.long() == inp.needle_pos[:, None]).any(1).all())


def test_overlap_recall_counts_the_intersection(gen):
    n, k = 300, 20
    ref = torch.stack([torch.randperm(n, generator=gen)[:k] for _ in range(3)]).to(torch.int32)
    assert RC.overlap_recall(ref, ref, torch.full((3,), n), k).tolist() == [1.0, 1.0, 1.0]
    got = ref.clone()
    outside = [j for j in range(n) if j not in set(ref[1].tolist())][:5]
    got[1, -5:] = torch.tensor(outside, dtype=torch.int32)
    got[2] = got[2].flip(0)                        # order does not matter
    assert RC.overlap_recall(got, ref, torch.full((3,), n), k).tolist() == [1.0, 15 / 20, 1.0]
    # fewer visible keys than k: -1 padding, denominator = visible keys
    pad = torch.full((1, k), -1, dtype=torch.int32)
    pad[0, :6] = torch.arange(6)
    assert RC.overlap_recall(pad, pad, torch.tensor([6]), k).tolist() == [1.0]


class _ExactOps:
    """A lossless stand-in backend: stores float64 keys with the same paging and scores them in
    float64 (for checking the plumbing: block table, shared pages, needle pages)."""

    def __init__(self, spec):
        self.spec = spec

    def new_cache(self, num_pages, device="cpu"):
        return torch.full((num_pages * self.spec.page_size, self.spec.head_dim), float("nan"),
                          dtype=torch.float64)

    def store(self, k, cache, loc):
        cache[loc] = k.double()

    def paged_logits(self, q, cache, w, cl, bt, max_len, clean_logits=True):
        B, nn, H, _ = q.shape
        ps = self.spec.page_size
        j = torch.arange(max_len)
        slots = bt.long()[:, j // ps] * ps + j % ps                     # [B, max_len]
        keys = cache[slots]                                              # [B, max_len, D]
        out = _direct_logits(q[:, 0], keys, w.view(B, nn, H)[:, 0])
        lens = cl if cl.dim() == 1 else cl[:, 0]
        return out.masked_fill(j[None] >= lens[:, None], float("-inf")).repeat_interleave(nn, 0)


def test_lossless_backend_has_recall_one(gen, monkeypatch):
    """Through the same paging and needle pages, an unquantized backend gives recall 1.0 and keeps
    every needle (so any loss measured for a layout comes from the layout)."""
    spec = dsagen.load_spec(BF16)
    monkeypatch.setattr(RC, "quantize_queries", lambda q, w, s: (q.double(), w.double()))
    inp, ex = _inputs(spec, 700, 16, 64, gen)
    got = RC.layout_logits(_ExactOps(spec), spec, inp, page_seed=int(torch.randint(0, 99, (1,), generator=gen)))
    assert torch.allclose(got, ex, rtol=1e-12, atol=1e-12)
    ref = topk(ex, inp.lengths, 64)
    assert RC.overlap_recall(topk(got, inp.lengths, 64), ref, inp.lengths, 64).tolist() == [1.0] * 16
    res = RC.run_recall([spec], contexts=[1200, 2400], index_topk=64, compress_ratio=4, num_queries=16,
                        seed=int(torch.randint(0, 2**31, (1,), generator=gen)), ops_list=[_ExactOps(spec)])
    lay = res["layouts"][0]
    assert [r["recall_mean"] for r in lay["contexts"]] == [1.0, 1.0]
    assert lay["first_context_below_99"] is None
    assert all(x["hit_rate"] == 1.0 for x in lay["needle_hit"])
    assert [c["exact_needle_hit"] for c in res["contexts"]] == [1.0, 1.0]


def test_noisy_backend_is_flagged_below_99(gen, monkeypatch):
    spec = dsagen.load_spec(BF16)
    monkeypatch.setattr(RC, "quantize_queries", lambda q, w, s: (q.double(), w.double()))

    class Noisy(_ExactOps):
        def paged_logits(self, *a, **kw):
            out = super().paged_logits(*a, **kw)
            return out + torch.randn(out.shape, generator=gen, dtype=torch.float64) * out[out.isfinite()].std()

    res = RC.run_recall([spec], contexts=[1200, 2400], index_topk=64, num_queries=16,
                        seed=int(torch.randint(0, 2**31, (1,), generator=gen)), ops_list=[Noisy(spec)])
    lay = res["layouts"][0]
    assert all(r["recall_mean"] < 0.9 for r in lay["contexts"])
    assert lay["first_context_below_99"] == 1200


@pytest.mark.parametrize("which", ["bf16", "fp8"])
def test_layout_recall_equals_direct_float64(which, bf16_ops, fp8_ops, gen):
    """The layout's recall equals the recall of a direct float64 computation from the same
    quantized values (bf16: q and k cast to bf16; fp8: the reference quantization of the keys
    and the per-head e4m3 query quantization)."""
    ops = bf16_ops if which == "bf16" else fp8_ops
    spec = ops.spec
    T, n, k = 16, 700, 64
    inp, ex = _inputs(spec, n, T, k, gen)
    got = RC.layout_logits(ops, spec, inp, page_seed=int(torch.randint(0, 99, (1,), generator=gen)))
    assert got.dtype == torch.float32 and got.shape == (T, n)
    keys = _per_query_keys(inp).float().reshape(T * n, -1)
    if which == "bf16":
        kq = keys.to(torch.bfloat16).double()
        q, w = inp.q.to(torch.bfloat16).double(), inp.weights.double()
    else:
        kq8, sc = R.quantize(keys, spec)
        kq = kq8.double() * sc.double()
        q8, w = RC.quantize_queries(inp.q, inp.weights, spec)
        assert q8.dtype == torch.float8_e4m3fn
        q, w = q8.double(), w.double()
        assert float((inp.q - q.float() * (w / inp.weights)[..., None].float()).abs().max()
                     / inp.q.abs().max()) < 0.07, "the query scale is folded into the weights"
    direct = _direct_logits(q, kq.view(T, n, -1), w)
    rel = float((got.double() - direct).norm() / direct.norm())
    assert rel < 1e-5, rel
    ref = topk(ex, inp.lengths, k)
    rec_layout = RC.overlap_recall(topk(got, inp.lengths, k), ref, inp.lengths, k)
    rec_direct = RC.overlap_recall(topk(direct, inp.lengths, k), ref, inp.lengths, k)
    assert torch.equal(rec_layout, rec_direct), (rec_layout, rec_direct)
    assert 0.8 < float(rec_layout.mean()) <= 1.0
    if which == "fp8":
        assert float(rec_layout.mean()) < 1.0, "e4m3 keys and queries lose some of the exact top-k"


def _run(*args):
    return CliRunner().invoke(main, list(map(str, args)), catch_exceptions=False)


SMALL = ("--context", "1024,2048", "--compress-ratio", "2", "--index-topk", "64", "--queries", "16")


def test_cli_recall_reproducible(tmp_path, monkeypatch, bf16_ops, fp8_ops, gen):
    monkeypatch.chdir(REPO)
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    outs = []
    for i, s in enumerate((seed, seed)):
        r = _run("recall", FP8, BF16, *SMALL, "--seed", s, "--out", tmp_path / f"o{i}")
        assert r.exit_code == 0, r.output
        outs.append(tmp_path / f"o{i}")
    assert "first context with recall < 99%" in r.stdout and "bf16_page64" in r.stdout
    a, b = ((o / "recall.json").read_text() for o in outs)
    assert a == b, "the same seed gives the same JSON"
    r = _run("recall", BF16, *SMALL, "--seed", seed + 1, "--out", tmp_path / "other")
    assert r.exit_code == 0, r.output
    other = json.loads((tmp_path / "other" / "recall.json").read_text())["layouts"][0]
    assert other != json.loads(a)["layouts"][1], "another seed gives other inputs"
    res = json.loads(a)
    assert res["seed"] == seed and res["index_topk"] == 64 and res["compress_ratio"] == 2
    assert [c["keys"] for c in res["contexts"]] == [512, 1024]
    assert all(c["exact_needle_hit"] == 1.0 for c in res["contexts"])
    for lay in res["layouts"]:
        for row in lay["contexts"]:
            assert 0.5 < row["recall_mean"] <= 1.0 and row["recall_min"] <= row["recall_mean"]
            assert sum(x["queries"] for x in row["needle_hit"]) == 16
        below = [r["context"] for r in lay["contexts"] if r["recall_mean"] < 0.99]
        assert lay["first_context_below_99"] == (below[0] if below else None)
    png = outs[0] / "recall.png"
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def _dump(path, gen, T=6, H=64, D=128, N=800, lengths=True):
    from safetensors.torch import save_file
    t = {"q": (torch.randn(T, H, D, generator=gen) * 3).to(torch.bfloat16),
         "k": torch.randn(N, D, generator=gen) * torch.exp(torch.randn(N, 1, generator=gen)),
         "weights": torch.randn(T, H, generator=gen) * H ** -0.5}
    if lengths:
        t["lengths"] = torch.randint(N // 2, N + 1, (T,), generator=gen, dtype=torch.int32)
    save_file(t, str(path))
    return t


def test_cli_recall_dump(tmp_path, monkeypatch, bf16_ops, fp8_ops, gen):
    monkeypatch.chdir(REPO)
    d = _dump(tmp_path / "real.safetensors", gen)
    r = _run("recall", BF16, FP8, "--dump", tmp_path / "real.safetensors", "--index-topk", "64",
             "--compress-ratio", "4", "--out", tmp_path / "o")
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "o" / "recall.json").read_text())
    assert res["source"] == "dump" and res["dump"] == "real.safetensors" and res["margins"] is None
    assert res["queries"] == 6 and [c["context"] for c in res["contexts"]] == [3200]
    assert (tmp_path / "o" / "recall.png").stat().st_size > 5_000
    # the bf16 number is the direct float64 computation of bf16-rounded q and k
    q, k, w, lens = d["q"].double(), d["k"].to(torch.bfloat16).double(), d["weights"].double(), d["lengths"].long()
    direct = RC.exact_logits(q, k, w, lens)
    exact = RC.exact_logits(d["q"].float(), d["k"], d["weights"], lens)
    rec = RC.overlap_recall(topk(direct, lens, 64), topk(exact, lens, 64), lens, 64)
    bf = res["layouts"][0]
    assert bf["spec"] == "bf16_page64" and bf["needle_hit"] is None
    assert bf["contexts"][0]["recall_mean"] == round(float(rec.mean()), 6)
    assert bf["contexts"][0]["recall_min"] == round(float(rec.min()), 6)
    # a shorter context uses the first keys of the dump; a longer one is a usage error
    r = _run("recall", BF16, "--dump", tmp_path / "real.safetensors", "--index-topk", "64",
             "--context", "1000,2000", "--out", tmp_path / "o2")
    assert r.exit_code == 0, r.output
    assert [c["keys"] for c in json.loads((tmp_path / "o2" / "recall.json").read_text())["contexts"]] == [250, 500]
    r = _run("recall", BF16, "--dump", tmp_path / "real.safetensors", "--context", "4000",
             "--out", tmp_path / "o3")
    assert r.exit_code == 2 and "needs 1000 keys; the dump has 800" in r.output


def test_load_dump_errors(tmp_path, gen):
    from safetensors.torch import save_file
    p = tmp_path / "bad.safetensors"
    save_file({"q": torch.randn(2, 8, 32, generator=gen), "k": torch.randn(9, 32, generator=gen)}, str(p))
    with pytest.raises(ValueError, match="tensor 'weights' missing"):
        RC.load_dump(p)
    save_file({"q": torch.randn(2, 8, 32, generator=gen), "k": torch.randn(9, 16, generator=gen),
               "weights": torch.randn(2, 8, generator=gen)}, str(p))
    with pytest.raises(ValueError, match="do not fit"):
        RC.load_dump(p)
    save_file({"q": torch.randn(2, 8, 32, generator=gen), "k": torch.randn(9, 32, generator=gen),
               "weights": torch.randn(2, 8, generator=gen), "lengths": torch.ones(2, dtype=torch.bool)}, str(p))
    with pytest.raises(ValueError, match="lengths must be an integer"):
        RC.load_dump(p)                              # (bool is not a length)
    _dump(p, gen, T=3, H=8, D=32, N=40, lengths=False)
    inp = RC.load_dump(p)
    assert inp.q.shape == (3, 8, 32) and inp.lengths.tolist() == [40] * 3 and inp.needle_pos is None
    # heads that do not match the layout are a usage error
    r = CliRunner().invoke(main, ["recall", str(BF16), "--dump", str(p), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "the layout has 64 heads x 128 dims" in r.output


def test_cli_recall_bad_usage(tmp_path):
    r = CliRunner().invoke(main, ["recall", str(BF16), "--context", "4k", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "--context" in r.output
    r = CliRunner().invoke(main, ["recall", str(BF16), "--context", "3", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "shorter than compress_ratio 4" in r.output
    # sizes past the bounds are one line, not an allocation failure; a new --out is not left behind
    for args, msg in ((["--index-topk", str(10**10)], "--index-topk must be <="),
                      (["--index-topk", str(10**20)], "--index-topk must be <="),
                      (["--queries", str(3 * 10**9)], "--queries <="),
                      (["--context", str(10**10)], "keys; at most")):
        new = tmp_path / "new_out"
        r = CliRunner().invoke(main, ["recall", str(BF16), "--device", "cpu", *args, "--out", str(new)])
        assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output, (args, r.output)
        assert not new.exists()


def test_cli_recall_bad_out_fails_before_the_run(tmp_path):
    """An --out that cannot be made (a path through a file) is a usage error (exit 2) before any
    layout is built or scored: no table is printed."""
    f = tmp_path / "afile"
    f.write_text("x")
    r = CliRunner().invoke(main, ["recall", str(BF16), "--context", "256", "--queries", "2",
                                  "--out", str(f / "sub")])
    assert r.exit_code == 2 and "--out" in r.output and "recall" not in r.output.split("Error")[0], r.output
