"""DeepGEMM-compatible entry points give the generated kernel's (and the reference's) results,
on the CPU backend and, with a GPU, on the CUDA kernels (the fp8 tensor-core kernel on sm_90)."""
from __future__ import annotations

import pytest
import torch

import dsagen.compat as dg
from dsagen import reference as R
from dsagen.spec import Spec
from dsagen.verify import logits_tolerance, make_cache, random_q

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]

from conftest import VARIANTS


def _need(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def _decode_inputs(gen, device):
    """Three requests (300, 65, 1 tokens) at next_n 2 for the compat spec: ``(spec, kv_cache,
    block_table, q, weights, context_lens)``."""
    spec = dg._ops().spec
    lens = [300, 65, 1]
    cache, bt, _ = make_cache(spec, lens, gen, device)
    q = random_q(spec, 3, 2, gen, device)
    w = torch.randn(6, spec.num_heads, generator=gen).to(device)
    return spec, cache, bt, q, w, torch.tensor(lens, dtype=torch.int32, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_deepgemm_signature_matches_reference(gen, device):
    _need(device)
    spec, cache, bt, q, w, cl = _decode_inputs(gen, device)
    meta = dg.get_paged_mqa_logits_metadata(cl, spec.page_size, 132)
    assert meta.shape == (133, 2) and meta.dtype == torch.int32 and meta.device == cl.device
    view = cache.view(cache.shape[0], spec.page_size, 1, spec.bytes_per_token)   # DeepGEMM's view
    out = dg.fp8_paged_mqa_logits(q, view, w, cl, bt, meta, 300, clean_logits=True)
    assert out.device == cache.device and out.shape == (6, 300)
    out = out.cpu()
    ref = R.paged_logits(q.cpu(), cache.cpu(), w.cpu(), cl.cpu(), bt.cpu(), 300, True, spec,
                         compute_dtype=torch.float64)
    v = torch.isfinite(ref)
    assert torch.equal(torch.isneginf(out), ~v)
    rel_tol, _ = logits_tolerance(spec, device, 2, dg._ops().tuning)
    assert float((out[v].double() - ref[v]).norm() / ref[v].norm()) < rel_tol


@pytest.mark.parametrize("device", DEVICES)
def test_deepgemm_mqa_logits_signature(gen, device):
    from dsagen.verify import ragged_inputs
    _need(device)
    spec = dg._ops().spec
    q, k, sc, w = ragged_inputs(spec, 6, 40, gen, device)
    ks = torch.tensor([0, 0, 5, 10, 20, 39], dtype=torch.int32, device=device)
    ke = torch.tensor([1, 40, 25, 10, 40, 40], dtype=torch.int32, device=device)
    out = dg.fp8_mqa_logits(q, (k, sc), w, ks, ke)
    assert out.device == q.device
    out = out.cpu()
    ref = R.ragged_logits(q.cpu(), k.cpu(), sc.cpu(), w.cpu(), ks.cpu(), ke.cpu(), True, spec,
                          compute_dtype=torch.float64)
    v = torch.isfinite(ref)
    assert out.shape == (6, 40) and torch.equal(torch.isneginf(out), ~v)
    assert float((out[v].double() - ref[v]).norm() / ref[v].norm()) < 1e-4
    # kv must be the pair (k, k_scale): a bare tensor of 2 rows would otherwise unpack into one
    for bad in (k, k[:2], (k,), [k, sc, sc]):
        with pytest.raises(TypeError, match=r"kv must be the pair \(k, k_scale\)"):
            dg.fp8_mqa_logits(q, bad, w, ks, ke)


@pytest.mark.parametrize("device", DEVICES)
def test_deepgemm_metadata_extension_gives_a_schedule(gen, device):
    """get_paged_mqa_logits_metadata with the block table and max_context_len (a dsagen
    extension) returns the ops' schedule; fp8_paged_mqa_logits passes it on: the same bits as
    with DeepGEMM's placeholder. Half of the extension's arguments is an error."""
    from dsagen.ops import SCHEDULE_ROW
    _need(device)
    spec, cache, bt, q, w, cl = _decode_inputs(gen, device)
    plain = dg.fp8_paged_mqa_logits(q, cache, w, cl, bt, dg.get_paged_mqa_logits_metadata(cl, spec.page_size, 132),
                                    300, clean_logits=True)
    meta = dg.get_paged_mqa_logits_metadata(cl, spec.page_size, 132, block_table=bt, max_context_len=300,
                                            next_n=2)
    assert meta.dtype == torch.int32 and meta.shape[1] == SCHEDULE_ROW and meta.device == cl.device
    if device == "cuda":
        assert meta.shape[0] == torch.cuda.get_device_properties(cl.device).multi_processor_count
    assert torch.equal(dg.fp8_paged_mqa_logits(q, cache, w, cl, bt, meta, 300, clean_logits=True), plain)
    with pytest.raises(ValueError, match="both block_table and max_context_len"):
        dg.get_paged_mqa_logits_metadata(cl, spec.page_size, 132, block_table=bt)


def test_separate_scales_are_refused():
    """DeepGEMM's kv_cache holds the scales: a separate-scales spec cannot back its signature."""
    before = dg._ops()
    with pytest.raises(ValueError, match="separate"):
        dg.use_spec(Spec.from_dict(VARIANTS["fp8_separate_page32"]))
    assert dg._ops() is before


def test_use_spec_bf16_keys_through_the_deepgemm_signature(gen):
    """README's switch to bf16 keys: ``use_spec("specs/bf16_page64.yaml")``, bf16 q and a
    uint8 ``[num_pages, 64, 1, 256]`` or bf16 ``[num_pages, 64, 1, 128]`` cache view through
    ``fp8_paged_mqa_logits``, against the float64
    reference; outputs NaN-poisoned before the kernel, every entry written (CPU backend)."""
    from conftest import SPECS
    before = dg._ops()
    try:
        dg.use_spec(SPECS["bf16_page64"])
        ops = dg._ops()
        spec = ops.spec
        assert spec.name == "bf16_page64"
        lens = [200, 64, 3]
        cache, bt, _ = make_cache(spec, lens, gen, "cpu")
        q = random_q(spec, 3, 2, gen, "cpu")
        assert q.dtype == torch.bfloat16
        w = torch.randn(6, spec.num_heads, generator=gen)
        cl = torch.tensor(lens, dtype=torch.int32)
        view = cache.view(cache.shape[0], spec.page_size, 1, spec.bytes_per_token)
        assert tuple(view.shape[1:]) == (64, 1, 256)
        ref = R.paged_logits(q, cache, w, cl, bt, 200, True, spec, compute_dtype=torch.float64)
        v = torch.isfinite(ref)
        # the uint8 view, and the same bytes as a bf16 [num_pages, 64, 1, 128] cache
        for kv in (view, view.view(torch.bfloat16)):
            with ops.poisoned_outputs():
                out = dg.fp8_paged_mqa_logits(q, kv, w, cl, bt, dg.get_paged_mqa_logits_metadata(cl, 64, 132),
                                              200, clean_logits=True)
            assert not out.isnan().any()
            assert torch.equal(torch.isneginf(out), ~v)
            assert float((out[v].double() - ref[v]).norm() / ref[v].norm()) < 1e-5
        assert tuple(view.view(torch.bfloat16).shape[1:]) == (64, 1, 128)
        with pytest.raises(ValueError, match="bytes per token"):    # bf16 elements, 256 of them: 512 bytes
            dg.fp8_paged_mqa_logits(q, torch.zeros(2, 64, 1, 256, dtype=torch.bfloat16), w, cl, bt,
                                    None, 200)
    finally:
        dg._OPS = before


def test_padded_page_stride_refuses_the_4d_view(monkeypatch):
    """DeepGEMM's [num_pages, page_size, 1, bytes_per_token] view cannot hold padded pages: a
    clear ValueError naming page_stride_bytes, not a reshape error."""
    from types import SimpleNamespace
    spec = Spec.from_dict(VARIANTS["fp8_interleaved_pow2_page16"])
    assert spec.page_bytes != spec.page_size * spec.bytes_per_token
    monkeypatch.setattr(dg, "_OPS", SimpleNamespace(spec=spec))
    view = torch.zeros(2, spec.page_size, 1, spec.bytes_per_token, dtype=torch.uint8)
    with pytest.raises(ValueError, match="page_stride_bytes"):
        dg.fp8_paged_mqa_logits(None, view, None, None, None, None, 16)
