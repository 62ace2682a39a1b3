"""Indexer top-k recall of a key-cache layout (``dsagen recall``).

A layout quantizes the indexer keys (e4m3 with a per-token scale, bf16, ...), and an e4m3 layout
also quantizes the queries. The question a deployment asks is not "how large is the logit
error" but "does the indexer still pick the same tokens": this module stores keys through a
layout's generated ``store`` op, scores them with its ``paged_logits`` op, takes the top-k with
:func:`dsagen.serving.topk`, and compares it with the top-k of exact float64 logits of the
unquantized queries and keys.

Measures, per (layout, context length):

* **recall** of a query: ``|topk_layout & topk_exact| / min(index_topk, keys visible)``; the
  table reports the mean (and minimum) over the queries.
* **needle hit rate**: every synthetic query has one planted "needle" key whose exact logit is
  ``threshold + margin * std``, where ``threshold`` is the ``index_topk``-th largest exact logit
  of the other keys and ``std`` the standard deviation of the query's exact logits. The exact
  ranking always selects the needle (margin > 0); the hit rate is how often the layout's top-k
  still does, per margin (from strong, 1 std, to marginal, 0.0003 std).
* the first context length whose mean recall is below 99 % (or none).

Context and compression: the indexer scores ``keys = context // compress_ratio`` keys per query
(DeepSeek V4 compresses several tokens into one indexer key; V3.2 has one key per token,
``compress_ratio = 1``). DESIGN.md does not define a compression ratio; this is dsagen's reading.

Synthetic inputs (default) model the real indexer's: heavy-tailed elements (Student-t, 4 degrees
of freedom), a few outlier channels 5-20x larger than the rest in both q and k, a mean key
component, log-normal per-token key magnitudes, signed head weights scaled by ``H^-0.5 D^-0.5``,
and the orthonormal Hadamard rotation that DeepSeek V3.2 applies to q and k before quantizing
them (``rotate_activation``). Real inputs come from a safetensors dump (:func:`load_dump`).

Everything is seeded: the same seed, inputs and device give identical results.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from . import reference as R
from .serving import topk
from .spec import Spec

__all__ = [
    "DEFAULT_CONTEXTS", "DEFAULT_MARGINS", "DEFAULT_QUERIES", "Inputs", "hadamard",
    "synthetic_inputs", "plant_needles", "exact_logits", "load_dump", "quantize_queries",
    "layout_logits", "overlap_recall", "run_recall", "format_table", "plot", "write_outputs",
]

DEFAULT_CONTEXTS = (4096, 8192, 16384, 32768, 65536, 131072)
# bounds on the run's size (the exact float64 logits are [queries, heads, keys]); larger values
# are refused with a ValueError rather than left to fail in an allocation
MAX_KEYS = 1 << 20
MAX_INDEX_TOPK = 1 << 20
MAX_QUERIES = 1 << 14
DEFAULT_MARGINS = (1.0, 0.3, 0.1, 0.03, 0.01, 0.003, 0.001, 0.0003)
DEFAULT_QUERIES = 64
RECALL_TARGET = 0.99

# the synthetic distribution (recorded in recall.json)
SYNTH = {
    "element": "student_t(df=4)",
    "outlier_channels": "head_dim // 32 (min 2), magnitude log-uniform in [5, 20]",
    "key_mean": "normal(0, 0.5) * channel magnitude",
    "key_token_magnitude": "exp(normal(0, 0.25))",
    "weights": "normal(0, 1) * num_heads^-0.5 * head_dim^-0.5",
    "rotation": "orthonormal Hadamard on q and k (DeepSeek V3.2 rotate_activation)",
    "needle": ("best of 16 fresh keys (else of the haystack, else a direction built from the "
               "query), scaled so that its exact logit is threshold + margin * std"),
}


@dataclass
class Inputs:
    """Indexer inputs of one context length (all on the CPU).

    Attributes:
        q: float32 ``[T, H, D]`` unquantized queries (after the rotation).
        k: float32 ``[N, D]`` unquantized keys (after the rotation), the haystack.
        weights: float32 ``[T, H]`` head weights (no query scale folded in).
        lengths: int64 ``[T]`` keys visible to each query (1..N); key ``j`` is visible to query
            ``t`` iff ``j < lengths[t]``.
        needle_pos: int64 ``[T]`` position of query ``t``'s needle, or None (no needles).
        needle_k: float32 ``[T, D]`` the needle key that replaces ``k[needle_pos[t]]`` for query
            ``t`` only, or None.
        margin: float64 ``[T]`` the needle's margin in standard deviations, or None.
    """

    q: torch.Tensor
    k: torch.Tensor
    weights: torch.Tensor
    lengths: torch.Tensor
    needle_pos: torch.Tensor | None = None
    needle_k: torch.Tensor | None = None
    margin: torch.Tensor | None = None

    @property
    def num_queries(self) -> int:
        """Query rows (``q.shape[0]``)."""
        return self.q.shape[0]

    @property
    def num_keys(self) -> int:
        """Keys (tokens) scored per query (``k.shape[0]``)."""
        return self.k.shape[0]


def hadamard(n: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Orthonormal Sylvester Hadamard matrix ``[n, n]`` (symmetric, ``H @ H = I``).

    Raises:
        ValueError: ``n`` is not a power of two.
    """
    if n < 1 or n & (n - 1):
        raise ValueError(f"hadamard: {n} is not a power of two")
    h = torch.ones(1, 1, dtype=dtype)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


def _student_t(shape, gen: torch.Generator, df: int = 4) -> torch.Tensor:
    z = torch.randn(shape, generator=gen, dtype=torch.float64)
    chi2 = torch.randn((df, *shape), generator=gen, dtype=torch.float64).square().sum(0)
    return z / torch.sqrt(chi2 / df)


@dataclass
class _Model:
    """Channel structure shared by the queries and keys of one synthetic draw."""

    chan: torch.Tensor      # float64 [D] channel magnitudes (outliers 5-20, else 1)
    mean: torch.Tensor      # float64 [D] mean key component
    rot: torch.Tensor | None

    def keys(self, shape, gen: torch.Generator) -> torch.Tensor:
        """float64 ``[*shape, D]`` keys (rotated if the model rotates)."""
        D = self.chan.shape[0]
        k = self.mean + _student_t((*shape, D), gen) * self.chan
        k = k * torch.exp(0.25 * torch.randn((*shape, 1), generator=gen, dtype=torch.float64))
        return k @ self.rot if self.rot is not None else k


def _model(head_dim: int, gen: torch.Generator, rotate: bool) -> _Model:
    D = head_dim
    n_out = max(2, D // 32)
    chan = torch.ones(D, dtype=torch.float64)
    out = torch.randperm(D, generator=gen)[:n_out]
    chan[out] = torch.exp(math.log(5) + (math.log(20) - math.log(5)) *
                          torch.rand(n_out, generator=gen, dtype=torch.float64))
    mean = 0.5 * torch.randn(D, generator=gen, dtype=torch.float64) * chan
    return _Model(chan, mean, hadamard(D) if rotate else None)


def synthetic_inputs(num_keys: int, num_heads: int, head_dim: int, num_queries: int,
                     gen: torch.Generator, *, rotate: bool = True) -> tuple[Inputs, _Model]:
    """Model-like indexer queries, keys and weights (no needles yet; see :func:`plant_needles`).

    Args:
        num_keys: N, keys every query sees (>= 1).
        num_heads, head_dim: H and D (D a power of two when ``rotate``).
        num_queries: T (>= 1).
        gen: CPU generator; the draw is a function of its state only.
        rotate: apply the orthonormal Hadamard rotation to q and k (DeepSeek V3.2).
    Returns:
        ``(Inputs, model)``: float32 q ``[T, H, D]``, k ``[N, D]``, weights ``[T, H]``,
        lengths ``[T]`` all N; ``model`` draws more keys of the same distribution.
    Raises:
        ValueError: a size is < 1 or ``head_dim`` is not a power of two with ``rotate``.
    """
    if min(num_keys, num_heads, head_dim, num_queries) < 1:
        raise ValueError("synthetic_inputs: every size must be >= 1")
    m = _model(head_dim, gen, rotate)
    k = m.keys((num_keys,), gen)
    q = _student_t((num_queries, num_heads, head_dim), gen) * m.chan
    if m.rot is not None:
        q = q @ m.rot
    w = torch.randn(num_queries, num_heads, generator=gen, dtype=torch.float64)
    w = w * (num_heads ** -0.5) * (head_dim ** -0.5)
    lengths = torch.full((num_queries,), num_keys, dtype=torch.int64)
    return Inputs(q.float(), k.float(), w.float(), lengths), m


def _row_logits(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # q [t, H, D], k [t, c, D] or [c, D], w [t, H] (float64) -> [t, c]
    s = torch.einsum("thd,tcd->thc", q, k) if k.dim() == 3 else torch.einsum("thd,cd->thc", q, k)
    return (torch.relu(s) * w[:, :, None]).sum(1)


def exact_logits(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor,
                 lengths: torch.Tensor | None = None, chunk: int = 8) -> torch.Tensor:
    """Exact indexer logits ``sum_h w[t,h] * relu(q[t,h] . k[j])`` in float64, no quantization.

    Args:
        q: ``[T, H, D]`` any float dtype.  k: ``[N, D]``.  weights: ``[T, H]``.
        lengths: optional int ``[T]``; entries ``j >= lengths[t]`` become ``-inf``.
        chunk: queries per einsum (memory ``chunk * H * N`` float64).
    Returns:
        float64 ``[T, N]`` on ``q``'s device.
    """
    qd, kd, wd = q.double(), k.double().to(q.device), weights.double().to(q.device)
    out = torch.empty(q.shape[0], k.shape[0], dtype=torch.float64, device=q.device)
    for t0 in range(0, q.shape[0], chunk):
        out[t0:t0 + chunk] = _row_logits(qd[t0:t0 + chunk], kd, wd[t0:t0 + chunk])
    if lengths is not None:
        j = torch.arange(k.shape[0], device=q.device)
        out.masked_fill_(j[None, :] >= lengths.to(q.device)[:, None], float("-inf"))
    return out


def plant_needles(inp: Inputs, model: _Model, exact: torch.Tensor, margins: Sequence[float],
                  index_topk: int, gen: torch.Generator, candidates: int = 16) -> torch.Tensor:
    """Give every query a needle key just above its exact top-k threshold; updates ``inp``.

    Query ``t`` gets margin ``margins[t % len(margins)]``, a random position ``p`` and a needle
    key ``n`` (the best of ``candidates`` fresh keys of the model; else, when none has a logit of
    the needed sign, the best haystack key; else the sum of the query's positive-weight head
    vectors projected orthogonally to its negative-weight ones; scaled, since the logit is
    positively homogeneous in the key) with exact logit
    ``threshold_t + margin * std_t``: ``threshold_t`` is the ``index_topk``-th largest exact
    logit of the haystack without position ``p`` (its smallest when fewer keys) and ``std_t``
    the standard deviation of the haystack's exact logits.

    Args:
        inp: from :func:`synthetic_inputs` (all lengths equal N); its ``needle_pos``,
            ``needle_k`` and ``margin`` are set.
        exact: float64 ``[T, N]`` exact logits of the haystack (:func:`exact_logits`).
        margins: positive margins in standard deviations.
    Returns:
        float64 ``[T, N]``: ``exact`` with each query's needle logit at its position.
    Raises:
        ValueError: a margin is not positive, or N < 2.
        RuntimeError: no key can reach the target (every head weight <= 0 and a target > 0).
    """
    if any(m <= 0 for m in margins) or not margins:
        raise ValueError(f"margins must be positive, got {list(margins)}")
    T, N = exact.shape
    if N < 2:
        raise ValueError("plant_needles: needs at least 2 keys")
    pos = torch.randint(0, N, (T,), generator=gen)
    margin = torch.tensor([margins[t % len(margins)] for t in range(T)], dtype=torch.float64)
    hay = exact.clone()
    hay[torch.arange(T), pos] = float("-inf")
    kth = min(index_topk, N - 1)
    thr = hay.topk(kth, dim=1).values[:, -1]
    others = exact.clone()
    others[torch.arange(T), pos] = float("nan")
    mu = others.nanmean(1, keepdim=True)
    std = ((others - mu).square().nansum(1) / (N - 2 if N > 2 else 1)).sqrt()
    target = thr + margin * std
    cand = model.keys((T, candidates), gen)                         # [T, C, D] float64
    cl = _row_logits(inp.q.double(), cand, inp.weights.double())    # [T, C]
    sign = torch.where(target > 0, 1.0, -1.0).double()
    best = (cl * sign[:, None]).argmax(1)
    base = cl[torch.arange(T), best]
    vec = cand[torch.arange(T), best]
    # a query whose fresh candidates all have the wrong sign (it scores few keys above 0) takes
    # the haystack key with the largest logit of the needed sign instead, or (a query that scores
    # every key <= 0) a direction built from its own queries
    for t in torch.nonzero(base * sign <= 0).flatten().tolist():
        h = hay[t] * sign[t]
        h[pos[t]] = float("-inf")
        j = int(h.argmax())
        if float(h[j]) > 0:
            base[t], vec[t] = exact[t, j], inp.k[j].double()
            continue
        if sign[t] < 0:   # unreachable: a target <= 0 lies above haystack keys with logits < 0
            raise RuntimeError(f"plant_needles: query {t} has no key with a negative logit")
        # u = the positive-weight heads' query sum projected orthogonally to every negative-weight
        # head's query: those heads' relu is 0, so logit(u) >= sum_h w_h q_h.u = |u|^2 > 0
        qt, wt = inp.q[t].double(), inp.weights[t].double()
        u = (torch.relu(wt)[:, None] * qt).sum(0)
        neg = qt[wt < 0]
        if neg.shape[0]:
            u = u - neg.T @ (torch.linalg.pinv(neg @ neg.T) @ (neg @ u))
        lu = float(_row_logits(qt[None], u[None, None], wt[None])[0, 0])
        if not lu > 0:
            raise RuntimeError(f"plant_needles: no key can give query {t} a positive logit")
        base[t], vec[t] = lu, u
    needle = (vec * (target / base)[:, None]).float()
    got = _row_logits(inp.q.double(), needle.double()[:, None, :], inp.weights.double())[:, 0]
    out = exact.clone()
    out[torch.arange(T), pos] = got
    inp.needle_pos, inp.needle_k, inp.margin = pos, needle, margin
    return out


def load_dump(path: str | Path) -> Inputs:
    """Real indexer inputs from a safetensors file.

    Tensor names (any float dtype for the first three):

    * ``q``: ``[T, H, D]`` indexer queries as they enter quantization (DeepSeek V3.2: after
      ``rotate_activation``, before ``act_quant``), unscaled.
    * ``k``: ``[N, D]`` indexer keys as they enter the cache's store (after the rotation),
      in sequence order.
    * ``weights``: ``[T, H]`` head weights with the softmax scales folded in and no query
      quantization scale (``w_proj(x) * H^-0.5 * D^-0.5`` in DeepSeek V3.2).
    * ``lengths`` (optional): integer ``[T]`` keys visible to each query, 1..N (default N:
      decode queries see every key).

    Returns:
        :class:`Inputs` without needles (float32 q, k, weights; int64 lengths).
    Raises:
        FileNotFoundError: no such file.  ValueError: a tensor is missing, has the wrong rank,
        inconsistent sizes, non-finite values, or lengths outside 1..N.
    """
    from safetensors.torch import load_file
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        t = load_file(str(path))
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
        raise ValueError(f"{path}: not a safetensors file ({e})") from None
    for name, rank in (("q", 3), ("k", 2), ("weights", 2)):
        if name not in t:
            raise ValueError(f"{path}: tensor {name!r} missing (has {sorted(t)}); expected "
                             "q [T, H, D], k [N, D], weights [T, H], optional lengths [T]")
        if t[name].dim() != rank or not t[name].is_floating_point():
            raise ValueError(f"{path}: {name} must be a {rank}-D float tensor, got "
                             f"{t[name].dtype} {list(t[name].shape)}")
    q, k, w = t["q"].float(), t["k"].float(), t["weights"].float()
    T, H, D = q.shape
    N = k.shape[0]
    if k.shape[1] != D or w.shape != (T, H) or T < 1 or N < 1:
        raise ValueError(f"{path}: shapes q {list(q.shape)}, k {list(k.shape)}, weights "
                         f"{list(w.shape)} do not fit q [T, H, D], k [N, D], weights [T, H]")
    for name, x in (("q", q), ("k", k), ("weights", w)):
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{path}: {name} has non-finite values")
    if "lengths" in t:
        lengths = t["lengths"]
        if not R._is_integer_tensor(lengths) or lengths.shape != (T,):
            raise ValueError(f"{path}: lengths must be an integer [T={T}] tensor, got "
                             f"{lengths.dtype} {list(lengths.shape)}")
        lengths = lengths.long()
        if int(lengths.min()) < 1 or int(lengths.max()) > N:
            raise ValueError(f"{path}: lengths must be in 1..{N}")
    else:
        lengths = torch.full((T,), N, dtype=torch.int64)
    return Inputs(q.contiguous(), k.contiguous(), w.contiguous(), lengths)


def _query_dtype(spec: Spec) -> torch.dtype:
    qd = getattr(spec, "query", None)          # newer specs name the query dtype
    return qd.torch_dtype if qd is not None else spec.key.torch_dtype


def quantize_queries(q: torch.Tensor, weights: torch.Tensor, spec: Spec
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries in the dtype ``paged_logits`` takes for ``spec``, scales folded into the weights.

    e4m3: per (query, head) ``scale = max(amax(|q|), 1e-4) / 448`` (a power of two, rounded up,
    when the spec's scale rounding is ``pow2``, as DeepSeek V3.2's ue8m0 ``act_quant``),
    ``q_e4m3 = e4m3(q / scale)``, ``weights * scale``. Other dtypes: a cast, weights unchanged.

    Args:
        q: float32 ``[T, H, D]``.  weights: float32 ``[T, H]``.
    Returns:
        ``(q_in [T, H, D]`` in the query dtype, float32 ``weights [T, H])``.
    """
    qt = _query_dtype(spec)
    if qt != torch.float8_e4m3fn:
        return q.to(qt), weights.float()
    amax = q.float().abs().amax(-1).clamp(min=1e-4)
    scale = amax / 448.0
    if spec.scale_rounding == "pow2":
        m, e = torch.frexp(scale)
        scale = torch.where(m == 0.5, scale, torch.ldexp(torch.ones_like(scale), e))
    return (q.float() / scale[..., None]).to(qt), (weights.float() * scale)


def layout_logits(ops, spec: Spec, inp: Inputs, device="cpu", page_seed: int = 0) -> torch.Tensor:
    """Store the keys through the layout and score them with its ``paged_logits`` kernel.

    Each query is one request (decode, ``next_n`` = 1, or the spec's smallest ``next_n`` with the
    query repeated and 2-D ``context_lens`` so every row sees all its keys). The haystack pages
    are shared by every request through the block table (physical pages in a random order);
    a query with a needle gets a private copy of the page that holds its needle.

    Args:
        ops: :class:`dsagen.ops.Ops` of ``spec`` (CPU or CUDA backend matching ``device``).
        inp: queries, keys, weights, lengths and optional needles.
        page_seed: seed of the physical page order (does not change the result).
    Returns:
        ``[T, N]`` logits on the CPU in the kernel's dtype (float32), ``-inf`` where
        ``j >= lengths[t]``.
    Raises:
        ValueError: ``q``/``k`` do not have the spec's num_heads and head_dim.
    """
    T, H, D = inp.q.shape
    N = inp.num_keys
    if H != spec.num_heads or D != spec.head_dim:
        raise ValueError(f"{spec.name}: inputs have {H} heads x {D} dims, the layout "
                         f"{spec.num_heads} x {spec.head_dim}")
    ps = spec.page_size
    P = -(-N // ps)
    needles = inp.needle_pos is not None
    total = P + (T if needles else 0)
    perm = torch.randperm(total, generator=torch.Generator().manual_seed(page_seed))
    cache = ops.new_cache(total, device=device)
    # scale.placement separate: the scales' own tensor, passed to store and paged_logits
    skw = {"kv_scales": ops.new_scales(total, device=device)} if spec.separate_scales else {}
    j = torch.arange(N)
    ops.store(inp.k.to(device), cache, (perm[j // ps] * ps + j % ps).to(device), **skw)
    bt = perm[:P].to(torch.int32)[None, :].repeat(T, 1)
    if needles:
        o = torch.arange(ps)
        src = (inp.needle_pos // ps * ps)[:, None] + o[None, :]            # [T, ps] positions
        valid = src < N
        keys = inp.k[src.clamp(max=N - 1)]                                  # [T, ps, D]
        keys[torch.arange(T), inp.needle_pos % ps] = inp.needle_k
        priv = perm[P:]
        slots = priv[:, None] * ps + o[None, :]
        ops.store(keys[valid].to(device), cache, slots[valid].to(device), **skw)
        bt[torch.arange(T), inp.needle_pos // ps] = priv.to(torch.int32)
    nn = 1 if 1 in spec.next_n else min(spec.next_n)
    q_in, w_in = quantize_queries(inp.q, inp.weights, spec)
    q_in = q_in[:, None].expand(T, nn, H, D).contiguous()
    w_in = w_in[:, None].expand(T, nn, H).reshape(T * nn, H).contiguous()
    cl = inp.lengths.to(torch.int32)
    if nn > 1:
        cl = cl[:, None].expand(T, nn).contiguous()
    out = ops.paged_logits(q_in.to(device), cache, w_in.to(device), cl.to(device),
                           bt.to(device), N, **skw)
    return out.view(T, nn, N)[:, 0].cpu()


def overlap_recall(got: torch.Tensor, ref: torch.Tensor, lengths: torch.Tensor,
                   index_topk: int) -> torch.Tensor:
    """Per-row recall ``|got & ref| / min(index_topk, lengths)``.

    Args:
        got, ref: int ``[T, index_topk]`` token indices from :func:`dsagen.serving.topk`
            (``-1`` padding is ignored).
        lengths: int ``[T]`` keys visible per row (>= 1).
    Returns:
        float64 ``[T]`` in [0, 1].
    """
    T = got.shape[0]
    n = int(max(int(got.max()), int(ref.max()), 0)) + 1
    mark = torch.zeros(T, n + 1, dtype=torch.bool)
    r = ref.long().clone()
    r[r < 0] = n
    mark.scatter_(1, r, True)
    mark[:, n] = False
    g = got.long().clone()
    g[g < 0] = n
    hits = mark.gather(1, g).sum(1).double()
    return hits / lengths.double().clamp(max=index_topk)


def _seed_for(seed: int, *parts) -> int:
    h = hashlib.sha256(":".join(map(str, (seed, *parts))).encode()).digest()
    return int.from_bytes(h[:8], "little") % 2**63


def _r(x: float) -> float:
    return round(float(x), 6)


def run_recall(specs: Sequence[Spec], *, contexts: Sequence[int] | None = None,
               index_topk: int = 512, compress_ratio: int = 4,
               num_queries: int = DEFAULT_QUERIES, seed: int = 0, device: str = "cpu",
               dump: str | Path | None = None, margins: Sequence[float] = DEFAULT_MARGINS,
               rotate: bool = True, ops_list: Sequence | None = None,
               progress: Callable[[int, int, str], None] | None = None,
               log: Callable[[str], None] | None = None) -> dict:
    """Measure the top-k recall of each layout at each context length.

    Args:
        specs: layouts to measure.
        contexts: context lengths in tokens; the indexer sees ``context // compress_ratio`` keys
            each. Default :data:`DEFAULT_CONTEXTS`, or with ``dump`` the dump's full length
            (``N * compress_ratio``).
        index_topk: keys the indexer keeps per query.
        compress_ratio: tokens per indexer key (>= 1).
        num_queries: synthetic queries per context (ignored with ``dump``: all its queries).
        seed: seeds the synthetic inputs (per context) and the page order.
        device: "cpu" or "cuda", where the layout's kernels run.
        dump: safetensors file of real inputs (:func:`load_dump`); no needles then. A context
            uses the dump's first ``context // compress_ratio`` keys.
        margins: needle margins in standard deviations of the exact logits.
        rotate: Hadamard-rotate the synthetic q and k.
        ops_list: already loaded ops, one per spec (default ``dsagen.load(spec)`` for ``device``).
        progress: ``progress(done, total, label)``, called once with ``done = 0`` when the ops
            are loaded and then after each (context, layout) step.
        log: called with progress messages (loading, building).
    Returns:
        A JSON-able dict (see ``recall.json``): settings, ``contexts`` (keys, exact needle hit
        rate) and per layout the per-context recall mean/min, needle hit rates per margin, the
        overall hit rate per margin, and ``first_context_below_99`` (int or None). No times or
        paths, so the same seed gives the same dict.
    Raises:
        ValueError: bad settings (sizes, context shorter than ``compress_ratio``, a context longer
            than the dump, head count or head_dim not matching a spec).
        dsagen.jit.BuildError: a layout failed to build.
    """
    from . import __version__, load
    specs = list(specs)
    if not specs:
        raise ValueError("no spec given")
    if compress_ratio < 1 or index_topk < 1 or num_queries < 1:
        raise ValueError("--compress-ratio, --index-topk and --queries must be >= 1")
    if index_topk > MAX_INDEX_TOPK or num_queries > MAX_QUERIES:
        raise ValueError(f"--index-topk must be <= {MAX_INDEX_TOPK} and --queries <= {MAX_QUERIES} "
                         f"(got {index_topk}, {num_queries})")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {device!r}")
    dumped = load_dump(dump) if dump is not None else None
    if contexts is None:
        contexts = ([dumped.num_keys * compress_ratio] if dumped is not None
                    else list(DEFAULT_CONTEXTS))
    contexts = sorted({int(c) for c in contexts})
    for c in contexts:
        if c < compress_ratio:
            raise ValueError(f"context {c} is shorter than compress_ratio {compress_ratio}: no key")
        if c // compress_ratio > MAX_KEYS:
            raise ValueError(f"context {c} needs {c // compress_ratio} keys; at most {MAX_KEYS} "
                             f"(context {MAX_KEYS * compress_ratio} at compress_ratio {compress_ratio})")
        if dumped is not None and c // compress_ratio > dumped.num_keys:
            raise ValueError(f"context {c} needs {c // compress_ratio} keys; the dump has "
                             f"{dumped.num_keys} (at most context {dumped.num_keys * compress_ratio})")
        if dumped is None and c // compress_ratio < 2:
            raise ValueError(f"context {c}: synthetic inputs need at least 2 keys")
    if dumped is not None:
        for s in specs:
            if dumped.q.shape[1:] != (s.num_heads, s.head_dim):
                raise ValueError(f"{s.name}: the dump's q is [T, {dumped.q.shape[1]}, "
                                 f"{dumped.q.shape[2]}], the layout has {s.num_heads} heads x "
                                 f"{s.head_dim} dims")
    if ops_list is None:
        ops_list = []
        for s in specs:
            if log:
                log(f"[{s.name}] loading ops ({device}; the first use builds the extension)")
            t0 = time.time()
            ops_list.append(load(s, with_cuda=(device == "cuda")))
            if log:
                log(f"[{s.name}] ready in {time.time() - t0:.1f} s")

    res = {
        "tool": "dsagen recall", "dsagen": __version__,
        "source": "dump" if dumped is not None else "synthetic",
        "dump": Path(dump).name if dumped is not None else None,
        "synthetic": None if dumped is not None else dict(SYNTH, rotate=rotate),
        "seed": seed, "device": device, "index_topk": index_topk,
        "compress_ratio": compress_ratio,
        "queries": dumped.num_queries if dumped is not None else num_queries,
        "margins": None if dumped is not None else [float(m) for m in margins],
        "recall_target": RECALL_TARGET,
        "contexts": [],
        "layouts": [{"spec": s.name, "description": s.description, "key_dtype": s.key_dtype,
                     "bytes_per_token": s.bytes_per_token, "num_heads": s.num_heads,
                     "head_dim": s.head_dim, "contexts": []} for s in specs],
    }
    total, done = len(contexts) * len(specs), 0
    if progress:
        progress(0, total, "")
    for c in contexts:
        n = c // compress_ratio
        groups: dict[tuple[int, int], tuple[Inputs, torch.Tensor, torch.Tensor]] = {}   # (inputs, exact logits, their top-k)
        for li, (s, ops) in enumerate(zip(specs, ops_list)):
            shape = (s.num_heads, s.head_dim)
            if shape not in groups:
                if dumped is not None:
                    inp = Inputs(dumped.q, dumped.k[:n].contiguous(), dumped.weights,
                                 dumped.lengths.clamp(max=n))
                    ex = exact_logits(inp.q, inp.k, inp.weights, inp.lengths)
                else:
                    gen = torch.Generator().manual_seed(_seed_for(seed, c, compress_ratio, *shape))
                    inp, model = synthetic_inputs(n, s.num_heads, s.head_dim, num_queries, gen,
                                                  rotate=rotate)
                    ex = exact_logits(inp.q, inp.k, inp.weights)
                    ex = plant_needles(inp, model, ex, margins, index_topk, gen)
                groups[shape] = (inp, ex, topk(ex, inp.lengths, index_topk))
                crow = {"context": c, "keys": n, "heads": shape[0], "head_dim": shape[1]}
                if inp.needle_pos is not None:
                    hit = (groups[shape][2].long() == inp.needle_pos[:, None]).any(1)
                    crow["exact_needle_hit"] = _r(hit.double().mean())
                res["contexts"].append(crow)
            inp, ex, top_ref = groups[shape]
            got = layout_logits(ops, s, inp, device, page_seed=_seed_for(seed, "pages", c))
            top = topk(got, inp.lengths, index_topk)
            rec = overlap_recall(top, top_ref, inp.lengths, index_topk)
            row = {"context": c, "keys": n,
                   "all_keys_selected": bool(int(inp.lengths.max()) <= index_topk),
                   "recall_mean": _r(rec.mean()), "recall_min": _r(rec.min())}
            if inp.needle_pos is not None:
                hit = (top.long() == inp.needle_pos[:, None]).any(1)
                row["needle_hit"] = [
                    {"margin": float(m), "hit_rate": _r(hit[inp.margin == m].double().mean()),
                     "queries": int((inp.margin == m).sum()), "hits": int(hit[inp.margin == m].sum())}
                    for m in margins if bool((inp.margin == m).any())]
            res["layouts"][li]["contexts"].append(row)
            done += 1
            if progress:
                progress(done, total, f"{s.name} ctx={c}")
    for lay in res["layouts"]:
        below = [r["context"] for r in lay["contexts"] if r["recall_mean"] < RECALL_TARGET]
        lay["first_context_below_99"] = below[0] if below else None
        lay["recall_mean_overall"] = _r(sum(r["recall_mean"] for r in lay["contexts"]) /
                                        len(lay["contexts"]))
        if dumped is None:
            agg = []
            for m in margins:
                q = sum(x["queries"] for r in lay["contexts"] for x in r["needle_hit"] if x["margin"] == m)
                h = sum(x["hits"] for r in lay["contexts"] for x in r["needle_hit"] if x["margin"] == m)
                if q:
                    agg.append({"margin": float(m), "hit_rate": _r(h / q), "queries": q, "hits": h})
            lay["needle_hit"] = agg
        else:
            lay["needle_hit"] = None
    return res


def format_table(res: dict) -> str:
    """The plain-text table printed by ``dsagen recall``, from :func:`run_recall`'s ``res``: per
    layout and context, mean and minimum recall and the needle hit rate per margin."""
    no_rot = bool(res["synthetic"]) and not res["synthetic"]["rotate"]
    title = (f"indexer top-{res['index_topk']} recall vs exact float64 ranking "
             f"({res['source']}{' ' + res['dump'] if res['dump'] else ''}, {res['queries']} queries "
             f"per context, compress_ratio {res['compress_ratio']}, seed {res['seed']}, "
             f"{res['device']}{', no Hadamard rotation' if no_rot else ''})")
    lines = [title]
    margins = res["margins"] or []
    head = f"{'layout':<28}{'context':>8}{'keys':>7}{'recall':>9}{'min':>8}"
    if margins:
        head += "  needle hit @ margin (std): " + " ".join(f"{m:>6g}" for m in margins)
    lines.append(head)
    for lay in res["layouts"]:
        for r in lay["contexts"]:
            s = (f"{lay['spec']:<28}{r['context']:>8}{r['keys']:>7}{r['recall_mean']:>9.4f}"
                 f"{r['recall_min']:>8.4f}")
            if margins:
                by = {x["margin"]: x["hit_rate"] for x in r["needle_hit"]}
                s += "  " + " " * len("needle hit @ margin (std):") + " ".join(
                    f"{by[m]:>6.2f}" if m in by else f"{'-':>6}" for m in margins)
            if r["all_keys_selected"]:
                s += "  (keys <= index_topk: all selected)"
            lines.append(s)
    lines.append("")
    for lay in res["layouts"]:
        f = lay["first_context_below_99"]
        s = (f"{lay['spec']}: mean recall {lay['recall_mean_overall']:.4f}; first context with "
             f"recall < 99%: {f if f is not None else 'none'}")
        if lay["needle_hit"]:
            s += "; needle hit (all contexts): " + ", ".join(
                f"{x['margin']:g}: {x['hit_rate']:.2f}" for x in lay["needle_hit"])
        lines.append(s)
    return "\n".join(lines)


def plot(res: dict, path: str | Path) -> Path:
    """Write the chart of :func:`run_recall`'s ``res`` to ``path`` (matplotlib Agg, format by its
    suffix; :func:`write_outputs` names it ``recall.png``): mean recall vs context per layout,
    and (synthetic inputs) needle hit rate vs margin per layout over all contexts. Returns the
    path. Raises OSError where it cannot be written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    has_needles = bool(res["margins"])
    fig, axes = plt.subplots(1, 2 if has_needles else 1, figsize=(12 if has_needles else 6.5, 4.5),
                             squeeze=False)
    ax = axes[0][0]
    for lay in res["layouts"]:
        xs = [r["context"] for r in lay["contexts"]]
        ax.plot(xs, [r["recall_mean"] for r in lay["contexts"]], marker="o", label=lay["spec"])
    ax.axhline(RECALL_TARGET, color="gray", ls="--", lw=1, label="99%")
    lo = min(r["recall_mean"] for lay in res["layouts"] for r in lay["contexts"])
    ax.set_ylim(min(lo, RECALL_TARGET) - 0.002, 1.0005)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"context (tokens; {res['compress_ratio']} tokens per indexer key)")
    ax.set_ylabel(f"mean top-{res['index_topk']} recall")
    ax.set_title(f"recall vs exact float64 ranking ({res['source']}, seed {res['seed']})")
    ax.grid(True, alpha=0.3)
    ax.legend()
    if has_needles:
        ax = axes[0][1]
        for lay in res["layouts"]:
            ax.plot([x["margin"] for x in lay["needle_hit"]],
                    [x["hit_rate"] for x in lay["needle_hit"]], marker="o", label=lay["spec"])
        ax.set_xscale("log")
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("needle margin over the top-k threshold (std of the exact logits)")
        ax.set_ylabel("needle hit rate (all contexts)")
        ax.set_title("planted needle kept in the layout's top-k")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


def write_outputs(res: dict, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``recall.json`` (``res`` as JSON) and ``recall.png`` (:func:`plot`) into ``out_dir``
    (created with its parents); returns their paths. Raises OSError where they cannot be
    written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    js = out / "recall.json"
    js.write_text(json.dumps(res, indent=1) + "\n")
    return js, plot(res, out / "recall.png")
