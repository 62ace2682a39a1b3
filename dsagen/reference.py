"""Pure-PyTorch reference of every dsagen op (CPU and CUDA).

Semantics are those of DESIGN.md section 2: DeepGEMM's ``fp8_paged_mqa_logits`` for the logits,
DeepGEMM's tests / sglang's fused store for the quantization. All byte addressing goes through
:attr:`dsagen.spec.Spec.layout`, the same four integers the generated kernels are rendered from.
"""
from __future__ import annotations

import torch

from .spec import Spec

__all__ = [
    "new_cache", "quantize", "store", "read_tokens", "dequantize", "paged_logits",
    "valid_mask", "fallback_paged_logits", "calc_diff",
]


def new_cache(spec: Spec, num_pages: int, device="cpu") -> torch.Tensor:
    """A zeroed ``kv_cache`` for ``num_pages`` pages: uint8 ``[num_pages, spec.page_bytes]``."""
    return torch.zeros(num_pages, spec.page_bytes, dtype=torch.uint8, device=device)


def _pow2_ceil(s: torch.Tensor) -> torch.Tensor:
    """Exact ``2**ceil(log2(s))`` for positive float32 ``s`` (no libm rounding involved)."""
    m, e = torch.frexp(s)
    return torch.where(m == 0.5, s, torch.ldexp(torch.ones_like(s), e))


def quantize(k: torch.Tensor, spec: Spec) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Quantize keys the way the layout stores them.

    Args:
        k: ``[N, head_dim]`` bf16/fp16/fp32 keys.
        spec: the layout.
    Returns:
        ``(k_q [N, head_dim]`` in the key dtype, ``scale [N, scales_per_token]`` float32 or None).
        For e4m3: ``amax = max(|k|, 1e-4)`` per block, ``scale = amax / 448`` (``pow2`` rounding:
        ``2**ceil(log2(amax/448))``, DeepSeek V3.2's ue8m0 format), ``k_q = e4m3(k / scale)``.
    """
    kd = spec.key
    if not spec.quantized:
        return k.to(kd.torch_dtype), None
    x = k.float().reshape(k.shape[0], spec.scales_per_token, spec.scale_block)
    amax = x.abs().amax(-1).clamp(min=1e-4)
    scale = amax / kd.max_value
    if spec.scale_rounding == "pow2":
        scale = _pow2_ceil(scale)
    kq = (x / scale[..., None]).to(kd.torch_dtype).reshape(k.shape[0], spec.head_dim)
    return kq, scale


def _offsets(spec: Spec, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lay = spec.layout
    slots = slots.long()
    page, off = slots // lay.page_size, slots % lay.page_size
    key = page * lay.page_stride + off * lay.key_token_stride
    scale = page * lay.page_stride + lay.scale_base + off * lay.scale_token_stride
    return key, scale


def store(k: torch.Tensor, kv_cache: torch.Tensor, loc: torch.Tensor, spec: Spec) -> None:
    """Quantize ``k [N, head_dim]`` and write token ``i`` to slot ``loc[i]`` of ``kv_cache`` in place.

    ``loc`` is int64 ``[N]``; slots must be distinct. Only the bytes of those slots change.
    """
    flat = kv_cache.view(-1)
    kq, scale = quantize(k, spec)
    key_off, scale_off = _offsets(spec, loc.to(kv_cache.device))
    kb = spec.key_bytes_per_token
    idx = key_off[:, None] + torch.arange(kb, device=flat.device)
    flat[idx.reshape(-1)] = kq.contiguous().view(torch.uint8).reshape(-1).to(flat.device)
    if scale is not None:
        sb = spec.scale_bytes_per_token
        idx = scale_off[:, None] + torch.arange(sb, device=flat.device)
        flat[idx.reshape(-1)] = scale.contiguous().view(torch.uint8).reshape(-1).to(flat.device)


def read_tokens(kv_cache: torch.Tensor, slots: torch.Tensor, spec: Spec):
    """Raw stored values of some slots: ``(k_q [n, head_dim]`` key dtype, ``scale [n, s]`` fp32 or None)."""
    flat = kv_cache.reshape(-1)
    key_off, scale_off = _offsets(spec, slots.to(flat.device))
    kb = spec.key_bytes_per_token
    kq = flat[key_off[:, None] + torch.arange(kb, device=flat.device)].view(spec.key.torch_dtype)
    if not spec.quantized:
        return kq, None
    sb = spec.scale_bytes_per_token
    sc = flat[scale_off[:, None] + torch.arange(sb, device=flat.device)].view(torch.float32)
    return kq, sc


def dequantize(kv_cache: torch.Tensor, slots: torch.Tensor, spec: Spec,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Keys of some slots as ``[n, head_dim]`` ``dtype`` (stored value times its scale)."""
    kq, sc = read_tokens(kv_cache, slots, spec)
    k = kq.to(dtype)
    if sc is not None:
        k = (k.view(k.shape[0], spec.scales_per_token, spec.scale_block) * sc.to(dtype)[..., None])
        k = k.view(-1, spec.head_dim)
    return k


def valid_mask(context_lens: torch.Tensor, next_n: int, max_context_len: int) -> torch.Tensor:
    """bool ``[B*next_n, max_context_len]``: which logits are defined (DESIGN.md section 2).

    1-D ``context_lens [B]``: row ``b*next_n+i`` sees key ``j`` iff ``j < ctx[b]`` and
    ``j <= ctx[b] - next_n + i``. 2-D ``context_lens [B, next_n]``: iff ``j < ctx[b, i]``.
    """
    cl = context_lens.long()
    j = torch.arange(max_context_len, device=cl.device)
    if cl.dim() == 1:
        i = torch.arange(next_n, device=cl.device)
        bound = torch.minimum(cl[:, None], cl[:, None] - next_n + i[None, :] + 1)  # [B, next_n]
    else:
        bound = cl
    return (j[None, None, :] < bound[:, :, None]).reshape(-1, max_context_len)


def _check_logits_args(q, kv_cache, weights, context_lens, block_table, max_context_len, spec):
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
    if max_context_len > block_table.shape[1] * spec.page_size:
        raise ValueError("max_context_len exceeds block_table capacity")


def paged_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                 context_lens: torch.Tensor, block_table: torch.Tensor, max_context_len: int,
                 clean_logits: bool, spec: Spec,
                 compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Lightning-indexer paged logits, matching DeepGEMM ``fp8_paged_mqa_logits``.

    ``logits[b*next_n+i, j] = k_scale[j] * sum_h weights[b*next_n+i, h] * relu(q[b,i,h] . k_q[j])``

    Args:
        q: ``[B, next_n, num_heads, head_dim]`` (e4m3 for e4m3 layouts, else the key dtype).
        kv_cache: uint8 ``[num_pages, page_bytes]``.
        weights: fp32 ``[B*next_n, num_heads]``.
        context_lens: int32 ``[B]`` or ``[B, next_n]``.
        block_table: int32 ``[B, max_pages]`` page ids.
        max_context_len: columns of the result.
        clean_logits: invalid entries are ``-inf`` (the reference always writes ``-inf`` there).
        compute_dtype: float32 or float64; also the result's dtype.
    Returns:
        ``[B*next_n, max_context_len]`` logits.
    """
    _check_logits_args(q, kv_cache, weights, context_lens, block_table, max_context_len, spec)
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
        kq, sc = read_tokens(kv_cache, slots, spec)
        k = kq.to(compute_dtype)
        s = torch.relu(torch.einsum("ihd,jd->ihj", q[b].to(compute_dtype), k))
        s = (s * weights[b * next_n:(b + 1) * next_n].to(compute_dtype)[:, :, None]).sum(1)
        if sc is not None:
            s = s * sc[:, 0].to(compute_dtype)[None, :]
        out[b * next_n:(b + 1) * next_n, :L] = s
    if max_context_len > 0:
        out.masked_fill_(~valid_mask(cl, next_n, max_context_len), float("-inf"))
    return out


def fallback_paged_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                          context_lens: torch.Tensor, block_table: torch.Tensor,
                          max_context_len: int, spec: Spec) -> torch.Tensor:
    """The plain-PyTorch serving fallback, batched (what a stack does without a kernel).

    Gathers whole pages with ``block_table``, dequantizes them to bf16, runs one batched GEMM,
    ``relu * weights``, sums heads, masks with ``-inf``. Same result as :func:`paged_logits` up to
    bf16 rounding; used as the speed baseline in ``dsagen bench``. Returns fp32
    ``[B*next_n, max_context_len]``.
    """
    B, next_n, H, D = q.shape
    ps, lay = spec.page_size, spec.layout
    P = (max_context_len + ps - 1) // ps
    pages = kv_cache[block_table[:, :P].long()]                     # [B, P, page_bytes]
    o = torch.arange(ps, device=q.device)
    kidx = (o * lay.key_token_stride)[:, None] + torch.arange(spec.key_bytes_per_token, device=q.device)
    keys = pages[:, :, kidx].view(spec.key.torch_dtype).to(torch.bfloat16)   # [B, P, ps, D]
    if spec.quantized:
        sidx = (lay.scale_base + o * lay.scale_token_stride)[:, None] + torch.arange(4, device=q.device)
        sc = pages[:, :, sidx].view(torch.float32)                  # [B, P, ps, 1]
        keys = (keys * sc).to(torch.bfloat16)
    keys = keys.reshape(B, P * ps, D)
    s = torch.bmm(q.to(torch.bfloat16).reshape(B, next_n * H, D), keys.transpose(1, 2))
    s = torch.relu(s.float()).view(B, next_n, H, P * ps) * weights.view(B, next_n, H, 1)
    out = s.sum(2).reshape(B * next_n, P * ps)[:, :max_context_len]
    mask = valid_mask(context_lens, next_n, max_context_len)
    return out.masked_fill(~mask, float("-inf"))


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's similarity measure ``1 - 2*sum(x*y) / sum(x*x + y*y)`` in float64."""
    x, y = x.double(), y.double()
    denom = (x * x + y * y).sum()
    if denom == 0:
        return 0.0
    return float(1 - 2 * (x * y).sum() / denom)
