"""Check generated ops against :mod:`dsagen.reference` over a sweep of shapes.

Inputs are fresh random draws (never zeros; the CLI draws a new seed per run); outputs are
poisoned before the kernel writes them (:meth:`dsagen.ops.Ops.poisoned_outputs`: the ops fill
their output with NaN before each kernel during the sweep);
the block table is a random permutation of pages; context lengths are not page multiples.

* store: the whole ``kv_cache`` (and ``kv_scales`` of a ``separate`` spec) after the op must
  equal, byte for byte, the reference's.
* paged_logits: the ``-inf`` masks must be equal, no NaN may be left (so every element was
  written), the same call from a precomputed schedule (``paged_logits_schedule``) must give
  the same bits, and the error of the valid entries against the reference computed in float64 from
  the same quantized q and keys must be small: relative L2 error ``|out - ref| / |ref|`` below
  1e-4, or, where the logits nearly cancel, the condition-scaled error ``|out - ref| / |mag|``
  below 2e-6, ``mag`` being the same sums over absolute values (``scale * sum_h |w| |q|.|k|``),
  which bounds any floating-point evaluation's rounding error. Over random multi-logit cases
  ``|mag| / |ref|`` is 50-75, so 2e-6 is the 1e-4 bar at the best-conditioned of them; a single
  logit can be far worse conditioned (ratios up to 2356 measured), and there even exact-input
  fp32 arithmetic (the CPU backend) exceeded a plain 1e-4 relative error (1.57e-4 at a ratio
  that took it to ~1e-7 condition-scaled). DeepGEMM's ``calc_diff`` is reported too.
* ragged_logits (prefill): the same checks over contiguous keys and per-query ``[ks, ke)``
  ranges (empty ranges, a chunked-prefill batch whose second request starts at an offset).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, field

import torch

from . import reference as R
from .spec import Spec

REL_L2_TOL = 1e-4
COND_TOL = 2e-6    # |out - ref| / |sums of absolute values|; see the module docstring
# Hopper's fp8 tensor-core (WGMMA e4m3) accumulator is not full fp32: the default (no fp32
# promotion, as DeepGEMM) measured relative L2 errors of 1.1e-4..1.5e-4 on the H200; with each
# 32-wide K step summed in fp32 (tuning "promote" 1) 4.0e-5..5.4e-5 on multi-logit cases and
# 1.46e-4 on one single-logit case (every 2 steps: 6.9e-5..8.2e-5); DeepGEMM's own
# kernel measured 1.3e-4 on the same machine, and DeepGEMM's bar (calc_diff < 5e-6 against a
# reference quantized the same way, DESIGN.md section 2) allows a relative L2 error of ~3e-3.
# The fp8 tensor-core path is held to 5x the project's bars, 6x stricter than DeepGEMM's.
FP8_MMA_REL_L2_TOL = 5e-4
FP8_MMA_COND_TOL = 1e-5


def logits_tolerance(spec: Spec, device, next_n: int | None = None,
                     tuning: dict | None = None) -> tuple[float, float]:
    """``(relative L2, condition-scaled)`` bars of :func:`check_logits` for ``spec`` on ``device``.

    The fp8 tensor-core paged kernel (e4m3 keys on an sm_90 device where
    :func:`dsagen.codegen.wgmma_kernel_applies` for ``next_n``, default the spec's largest, and
    the ops' ``tuning``, or for its small-work kernel's tuning) gets ``FP8_MMA_*``, and so does
    the portable tensor-core kernel (``paged_logits_mma``, tuning ``portable`` "mma") on e4m3
    keys on any device (a margin kept from before it ran: fp8 ``mma.sync`` was expected to
    accumulate as WGMMA does, with fewer bits than fp32. On sm_90a and sm_100a ptxas lowers it
    to f16 HMMAs with fp32 accumulation, and on the H200 it measured 6.6e-8..9.1e-8, as the
    CUDA-core kernel does: ``benchmarks/RESULTS.md``, thirty-sixth session); every other kernel
    (the CUDA-core kernel, bf16/fp16 tensor cores, CPU) the exact-fp32 bars ``REL_L2_TOL`` /
    ``COND_TOL``.
    """
    from .codegen import portable_kernel, small_tuning, wgmma_kernel_applies
    dev = torch.device(device)
    nn = next_n or max(spec.next_n)
    small = small_tuning(spec, tuning)
    if dev.type != "cuda" or spec.key_dtype != "e4m3":
        return REL_L2_TOL, COND_TOL
    sm90 = torch.cuda.get_device_capability(dev)[0] == 9
    wgmma = (wgmma_kernel_applies(spec, nn, tuning)
             or (small is not None and wgmma_kernel_applies(spec, nn, small)))
    if sm90 and wgmma:
        return FP8_MMA_REL_L2_TOL, FP8_MMA_COND_TOL
    if portable_kernel(spec, nn, tuning) == "mma":
        return FP8_MMA_REL_L2_TOL, FP8_MMA_COND_TOL
    return REL_L2_TOL, COND_TOL


@dataclass
class Row:
    """One verification case. ``op``: store / paged_logits / ragged_logits; ``backend``: cpu
    or cuda; ``shape``: the case in words. Over the valid logits, against the float64
    reference: ``rel_l2`` = ||out - ref|| / ||ref||; ``cond_err`` = ||out - ref|| / ||the same
    sums over absolute values|| (bounds what rounding can do); ``calc_diff`` is DeepGEMM's
    measure. ``masks_equal``: ``-inf`` exactly where the reference has it; ``all_written``: no
    entry left NaN from the poisoned output; ``bytes_equal``: (store) the cache bytes equal the
    reference store's; ``deterministic``: reruns (and, for paged logits, the call from a precomputed
    schedule) gave the same bits. ``passed`` combines them
    with :func:`logits_tolerance`; ``note`` says why a row failed or what it covers."""
    op: str
    backend: str
    shape: str
    rel_l2: float = 0.0
    cond_err: float = 0.0
    calc_diff: float = 0.0
    masks_equal: bool = True
    all_written: bool = True
    bytes_equal: bool = True
    deterministic: bool = True
    passed: bool = True
    note: str = ""


@dataclass
class Report:
    """The rows of one spec's verification on one backend (:func:`verify`)."""
    spec: str
    backend: str
    rows: list[Row] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """At least one row, and every row passed."""
        return bool(self.rows) and all(r.passed for r in self.rows)

    def table(self) -> str:
        """The rows as a fixed-width text table (what ``dsagen verify`` prints)."""
        lines = [f"{'op':<14}{'shape':<46}{'rel_l2':>10}{'cond_err':>10}{'calc_diff':>11}  masks  written  bytes  result"]
        for r in self.rows:
            lines.append(
                f"{r.op:<14}{r.shape:<46}{r.rel_l2:>10.2e}{r.cond_err:>10.2e}{r.calc_diff:>11.2e}  "
                f"{'equal' if r.masks_equal else 'DIFF':<7}{'all' if r.all_written else 'NO':<9}"
                f"{('equal' if r.bytes_equal else 'DIFF') if r.op == 'store' else '-':<7}"
                f"{'ok' if r.passed else 'FAIL'}{(' ' + r.note) if r.note else ''}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """JSON-ready form: spec, backend, passed and every row's fields."""
        return {"spec": self.spec, "backend": self.backend, "passed": self.passed,
                "rows": [asdict(r) for r in self.rows]}


def random_keys(n: int, head_dim: int, gen: torch.Generator, device, dtype=torch.bfloat16) -> torch.Tensor:
    """Keys ``[n, head_dim]`` in ``dtype`` on ``device`` with heavy-ish per-token magnitudes
    (``randn * exp(randn) * 2``, drawn in float32 on the CPU with ``gen``), so scales differ
    between tokens."""
    k = torch.randn(n, head_dim, generator=gen, dtype=torch.float32)
    k = k * torch.exp(torch.randn(n, 1, generator=gen)) * 2.0
    return k.to(device=device, dtype=dtype)


def with_edge_tokens(k: torch.Tensor, spec: Spec, gen: torch.Generator) -> torch.Tensor:
    """``k`` ``[n, head_dim]`` with four tokens (at random rows; none where ``n < 8``) replaced by
    the store's edge cases, which :func:`random_keys` practically never draws: an all-zero key,
    keys of magnitude ~1e-6 and ~1e-30 (their amax under the 1e-4 floor of the scale, DESIGN.md
    section 2), and a key whose first scale block is zero (half the key where the block is the
    whole key). A store that drops the floor writes NaN or other bytes for them."""
    if k.shape[0] < 8:
        return k
    k = k.clone()
    rows = torch.randperm(k.shape[0], generator=gen)[:4].tolist()
    tiny = torch.randn(2, k.shape[1], generator=gen)
    k[rows[0]] = 0
    k[rows[1]] = (tiny[0] * 1e-6).to(k.dtype)
    k[rows[2]] = (tiny[1] * 1e-30).to(k.dtype)
    k[rows[3], :spec.scale_block if spec.scale_block < spec.head_dim else spec.head_dim // 2] = 0
    return k


def random_q(spec: Spec, B: int, next_n: int, gen: torch.Generator, device) -> torch.Tensor:
    """Random queries ``[B, next_n, num_heads, head_dim]`` in ``spec.query`` (standard normal;
    times 8 for e4m3, so that the fp8 values use more of its range)."""
    q = torch.randn(B, next_n, spec.num_heads, spec.head_dim, generator=gen)
    if spec.key_dtype == "e4m3":
        q = q * 8.0
    return q.to(device=device, dtype=spec.query.torch_dtype)


def random_bytes(num_pages: int, page_bytes: int, gen: torch.Generator) -> torch.Tensor:
    """uint8 ``[num_pages, page_bytes]`` of random bytes (a cache before anything is stored)."""
    return torch.randint(0, 256, (num_pages, page_bytes), generator=gen, dtype=torch.uint8)


def _scales_kw(kv_scales) -> dict:
    """``{"kv_scales": t}`` for a separate spec's scale tensor, else ``{}`` (ops objects written
    before ``separate`` existed need not take the argument)."""
    return {} if kv_scales is None else {"kv_scales": kv_scales}


def make_cache(spec: Spec, context_lens: list[int], gen: torch.Generator, device,
               extra_pages: int = 3):
    """A filled cache and a random-permutation block table for requests of these lengths.

    Returns ``(kv_cache, block_table int32 [B, max_pages], kv_scales)``; ``kv_scales`` is uint8
    ``[num_pages, spec.scale_page_bytes]`` for a ``separate`` spec, else None. Every slot holds a
    stored random key (reference store); page padding bytes, if any, are random.
    """
    ps = spec.page_size
    pages_per = [max(1, math.ceil(c / ps)) for c in context_lens]
    max_pages = max(pages_per)
    num_pages = sum(pages_per) + extra_pages
    perm = torch.randperm(num_pages, generator=gen)
    bt = torch.empty(len(context_lens), max_pages, dtype=torch.int32)
    pos = 0
    for b, n in enumerate(pages_per):
        bt[b, :n] = perm[pos:pos + n].to(torch.int32)
        pos += n
        if n < max_pages:   # unused columns point at real pages, as a serving stack's would
            bt[b, n:] = torch.randint(0, num_pages, (max_pages - n,), generator=gen, dtype=torch.int32)
    cache = random_bytes(num_pages, spec.page_bytes, gen)
    scales = random_bytes(num_pages, spec.scale_page_bytes, gen) if spec.separate_scales else None
    slots = torch.arange(num_pages * ps, dtype=torch.int64)
    keys = with_edge_tokens(random_keys(len(slots), spec.head_dim, gen, "cpu"), spec, gen)
    R.store(keys, cache, slots, spec, kv_scales=scales)
    return cache.to(device), bt.to(device), None if scales is None else scales.to(device)


def _poisoned_alloc(shape, device):
    """Fill the allocator's next block of this size with NaN (best effort: the next allocation
    of that size usually gets it from CUDA's caching allocator, on the CPU mostly not). The
    verification uses the ops' own switch instead (:func:`_poisoning`); GPU tests that call
    the ops directly use this."""
    t = torch.full(shape, float("nan"), dtype=torch.float32, device=device)
    del t


@contextlib.contextmanager
def _poisoning(ops):
    """The ops' outputs NaN-filled before every kernel inside the block
    (:meth:`dsagen.ops.Ops.poisoned_outputs`), where the ops object has the switch."""
    if hasattr(ops, "poisoned_outputs"):
        with ops.poisoned_outputs():
            yield
    else:
        yield


def _same_bits(a: torch.Tensor, b: torch.Tensor, ref: torch.Tensor, clean_logits: bool) -> bool:
    """Whether two results of one logits call are bitwise equal: everywhere with
    ``clean_logits``, else on the visible entries (finite in ``ref``; the rest is unspecified)."""
    if clean_logits:
        return torch.equal(a, b)
    vis = torch.isfinite(ref)
    return torch.equal(a[vis], b[vis])


def _score(row: Row, out: torch.Tensor, ref: torch.Tensor, mag: torch.Tensor, clean_logits: bool) -> None:
    """Fill ``row``'s masks / written / error fields from the kernel's ``out``, the float64
    ``ref`` (``-inf`` where invalid) and the absolute-value sums ``mag``."""
    valid = torch.isfinite(ref)
    o = out.double()
    if clean_logits:
        row.masks_equal = bool(torch.equal(torch.isneginf(o), ~valid))
        row.all_written = not bool(torch.isnan(o).any())
    else:
        row.all_written = not bool(torch.isnan(o[valid]).any())
    d, r = o[valid], ref[valid]
    if d.numel():
        err = float(torch.linalg.vector_norm(d - r))
        den = float(torch.linalg.vector_norm(r))
        mden = float(torch.linalg.vector_norm(mag[valid]))
        row.rel_l2 = err / (den if den > 0 else 1.0)
        row.cond_err = err / (mden if mden > 0 else 1.0)
        row.calc_diff = R.calc_diff(d, r)
    if math.isnan(row.rel_l2) or math.isnan(row.cond_err):
        row.rel_l2 = row.cond_err = float("inf")


def _verdict(row: Row, rel_tol: float = REL_L2_TOL, cond_tol: float = COND_TOL) -> Row:
    """Set ``row.passed``: masks equal, every element written, error within either bar, and
    reruns identical."""
    row.passed = (row.masks_equal and row.all_written
                  and (row.rel_l2 < rel_tol or row.cond_err < cond_tol)
                  and row.deterministic)
    return row


def check_logits(ops, spec: Spec, context_lens, next_n: int, gen: torch.Generator, device,
                 ctx_2d: bool = False, clean_logits: bool = True, reruns: int = 1,
                 max_context_len: int | None = None) -> Row:
    """One paged-logits case; see the module docstring for what is checked (outputs
    NaN-poisoned by the ops' switch where they have it).

    Args:
        ops: :class:`dsagen.ops.Ops` of ``spec`` (or an object with its ``paged_logits``).
        context_lens: ``B`` lengths in tokens, or with ``ctx_2d`` ``B`` lists of ``next_n``.
        next_n: query rows per request (one of ``spec.next_n``).
        gen: CPU generator of every random input; device: where the op runs.
        clean_logits: passed to the op (False: only the visible entries are compared).
        reruns: calls whose results must be bitwise equal (without ``clean_logits``: on
            the visible entries).
        max_context_len: result columns (default the longest length).
    Returns:
        a :class:`Row` (``op="paged_logits"``; ``backend`` left for the caller to set).
    Raises:
        what the op or :func:`dsagen.reference.paged_logits` raises for the inputs (e.g. a
        RuntimeError for a ``next_n`` the spec was not built for); a disagreement is a failed
        row, not an exception.
    """
    with _poisoning(ops):
        return _check_logits(ops, spec, context_lens, next_n, gen, device, ctx_2d, clean_logits,
                             reruns, max_context_len)


def _check_logits(ops, spec, context_lens, next_n, gen, device, ctx_2d, clean_logits, reruns,
                  max_context_len) -> Row:
    B = len(context_lens)
    lens = [int(c) for c in (context_lens if not ctx_2d else [max(c) for c in context_lens])]
    max_len = int(max_context_len if max_context_len is not None else max(lens))
    # the block table must cover max_context_len columns (DeepGEMM's contract too)
    cache, bt, sc = make_cache(spec, [max(c, max_len) if i == 0 else c for i, c in enumerate(lens)],
                               gen, device)
    cl = torch.tensor(context_lens, dtype=torch.int32, device=device)
    q = random_q(spec, B, next_n, gen, device)
    w = torch.randn(B * next_n, spec.num_heads, generator=gen).to(device)
    out = ops.paged_logits(q, cache, w, cl, bt, max_len, clean_logits, **_scales_kw(sc))
    ref = R.paged_logits(q, cache, w, cl, bt, max_len, True, spec, compute_dtype=torch.float64,
                         kv_scales=sc)
    mag = R.paged_logits(q, cache, w, cl, bt, max_len, True, spec, compute_dtype=torch.float64,
                         magnitude=True, kv_scales=sc)
    row = Row("paged_logits", "", f"B={B} next_n={next_n} ctx={_ctx_str(context_lens)}"
              + (" 2d" if ctx_2d else "") + ("" if clean_logits else " unclean"))
    _score(row, out, ref, mag, clean_logits)
    for _ in range(reruns - 1):
        again = ops.paged_logits(q, cache, w, cl, bt, max_len, clean_logits, **_scales_kw(sc))
        if not _same_bits(again, out, ref, clean_logits):
            row.deterministic = False
    # the same call from a precomputed schedule (paged_logits_schedule) must give the same bits
    # (on the visible entries without clean_logits: the rest is unspecified); ops objects
    # without the schedule op (stand-ins in tests) skip this
    if hasattr(ops, "paged_logits_schedule"):
        sched = ops.paged_logits_schedule(cl, bt, next_n, max_len)
        with_sched = ops.paged_logits(q, cache, w, cl, bt, max_len, clean_logits, **_scales_kw(sc),
                                      schedule=sched)
        if not _same_bits(with_sched, out, ref, clean_logits):
            row.deterministic = False
            row.note = (row.note + "; " if row.note else "") + "differs with a precomputed schedule"
    return _verdict(row, *logits_tolerance(spec, device, next_n, getattr(ops, "tuning", None)))


def ragged_inputs(spec: Spec, S: int, N: int, gen: torch.Generator, device):
    """Random prefill inputs: ``(q [S, H, D], k, k_scale, weights [S, H])`` with ``k`` in the
    form :meth:`dsagen.ops.Ops.ragged_logits` takes (key dtype, or packed uint8 for e2m1) and
    ``k_scale`` fp32 ``[N]`` (one scale per token, DeepGEMM's form) / ``[N, scales]`` / None."""
    k, sc = R.key_storage(*R.quantize(random_keys(N, spec.head_dim, gen, "cpu"), spec), spec)
    q = random_q(spec, S, 1, gen, device)[:, 0]
    w = torch.randn(S, spec.num_heads, generator=gen).to(device)
    return q, k.to(device), None if sc is None else sc.to(device), w


def check_ragged(ops, spec: Spec, ks: list[int], ke: list[int], N: int, gen: torch.Generator,
                 device, clean_logits: bool = True, label: str = "", reruns: int = 1) -> Row:
    """One ragged (prefill) logits case: query s sees keys ``[ks[s], ke[s])`` of ``N``
    (outputs NaN-poisoned by the ops' switch where they have it), against
    :func:`dsagen.reference.ragged_logits` in float64 (DeepGEMM ``fp8_mqa_logits``
    semantics). ``ks``, ``ke``: ``S`` integers each; ``label``: appended to the row's shape;
    ``reruns``: calls that must be bitwise equal. Returns a :class:`Row` (``backend`` left for
    the caller); what the op raises for the inputs propagates."""
    with _poisoning(ops):
        return _check_ragged(ops, spec, ks, ke, N, gen, device, clean_logits, label, reruns)


def _check_ragged(ops, spec, ks, ke, N, gen, device, clean_logits, label, reruns) -> Row:
    S = len(ks)
    q, k, sc, w = ragged_inputs(spec, S, N, gen, device)
    ks_t = torch.tensor(ks, dtype=torch.int32, device=device)
    ke_t = torch.tensor(ke, dtype=torch.int32, device=device)
    out = ops.ragged_logits(q, k, sc, w, ks_t, ke_t, clean_logits)
    ref = R.ragged_logits(q, k, sc, w, ks_t, ke_t, True, spec, compute_dtype=torch.float64)
    mag = R.ragged_logits(q, k, sc, w, ks_t, ke_t, True, spec, compute_dtype=torch.float64,
                          magnitude=True)
    row = Row("ragged_logits", "", f"S={S} N={N} {label}".strip() + ("" if clean_logits else " unclean"))
    _score(row, out, ref, mag, clean_logits)
    for _ in range(reruns - 1):
        if not _same_bits(ops.ragged_logits(q, k, sc, w, ks_t, ke_t, clean_logits), out, ref, clean_logits):
            row.deterministic = False
    return _verdict(row)


def ragged_cases(gen: torch.Generator, quick: bool):
    """(ks, ke, N, label) prefill cases: one key, random ranges with empty ones, and a chunked
    prefill of two requests (the second's queries see keys from an offset: its own prefix)."""
    cases = [([0], [1], 1, "single")]
    n = 300
    lo = torch.randint(0, n, (37,), generator=gen)
    hi = torch.minimum(lo + torch.randint(0, 120, (37,), generator=gen), torch.tensor(n))
    hi[::9] = lo[::9]                                    # some empty ranges
    cases.append((lo.tolist(), hi.tolist(), n, "random ranges"))
    if not quick:
        # request 0: 150 keys, its last 40 tokens are this chunk's queries; request 1: 230 keys
        # (a 170-token prefix + 60 new), stored after request 0: its queries start at offset 150
        r0 = [(0, 110 + i + 1) for i in range(40)]
        r1 = [(150, 150 + 170 + i + 1) for i in range(60)]
        ks, ke = zip(*(r0 + r1))
        cases.append((list(ks), list(ke), 380, "chunked prefill"))
    return cases


def check_store(ops, spec: Spec, n: int, gen: torch.Generator, device, k_dtype=torch.bfloat16) -> Row:
    """Store ``n`` random keys (``k_dtype`` ``[n, head_dim]``, with :func:`with_edge_tokens`'
    edge cases) at random distinct slots of a random-byte cache of ``ceil(2n/page_size)+1``
    pages; the whole cache (and the scale tensor of a ``separate`` spec) must equal
    :func:`dsagen.reference.store`'s, byte for byte. Returns a :class:`Row` (``op="store"``,
    ``bytes_equal``; ``backend`` left for the caller); what the op raises propagates."""
    num_pages = math.ceil(2 * n / spec.page_size) + 1
    cache = random_bytes(num_pages, spec.page_bytes, gen)
    scales = random_bytes(num_pages, spec.scale_page_bytes, gen) if spec.separate_scales else None
    loc = torch.randperm(num_pages * spec.page_size, generator=gen)[:n].to(torch.int64)
    k = with_edge_tokens(random_keys(n, spec.head_dim, gen, "cpu", dtype=k_dtype), spec, gen)
    ref = cache.clone()
    ref_sc = None if scales is None else scales.clone()
    R.store(k, ref, loc, spec, kv_scales=ref_sc)
    got = cache.to(device)
    got_sc = None if scales is None else scales.to(device)
    ops.store(k.to(device), got, loc.to(device), **_scales_kw(got_sc))
    row = Row("store", "", f"N={n} k={str(k_dtype).replace('torch.', '')}")
    got = got.cpu()
    if got_sc is not None:   # compare keys and scales together
        got, ref = torch.cat([got.view(-1), got_sc.cpu().view(-1)]), torch.cat([ref.view(-1), ref_sc.view(-1)])
    row.bytes_equal = bool(torch.equal(got, ref))
    if not row.bytes_equal:
        row.note = f"{int((got != ref).sum())} bytes differ"
    row.passed = row.bytes_equal
    return row


def two_d_lens(context_lens: list[int], next_n: int) -> list[list[int]]:
    """2-D ``context_lens`` ``[B][next_n]`` around 1-D lengths ``c``: rows ``c, c-1, ...`` for the
    even requests (and every request when ``next_n`` is 1), and ``c-1, c, c-2, c-3, ...`` for the
    odd ones, whose longest row is not the first or the last when ``next_n >= 3`` (a kernel that
    bounds a request by its first and last rows only gets those wrong). Each length is at least 1."""
    def order(b):
        return range(next_n) if b % 2 == 0 or next_n == 1 else [1, 0, *range(2, next_n)]
    return [[max(1, c - d) for d in order(b)] for b, c in enumerate(context_lens)]


def _ctx_str(c) -> str:
    s = str(list(c) if not isinstance(c, list) else c).replace(" ", "")
    return s if len(s) <= 30 else s[:27] + "..."


def default_cases(device: str, gen: torch.Generator):
    """(context_lens, ctx_2d) cases: B in {1, 3, 64}, lengths that are not page multiples, and a
    long one (>= 32768) on the GPU."""
    g = lambda n, hi: torch.randint(1, hi + 1, (n,), generator=gen).tolist()  # noqa: E731
    # random lengths up to 4097 on the GPU; up to 1024 on the (slow, plain-loop) CPU backend
    hi = 4097 if device != "cpu" else 1024
    cases = [([1], False), ([63, 65, 130], False), ([4097, 1, 130], False),
             ([65, 130, 63], True),
             ([1, 63, 65, 130, 4097] + g(59, hi), False)]
    if device != "cpu":
        cases.append(([32768 + 17, 40000], False))
        cases.append((g(3, 65536), False))
    # more than 128 requests (the kernel's two-pass schedule), empty requests
    cases.append(([0, 5, 0, 200] + g(130, 300), False))
    return cases


def _main_kernel_cases(spec: Spec, ops, device, cases, next_n: int):
    """Where a small-work kernel (tuning ``small``) takes the cases of :func:`default_cases` on
    ``device``: the 64-request and the longest 1-D cases again, each with a ``max_context_len``
    past its bound (:func:`dsagen.codegen.small_work_max_len`) so the main kernel runs:
    ``[(context_lens, max_context_len)]``; none on the CPU or without a small-work kernel."""
    if str(device) == "cpu" or not getattr(ops, "has_cuda", True):
        return []
    from .codegen import small_work_max_len
    sms = torch.cuda.get_device_properties(torch.device(device)).multi_processor_count
    flat = [c for c, two_d in cases if not two_d]
    picked = [c for c in flat if len(c) == 64][:1]
    picked += [c for c in [max(flat, key=max)] if c not in picked]
    out = []
    for lens in picked:
        bound = small_work_max_len(spec, next_n, len(lens), sms, getattr(ops, "tuning", None))
        if bound is not None:
            out.append((lens, max(max(lens), bound + 1)))
    return out


def _unhinted_cases(spec: Spec, ops, device, cases, next_n: int):
    """Where the sm_90a TMA kernel gives its key copies the L2 evict-first hint only in calls
    whose logits fit a share of the L2 (tuning ``kv_evict_first`` a fraction: its other
    instantiation, with the ``lean_loop`` form by default, runs the large calls), the 64-request
    case of :func:`default_cases` again with ``max_context_len`` raised until its logits
    (``B * next_n * max_context_len * 4`` bytes) pass that share, so the instantiation without
    the hint runs (and past the small-work kernel's bound, so the main kernel takes it):
    ``[(context_lens, max_context_len)]``; none on the CPU, without CUDA ops, or where every call
    runs one instantiation."""
    if str(device) == "cpu" or not getattr(ops, "has_cuda", True):
        return []
    from .codegen import (_kv_evict_first, effective_tuning, kv_evict_first_applies, paged_logits_kernel,
                          small_work_max_len)
    tuning = getattr(ops, "tuning", None)
    frac = _kv_evict_first(effective_tuning(spec, tuning))
    if frac <= 0:
        return []
    props = torch.cuda.get_device_properties(torch.device(device))
    flat = [c for c, two_d in cases if not two_d and len(c) == 64][:1]
    out = []
    for lens in flat:
        B, sms = len(lens), props.multi_processor_count
        small = small_work_max_len(spec, next_n, B, sms, tuning)
        max_len = max(max(lens), int(frac * props.L2_cache_size) // (B * next_n * 4) + spec.page_size,
                      (small or 0) + 1)
        kernel = paged_logits_kernel(spec, next_n, B, max_len, sms, props.major, tuning)
        if kernel == "ws" and not kv_evict_first_applies(spec, next_n, B, max_len, props.L2_cache_size,
                                                         tuning):
            out.append((lens, max_len))
    return out


def verify(spec: Spec, ops, device: str = "cpu", seed: int = 0, quick: bool = False,
           reruns: int = 2) -> Report:
    """Run the verification sweep of ``spec``'s ops on ``device`` ("cpu" or "cuda").

    ``seed`` seeds every random input (the same seed repeats a run); ``quick`` runs a short
    subset; ``reruns`` calls of each logits case must give the same bits. The ops' outputs are
    NaN-poisoned in every logits case (:func:`check_logits`, :func:`check_ragged`; restored
    after each). Returns a :class:`Report`;
    ``report.passed`` is the verdict.

    ``ops``: :class:`dsagen.ops.Ops` of ``spec`` loaded for ``device`` (CUDA kernels for
    "cuda"). Raises nothing for a disagreement (a failed row); an error an op raises for the
    sweep's inputs (e.g. RuntimeError from CPU-only ops on "cuda") propagates.
    """
    gen = torch.Generator().manual_seed(seed)
    rep = Report(spec.name, device)
    for n, kd in ((1, torch.bfloat16), (3, torch.float32), (128, torch.bfloat16), (4097, torch.bfloat16)):
        if quick and n > 128:
            continue
        row = check_store(ops, spec, n, gen, device, kd)
        row.backend = device
        rep.rows.append(row)
    cases = default_cases(device, gen)
    if quick:
        cases = cases[:3]
    for next_n in spec.next_n:
        for ctx, two_d in cases:
            if two_d:
                # 2-D lengths: each row its own length, around the 1-D case
                ctx = two_d_lens(ctx, next_n)
            row = check_logits(ops, spec, ctx, next_n, gen, device, ctx_2d=two_d, reruns=reruns)
            row.backend = device
            rep.rows.append(row)
        # cases again with max_context_len raised: with a small-work kernel (tuning `small`) the
        # cases above run on it, so the main kernel gets the two larger ones past its bound; and
        # the 64 requests with logits too large for the L2 evict-first hint run the main kernel's
        # other instantiation (the one large decode calls run)
        raised = ([(c, m, " main kernel") for c, m in _main_kernel_cases(spec, ops, device, cases, next_n)]
                  + [(c, m, f" max_len={m} no L2 hint") for c, m in _unhinted_cases(spec, ops, device, cases, next_n)])
        for ctx, max_len, label in raised:
            row = check_logits(ops, spec, ctx, next_n, gen, device, reruns=reruns,
                               max_context_len=max_len)
            row.shape += label
            row.backend = device
            rep.rows.append(row)
        row = check_logits(ops, spec, [130, 65], next_n, gen, device, clean_logits=False,
                           reruns=reruns, max_context_len=150)
        row.backend = device
        rep.rows.append(row)
        # max_context_len shorter than the contexts: columns are cut, not wrapped
        row = check_logits(ops, spec, [130, 300, 64], next_n, gen, device, reruns=reruns,
                           max_context_len=100)
        row.shape += " max_len=100"
        row.backend = device
        rep.rows.append(row)
    prefill = ragged_cases(gen, quick)
    for ks, ke, n, label in prefill:
        row = check_ragged(ops, spec, ks, ke, n, gen, device, label=label, reruns=reruns)
        row.backend = device
        rep.rows.append(row)
    if not quick:
        ks, ke, n, label = prefill[1]
        row = check_ragged(ops, spec, ks, ke, n, gen, device, clean_logits=False, label=label,
                           reruns=reruns)
        row.backend = device
        rep.rows.append(row)
    return rep
