"""dsagen: generated store / paged-logits kernels for the DSA lightning-indexer key cache.

    spec = dsagen.load_spec("specs/bf16_page64.yaml")
    ops = dsagen.load(spec)            # JIT-builds (cached) and registers the torch ops
    cache = ops.new_cache(num_pages=1024, device="cuda")
    ops.store(k, cache, loc)
    logits = ops.paged_logits(q, cache, weights, context_lens, block_table, max_context_len)

A ``scale.placement: separate`` spec keeps the scales in their own tensor::

    scales = ops.new_scales(num_pages=1024, device="cuda")   # uint8 [pages, scale_page_bytes]
    ops.store(k, cache, loc, scales)
    logits = ops.paged_logits(q, cache, weights, context_lens, block_table, max_context_len,
                              kv_scales=scales)
"""
from .spec import Spec, SpecError, load_spec

__version__ = "0.1.0"

__all__ = ["Spec", "SpecError", "load_spec", "load", "__version__"]


def load(spec, *, with_cuda=None, tuning=None):
    """Build (or load from cache) the ops of a spec: a :class:`dsagen.ops.Ops` with ``store``,
    ``paged_logits`` (DeepGEMM ``fp8_paged_mqa_logits`` semantics), ``paged_logits_schedule``
    and ``ragged_logits`` (``fp8_mqa_logits`` semantics). ``spec``: a :class:`Spec` or a YAML
    path; ``with_cuda``: None builds the CUDA kernels where a device matches a target;
    ``tuning``: kernel tuning overrides. Arguments and errors as :func:`dsagen.ops.load`
    (SpecError, BuildError, JitDisabledError, CaptureError, ValueError, RuntimeError)."""
    from .ops import load as _load
    return _load(spec, with_cuda=with_cuda, tuning=tuning)
