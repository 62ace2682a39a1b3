"""``scale.placement: separate``: scales in their own tensor ``kv_scales``.

No shipped spec has separate scales, so the op tests written for every spec (test_cpu_backend.py,
test_serving.py: they pass ``kv_scales`` where the spec has one) run here on the separate variant
of conftest.VARIANTS, on the CPU backend; the variant's verification sweep and nvcc compile run
with the other variants. Here too: where the op puts the scales (read back by hand), the
reference's errors, recall's plumbing, and CUDA checks (skipped without a matching GPU).
"""
from __future__ import annotations

import importlib
import inspect

import pytest
import torch

import dsagen
from dsagen import reference as R
from dsagen.spec import Spec
from dsagen.verify import make_cache, random_keys, random_q, verify

from conftest import VARIANTS


@pytest.fixture(scope="module")
def sep_spec() -> Spec:
    return Spec.from_dict(VARIANTS["fp8_separate_page32"], source="<variant fp8_separate_page32>")


@pytest.fixture(scope="module")
def sep_ops(sep_spec):
    return dsagen.load(sep_spec)


# (module, test): op tests written for any spec, run here with the separate spec as dsagen_spec
GENERIC = [
    ("test_cpu_backend", "test_store_changes_only_its_slots"),
    ("test_cpu_backend", "test_store_empty"),
    ("test_cpu_backend", "test_logits_masks_poison_and_accuracy"),
    ("test_cpu_backend", "test_store_then_logits_vs_unquantized"),
    ("test_cpu_backend", "test_bad_inputs_raise"),
    ("test_cpu_backend", "test_torch_library_registration"),
    ("test_cpu_backend", "test_ops_under_torch_compile_fullgraph"),
    ("test_serving", "test_three_layer_pool_each_layer_reads_its_own_scales"),
    ("test_serving", "test_chunked_prefill_gather_then_ragged_logits"),
]


@pytest.mark.parametrize("module, name", GENERIC, ids=[n for _, n in GENERIC])
def test_generic_op_test_on_separate_spec(module, name, sep_spec, sep_ops, gen, repro):
    fn = getattr(importlib.import_module(module), name)
    given = {"dsagen_spec": sep_spec, "dsagen_ops": sep_ops, "gen": gen, "repro": repro, "device": "cpu"}
    params = inspect.signature(fn).parameters
    for k_dtype in ((torch.bfloat16, torch.float32, torch.float16) if "k_dtype" in params else (None,)):
        fn(**{p: k_dtype if p == "k_dtype" else given[p] for p in params})


def test_scales_land_in_kv_scales(sep_spec, sep_ops, gen, repro):
    """Decoded by hand: token t of page p has its fp32 scale (amax / 448) at bytes 4*(32p + t)
    of kv_scales; kv_cache holds only the e4m3 keys at 4160*p + 128*t, its page padding untouched."""
    spec, ops = sep_spec, sep_ops
    assert (spec.page_bytes, spec.scale_page_bytes) == (4160, 128)
    cache, scales = ops.new_cache(5), ops.new_scales(5)
    assert cache.shape == (5, 4160) and scales.shape == (5, 128) and scales.dtype == torch.uint8
    loc = torch.randperm(5 * 32, generator=gen)[:40]
    k = random_keys(40, 128, gen, "cpu", dtype=torch.float32)
    ops.store(k, cache, loc, scales)
    amax = k.abs().amax(1)
    got = scales.view(torch.float32).reshape(-1)[loc]            # fp32 slot of each token
    assert torch.equal(got, amax / 448), repro
    assert int((scales.view(torch.float32).reshape(-1) != 0).sum()) == 40   # nothing else written
    for t, slot in enumerate(loc.tolist()):
        p, o = divmod(slot, 32)
        row = cache[p, 128 * o:128 * (o + 1)].view(torch.float8_e4m3fn)
        assert torch.equal(row, (k[t] / got[t]).to(torch.float8_e4m3fn)), repro
    assert not cache[:, 4096:].any(), "the page padding was written"


def test_reference_needs_kv_scales_for_separate_and_refuses_it_otherwise(sep_spec, gen):
    spec = sep_spec
    cache, bt, sc = make_cache(spec, [40, 7], gen, "cpu")
    assert sc.shape == (cache.shape[0], 128)
    q = random_q(spec, 2, 1, gen, "cpu")
    w = torch.randn(2, spec.num_heads, generator=gen)
    cl = torch.tensor([40, 7], dtype=torch.int32)
    with pytest.raises(ValueError, match="pass kv_scales"):
        R.paged_logits(q, cache, w, cl, bt, 40, True, spec)
    with pytest.raises(ValueError, match="pass kv_scales"):
        R.store(torch.randn(1, 128), cache, torch.tensor([0]), spec)
    with pytest.raises(ValueError, match="kv_scales must be uint8"):
        R.read_scales(cache, torch.tensor([0]), spec, kv_scales=sc[:, :64])
    with pytest.raises(ValueError, match="pages"):
        R.paged_logits(q, cache, w, cl, bt, 40, True, spec, kv_scales=sc[:-1])
    other = spec.with_(scale_placement="page_tail", page_stride_bytes=None)
    with pytest.raises(ValueError, match="only for scale.placement separate"):
        R.store(torch.randn(1, 128), R.new_cache(other, 1), torch.tensor([0]), other,
                kv_scales=torch.zeros(1, 128, dtype=torch.uint8))
    assert R.new_scales(other, 3) is None and R.new_scales(spec, 3).shape == (3, 128)


def test_recall_stores_and_scores_through_kv_scales(sep_spec, sep_ops, gen):
    """dsagen recall's layout_logits on a separate spec equals the reference over the same cache."""
    import dsagen.recall as RC
    spec = sep_spec
    inp, model = RC.synthetic_inputs(300, spec.num_heads, spec.head_dim, 4, gen)
    got = RC.layout_logits(sep_ops, spec, inp)
    # the same keys stored by the reference, scored in float64 by the reference
    cache, scales = R.new_cache(spec, 10), R.new_scales(spec, 10)
    R.store(inp.k, cache, torch.arange(300), spec, kv_scales=scales)
    q, w = RC.quantize_queries(inp.q, inp.weights, spec)
    bt = torch.arange(10, dtype=torch.int32)[None].repeat(4, 1)
    want = R.paged_logits(q[:, None], cache, w, inp.lengths.to(torch.int32), bt, 300, True, spec,
                          compute_dtype=torch.float64, kv_scales=scales)
    v = torch.isfinite(want)
    assert torch.equal(torch.isneginf(got), ~v)
    assert float((got[v].double() - want[v]).norm() / want[v].norm()) < 1e-5


# ---- CUDA (skipped without a device that a target of the spec matches) -----------------------

@pytest.fixture
def sep_cuda_ops(sep_spec):
    from dsagen.ops import cuda_archs
    if not torch.cuda.is_available() or not cuda_archs(sep_spec):
        pytest.skip("no CUDA device matching the spec's targets")
    ops = dsagen.load(sep_spec)
    assert ops.has_cuda
    return ops


@pytest.mark.gpu
def test_verify_cuda_separate(sep_spec, sep_cuda_ops, seed, repro):
    rep = verify(sep_spec, sep_cuda_ops, "cuda", seed=seed, quick=False, reruns=3)
    assert rep.passed, f"{repro}\n{rep.table()}"


@pytest.mark.gpu
@pytest.mark.parametrize("k_dtype", [torch.bfloat16, torch.float32, torch.float16], ids=str)
def test_cuda_store_separate_equals_cpu_store(sep_spec, sep_cuda_ops, gen, repro, k_dtype):
    spec, ops = sep_spec, sep_cuda_ops
    n, pages = 3000, 2 * 3000 // 32 + 2
    cache = torch.randint(0, 256, (pages, spec.page_bytes), generator=gen, dtype=torch.uint8)
    scales = torch.randint(0, 256, (pages, spec.scale_page_bytes), generator=gen, dtype=torch.uint8)
    loc = torch.randperm(pages * 32, generator=gen)[:n]
    k = random_keys(n, spec.head_dim, gen, "cpu", dtype=k_dtype)
    c_cpu, s_cpu = cache.clone(), scales.clone()
    ops.store(k, c_cpu, loc, s_cpu)
    c_gpu, s_gpu = cache.cuda(), scales.cuda()
    ops.store(k.cuda(), c_gpu, loc.cuda(), s_gpu)
    torch.cuda.synchronize()
    assert torch.equal(c_gpu.cpu(), c_cpu) and torch.equal(s_gpu.cpu(), s_cpu), repro
