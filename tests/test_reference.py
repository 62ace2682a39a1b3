"""The PyTorch reference itself, on small cases checked by hand or by naive loops written here.

Everything the generated kernels are verified against is in dsagen.reference, so these tests
re-derive its semantics (DESIGN.md section 2) independently: byte addressing from the spec's
fields, masks from the formula, logits by a triple loop in float64, quantization by hand.
"""
from __future__ import annotations

import math

import pytest
import torch

from dsagen import reference as R
from dsagen.spec import Spec
from dsagen.verify import make_cache, random_keys, verify

SMALL = dict(name="t_small", head_dim=32, page_size=4, key={"dtype": "e4m3"},
             scale={"dtype": "fp32", "placement": "page_tail"},
             logits={"num_heads": 8, "next_n": [1, 2]}, targets=["sm_90a"])


def small(**changes) -> Spec:
    return Spec.from_dict(SMALL, source="<small>").with_(**changes) if changes else \
        Spec.from_dict(SMALL, source="<small>")


SMALL_SPECS = {
    "e4m3_page_tail": small(),
    "e4m3_interleaved_pow2": small(scale_placement="interleaved", scale_rounding="pow2"),
    "bf16": Spec.from_dict({**SMALL, "key": {"dtype": "bf16"}, "scale": {"dtype": "none"}}),
    "fp16_padded": Spec.from_dict({**SMALL, "key": {"dtype": "fp16"}, "scale": {"dtype": "none"},
                                   "page_stride_bytes": 272}),
    # DeepSeek V3.2 ue8m0 exponent bytes, two 16-element blocks per token, interleaved
    "e4m3_ue8m0_block16_interleaved": small(scale_dtype="ue8m0", scale_rounding="pow2",
                                            scale_block=16, scale_placement="interleaved"),
    # FP4: packed e2m1 + ue8m0 per 16 elements at the page tail (DESIGN.md fp4 layout, smaller)
    "e2m1_ue8m0_block16": small(key_dtype="e2m1", scale_dtype="ue8m0", scale_rounding="pow2",
                                scale_block=16),
    # e4m3 with fp32 block scales
    "e4m3_fp32_block16": small(scale_block=16),
    # scales in their own tensor kv_scales; kv_cache pages padded past the keys
    "e4m3_separate_padded": small(scale_placement="separate", page_stride_bytes=144),
    # FP4 keys, ue8m0 bytes per 16 elements in their own tensor
    "e2m1_ue8m0_block16_separate": small(key_dtype="e2m1", scale_dtype="ue8m0", scale_rounding="pow2",
                                         scale_block=16, scale_placement="separate"),
}

# E2M1 magnitudes by code, written out here (independent of dsagen.dtypes)
_FP4 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def naive_scale_bytes(spec: Spec) -> int:
    if not spec.quantized:
        return 0
    return (spec.head_dim // spec.scale_block) * {"fp32": 4, "ue8m0": 1}[spec.scale_dtype]


def rel_err(x, ref) -> float:
    x, ref = x.double(), ref.double()
    den = float(torch.linalg.vector_norm(ref))
    return float(torch.linalg.vector_norm(x - ref)) / (den or 1.0)


# ---- naive, independent re-implementations ------------------------------------------------------

def naive_addr(spec: Spec, slot: int) -> tuple[int, int]:
    """(first key byte in kv_cache, first scale byte in the scales' tensor: kv_cache, or
    kv_scales for separate placement) of a slot, from the spec's fields alone."""
    page, off = divmod(slot, spec.page_size)
    kb = spec.head_dim * spec.key.bits // 8
    sb = naive_scale_bytes(spec)
    if spec.scale_placement == "separate":   # kv_scales: every token's scales back to back
        stride = spec.page_stride_bytes or spec.page_size * kb
        return page * stride + off * kb, slot * sb
    stride = spec.page_stride_bytes or spec.page_size * (kb + sb)
    if spec.scale_placement == "page_tail":
        return page * stride + off * kb, page * stride + spec.page_size * kb + off * sb
    return page * stride + off * (kb + sb), page * stride + off * (kb + sb) + kb


def scale_home(cache: torch.Tensor, scales: torch.Tensor | None) -> torch.Tensor:
    """The tensor naive_addr's scale offsets index: kv_scales if given, else kv_cache."""
    return cache if scales is None else scales


def naive_scales(cache: torch.Tensor, spec: Spec, slot: int) -> list[float]:
    """The scales of a slot, decoded from their bytes (``cache``: the scales' tensor)."""
    flat = cache.reshape(-1)
    _, s0 = naive_addr(spec, slot)
    n = spec.head_dim // spec.scale_block
    if spec.scale_dtype == "ue8m0":
        return [2.0 ** (int(flat[s0 + i]) - 127) for i in range(n)]
    return [float(flat[s0 + 4 * i:s0 + 4 * i + 4].clone().view(torch.float32)) for i in range(n)]


def naive_read(cache: torch.Tensor, spec: Spec, slot: int,
               scales: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
    """(key of a slot as float64 [head_dim], the factor left to apply to its dot products).
    With one scale per token the key is the stored value and the factor its scale; with block
    scales the key is dequantized here and the factor is 1. ``scales``: kv_scales (separate)."""
    flat = cache.reshape(-1)
    k0, _ = naive_addr(spec, slot)
    kb = spec.head_dim * spec.key.bits // 8
    raw = flat[k0:k0 + kb].clone()
    if spec.key_dtype == "e2m1":
        vals = []
        for byte in raw.tolist():
            for code in (byte & 15, byte >> 4):
                vals.append(-_FP4[code & 7] if code & 8 else _FP4[code & 7])
        k = torch.tensor(vals, dtype=torch.float64)
    else:
        k = raw.view(spec.key.torch_dtype).double()
    if not spec.quantized:
        return k, 1.0
    sc = naive_scales(scale_home(cache, scales), spec, slot)
    if len(sc) == 1:
        return k, sc[0]
    return k * torch.tensor(sc, dtype=torch.float64).repeat_interleave(spec.scale_block), 1.0


def naive_visible(ctx: torch.Tensor, b: int, i: int, next_n: int, j: int) -> bool:
    if ctx.dim() == 2:
        return j < int(ctx[b, i])
    c = int(ctx[b])
    return j < c and j <= c - next_n + i


def naive_logits(q, cache, w, ctx, bt, max_len, spec, scales=None) -> torch.Tensor:
    B, next_n, H, _ = q.shape
    out = torch.full((B * next_n, max_len), -math.inf, dtype=torch.float64)
    for b in range(B):
        for i in range(next_n):
            r = b * next_n + i
            for j in range(max_len):
                if not naive_visible(ctx, b, i, next_n, j):
                    continue
                slot = int(bt[b, j // spec.page_size]) * spec.page_size + j % spec.page_size
                k, s = naive_read(cache, spec, slot, scales)
                acc = 0.0
                for h in range(H):
                    acc += float(w[r, h]) * max(0.0, float(q[b, i, h].double() @ k))
                out[r, j] = s * acc
    return out


# ---- masks ----------------------------------------------------------------------------------

def test_valid_mask_by_hand():
    ctx = torch.tensor([5, 3], dtype=torch.int32)
    # next_n 2: row b*2+i sits at position ctx-2+i and sees keys j <= that position
    assert R.valid_mask(ctx, 2, 6).int().tolist() == [
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0]]
    assert R.valid_mask(ctx, 1, 6).int().tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]]
    ctx2 = torch.tensor([[3, 5], [1, 2]], dtype=torch.int32)
    assert R.valid_mask(ctx2, 2, 6).int().tolist() == [
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 1, 0],
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0]]
    # an empty request sees nothing
    assert not R.valid_mask(torch.tensor([0, 1], dtype=torch.int32), 2, 3)[:2].any()


# ---- logits vs the triple loop --------------------------------------------------------------------

CASES = [  # (context_lens, next_n, 2-D)
    ([5, 11, 1], 1, False),
    ([5, 11, 2], 2, False),
    ([[4, 5], [10, 11], [1, 3]], 2, True),
    ([0, 7], 2, False),
]


@pytest.mark.parametrize("name", sorted(SMALL_SPECS))
@pytest.mark.parametrize("ctx, next_n, two_d", CASES, ids=["1d-n1", "1d-n2", "2d-n2", "empty-req"])
def test_paged_logits_vs_triple_loop(name, ctx, next_n, two_d, gen, repro):
    spec = SMALL_SPECS[name]
    lens = [max(c) if two_d else c for c in ctx]
    cache, bt, sc = make_cache(spec, lens, gen, "cpu")
    assert (sc is None) == (spec.scale_placement != "separate")
    # one more block-table column (pointing at real pages) so columns past every length exist
    bt = torch.cat([bt, torch.randint(0, cache.shape[0], (bt.shape[0], 1), generator=gen,
                                      dtype=torch.int32)], 1)
    B = len(ctx)
    q = torch.randn(B, next_n, spec.num_heads, spec.head_dim, generator=gen).mul(4).to(spec.query.torch_dtype)
    w = torch.randn(B * next_n, spec.num_heads, generator=gen)
    cl = torch.tensor(ctx, dtype=torch.int32)
    max_len = max(lens) + 2
    got = R.paged_logits(q, cache, w, cl, bt, max_len, True, spec, compute_dtype=torch.float64, kv_scales=sc)
    want = naive_logits(q, cache, w, cl, bt, max_len, spec, sc)
    assert got.dtype == torch.float64 and got.shape == (B * next_n, max_len)
    assert torch.equal(torch.isneginf(got), torch.isneginf(want)), repro
    valid = torch.isfinite(want)
    assert valid.any()
    assert rel_err(got[valid], want[valid]) < 1e-12, repro
    # float32 compute is the same to float32 rounding
    got32 = R.paged_logits(q, cache, w, cl, bt, max_len, True, spec, kv_scales=sc)
    assert got32.dtype == torch.float32
    assert rel_err(got32[valid], want[valid]) < 1e-5, repro


def two_requests(spec: Spec, gen: torch.Generator):
    """Random paged-logits inputs of a small spec: requests of 13 and 6 keys, next_n 2.
    Returns ``(q, cache, w, bt, sc)``."""
    cache, bt, sc = make_cache(spec, [13, 6], gen, "cpu")
    q = torch.randn(2, 2, 8, 32, generator=gen).mul(4).to(spec.query.torch_dtype)
    w = torch.randn(4, 8, generator=gen)
    return q, cache, w, bt, sc


@pytest.mark.parametrize("name", ["e4m3_page_tail", "e4m3_separate_padded", "e2m1_ue8m0_block16_separate"])
def test_fallback_matches_reference(name, gen, repro):
    spec = SMALL_SPECS[name]
    q, cache, w, bt, sc = two_requests(spec, gen)
    cl = torch.tensor([13, 6], dtype=torch.int32)
    ref = R.paged_logits(q, cache, w, cl, bt, 13, True, spec, compute_dtype=torch.float64, kv_scales=sc)
    fb = R.fallback_paged_logits(q, cache, w, cl, bt, 13, spec, kv_scales=sc)
    assert torch.equal(torch.isneginf(fb), torch.isneginf(ref))
    v = torch.isfinite(ref)
    assert rel_err(fb[v], ref[v]) < 2e-2, repro      # keys rounded to bf16 on the way


@pytest.mark.parametrize("name", sorted(SMALL_SPECS))
def test_fallback_reads_no_tensor_value_on_the_host(name, gen, monkeypatch):
    # dsagen bench times the fallback after a GPU spin that hides its launches: a tensor value
    # read on the host (bool(t), t.item(), int(t), ...) synchronizes a CUDA call and uncovers
    # them, inflating the fallback time and the speed-up quoted over it. On the CPU, the same
    # code path: count such reads.
    spec = SMALL_SPECS[name]
    q, cache, w, bt, sc = two_requests(spec, gen)
    cl = torch.tensor([13, 6], dtype=torch.int32)
    reads = []
    for attr in ("__bool__", "__int__", "__float__", "__index__", "item", "tolist"):
        orig = getattr(torch.Tensor, attr)

        def spy(self, *a, _attr=attr, _orig=orig, **kw):
            reads.append(_attr)
            return _orig(self, *a, **kw)
        monkeypatch.setattr(torch.Tensor, attr, spy)
    out = R.fallback_paged_logits(q, cache, w, cl, bt, 13, spec, kv_scales=sc)
    monkeypatch.undo()
    assert reads == []
    assert out.shape == (4, 13) and bool(torch.isfinite(out[R.valid_mask(cl, 2, 13)]).all())


@pytest.mark.parametrize("name", ["e4m3_page_tail", "e4m3_separate_padded", "e2m1_ue8m0_block16_separate"])
def test_no_logits_at_max_context_len_0(name, gen):
    # max_context_len 0 (no request has a key yet) is an empty result, as from the ops
    spec = SMALL_SPECS[name]
    q, cache, w, bt, sc = two_requests(spec, gen)
    cl = torch.tensor([0, 0], dtype=torch.int32)
    assert R.valid_mask(cl, 2, 0).shape == (4, 0)
    assert R.valid_mask(torch.tensor([[0, 0], [0, 0]], dtype=torch.int32), 2, 0).shape == (4, 0)
    assert R.paged_logits(q, cache, w, cl, bt, 0, True, spec, kv_scales=sc).shape == (4, 0)
    assert R.fallback_paged_logits(q, cache, w, cl, bt, 0, spec, kv_scales=sc).shape == (4, 0)


def test_calc_diff():
    x = torch.randn(100, dtype=torch.float64) + 0.5
    assert abs(R.calc_diff(x, x)) < 1e-15
    assert R.calc_diff(x, -x) == pytest.approx(2.0)
    assert R.calc_diff(torch.zeros(3), torch.zeros(3)) == 0.0
    assert 0 < R.calc_diff(x, x * 1.001) < 1e-6


# ---- quantization ---------------------------------------------------------------------------

def test_scale_is_amax_over_448(gen):
    spec = small()
    k = random_keys(64, 32, gen, "cpu", dtype=torch.float32)
    kq, sc = R.quantize(k, spec)
    assert sc.shape == (64, 1) and sc.dtype == torch.float32 and kq.dtype == torch.float8_e4m3fn
    amax = torch.tensor([max(abs(float(v)) for v in row) for row in k], dtype=torch.float32)
    assert torch.equal(sc[:, 0], amax / 448)
    # the largest element lands on +-448, no element is beyond it, values are k / scale rounded
    top = k.abs().argmax(1)
    assert torch.equal(kq.float().gather(1, top[:, None]).abs()[:, 0], torch.full((64,), 448.0))
    assert kq.float().abs().max() <= 448
    assert torch.equal(kq, (k / sc).to(torch.float8_e4m3fn))
    # dequantized keys are within e4m3 rounding (3 mantissa bits) of the input
    assert rel_err(kq.float() * sc, k) < 2 ** -4


def test_amax_floor():
    spec = small()
    k = torch.full((2, 32), 1e-7)
    k[1, 3] = -3e-6
    _, sc = R.quantize(k, spec)
    floor = torch.tensor(1e-4, dtype=torch.float32) / 448
    assert torch.equal(sc[:, 0], torch.stack([floor, floor]))


def test_pow2_rounding(gen):
    spec = small(scale_rounding="pow2")
    k = random_keys(256, 32, gen, "cpu", dtype=torch.float32)
    kq, sc = R.quantize(k, spec)
    s, raw = sc[:, 0].double(), (k.abs().amax(1) / 448).double()
    m, _ = torch.frexp(sc[:, 0])
    assert torch.all(m == 0.5), "pow2 scales must be exact powers of two"
    assert torch.all(s >= raw) and torch.all(s / 2 < raw)
    assert kq.float().abs().max() <= 448


@pytest.mark.parametrize("e", [-20, -9, -1, 0, 1, 6])
def test_pow2_rounding_of_exact_powers(e):
    spec = small(scale_rounding="pow2")
    k = torch.randn(3, 32).clamp(-1, 1) * 448 * 2.0 ** e * 0.999
    k[:, 5] = 448 * 2.0 ** e                         # amax / 448 == 2**e exactly
    k[2, 5] = 448 * 2.0 ** e * (1 + 2 ** -20)        # a hair above: the next power
    _, sc = R.quantize(k, spec)
    assert sc[:, 0].tolist() == [2.0 ** e, 2.0 ** e, 2.0 ** (e + 1)]


def test_bf16_is_stored_unscaled(gen):
    spec = SMALL_SPECS["bf16"]
    k = random_keys(5, 32, gen, "cpu", dtype=torch.float32)
    kq, sc = R.quantize(k, spec)
    assert sc is None and torch.equal(kq, k.to(torch.bfloat16))


# ---- store / read ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(SMALL_SPECS))
def test_store_writes_exactly_the_slot_bytes(name, gen, repro):
    spec = SMALL_SPECS[name]
    num_pages = 5
    cache = torch.randint(0, 256, (num_pages, spec.page_bytes), generator=gen, dtype=torch.uint8)
    sep = spec.scale_placement == "separate"
    scales = (torch.randint(0, 256, (num_pages, spec.page_size * naive_scale_bytes(spec)), generator=gen,
                            dtype=torch.uint8) if sep else None)
    before = cache.clone()
    before_sc = None if scales is None else scales.clone()
    loc = torch.randperm(num_pages * spec.page_size, generator=gen)[:7]
    k = random_keys(7, spec.head_dim, gen, "cpu")
    R.store(k, cache, loc, spec, kv_scales=scales)
    kq, sc = R.quantize(k, spec)
    home = scale_home(cache, scales)
    touched = torch.zeros(cache.numel(), dtype=torch.bool)
    s_touched = touched if not sep else torch.zeros(scales.numel(), dtype=torch.bool)
    flat = cache.reshape(-1)
    kb, sb = spec.key_bytes_per_token, naive_scale_bytes(spec)
    for t, slot in enumerate(loc.tolist()):
        k0, s0 = naive_addr(spec, slot)
        k_read, factor = naive_read(cache, spec, slot, scales)
        if sc is None:
            assert torch.equal(k_read, kq[t].double()), repro
        else:   # what was quantized comes back, scales exactly
            assert naive_scales(home, spec, slot) == sc[t].tolist(), repro
            deq = kq[t].double() * sc[t].double().repeat_interleave(spec.scale_block)
            assert torch.equal(k_read * factor, deq), repro
        touched[k0:k0 + kb] = True
        s_touched[s0:s0 + sb] = True
    assert torch.equal(flat[~touched], before.reshape(-1)[~touched]), "bytes of other slots changed"
    if sep:
        assert torch.equal(scales.reshape(-1)[~s_touched], before_sc.reshape(-1)[~s_touched]), \
            "scale bytes of other slots changed"
    # and read_tokens / dequantize give back what was stored
    rq, rs = R.read_tokens(cache, loc, spec, kv_scales=scales)
    assert torch.equal(rq.float(), kq.float())
    if sc is not None:
        assert torch.equal(rs, sc)
        deq = (kq.float().view(7, -1, spec.scale_block) * sc[..., None]).view(7, -1)
        assert torch.equal(R.dequantize(cache, loc, spec, kv_scales=scales), deq)


def test_fp32_scales_survive_store_and_read_exactly(gen):
    spec = small()
    k = random_keys(200, 32, gen, "cpu", dtype=torch.float32)
    _, sc = R.quantize(k, spec)
    m, _ = torch.frexp(sc)
    assert (m != 0.5).sum() > 190, "the test wants scales that are not powers of two"
    cache = R.new_cache(spec, 60)
    loc = torch.randperm(240, generator=gen)[:200]
    R.store(k, cache, loc, spec)
    _, back = R.read_tokens(cache, loc, spec)
    assert torch.equal(back.view(torch.int32), sc.view(torch.int32))   # bit for bit
    assert [naive_read(cache, spec, int(s))[1] for s in loc[:20]] == sc[:20, 0].tolist()


class RefOps:
    """The reference posing as generated ops of ``spec`` (to test the verifier itself). Ops of a
    layout whose scales are in kv_cache ignore a kv_scales tensor (as a kernel of that layout
    would never look at it)."""

    def __init__(self, spec: Spec):
        self.spec = spec

    def _own(self, kv_scales):
        return kv_scales if self.spec.separate_scales else None

    def store(self, k, kv_cache, loc, kv_scales=None):
        R.store(k, kv_cache, loc, self.spec, kv_scales=self._own(kv_scales))

    def paged_logits(self, q, kv_cache, w, cl, bt, max_len, clean_logits=True, kv_scales=None):
        return R.paged_logits(q, kv_cache, w, cl, bt, max_len, clean_logits, self.spec,
                              kv_scales=self._own(kv_scales))

    def ragged_logits(self, q, k, k_scale, w, ks, ke, clean_logits=True):
        return R.ragged_logits(q, k, k_scale, w, ks, ke, clean_logits, self.spec)


# separate with kv_cache pages padded to page_tail's size: the same kv_cache shape, the keys at
# the same offsets, and the page-tail scales land in the padding (so only the scales differ)
@pytest.mark.parametrize("change", [dict(scale_placement="interleaved"), dict(scale_rounding="pow2"),
                                    dict(scale_placement="separate", page_stride_bytes=64 * 36)],
                         ids=["placement", "rounding", "separate"])
def test_other_layout_is_caught(change, gen, seed):
    a = small(page_size=64)
    b = a.with_(**change)
    assert a.page_bytes == b.page_bytes
    # written with layout a, read with layout b: other values
    cache = R.new_cache(a, 1)
    loc = torch.arange(16)
    k = random_keys(16, 32, gen, "cpu")
    R.store(k, cache, loc, a)
    ka = R.dequantize(cache, loc, a)
    kb = R.dequantize(cache, loc, b, kv_scales=R.new_scales(b, 1))
    if "scale_placement" in change:
        assert not torch.equal(ka, kb)
    # the verifier passes ops that implement the layout and fails ops of another one
    assert verify(a, RefOps(a), "cpu", seed=seed, quick=True).passed
    assert verify(b, RefOps(b), "cpu", seed=seed, quick=True).passed
    rep = verify(b, RefOps(a), "cpu", seed=seed, quick=True)
    assert not rep.passed
    store_rows = [r for r in rep.rows if r.op == "store"]
    if "scale_rounding" in change:
        # a single token whose scale is already a power of two (amax = 1.75 * 2^k: about 1 bf16
        # key in 128; seed 1933503567 drew one) is stored the same way by both layouts
        store_rows = [r for r in store_rows if not r.shape.startswith("N=1 ")]
    assert store_rows and not any(r.bytes_equal for r in store_rows), rep.table()
    if "scale_placement" in change:
        assert not any(r.passed for r in rep.rows if r.op == "paged_logits" and "ctx=[1]" not in r.shape), \
            rep.table()


@pytest.mark.parametrize("page_size", [1, 16])
def test_verify_small_pages(page_size, seed):
    spec = small(page_size=page_size)
    assert verify(spec, RefOps(spec), "cpu", seed=seed, quick=True).passed


# ---- FP4 (e2m1) and ue8m0 --------------------------------------------------------------------

def test_e2m1_values_of_every_code():
    # the computed decode equals the grid written out here, signed zero included
    got = R._e2m1_values(torch.arange(16, dtype=torch.uint8))
    want = torch.tensor(_FP4 + [-v for v in _FP4])
    assert torch.equal(got, want) and torch.equal(torch.signbit(got), torch.signbit(want))


def test_quantize_divides_by_a_tensor_on_the_keys_device(gen, monkeypatch):
    # PyTorch's CUDA division by a Python number multiplies by a float32 reciprocal (not the
    # correctly rounded quotient), so the scale must be divided by a tensor: check that the
    # division quantize makes has a tensor divisor on the keys' device
    spec = SMALL_SPECS["e4m3_page_tail"]
    k = torch.randn(5, 32, generator=gen)
    seen = []
    orig = torch.Tensor.__truediv__

    def spy(self, other):
        seen.append(other)
        return orig(self, other)
    monkeypatch.setattr(torch.Tensor, "__truediv__", spy)
    _, scale = R.quantize(k, spec)
    monkeypatch.undo()
    assert seen and all(isinstance(o, torch.Tensor) and o.device == k.device for o in seen)
    amax = k.abs().amax(-1, keepdim=True).clamp(min=1e-4)
    assert torch.equal(scale, amax / 448.0)        # on the CPU the two divisions agree


def test_e2m1_rounding_by_hand():
    spec = SMALL_SPECS["e2m1_ue8m0_block16"]
    # one token: block 0 has amax 7 -> scale 2**ceil(log2(7/6)) = 2; block 1 amax 6 -> scale 1
    x = [0.0, 0.2, 0.25, 0.3, 0.75, 1.25, 1.3, 1.75, 2.5, 2.6, 3.5, 5.0, 5.1, 7.0, -0.75, -6.0]
    k = torch.tensor([x + [6.0] * 16], dtype=torch.float32)
    kq, sc = R.quantize(k, spec)
    assert sc[0].tolist() == [2.0, 1.0]
    got = kq[0, :16] * 2.0
    want2 = [2 * v for v in [0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 1.0, 1.0, 1.5, 2.0, 2.0, 3.0, 4.0, -0.5, -3.0]]
    # x / 2 rounded: 0.1->0, 0.125->0 (tie to even code 0), 0.15->0, 0.375->0.5, 0.625->0.5,
    # 0.65->0.5, 0.875->1, 1.25->1 (tie to even), 1.3->1.5, 1.75->2 (tie to even), 2.5->2 (tie),
    # 2.55->3, 3.5->4 (tie), -0.375->-0.5, -3 -> -3
    assert got.tolist() == want2
    assert kq[0, 16:].tolist() == [6.0] * 16


def test_ue8m0_bytes_are_biased_exponents(gen):
    spec = SMALL_SPECS["e4m3_ue8m0_block16_interleaved"]
    k = random_keys(9, 32, gen, "cpu", dtype=torch.float32)
    cache = R.new_cache(spec, 4)
    loc = torch.randperm(16, generator=gen)[:9]
    R.store(k, cache, loc, spec)
    _, sc = R.quantize(k, spec)
    flat = cache.reshape(-1)
    for t, slot in enumerate(loc.tolist()):
        _, s0 = naive_addr(spec, slot)
        for i in range(2):
            raw = (k[t, 16 * i:16 * (i + 1)].abs().max() / 448).item()
            e = math.ceil(math.log2(raw))
            assert int(flat[s0 + i]) == e + 127 and sc[t, i] == 2.0 ** e


@pytest.mark.parametrize("name", sorted(SMALL_SPECS))
def test_ragged_logits_vs_loop(name, gen, repro):
    """Prefill logits against a double loop over the decoded keys (DeepGEMM fp8_mqa_logits)."""
    spec = SMALL_SPECS[name]
    from dsagen.verify import ragged_inputs
    q, k, sc, w = ragged_inputs(spec, 5, 11, gen, "cpu")
    ks = torch.tensor([0, 3, 4, 10, 2], dtype=torch.int32)
    ke = torch.tensor([11, 3, 9, 11, 5], dtype=torch.int32)       # row 1 is empty
    got = R.ragged_logits(q, k, sc, w, ks, ke, True, spec, compute_dtype=torch.float64)
    kf = R.decode_keys(k, spec).double()
    if sc is not None:
        kf = kf * sc.double().reshape(11, -1).repeat_interleave(spec.scale_block, 1)
    for s in range(5):
        for n in range(11):
            if not int(ks[s]) <= n < int(ke[s]):
                assert got[s, n] == -math.inf
                continue
            acc = sum(float(w[s, h]) * max(0.0, float(q[s, h].double() @ kf[n])) for h in range(spec.num_heads))
            assert got[s, n].item() == pytest.approx(acc, rel=1e-9, abs=1e-9), repro


@pytest.mark.parametrize("tuning", [None, {"kv_evict_first": 0.01}, {"small_tiles": 2000},
                                    {"kv_evict_first": True}, {"kv_evict_first": False}])
def test_unhinted_cases_reach_the_main_kernel_without_the_hint(tuning, monkeypatch):
    """The sm_90 verification case for the TMA kernel's instantiation without the L2 hint
    (dsagen.verify._unhinted_cases), on a stand-in H200 (60 MiB L2, 132 SMs): its
    max_context_len puts the call past the hint's bound and past the small-work kernel's, so the
    launch's rules (paged_logits_kernel, kv_evict_first_applies) give the main kernel without the
    hint; no case where the hint is always on or always off."""
    from types import SimpleNamespace

    from dsagen import load_spec
    from dsagen.codegen import _kv_evict_first, effective_tuning, kv_evict_first_applies, paged_logits_kernel
    from dsagen.verify import _unhinted_cases, default_cases
    from conftest import SPECS
    props = SimpleNamespace(L2_cache_size=60 * 2**20, multi_processor_count=132, major=9)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a, **k: props)
    ops = SimpleNamespace(has_cuda=True, tuning=tuning)
    spec = load_spec(SPECS["fp8_e4m3_page64"])
    cases = default_cases("cuda", torch.Generator().manual_seed(0))
    for next_n in (1, 2, 4):
        got = _unhinted_cases(spec, ops, "cuda", cases, next_n)
        if _kv_evict_first(effective_tuning(spec, tuning)) <= 0:
            assert got == [], tuning
            continue
        assert len(got) == 1 and len(got[0][0]) == 64, (tuning, got)
        lens, max_len = got[0]
        assert max_len >= max(lens)
        assert paged_logits_kernel(spec, next_n, 64, max_len, 132, 9, tuning) == "ws"
        assert not kv_evict_first_applies(spec, next_n, 64, max_len, props.L2_cache_size, tuning)
    # none on the CPU or without CUDA ops
    assert _unhinted_cases(spec, ops, "cpu", cases, 1) == []
    assert _unhinted_cases(spec, SimpleNamespace(has_cuda=False, tuning=None), "cuda", cases, 1) == []


def test_e2m1_reference_with_no_keys():
    """FP4 keys: the reference's ragged logits over N=0 keys are [S, 0] (as the op's)."""
    import dsagen
    from dsagen.verify import ragged_inputs
    from conftest import SPECS
    spec = dsagen.load_spec(SPECS["fp4_e2m1_page64"])
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))
    q, k, sc, w = ragged_inputs(spec, 3, 0, g, "cpu")
    ks = torch.zeros(3, dtype=torch.int32)
    assert R.ragged_logits(q, k, sc, w, ks, ks, True, spec, compute_dtype=torch.float64).shape == (3, 0)


def test_reference_argument_errors(gen):
    spec = SMALL_SPECS["e4m3_page_tail"]
    cache, bt, sc = make_cache(spec, [13, 6], gen, "cpu")
    q = torch.randn(2, 2, 8, 32, generator=gen).to(spec.query.torch_dtype)
    w = torch.randn(4, 8, generator=gen)
    cl = torch.tensor([13, 6], dtype=torch.int32)
    with pytest.raises(ValueError, match="max_context_len must be >= 0"):
        R.paged_logits(q, cache, w, cl, bt, -1, True, spec, kv_scales=sc)
    with pytest.raises(ValueError, match="block_table must be"):
        R.fallback_paged_logits(q, cache, w, cl, bt[:, :1], 13, spec, kv_scales=sc)
    with pytest.raises(ValueError, match="q must be"):
        R.ragged_logits(torch.tensor(1.0), torch.zeros(3, 32), torch.ones(3), torch.ones(1, 8),
                        torch.zeros(1, dtype=torch.int32), torch.ones(1, dtype=torch.int32), True, spec)
    with pytest.raises(IndexError, match="negative slot id -1"):
        R.read_key_bytes(cache, torch.tensor([3, -1]), spec)
    with pytest.raises(IndexError, match="negative slot id"):
        R.store(torch.randn(1, 32), cache.clone(), torch.tensor([-64]), spec)
    # a k of the wrong width (whose bytes would fill whole slots of an unscaled layout), a loc of
    # another length or dtype: ValueError naming the argument, and not a byte written
    for s in (spec, SMALL_SPECS["bf16"]):
        c = R.new_cache(s, 2)
        c.random_(0, 256, generator=gen)
        before = c.clone()
        for k, loc, what in ((torch.randn(6, 16), torch.tensor([0, 1, 2]), "k must be"),
                             (torch.randn(2, 32, 1), torch.tensor([0, 1]), "k must be"),
                             (torch.randint(0, 9, (2, 32)), torch.tensor([0, 1]), "k must be"),
                             (torch.randn(3, 32), torch.tensor([0, 1]), "loc must be"),
                             (torch.randn(2, 32), torch.tensor([[0, 1]]), "loc must be"),
                             (torch.randn(2, 32), torch.tensor([0.0, 1.0]), "loc must be")):
            with pytest.raises(ValueError, match=what):
                R.store(k, c, loc, s)
            assert torch.equal(c, before), (s.name, what)
        with pytest.raises(ValueError, match="k must be"):
            R.quantize(torch.randn(3, 33), s)
    with pytest.raises(ValueError, match="must be float8_e4m3fn"):
        R.ragged_logits(torch.randn(1, 8, 32), torch.tensor(1.0), torch.ones(3), torch.ones(1, 8),
                        torch.zeros(1, dtype=torch.int32), torch.ones(1, dtype=torch.int32), True, spec)
