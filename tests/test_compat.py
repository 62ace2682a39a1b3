"""DeepGEMM-compatible entry points give the generated kernel's (and the reference's) results."""
from __future__ import annotations

import pytest
import torch

import dsagen.compat as dg
from dsagen import reference as R
from dsagen.spec import Spec
from dsagen.verify import make_cache, random_q

from conftest import VARIANTS


def test_deepgemm_signature_matches_reference(gen):
    spec = dg._ops().spec
    lens = [300, 65, 1]
    cache, bt, _ = make_cache(spec, lens, gen, "cpu")
    q = random_q(spec, 3, 2, gen, "cpu")
    w = torch.randn(6, spec.num_heads, generator=gen)
    cl = torch.tensor(lens, dtype=torch.int32)
    meta = dg.get_paged_mqa_logits_metadata(cl, spec.page_size, 132)
    assert meta.shape == (133, 2) and meta.dtype == torch.int32
    view = cache.view(cache.shape[0], spec.page_size, 1, spec.bytes_per_token)   # DeepGEMM's view
    out = dg.fp8_paged_mqa_logits(q, view, w, cl, bt, meta, 300, clean_logits=True)
    ref = R.paged_logits(q, cache, w, cl, bt, 300, True, spec, compute_dtype=torch.float64)
    v = torch.isfinite(ref)
    assert torch.equal(torch.isneginf(out), ~v)
    assert float((out[v].double() - ref[v]).norm() / ref[v].norm()) < 1e-4


def test_deepgemm_mqa_logits_signature(gen):
    from dsagen.verify import ragged_inputs
    spec = dg._ops().spec
    q, k, sc, w = ragged_inputs(spec, 6, 40, gen, "cpu")
    ks = torch.tensor([0, 0, 5, 10, 20, 39], dtype=torch.int32)
    ke = torch.tensor([1, 40, 25, 10, 40, 40], dtype=torch.int32)
    out = dg.fp8_mqa_logits(q, (k, sc), w, ks, ke)
    ref = R.ragged_logits(q, k, sc, w, ks, ke, True, spec, compute_dtype=torch.float64)
    v = torch.isfinite(ref)
    assert out.shape == (6, 40) and torch.equal(torch.isneginf(out), ~v)
    assert float((out[v].double() - ref[v]).norm() / ref[v].norm()) < 1e-4


def test_separate_scales_are_refused():
    """DeepGEMM's kv_cache holds the scales: a separate-scales spec cannot back its signature."""
    before = dg._ops()
    with pytest.raises(ValueError, match="separate"):
        dg.use_spec(Spec.from_dict(VARIANTS["fp8_separate_page32"]))
    assert dg._ops() is before
