"""Serving-side helpers: a multi-layer indexer key pool and a deterministic top-k.

``IndexerKCache`` holds every layer's pages in one allocation (plus one for the scales of a
``scale.placement: separate`` spec); each layer's view carries its own byte offset, so layer ``l``
reads its own keys and scales (a public bug had every layer > 0 read layer 0's scales, invisible
until the context exceeded ``index_topk``).
"""
from __future__ import annotations

import torch

from . import reference as R
from .ops import _int_arg
from .spec import Spec

__all__ = ["IndexerKCache", "topk"]


def _same_kernels(a, b: Spec) -> bool:
    """Whether ops built for spec ``a`` serve a pool of spec ``b``: the same byte layout,
    element types, head_dim and heads, and every next_n of ``b`` (name, description and
    targets aside)."""
    if not isinstance(a, Spec):
        return False
    same = lambda s: (s.layout, s.head_dim, s.num_heads, s.key_dtype, s.scale_dtype,  # noqa: E731
                      s.scale_rounding, s.scale_block, s.scale_placement, s.page_bytes, s.scale_page_bytes)
    return same(a) == same(b) and set(b.next_n) <= set(a.next_n)


class IndexerKCache:
    """Indexer key cache of ``num_layers`` layers, ``num_pages`` pages each, one allocation.

    Args:
        spec: the layout (a :class:`dsagen.Spec` or a YAML path).
        num_layers, num_pages: pool size. Each layer starts on a 256-byte boundary (the sm_90a
            kernel's 16-byte cp.async loads need it; an unaligned layer would take the slow
            portable kernel), so ``pool`` has ``num_layers * layer_stride`` bytes with
            ``layer_stride = num_pages * spec.page_bytes`` rounded up to a multiple of 256.
            A ``separate`` spec has a second allocation ``scale_pool`` for the scales,
            ``num_layers * scale_layer_stride`` bytes (``num_pages * spec.scale_page_bytes``
            rounded up to 256), with per-layer views :meth:`layer_scales`; otherwise
            ``scale_pool`` is None.
        device: where the pool lives (the ops are loaded in ``__init__`` with
            ``dsagen.load(spec)``, which builds the CPU kernels and, where the current CUDA
            device matches one of the spec's targets, the CUDA kernels, or finds them in the
            cache). A CUDA pool whose ops have no CUDA kernels (no target matches the
            device) is refused with a RuntimeError.
        ops: already loaded ops (default: ``dsagen.load(spec)``) of a spec with the same byte
            layout, element types, head_dim and heads, and every next_n of ``spec`` (its name,
            description and targets may differ).
    Raises:
        TypeError: ``num_layers`` or ``num_pages`` is not an integer.
        ValueError: ``num_layers`` or ``num_pages`` < 1, or ``ops`` built for a spec that
            differs in any of those.
        RuntimeError: a CUDA ``device`` with ops that have no CUDA kernels.
        dsagen.SpecError: a bad spec file. dsagen.jit.BuildError: the build fails. Otherwise
            what :func:`dsagen.load` raises (e.g. ``dsagen.jit.CaptureError`` during CUDA-graph
            capture).
    """

    def __init__(self, spec, num_layers: int, num_pages: int, device="cpu", ops=None):
        from . import load
        from .spec import load_spec
        self.spec: Spec = spec if isinstance(spec, Spec) else load_spec(spec)
        num_layers, num_pages = _int_arg("num_layers", num_layers), _int_arg("num_pages", num_pages)
        if num_layers < 1 or num_pages < 1:
            raise ValueError(f"num_layers and num_pages must be >= 1, got {num_layers} and {num_pages}")
        self.num_layers, self.num_pages = num_layers, num_pages
        if ops is not None and not _same_kernels(getattr(ops, "spec", None), self.spec):
            raise ValueError(f"ops: built for spec {getattr(getattr(ops, 'spec', None), 'name', ops)!r}, "
                             f"not for {self.spec.name!r}: its layout, element types, heads or next_n differ")
        self.ops = ops if ops is not None else load(self.spec)
        if (device is not None and torch.device(device).type == "cuda"
                and not getattr(self.ops, "has_cuda", True)):
            ops_spec = getattr(self.ops, "spec", self.spec)
            raise RuntimeError(f"device={str(device)!r}: the ops of {ops_spec.name} have no CUDA kernels "
                               f"(built with with_cuda=False, or its targets "
                               f"{', '.join(ops_spec.targets)} do not match this process's CUDA device)")
        self.layer_stride = -(-num_pages * self.spec.page_bytes // 256) * 256
        self.pool = torch.zeros(num_layers * self.layer_stride, dtype=torch.uint8, device=device)
        self.scale_layer_stride = -(-num_pages * self.spec.scale_page_bytes // 256) * 256
        self.scale_pool = (torch.zeros(num_layers * self.scale_layer_stride, dtype=torch.uint8, device=device)
                           if self.spec.separate_scales else None)

    @property
    def nbytes(self) -> int:
        """Bytes of the pool (and of the scale pool of a separate spec)."""
        return self.pool.numel() + (0 if self.scale_pool is None else self.scale_pool.numel())

    @property
    def bytes_per_token(self) -> int:
        """Key plus scale bytes of one token (``spec.bytes_per_token``): 132 for
        fp8_e4m3_page64, 256 for bf16_page64. For a ``separate`` spec this includes the scales
        kept in ``scale_pool``; its bytes per token in ``pool`` are
        ``spec.cache_bytes_per_token``."""
        return self.spec.bytes_per_token

    def _layer_index(self, layer) -> int:
        """``layer`` as an int in ``[0, num_layers)``: TypeError for a non-integer (a bool, a
        float), IndexError outside the range."""
        i = _int_arg("layer", layer)
        if not 0 <= i < self.num_layers:
            raise IndexError(f"layer {layer} not in [0, {self.num_layers})")
        return i

    def layer(self, layer: int) -> torch.Tensor:
        """uint8 ``[num_pages, page_bytes]`` view of one layer (contiguous, its own offset).
        Raises IndexError for a layer outside ``[0, num_layers)``, TypeError for one that is
        not an integer."""
        layer = self._layer_index(layer)
        start = layer * self.layer_stride
        return self.pool[start:start + self.num_pages * self.spec.page_bytes].view(
            self.num_pages, self.spec.page_bytes)

    def layer_scales(self, layer: int) -> torch.Tensor | None:
        """uint8 ``[num_pages, scale_page_bytes]`` view of one layer's scales (contiguous, its own
        offset in ``scale_pool``) for a ``separate`` spec; None for the other placements.
        Raises IndexError for a layer outside ``[0, num_layers)``, TypeError for one that is
        not an integer."""
        layer = self._layer_index(layer)
        if self.scale_pool is None:
            return None
        start = layer * self.scale_layer_stride
        n = self.num_pages * self.spec.scale_page_bytes
        return self.scale_pool[start:start + n].view(self.num_pages, self.spec.scale_page_bytes)

    def store(self, layer: int, k: torch.Tensor, loc: torch.Tensor) -> None:
        """Quantize ``k [N, head_dim]`` (bf16, fp16 or fp32) into slots ``loc [N]`` (int64,
        ``page * page_size + offset``, distinct) of ``layer``.

        Raises:
            IndexError: ``layer`` out of range. TypeError: ``layer`` not an integer.
            RuntimeError: what :meth:`dsagen.ops.Ops.store` raises for the inputs.
        """
        self.ops.store(k, self.layer(layer), loc, self.layer_scales(layer))

    def paged_logits(self, layer: int, q, weights, context_lens, block_table, max_context_len: int,
                     clean_logits: bool = True, out: torch.Tensor | None = None,
                     schedule: torch.Tensor | None = None) -> torch.Tensor:
        """Decode logits of ``layer`` (DeepGEMM ``fp8_paged_mqa_logits`` semantics; shapes as in
        :meth:`dsagen.ops.Ops.paged_logits`). ``out``, if given (fp32 ``[B*next_n,
        max_context_len]``), receives a copy of the result (the op still allocates its own);
        ``schedule`` is this step's :meth:`schedule` (optional; the same result).

        Raises:
            IndexError: ``layer`` out of range. TypeError: ``layer`` or ``max_context_len`` not
                an integer, ``clean_logits`` not a bool. RuntimeError: what
                :meth:`dsagen.ops.Ops.paged_logits` raises, or ``out`` is not fp32
                ``[B*next_n, max_context_len]`` on ``q``'s device (checked before the call; no
                broadcast or dtype conversion into it).
        """
        if out is not None and q.dim() == 4:   # (a q of another rank: the op's own error names q)
            want = (q.shape[0] * q.shape[1], _int_arg("max_context_len", max_context_len))
            if out.dtype != torch.float32 or tuple(out.shape) != want or out.device != q.device:
                raise RuntimeError(f"paged_logits: out must be fp32 {list(want)} "
                                   f"on {q.device}, got {out.dtype} {list(out.shape)} on {out.device}")
        res = self.ops.paged_logits(q, self.layer(layer), weights, context_lens, block_table,
                                    max_context_len, clean_logits, self.layer_scales(layer), schedule)
        if out is not None:
            out.copy_(res)
            return out
        return res

    def schedule(self, context_lens, block_table, next_n: int, max_context_len: int) -> torch.Tensor:
        """The decode step's paged-logits schedule, made once and passed to every layer's
        :meth:`paged_logits` (:meth:`dsagen.ops.Ops.paged_logits_schedule`; the role of
        DeepGEMM's ``get_paged_mqa_logits_metadata``).

        Args:
            context_lens: int32 ``[B]`` or ``[B, next_n]``.
            block_table: int32 ``[B, max_pages]``.
            next_n, max_context_len: those of the step's :meth:`paged_logits` calls.
        Returns:
            int32 ``[num_sms, 136]`` on CUDA, ``[0, 136]`` on the CPU backend.
        Raises:
            RuntimeError: next_n not in the spec, or shapes, dtypes or devices wrong.
            TypeError: ``next_n`` or ``max_context_len`` not an integer.
        """
        return self.ops.paged_logits_schedule(context_lens, block_table, next_n, max_context_len)

    def gather(self, layer: int, block_table: torch.Tensor, cu_seq_lens: torch.Tensor):
        """Contiguous keys of requests for prefill, in the form :meth:`ragged_logits` takes.

        Args:
            layer: which layer, in ``[0, num_layers)``.
            block_table: int32 ``[B, max_pages]`` (or more rows: only the first ``B`` are read).
            cu_seq_lens: int ``[B+1]`` prefix sums of the requests' lengths (tokens).
        Returns:
            ``(k [S, head_dim]`` in the key dtype (e2m1: uint8 ``[S, head_dim/2]`` packed),
            ``k_scale [S, scales_per_token]`` fp32 or None), ``S = cu_seq_lens[-1]``, requests
            one after another. (Reads ``cu_seq_lens[-1]`` and whether every page id read is
            valid on the host: a prefill-side call, not part of a captured decode step.)
        Raises:
            ValueError: ``block_table`` is not 2-D, ``cu_seq_lens`` is not a 1-D integer tensor
                of ``B+1`` prefix sums (from 0, non-decreasing) with ``B`` at most
                ``block_table``'s rows (request ``b`` reads row ``b``; rows past ``B``, such as a
                padded max-batch table's, are not read),
                a page id that a request's keys need is not in ``[0, num_pages)`` (such as the -1
                that pads block tables), or a request's keys run past ``block_table``'s columns.
            IndexError: ``layer`` out of range. TypeError: ``layer`` not an integer.
        """
        ps = self.spec.page_size
        if block_table.dim() != 2:
            raise ValueError(f"gather: block_table must be [B, max_pages], got {tuple(block_table.shape)}")
        rows = block_table.shape[0]
        if (not R._is_integer_tensor(cu_seq_lens) or cu_seq_lens.dim() != 1
                or not 1 <= cu_seq_lens.shape[0] <= rows + 1):
            raise ValueError(f"gather: cu_seq_lens must be an integer [B+1] tensor, 1 <= B+1 <= {rows + 1} "
                             f"(prefix sums of the lengths of the first B of block_table's {rows} rows), "
                             f"got {cu_seq_lens.dtype} {tuple(cu_seq_lens.shape)}")
        cu = cu_seq_lens.to(torch.int64)
        if int(cu[0]) != 0 or bool((cu[1:] < cu[:-1]).any()):
            raise ValueError(f"gather: cu_seq_lens must start at 0 and never decrease (prefix sums of "
                             f"lengths), got {cu.tolist() if len(cu) <= 16 else cu}")
        lens = cu[1:] - cu[:-1]
        b = torch.repeat_interleave(torch.arange(len(lens), device=cu.device), lens)
        j = torch.arange(int(cu[-1]), device=cu.device) - cu[:-1][b]
        if len(j) and int((j // ps).max()) >= block_table.shape[1]:
            raise ValueError(f"gather: a request needs {int((j // ps).max()) + 1} pages, block_table has "
                             f"{block_table.shape[1]} columns")
        pages = block_table.to(torch.int64)[b, j // ps]
        if len(pages) and bool(((pages < 0) | (pages >= self.num_pages)).any()):
            bad = int(pages[(pages < 0) | (pages >= self.num_pages)][0])
            raise ValueError(f"gather: block_table holds page id {bad} where a request's keys are "
                             f"read; page ids must be in [0, {self.num_pages})")
        slots = pages * ps + j % ps
        raw = R.read_key_bytes(self.layer(layer), slots, self.spec)
        k = raw if self.spec.key_dtype == "e2m1" else raw.view(self.spec.key.torch_dtype)
        return k, R.read_scales(self.layer(layer), slots, self.spec, self.layer_scales(layer))

    def ragged_logits(self, q, k, k_scale, weights, ks, ke, clean_logits: bool = True):
        """Prefill logits over keys from :meth:`gather` (DeepGEMM ``fp8_mqa_logits`` semantics;
        :meth:`dsagen.ops.Ops.ragged_logits`): ``q [S, num_heads, head_dim]`` in
        ``spec.query``, ``k``/``k_scale`` as :meth:`gather` returns them, fp32 ``weights [S,
        num_heads]``, int32 ``ks``/``ke [S]`` key ranges. Returns fp32 ``[S, N]``. No layer
        argument: the keys are already gathered. Raises RuntimeError where shapes, dtypes or
        devices do not match the spec, TypeError where ``clean_logits`` is not a bool."""
        return self.ops.ragged_logits(q, k, k_scale, weights, ks, ke, clean_logits)


def _describe(x) -> str:
    """``dtype [shape]`` of a tensor, else the type's name (for error messages)."""
    return f"{x.dtype} {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__


def topk(logits: torch.Tensor, lengths: torch.Tensor, index_topk: int) -> torch.Tensor:
    """Token indices of the ``index_topk`` largest logits of each row, deterministically.

    Args:
        logits: fp32 ``[rows, max_len]``; entries at ``j >= lengths[row]`` are ignored
            (``clean_logits=False`` output is fine), ``-inf`` and NaN entries are never selected.
        lengths: int ``[rows]`` valid keys per row.
        index_topk: how many to keep (512, 1024, 2048 in DeepSeek V3.2), at least 1.
    Returns:
        int32 ``[rows, index_topk]``, best first; ties go to the smaller index; ``-1`` pads rows
        with fewer valid keys (an all ``-inf`` row is all ``-1``). No host synchronization.
    Raises:
        ValueError: ``logits`` is not a 2-D floating-point tensor, ``lengths`` is not an integer
            ``[rows]`` tensor, or ``index_topk`` < 1.
    """
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"topk: logits must be a floating-point [rows, max_len] tensor, got "
                         f"{_describe(logits)}")
    rows, n = logits.shape
    if not R._is_integer_tensor(lengths) or tuple(lengths.shape) != (rows,):
        raise ValueError(f"topk: lengths must be an integer [{rows}] tensor (one per logits row), got "
                         f"{_describe(lengths)}")
    try:
        k = _int_arg("index_topk", index_topk)    # int, numpy and one-element torch integers
    except TypeError:
        k = 0
    if k < 1:
        raise ValueError(f"topk: index_topk={index_topk!r} must be an integer >= 1")
    index_topk = k
    j = torch.arange(n, device=logits.device)
    x = logits.masked_fill((j[None, :] >= lengths.to(logits.device)[:, None].long()) | torch.isnan(logits),
                           float("-inf"))
    if n < index_topk:
        x = torch.cat([x, x.new_full((rows, index_topk - n), float("-inf"))], 1)
    vals, idx = torch.sort(x, dim=1, descending=True, stable=True)
    vals, idx = vals[:, :index_topk], idx[:, :index_topk]
    return torch.where(torch.isneginf(vals), torch.full_like(idx, -1), idx).to(torch.int32)
