"""Pure-PyTorch reference of every dsagen op (CPU and CUDA).

Semantics are those of DESIGN.md section 2: DeepGEMM's ``fp8_paged_mqa_logits`` for the logits,
DeepGEMM's tests / sglang's fused store for the quantization. All byte addressing goes through
:attr:`dsagen.spec.Spec.layout`, the same integers the generated kernels are rendered from, in
one function (``_offsets``).

Scales live in ``kv_cache`` (``scale.placement`` ``page_tail`` / ``interleaved``) or, for
``separate``, in their own tensor ``kv_scales``, uint8 ``[num_pages, spec.scale_page_bytes]``
(token ``t`` of a page at bytes ``t * scale_bytes_per_token``), passed as ``kv_scales=`` to every
function that writes or reads scales. ``kv_scales`` is required for a separate spec and refused
(ValueError) for the others.
"""
from __future__ import annotations

import torch

from . import dtypes
from .spec import Spec

__all__ = [
    "new_cache", "new_scales", "quantize", "store", "read_tokens", "dequantize", "paged_logits",
    "read_key_bytes", "read_scales", "key_storage", "decode_keys", "ragged_logits",
    "valid_mask", "fallback_paged_logits", "calc_diff",
]


def new_cache(spec: Spec, num_pages: int, device="cpu") -> torch.Tensor:
    """A zeroed ``kv_cache`` for ``num_pages`` pages: uint8 ``[num_pages, spec.page_bytes]``
    (keys only for ``separate`` placement: see :func:`new_scales`)."""
    return torch.zeros(num_pages, spec.page_bytes, dtype=torch.uint8, device=device)


def new_scales(spec: Spec, num_pages: int, device="cpu") -> torch.Tensor | None:
    """A zeroed ``kv_scales`` for ``num_pages`` pages of a ``separate`` spec: uint8
    ``[num_pages, spec.scale_page_bytes]``; None for the other placements (scales in kv_cache)."""
    if not spec.separate_scales:
        return None
    return torch.zeros(num_pages, spec.scale_page_bytes, dtype=torch.uint8, device=device)


def _scale_tensor(spec: Spec, kv_cache: torch.Tensor, kv_scales: torch.Tensor | None) -> torch.Tensor:
    """The tensor that holds the scales: ``kv_scales`` for ``separate`` placement (required),
    else ``kv_cache`` (``kv_scales`` must be None). Raises ValueError with what to pass."""
    if spec.separate_scales:
        if kv_scales is None:
            raise ValueError(f"{spec.name}: scale.placement is separate: pass kv_scales, uint8 "
                             f"[num_pages, {spec.scale_page_bytes}]")
        if kv_scales.dtype != torch.uint8 or kv_scales.dim() != 2 or kv_scales.shape[1] != spec.scale_page_bytes:
            raise ValueError(f"{spec.name}: kv_scales must be uint8 [num_pages, {spec.scale_page_bytes}], "
                             f"got {kv_scales.dtype} {list(kv_scales.shape)}")
        return kv_scales
    if kv_scales is not None:
        raise ValueError(f"{spec.name}: kv_scales is only for scale.placement separate; this layout "
                         f"({spec.scale_placement}) keeps its scales in kv_cache: pass kv_scales=None")
    return kv_cache


def _is_integer_tensor(t) -> bool:
    """Whether ``t`` is a tensor of integers (any int or uint dtype; not float, complex or bool),
    as index and length arguments must be."""
    return isinstance(t, torch.Tensor) and not (t.is_floating_point() or t.is_complex()
                                                or t.dtype == torch.bool)


def _pow2_ceil(s: torch.Tensor) -> torch.Tensor:
    """Exact ``2**ceil(log2(s))`` for positive float32 ``s`` (no libm rounding involved)."""
    m, e = torch.frexp(s)
    return torch.where(m == 0.5, s, torch.ldexp(torch.ones_like(s), e))


def _e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """uint8 E2M1 codes (sign in bit 3) of float32 ``x``: round to nearest, ties to the even
    code, saturating at 6. The thresholds are the midpoints of the grid 0, .5, 1, 1.5, 2, 3, 4, 6."""
    a = x.abs()
    code = torch.zeros_like(a, dtype=torch.uint8)
    # (midpoint, tie goes up?) -- up exactly when the upper neighbour's code is even
    for i, (mid, up) in enumerate(((0.25, False), (0.75, True), (1.25, False), (1.75, True),
                                   (2.5, False), (3.5, True), (5.0, False))):
        code += ((a > mid) | ((a == mid) & up)).to(torch.uint8)
    return code | (torch.signbit(x).to(torch.uint8) << 3)


def _e2m1_values(code: torch.Tensor) -> torch.Tensor:
    """float32 values of uint8 E2M1 codes (``dtypes.E2M1_VALUES`` by magnitude code: ``c/2`` below 2,
    else ``2**((c>>1)-1) * (1 + (c&1)/2)``). Computed rather than looked up: a table built from
    a Python list on a CUDA device is a host-to-device copy, which synchronizes the host."""
    c = (code & 7).to(torch.int32)
    v = torch.where(c < 2, c.float() * 0.5, torch.ldexp(1.0 + (c & 1).float() * 0.5, (c >> 1) - 1))
    return torch.where((code & 8) != 0, -v, v)


def _e2m1_unpack(raw: torch.Tensor) -> torch.Tensor:
    """float32 ``[n, 2*bytes]`` values of packed uint8 ``[n, bytes]`` (low nibble first)."""
    return torch.stack((_e2m1_values(raw & 15), _e2m1_values(raw >> 4)), -1).reshape(raw.shape[0], 2 * raw.shape[1])


def quantize(k: torch.Tensor, spec: Spec) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Quantize keys the way the layout stores them.

    Args:
        k: ``[N, head_dim]`` bf16/fp16/fp32 keys.
        spec: the layout.
    Returns:
        ``(k_q [N, head_dim]``, ``scale [N, scales_per_token]`` float32 or None). ``k_q`` is in
        the key dtype, except e2m1: float32 holding the E2M1 grid values (exact).
        Per block of ``scale.block`` elements: ``amax = max(|k|, 1e-4)``, ``scale = amax / max``
        (max = 448 for e4m3, 6 for e2m1); ``pow2`` rounding (always for ue8m0 scales):
        ``2**ceil(log2(scale))``, DeepSeek V3.2's ue8m0 format; ``k_q = key_dtype(k / scale)``
        (round to nearest even, saturating). NaN elements are ignored by ``amax``; stored bytes
        are specified for finite keys (an inf element makes the block's scale inf, or 1.0 with
        ``pow2`` rounding, which ue8m0 scales always have).
    Raises:
        ValueError: ``k`` is not ``[N, head_dim]`` floating point. (The ue8m0 range check,
            ``2**-127 .. 2**127``, is :func:`store`'s.)
    """
    if k.dim() != 2 or k.shape[1] != spec.head_dim or not k.is_floating_point():
        raise ValueError(f"{spec.name}: k must be floating point [N, {spec.head_dim}], "
                         f"got {k.dtype} {list(k.shape)}")
    kd = spec.key
    if not spec.quantized:
        return k.to(kd.torch_dtype), None
    x = k.float().reshape(k.shape[0], spec.scales_per_token, spec.scale_block)
    a = x.abs()
    # NaN elements do not raise the scale (the kernels' fmaxf / std::max skip them)
    amax = torch.where(torch.isnan(a), torch.zeros_like(a), a).amax(-1).clamp(min=dtypes.AMAX_FLOOR)
    # (divided by a tensor on amax's device: PyTorch's CUDA division by a Python number
    # multiplies by its float32 reciprocal, which is not the correctly rounded quotient of
    # the CPU, the kernels and this docstring)
    scale = amax / amax.new_full((), kd.max_value)
    if spec.scale_rounding == "pow2":
        scale = _pow2_ceil(scale)
    y = x / scale[..., None]
    if kd.name == "e2m1":
        kq = _e2m1_values(_e2m1_codes(y)).reshape(k.shape[0], spec.head_dim)
    else:
        kq = y.to(kd.torch_dtype).reshape(k.shape[0], spec.head_dim)
    return kq, scale


def _key_bytes(kq: torch.Tensor, spec: Spec) -> torch.Tensor:
    """uint8 ``[N, key_bytes_per_token]`` storage of quantized keys (packs e2m1 nibbles)."""
    if kq.shape[0] == 0:       # (an empty tensor's strides cannot always be viewed as bytes)
        return torch.empty(0, spec.key_bytes_per_token, dtype=torch.uint8, device=kq.device)
    if spec.key.name == "e2m1":
        c = _e2m1_codes(kq.float())
        return c[:, 0::2] | (c[:, 1::2] << 4)
    return kq.contiguous().view(torch.uint8).reshape(kq.shape[0], -1)


def _scale_bytes(scale: torch.Tensor, spec: Spec, check: bool = True) -> torch.Tensor:
    """uint8 ``[N, scale_bytes_per_token]`` storage of float32 scales. ``check``: ValueError for
    a scale outside the ue8m0 range; on a CUDA tensor the check synchronizes the host."""
    if scale.shape[0] == 0:
        return torch.empty(0, spec.scale_bytes_per_token, dtype=torch.uint8, device=scale.device)
    if spec.scale_dtype == "ue8m0":
        _, e = torch.frexp(scale)          # scale = 0.5 * 2**e exactly (a power of two)
        biased = e.long() - 1 + 127
        if check and bool(((biased < 0) | (biased > 254)).any()):
            raise ValueError("scale outside the ue8m0 range 2**-127 .. 2**127")
        return biased.to(torch.uint8)
    return scale.contiguous().view(torch.uint8).reshape(scale.shape[0], -1)


def _offsets(spec: Spec, slots: torch.Tensor, check: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(first key byte in ``kv_cache``, first scale byte in the scale tensor) of each slot.
    ``check``: IndexError for a negative slot (it would index from the end: not a slot); on a
    CUDA tensor the check synchronizes the host."""
    lay = spec.layout
    slots = slots.long()
    if check and slots.numel() and bool((slots < 0).any()):
        raise IndexError(f"negative slot id {int(slots.min())}: slots are page * page_size + offset >= 0")
    page, off = slots // lay.page_size, slots % lay.page_size
    key = page * lay.page_stride + off * lay.key_token_stride
    scale = page * lay.scale_page_stride + lay.scale_base + off * lay.scale_token_stride
    return key, scale


def store(k: torch.Tensor, kv_cache: torch.Tensor, loc: torch.Tensor, spec: Spec,
          kv_scales: torch.Tensor | None = None) -> None:
    """Quantize ``k [N, head_dim]`` (bf16/fp16/fp32) and write token ``i`` to slot ``loc[i]``
    of ``kv_cache`` (uint8 ``[num_pages, page_bytes]``) in place, as :func:`quantize` and the
    layout say; the generated store kernels are checked against it.

    ``loc`` is int64 ``[N]`` slot ids (``page * page_size + offset``); slots must be distinct.
    Only the bytes of those slots change. ``kv_scales``: the scale tensor of a ``separate``
    spec (written in place; see the module docstring), None otherwise.

    Raises:
        ValueError: ``k`` is not floating point ``[N, head_dim]``, or ``loc`` is not ``[N]``
            integer slot ids; ``kv_scales`` missing for a separate spec or given for another; a ue8m0
            scale outside ``2**-127 .. 2**127`` (unreachable from finite keys), on CPU tensors (not
            checked on CUDA, where the check would synchronize the host).
        IndexError: a slot outside ``kv_cache`` (negative, or past its end) on CPU tensors
            (on CUDA a slot past the end fails with a device-side assert and a negative one is
            not checked).
    """
    flat = kv_cache.view(-1)
    sflat = _scale_tensor(spec, kv_cache, kv_scales).view(-1)
    kq, scale = quantize(k, spec)
    if not _is_integer_tensor(loc) or loc.dim() != 1 or loc.shape[0] != k.shape[0]:
        raise ValueError(f"{spec.name}: loc must be integer [N] = [{k.shape[0]}] slot ids, "
                         f"got {loc.dtype} {list(loc.shape)}")
    # (no negative-slot or ue8m0-range check on CUDA: each would synchronize the host in dsagen
    # bench's timed fallback store)
    on_cpu = kv_cache.device.type == "cpu"
    key_off, scale_off = _offsets(spec, loc.to(kv_cache.device), check=on_cpu)
    kb = spec.key_bytes_per_token
    idx = key_off[:, None] + torch.arange(kb, device=flat.device)
    flat[idx.reshape(-1)] = _key_bytes(kq, spec).reshape(-1).to(flat.device)
    if scale is not None:
        sb = spec.scale_bytes_per_token
        scale_off = scale_off.to(sflat.device)
        idx = scale_off[:, None] + torch.arange(sb, device=sflat.device)
        sflat[idx.reshape(-1)] = _scale_bytes(scale, spec, check=on_cpu).reshape(-1).to(sflat.device)


def read_key_bytes(kv_cache: torch.Tensor, slots: torch.Tensor, spec: Spec, *, _check: bool = True) -> torch.Tensor:
    """Stored key bytes of some slots: uint8 ``[n, key_bytes_per_token]`` on ``kv_cache``'s
    device. ``slots``: integer ``[n]`` slot ids (``page * page_size + offset``). Raises
    IndexError for a negative slot, and for one past ``kv_cache``'s end on CPU tensors (CUDA
    indexing fails with a device-side assert instead)."""
    flat = kv_cache.reshape(-1)
    key_off, _ = _offsets(spec, slots.to(flat.device), check=_check)
    return flat[key_off[:, None] + torch.arange(spec.key_bytes_per_token, device=flat.device)]


def key_storage(kq: torch.Tensor, scale: torch.Tensor | None, spec: Spec):
    """Quantized keys (:func:`quantize`: ``kq [N, head_dim]``, ``scale`` fp32
    ``[N, scales_per_token]`` or None) in the form ``ragged_logits`` takes: ``(k, k_scale)``,
    ``k`` in the key dtype ``[N, head_dim]`` (e2m1: packed uint8 ``[N, head_dim/2]``),
    ``k_scale`` fp32 ``[N]`` with one scale per token (DeepGEMM ``fp8_mqa_logits``' form),
    ``[N, scales_per_token]`` otherwise, or None."""
    k = _key_bytes(kq, spec) if spec.key.name == "e2m1" else kq
    if scale is not None and spec.scales_per_token == 1:
        scale = scale[:, 0].contiguous()
    return k, scale


def read_scales(kv_cache: torch.Tensor, slots: torch.Tensor, spec: Spec,
                kv_scales: torch.Tensor | None = None, *, _check: bool = True) -> torch.Tensor | None:
    """Stored scales of some slots: float32 ``[n, scales_per_token]``, or None (unscaled layout).
    ``slots``: integer ``[n]`` slot ids. ``kv_scales``: the scale tensor of a ``separate`` spec,
    None otherwise. ue8m0 bytes ``e`` decode to ``2**(e - 127)``.

    Raises:
        ValueError: ``kv_scales`` missing for a separate spec or given for another.
        IndexError: a negative slot, or one past the scale tensor's end on CPU tensors (CUDA
            indexing fails with a device-side assert instead).
    """
    flat = _scale_tensor(spec, kv_cache, kv_scales).reshape(-1)
    if not spec.quantized:
        return None
    _, scale_off = _offsets(spec, slots.to(flat.device), check=_check)
    sraw = flat[scale_off[:, None] + torch.arange(spec.scale_bytes_per_token, device=flat.device)]
    if spec.scale_dtype == "ue8m0":
        return torch.ldexp(torch.ones_like(sraw, dtype=torch.float32), sraw.long() - 127)
    return sraw.view(torch.float32)


def read_tokens(kv_cache: torch.Tensor, slots: torch.Tensor, spec: Spec,
                kv_scales: torch.Tensor | None = None, *, _check: bool = True):
    """Raw stored values of some slots: ``(k_q [n, head_dim]``, ``scale [n, scales_per_token]``
    float32 or None). ``k_q`` is in the key dtype (e2m1: float32 grid values, exact).
    ``slots``: integer ``[n]`` slot ids. ``kv_scales``: the scale tensor of a ``separate`` spec,
    None otherwise. Raises as :func:`read_scales` (ValueError, IndexError)."""
    raw = read_key_bytes(kv_cache, slots, spec, _check=_check)
    kq = _e2m1_unpack(raw) if spec.key.name == "e2m1" else raw.view(spec.key.torch_dtype)
    return kq, read_scales(kv_cache, slots, spec, kv_scales, _check=_check)


def dequantize(kv_cache: torch.Tensor, slots: torch.Tensor, spec: Spec,
               dtype: torch.dtype = torch.float32, kv_scales: torch.Tensor | None = None, *,
               _check: bool = True) -> torch.Tensor:
    """Keys of some slots as ``[n, head_dim]`` ``dtype`` (stored value times its scale, per
    block of ``scale.block`` elements). ``slots``: integer ``[n]`` slot ids. ``kv_scales``: the
    scale tensor of a ``separate`` spec, None otherwise. Raises as :func:`read_scales`
    (ValueError, IndexError)."""
    kq, sc = read_tokens(kv_cache, slots, spec, kv_scales, _check=_check)
    k = kq.to(dtype)
    if sc is not None:
        k = (k.view(k.shape[0], spec.scales_per_token, spec.scale_block) * sc.to(dtype)[..., None])
        k = k.view(-1, spec.head_dim)
    return k


def valid_mask(context_lens: torch.Tensor, next_n: int, max_context_len: int) -> torch.Tensor:
    """bool ``[B*next_n, max_context_len]``: which logits are defined (DESIGN.md section 2).

    1-D ``context_lens [B]``: row ``b*next_n+i`` sees key ``j`` iff ``j < ctx[b]`` and
    ``j <= ctx[b] - next_n + i``. 2-D ``context_lens [B, next_n]``: iff ``j < ctx[b, i]``
    (``next_n`` is then its second dimension; the argument is not used). Any integer dtype; the
    result is on ``context_lens``' device. Matches DeepGEMM ``fp8_paged_mqa_logits``' masking.
    """
    cl = context_lens.long()
    j = torch.arange(max_context_len, device=cl.device)
    if cl.dim() == 1:
        i = torch.arange(next_n, device=cl.device)
        bound = torch.minimum(cl[:, None], cl[:, None] - next_n + i[None, :] + 1)  # [B, next_n]
    else:
        bound = cl
    return (j[None, None, :] < bound[:, :, None]).reshape(bound.shape[0] * bound.shape[1], max_context_len)


def _check_logits_args(q, kv_cache, weights, context_lens, block_table, max_context_len, spec,
                       kv_scales=None):
    if q.dim() != 4 or q.shape[2] != spec.num_heads or q.shape[3] != spec.head_dim:
        raise ValueError(f"q must be [B, next_n, {spec.num_heads}, {spec.head_dim}], got {list(q.shape)}")
    B, next_n = q.shape[0], q.shape[1]
    if weights.shape != (B * next_n, spec.num_heads):
        raise ValueError(f"weights must be [{B * next_n}, {spec.num_heads}], got {list(weights.shape)}")
    if context_lens.shape not in ((B,), (B, next_n)):
        raise ValueError(f"context_lens must be [{B}] or [{B}, {next_n}], got {list(context_lens.shape)}")
    if block_table.dim() != 2 or block_table.shape[0] != B:
        raise ValueError(f"block_table must be [{B}, max_pages], got {list(block_table.shape)}")
    if kv_cache.dtype != torch.uint8 or kv_cache.dim() != 2 or kv_cache.shape[1] != spec.page_bytes:
        raise ValueError(f"kv_cache must be uint8 [num_pages, {spec.page_bytes}], got "
                         f"{kv_cache.dtype} {list(kv_cache.shape)}")
    if _scale_tensor(spec, kv_cache, kv_scales).shape[0] != kv_cache.shape[0]:
        raise ValueError(f"kv_scales must have kv_cache's {kv_cache.shape[0]} pages, got {kv_scales.shape[0]}")
    if max_context_len < 0:
        raise ValueError(f"max_context_len must be >= 0, got {max_context_len}")
    if max_context_len > block_table.shape[1] * spec.page_size:
        raise ValueError("max_context_len exceeds block_table capacity")


def _head_sum(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, sc: torch.Tensor | None,
              spec: Spec, magnitude: bool) -> torch.Tensor:
    """``scale * sum_h w[r, h] * relu(q[r, h] . k[n])`` as ``[R, N]`` from ``q [R, H, D]``, stored
    (unscaled) keys ``k [N, D]``, ``w [R, H]`` and scales ``sc [N, scales_per_token]`` or None,
    all in the compute dtype. Block scales dequantize the key first; one scale per token
    multiplies the sum (DESIGN.md section 2). ``magnitude``: the same over absolute values."""
    if sc is not None and spec.scales_per_token > 1:
        k = (k.view(k.shape[0], spec.scales_per_token, spec.scale_block)
             * sc[..., None]).view(k.shape[0], spec.head_dim)
    if magnitude:
        q, k, w = q.abs(), k.abs(), w.abs()
    s = torch.relu(torch.einsum("rhd,nd->rhn", q, k))
    s = (s * w[:, :, None]).sum(1)
    if sc is not None and spec.scales_per_token == 1:
        s = s * sc[:, 0][None, :]
    return s


def paged_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                 context_lens: torch.Tensor, block_table: torch.Tensor, max_context_len: int,
                 clean_logits: bool, spec: Spec,
                 compute_dtype: torch.dtype = torch.float32, magnitude: bool = False,
                 kv_scales: torch.Tensor | None = None) -> torch.Tensor:
    """Lightning-indexer paged logits, matching DeepGEMM ``fp8_paged_mqa_logits``.

    ``logits[b*next_n+i, j] = k_scale[j] * sum_h weights[b*next_n+i, h] * relu(q[b,i,h] . k_q[j])``
    (with several scales per token, ``scale.block < head_dim``: ``sum_h w * relu(q . k[j])`` of the
    dequantized key ``k[j] = k_q[j] * scale[j, d // block]``).

    Args:
        q: ``[B, next_n, num_heads, head_dim]`` in ``spec.query`` (e4m3 for e4m3 layouts, bf16
            for e2m1, else the key dtype).
        kv_cache: uint8 ``[num_pages, page_bytes]``.
        weights: fp32 ``[B*next_n, num_heads]``.
        context_lens: int32 ``[B]`` or ``[B, next_n]``.
        block_table: int32 ``[B, max_pages]`` page ids.
        max_context_len: columns of the result.
        clean_logits: invalid entries are ``-inf`` (the reference always writes ``-inf`` there).
        compute_dtype: float32 or float64; also the result's dtype.
        magnitude: instead of the logits, the same sums over absolute values,
            ``scale * sum_h |w| * sum_d |q * k|``: the size of the terms a logit is the sum of,
            which bounds its floating-point rounding error (the verifier's condition scale).
        kv_scales: uint8 ``[num_pages, scale_page_bytes]`` for a ``separate`` spec, else None.
    Returns:
        ``[B*next_n, max_context_len]`` logits.
    Raises:
        ValueError: shapes that do not match the spec, ``kv_cache`` not uint8
            ``[num_pages, page_bytes]``, ``max_context_len`` negative or past the block table's capacity,
            ``kv_scales`` missing for a separate spec or given for another. The other inputs'
            dtypes are not checked: they are converted to ``compute_dtype`` (a reference, not
            a kernel).
        IndexError: a page id a request reads outside ``kv_cache``.
    """
    _check_logits_args(q, kv_cache, weights, context_lens, block_table, max_context_len, spec,
                       kv_scales)
    B, next_n = q.shape[0], q.shape[1]
    dev = q.device
    out = torch.full((B * next_n, max_context_len), float("-inf"), dtype=compute_dtype, device=dev)
    cl = context_lens.to(dev).long()
    lens = cl if cl.dim() == 1 else cl.amax(1)
    ps = spec.page_size
    for b in range(B):
        L = int(min(int(lens[b]), max_context_len))
        if L <= 0:
            continue
        j = torch.arange(L, device=dev)
        slots = block_table[b].to(dev).long()[j // ps] * ps + j % ps
        kq, sc = read_tokens(kv_cache, slots, spec, kv_scales)
        out[b * next_n:(b + 1) * next_n, :L] = _head_sum(
            q[b].to(compute_dtype), kq.to(compute_dtype),
            weights[b * next_n:(b + 1) * next_n].to(compute_dtype),
            None if sc is None else sc.to(compute_dtype), spec, magnitude)
    if max_context_len > 0:
        out.masked_fill_(~valid_mask(cl, next_n, max_context_len), float("-inf"))
    return out


def decode_keys(k: torch.Tensor, spec: Spec) -> torch.Tensor:
    """Stored key values (unscaled) as float32 ``[N, head_dim]`` from their storage form: the key
    dtype ``[N, head_dim]``, or uint8 ``[N, key_bytes_per_token]`` (e2m1: packed nibbles).

    Raises:
        ValueError: ``k`` is neither form (e2m1: only the uint8 one).
    """
    if spec.key.name == "e2m1":
        if k.dtype != torch.uint8 or k.dim() != 2 or k.shape[1] != spec.key_bytes_per_token:
            raise ValueError(f"e2m1 keys must be uint8 [N, {spec.key_bytes_per_token}], got "
                             f"{k.dtype} {list(k.shape)}")
        return _e2m1_unpack(k)
    if k.dtype == torch.uint8:
        k = k.contiguous().view(spec.key.torch_dtype)
    if k.dtype != spec.key.torch_dtype or k.dim() != 2 or k.shape[1] != spec.head_dim:
        raise ValueError(f"keys must be {spec.key.torch_name} [N, {spec.head_dim}], got {k.dtype} {list(k.shape)}")
    return k.float()


def ragged_logits(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor | None,
                  weights: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, clean_logits: bool,
                  spec: Spec, compute_dtype: torch.dtype = torch.float32,
                  magnitude: bool = False) -> torch.Tensor:
    """Prefill (ragged) indexer logits over contiguous keys, DeepGEMM ``fp8_mqa_logits`` semantics.

    ``logits[s, n] = k_scale[n] * sum_h weights[s, h] * relu(q[s, h] . k[n])`` for
    ``ks[s] <= n < ke[s]``, ``-inf`` elsewhere (block scales: the key is dequantized first).

    Args:
        q: ``[S, num_heads, head_dim]`` in ``spec.query``.
        k: ``[N, head_dim]`` in the key dtype, or uint8 ``[N, key_bytes_per_token]`` (the only
            form for e2m1), as :meth:`dsagen.serving.IndexerKCache.gather` returns them.
        k_scale: fp32 ``[N]`` or ``[N, scales_per_token]``; None for unscaled layouts.
        weights: fp32 ``[S, num_heads]``.
        ks, ke: int32 ``[S]``: query ``s`` sees keys ``[ks[s], ke[s])``.
        clean_logits: the reference always writes ``-inf`` outside the range.
        compute_dtype: float32 or float64; also the result's dtype.
        magnitude: the sums over absolute values instead (see :func:`paged_logits`).
    Returns:
        ``[S, N]`` logits.
    Raises:
        ValueError: shapes that do not match the spec, ``k_scale`` missing or misshaped for a
            scaled layout, ``k`` neither the key dtype ``[N, head_dim]`` nor uint8
            ``[N, key_bytes_per_token]``. The other inputs' dtypes are converted to
            ``compute_dtype``, not checked.
    """
    if q.dim() != 3 or q.shape[1:] != (spec.num_heads, spec.head_dim):
        raise ValueError(f"q must be [S, {spec.num_heads}, {spec.head_dim}], got {list(q.shape)}")
    kf = decode_keys(k, spec)                       # checks k's forms
    S, N = q.shape[0], kf.shape[0]
    if weights.shape != (S, spec.num_heads) or ks.shape != (S,) or ke.shape != (S,):
        raise ValueError("weights must be [S, num_heads], ks and ke [S]")
    sc = None
    if spec.quantized:
        ok = ((N, spec.scales_per_token),) + (((N,),) if spec.scales_per_token == 1 else ())
        if k_scale is None or tuple(k_scale.shape) not in ok:
            raise ValueError(f"k_scale must be fp32 " + " or ".join(str(list(x)) for x in ok))
        sc = k_scale.reshape(N, spec.scales_per_token).to(compute_dtype)
    out = _head_sum(q.to(compute_dtype), kf.to(compute_dtype),
                    weights.to(compute_dtype), sc, spec, magnitude)
    n = torch.arange(N, device=q.device)
    valid = (n[None, :] >= ks.to(q.device).long()[:, None]) & (n[None, :] < ke.to(q.device).long()[:, None])
    return out.masked_fill(~valid, float("-inf"))


def fallback_paged_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                          context_lens: torch.Tensor, block_table: torch.Tensor,
                          max_context_len: int, spec: Spec,
                          kv_scales: torch.Tensor | None = None) -> torch.Tensor:
    """The plain-PyTorch serving fallback, batched (what a stack does without a kernel).

    Gathers whole pages with ``block_table`` (and their scale pages from ``kv_scales`` for a
    ``separate`` spec), dequantizes them to bf16, runs one batched GEMM, ``relu * weights``, sums
    heads, masks with ``-inf``. Same result as :func:`paged_logits` up to bf16 rounding; used as
    the speed baseline in ``dsagen bench``.

    Args: as :func:`paged_logits` (``q [B, next_n, num_heads, head_dim]``, uint8 ``kv_cache
    [num_pages, page_bytes]``, fp32 ``weights [B*next_n, num_heads]``, int32 ``context_lens
    [B]`` or ``[B, next_n]``, int32 ``block_table [B, max_pages]``), checked only as Raises says: it is a
    timing baseline. Returns fp32 ``[B*next_n, max_context_len]``.
    Raises:
        ValueError: ``kv_scales`` missing for a separate spec or given for another, or
            ``block_table`` narrower than ``max_context_len`` needs.
    """
    B, next_n, H, D = q.shape
    ps = spec.page_size
    P = (max_context_len + ps - 1) // ps
    home = _scale_tensor(spec, kv_cache, kv_scales)                 # checks kv_scales either way
    if block_table.dim() != 2 or block_table.shape[1] < P:
        raise ValueError(f"block_table must be [B, >= {P}] for max_context_len {max_context_len}, "
                         f"got {list(block_table.shape)}")
    ids = block_table[:, :P].long()
    pages = kv_cache[ids]                                           # [B, P, page_bytes]
    spages = home[ids] if spec.separate_scales else pages
    o = torch.arange(ps, device=q.device)
    # (the slots below are aranges, never negative: no check, which would synchronize the host
    # inside dsagen bench's timed fallback)
    key_in_page, scale_in_page = _offsets(spec, o, check=False)     # the slots of page 0
    if spec.key.name == "e2m1" or spec.scale_dtype == "ue8m0":
        # no torch dtype views these bytes: decode through the reference's reader
        slots = (torch.arange(B * P, device=q.device)[:, None] * ps + o).reshape(-1)
        k = dequantize(pages.reshape(B * P, pages.shape[-1]), slots, spec,
                       kv_scales=spages.reshape(B * P, spages.shape[-1]) if spec.separate_scales else None,
                       _check=False)
        keys = k.to(torch.bfloat16).view(B, P, ps, D)
    else:
        kidx = key_in_page[:, None] + torch.arange(spec.key_bytes_per_token, device=q.device)
        keys = pages[:, :, kidx].view(spec.key.torch_dtype).to(torch.bfloat16)   # [B, P, ps, D]
        if spec.quantized:
            sidx = scale_in_page[:, None] + torch.arange(spec.scale_bytes_per_token, device=q.device)
            sc = spages[:, :, sidx].view(torch.float32)             # [B, P, ps, scales]
            keys = (keys.view(B, P, ps, spec.scales_per_token, spec.scale_block)
                    * sc[..., None]).view(B, P, ps, D).to(torch.bfloat16)
    keys = keys.reshape(B, P * ps, D)
    s = torch.bmm(q.to(torch.bfloat16).reshape(B, next_n * H, D), keys.transpose(1, 2))
    s = torch.relu(s.float()).view(B, next_n, H, P * ps) * weights.view(B, next_n, H, 1)
    out = s.sum(2).reshape(B * next_n, P * ps)[:, :max_context_len]
    mask = valid_mask(context_lens, next_n, max_context_len)
    return out.masked_fill(~mask, float("-inf"))


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's similarity measure ``1 - 2*sum(x*y) / sum(x*x + y*y)`` in float64 (its tests'
    ``calc_diff``): 0 for identical inputs, and 0 where both are all zeros.

    ``x``, ``y``: tensors of one shape (or broadcastable), any float dtype; pass only the valid
    entries (an ``inf`` in either gives NaN). Returns a Python float. Nothing raised of its own.
    """
    x, y = x.double(), y.double()
    denom = (x * x + y * y).sum()
    if denom == 0:
        return 0.0
    return float(1 - 2 * (x * y).sum() / denom)
