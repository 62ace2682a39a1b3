"""Drop-in replacements for DeepGEMM's paged indexer-logits entry points, backed by the
generated kernels of the matching spec (``specs/fp8_e4m3_page64.yaml`` by default).

    import dsagen.compat as dg                      # instead of: import deep_gemm as dg
    meta = dg.get_paged_mqa_logits_metadata(context_lens, 64, num_sms)
    logits = dg.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, meta,
                                     max_context_len, clean_logits=False)
    logits = dg.fp8_mqa_logits(q, (k, k_scale), weights, cu_seqlen_ks, cu_seqlen_ke)   # prefill

The generated kernel computes its schedule on the device, so the metadata is a placeholder of
the shape DeepGEMM returns, unless ``get_paged_mqa_logits_metadata`` is also given the block
table, ``max_context_len`` and next_n (a dsagen extension): it then returns the decode step's
:meth:`dsagen.ops.Ops.paged_logits_schedule`, which ``fp8_paged_mqa_logits`` passes to the kernel. To switch a stack to bf16 keys, load ``specs/bf16_page64.yaml``
with :func:`use_spec` and pass bf16 ``q`` and the bf16 cache, viewed as uint8
``[num_pages, 64, 1, 256]`` or bf16 ``[num_pages, 64, 1, 128]`` (any element type whose last
dimension holds the token's 256 bytes).

The default spec is the repository's ``specs/fp8_e4m3_page64.yaml`` (dsagen is installed
editable; the specs are not inside the package): :func:`use_spec` any other spec first.
"""
from __future__ import annotations

import torch

from .spec import shipped_spec_paths

_OPS = None


def use_spec(spec) -> None:
    """Back the entry points with another layout (a :class:`dsagen.Spec` or a YAML path).

    Raises:
        dsagen.SpecError: a bad spec file.  dsagen.jit.BuildError: the build fails (the other
        errors of :func:`dsagen.load` likewise).
        ValueError: a ``scale.placement: separate`` spec (DeepGEMM's ``kv_cache`` holds the
            scales; its signature has no place for a second scale tensor: call
            :meth:`dsagen.ops.Ops.paged_logits` with ``kv_scales`` instead).
    """
    global _OPS
    from . import load
    from .spec import Spec, load_spec
    spec = spec if isinstance(spec, Spec) else load_spec(spec)
    if spec.separate_scales:
        raise ValueError(f"{spec.name}: scale.placement separate does not fit DeepGEMM's signature "
                         "(its kv_cache holds the scales); use dsagen.load(spec).paged_logits(..., "
                         "kv_scales=...)")
    _OPS = load(spec)


def _ops():
    global _OPS
    if _OPS is None:
        from . import load
        default = [p for p in shipped_spec_paths() if p.stem == "fp8_e4m3_page64"]
        if not default:
            raise FileNotFoundError("dsagen.compat: specs/fp8_e4m3_page64.yaml not found beside the "
                                    "package (install dsagen editable from its repository, or call "
                                    "dsagen.compat.use_spec(SPEC) first)")
        _OPS = load(default[0])
    return _OPS


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv: int, num_sms: int,
                                  block_table: torch.Tensor | None = None,
                                  max_context_len: int | None = None,
                                  next_n: int | None = None) -> torch.Tensor:
    """DeepGEMM's signature; returns int32 ``[num_sms + 1, 2]`` zeros, a placeholder (the
    generated kernel then computes its schedule on the device).

    dsagen extension: with ``block_table`` (int32 ``[B, max_pages]``) and ``max_context_len``
    also given, returns the decode step's schedule instead (int32 ``[device SMs, 136]``,
    :meth:`dsagen.ops.Ops.paged_logits_schedule`), which ``fp8_paged_mqa_logits`` passes to
    the kernel: 0.5-1.6 us less per call at small shapes on the H200, the same bits. ``next_n``
    defaults to ``context_lens.shape[1]`` for 2-D ``context_lens``, else 1. Make it again when
    ``context_lens`` or ``block_table`` change.

    ``num_sms`` only sizes the placeholder: a dsagen schedule always has one row per SM of
    ``block_table``'s device (``[0, 136]`` on the CPU backend, whose kernel needs none).

    Args:
        context_lens: int32 ``[B]`` or ``[B, next_n]`` (the placeholder is made on its device).
        block_kv: tokens per page; must be the spec's ``page_size`` (64 for the default spec).
        num_sms: rows of the placeholder, less one.
    Raises:
        ValueError: ``block_kv`` differs from the spec's page size, or only one of
            ``block_table`` and ``max_context_len`` is given.
        RuntimeError: (with ``block_table``) the shapes do not match the spec's ops.
        TypeError: (with ``block_table``) ``max_context_len`` is not an integer.
        dsagen.jit.BuildError: the first call builds the ops and the build fails.
        FileNotFoundError: no :func:`use_spec` yet and ``specs/fp8_e4m3_page64.yaml`` is not
            beside the package.
    """
    ops = _ops()
    if block_kv != ops.spec.page_size:
        raise ValueError(f"block_kv={block_kv} but the loaded spec has page_size {ops.spec.page_size}")
    if (block_table is None) != (max_context_len is None):
        raise ValueError("give both block_table and max_context_len (a dsagen schedule) or neither "
                         "(DeepGEMM's placeholder)")
    if block_table is None:
        return torch.zeros(num_sms + 1, 2, dtype=torch.int32, device=context_lens.device)
    if next_n is None:
        next_n = int(context_lens.shape[1]) if context_lens.dim() == 2 else 1
    return ops.paged_logits_schedule(context_lens, block_table, next_n, max_context_len)


def fp8_paged_mqa_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                         context_lens: torch.Tensor, block_table: torch.Tensor,
                         schedule_meta: torch.Tensor, max_context_len: int,
                         clean_logits: bool = False) -> torch.Tensor:
    """DeepGEMM ``fp8_paged_mqa_logits`` signature and semantics.

    Args:
        q: ``[B, next_n, num_heads, head_dim]`` (e4m3 for the fp8 layout).
        kv_cache: uint8 ``[num_pages, page_size, 1, bytes_per_token]`` (DeepGEMM's view; any
            element type whose last dimension holds ``bytes_per_token`` bytes, e.g. bf16
            ``[num_pages, 64, 1, 128]`` for bf16_page64) or uint8 ``[num_pages, page_bytes]``.
        weights: fp32 ``[B*next_n, num_heads]``; context_lens int32 ``[B]`` or ``[B, next_n]``;
        block_table: int32 ``[B, max_pages]``; schedule_meta: what
            :func:`get_paged_mqa_logits_metadata` returned (a dsagen schedule is passed to the
            kernel; DeepGEMM's placeholder shape is ignored).
        max_context_len: columns of the result (tokens), at most ``max_pages * page_size``.
        clean_logits: write ``-inf`` where a key is not visible (DeepGEMM's default False:
            those entries are then unspecified).
    Returns:
        fp32 ``[B*next_n, max_context_len]``.
    Raises:
        ValueError: a 4-D ``kv_cache`` whose last three dimensions are not ``page_size, 1``
            and ``bytes_per_token`` bytes, or that is not contiguous, or a spec with padded
            pages (``page_stride_bytes``), which that view cannot hold.
        RuntimeError, TypeError: what :meth:`dsagen.ops.Ops.paged_logits` raises for the inputs.
        dsagen.jit.BuildError: the first call builds the ops and the build fails.
        FileNotFoundError: as :func:`get_paged_mqa_logits_metadata`.
    """
    ops = _ops()
    spec = ops.spec
    if kv_cache.dim() == 4:
        if spec.page_bytes != spec.page_size * spec.bytes_per_token:
            raise ValueError(f"{spec.name}: page_stride_bytes {spec.page_bytes} pads the pages, which "
                             f"DeepGEMM's [num_pages, {spec.page_size}, 1, {spec.bytes_per_token}] view "
                             f"cannot express; pass kv_cache as uint8 [num_pages, {spec.page_bytes}]")
        esize = kv_cache.element_size()
        if (tuple(kv_cache.shape[1:3]) != (spec.page_size, 1)
                or kv_cache.shape[3] * esize != spec.bytes_per_token):
            raise ValueError(f"kv_cache must be uint8 [num_pages, {spec.page_size}, 1, {spec.bytes_per_token}] "
                             f"(or another element type holding {spec.bytes_per_token} bytes per token), "
                             f"got {kv_cache.dtype} {list(kv_cache.shape)}")
        if not kv_cache.is_contiguous():
            raise ValueError("kv_cache: a 4-D view must be contiguous")
        kv_cache = kv_cache.view(torch.uint8).reshape(kv_cache.shape[0], spec.page_bytes)
    from .ops import SCHEDULE_ROW
    schedule = (schedule_meta if schedule_meta is not None and schedule_meta.dim() == 2
                and schedule_meta.shape[1] == SCHEDULE_ROW else None)
    return ops.paged_logits(q, kv_cache, weights, context_lens, block_table, max_context_len, clean_logits,
                            schedule=schedule)


def fp8_mqa_logits(q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor | None], weights: torch.Tensor,
                   cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor,
                   clean_logits: bool = True) -> torch.Tensor:
    """DeepGEMM ``fp8_mqa_logits`` signature and semantics (prefill over contiguous keys).

    Args:
        q: ``[S, num_heads, head_dim]`` (e4m3 for the fp8 layout).
        kv: ``(k [N, head_dim]`` in the key dtype, ``k_scale`` fp32 ``[N]`` or
            ``[N, scales_per_token]``) -- e.g. from :meth:`dsagen.serving.IndexerKCache.gather`
            (which gives ``[N, scales_per_token]``; e2m1 keys as uint8 ``[N, head_dim/2]``);
            ``k_scale`` None for bf16 keys.
        weights: fp32 ``[S, num_heads]``.
        cu_seqlen_ks, cu_seqlen_ke: int32 ``[S]``: query ``s`` sees keys ``[ks[s], ke[s])``.
        clean_logits: ``-inf`` outside the range.
    Returns:
        fp32 ``[S, N]``.
    Raises:
        TypeError: ``kv`` is not a pair ``(k, k_scale)`` (e.g. a bare tensor).
        RuntimeError: what :meth:`dsagen.ops.Ops.ragged_logits` raises for the inputs (and
            TypeError for a ``clean_logits`` that is not a bool).
        dsagen.jit.BuildError: the first call builds the ops and the build fails.
        FileNotFoundError: as :func:`get_paged_mqa_logits_metadata`.
    """
    if not isinstance(kv, (tuple, list)) or len(kv) != 2:
        raise TypeError(f"fp8_mqa_logits: kv must be the pair (k, k_scale) (k_scale None for unscaled "
                        f"keys), got {type(kv).__name__}" + (f" of {len(kv)}" if isinstance(kv, (tuple, list)) else ""))
    k, k_scale = kv
    return _ops().ragged_logits(q, k, k_scale, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits)
