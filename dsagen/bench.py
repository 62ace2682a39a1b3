"""``dsagen bench``: time the generated kernels against copy bandwidth, the PyTorch fallback and
DeepGEMM, in one process (DESIGN.md section 5).

What one run does:

1. prints the card, torch / CUDA versions and the date, then measures the device copy bandwidth
   (a 2 GiB device-to-device copy, bytes read + written, CUDA events, median of 30 runs);
2. for each spec, loads its ops (``dsagen.load(spec, with_cuda=True)``) and times
   ``paged_logits`` and ``store`` over :func:`default_shapes`, printing one table row per shape
   as it completes and a summary table at the end;
3. returns the rows as JSON-serialisable dicts, a leading ``op="meta"`` row first.

Timing method (what the project's reference figures use): CUDA events around one call, the call
launched right after a short GPU spin (``torch.cuda._sleep``) that outlasts the host launch, so
the host side is hidden; warm-up first; median of ``>= 50`` runs; the inputs rotate among
``>= 4`` sets whose total exceeds ``L2_TARGET_BYTES`` (256 MB, the H200 L2 is 60 MB) so that
the L2 is not what is measured. When even 64 sets stay under that total (small stores), a 256 MB
read runs before each spin to evict the L2 (``l2_scrub`` in the row). CUDA-graph replay is
available as the alternative (``method="graph"`` or ``DSAGEN_BENCH_METHOD=graph``).

Before each row the GPU idles ``SETTLE_S`` seconds (2; ``DSAGEN_BENCH_SETTLE``, 0 for none;
``settle_s`` in the meta row). Without it a short row right after a long one read slower: on
an H100 (``benchmarks/RESULTS.md``, forty-fourth session) B=32 ctx 8192 next_n 2 took
20.2-20.3 us (its own schedule) and up to 19.3 us (from a schedule) after a B=128 ctx 65536 or
mixed row, against 18.2-18.5 / 17.3-17.6 us after a short row, and 18.5-18.6 / 17.4-17.7 us
after any row with a 2-second pause (a longer warm-up, 100 calls, did not help).

A paged-logits row on CUDA is timed twice: as a call that computes its own schedule (``us``)
and from a precomputed ``paged_logits_schedule`` (``us_scheduled``, with ``schedule_us`` the
schedule kernel's own time; a serving step makes one schedule for all of its layers). DeepGEMM
is timed with its schedule metadata made outside the timed call, so ``speedup_vs_deepgemm_scheduled``
is the like-for-like comparison. Where the DeepGEMM build runs only without its clean pass
(``clean_logits=False``, named in ``deepgemm_note``), which leaves each row's positions past its
request's length unwritten, dsagen's scheduled call is also timed with ``clean_logits=False``
(``us_scheduled_unclean``, ``speedup_vs_deepgemm_unclean``; ``unclean_valid_equal``: its
visible logits are the clean call's, bitwise; ``unclean_note``: why it did not run). Without the
clean pass the masked positions of each row (past its causal bound, and past its request's
length) hold whatever the kernels leave there; most of the written bytes saved are those of
requests shorter than ``max_context_len`` (the mixed batch).

The DeepGEMM series above runs right after the PyTorch fallback's, and at some shapes the series
that followed the fallback was measured to run faster than the same series elsewhere
(``benchmarks/ab_dg.py``; the card's clocks and power cap). So each DeepGEMM row is timed once more, paired
(:func:`paired_times`): ``PAIRED_ROUNDS`` rounds, each timing a whole series of dsagen's scheduled
call, of DeepGEMM's and (where DeepGEMM ran without its clean pass) of dsagen's unclean call,
in orders that put each one at each place of a round equally often. ``us_scheduled_paired``,
``deepgemm_us_paired``, ``us_scheduled_unclean_paired`` are the medians over the rounds of each
series' median; ``speedup_vs_deepgemm_paired`` (and ``speedup_vs_deepgemm_unclean_paired``) the
median over the rounds of that round's DeepGEMM / dsagen ratio (not the ratio of the medians);
the clean ratio's min and max over the rounds are ``speedup_vs_deepgemm_paired_range``. The
sequential fields above are kept as they were.

Bytes per row are the minimal traffic (:func:`paged_logits_bytes`, :func:`store_bytes`). A
paged-logits row on CUDA also names the kernel that ran (``kernel``:
:func:`dsagen.codegen.paged_logits_kernel`, e.g. ``"ws (small)"``) and, for those, whether its key
copies carry the L2 evict-first policy (``kv_evict_first``: :func:`dsagen.codegen.kv_evict_first_applies`).
The pure pieces (shapes, byte formulas, input construction, table formatting, :class:`Bench` with
a host timer) run on CPU tensors too, which is how ``tests/test_bench.py`` checks them.
"""
from __future__ import annotations

import datetime as _dt
import gc
import itertools
import math
import json
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from . import __version__, config
from . import reference as R
from .spec import Spec

L2_TARGET_BYTES = 256 * 10**6     # total bytes of the rotated input sets (H200 L2: 60 MB)
MIN_SETS = 4
MAX_SETS = 64
SET_MEMORY_BUDGET = 24 * 10**9    # cap on the bytes of all input sets of one shape
FALLBACK_MAX_BYTES = 40 * 10**9   # skip the PyTorch fallback above this estimated peak
COPY_BYTES = 2 << 30              # copy-bandwidth probe: 2 GiB read + 2 GiB written
MIXED_B = 128
MIXED_MAX_CTX = 65536
MIXED_SEED = 1234
RERUNS = 20                       # bitwise determinism reruns per row (every op)
PAIRED_ROUNDS = 6                 # order-balanced rounds of the paired dsagen / DeepGEMM timing
SETTLE_S = 2.0                    # the GPU idles this long before each row (env DSAGEN_BENCH_SETTLE)
SPIN_MIN_US = 30.0                # the spin before each timed call lasts at least this long
SPIN_MAX_US = 5000.0

__all__ = [
    "Shape", "Timing", "Bench", "run", "default_shapes", "context_lens_for",
    "paged_logits_bytes", "store_bytes", "ragged_flops", "fallback_peak_bytes", "num_sets",
    "make_logits_inputs", "make_store_inputs", "store_slots", "random_keys_on", "deepgemm_applies",
    "format_header", "format_row", "format_table", "measure_copy_bandwidth", "device_meta",
    "CudaTimer", "HostTimer",
]


# --------------------------------------------------------------------------------------------
# shapes and byte counts (pure)
# --------------------------------------------------------------------------------------------
STORE_SLOTS = ("random", "pages")   # store slot patterns (Shape.slots, make_store_inputs)


@dataclass(frozen=True)
class Shape:
    """One benchmark case.

    ``op="paged_logits"``: ``B`` requests of ``next_n`` query rows, each ``ctx`` keys long
    (``ctx="mixed"``: ``B`` lengths uniform in ``[1, 65536]``, seeded by ``MIXED_SEED``).
    ``op="store"``: ``N`` bf16 keys stored at distinct slots of a pool of about ``2N``:
    ``slots="random"`` (the default; each token anywhere, as a decode step's new tokens are) or
    ``slots="pages"`` (a prefill's: consecutive tokens fill whole pages, the pages in a random
    order).
    ``op="ragged_logits"``: causal prefill of the last ``B`` tokens of a ``ctx``-token sequence:
    query ``i`` sees keys ``[0, ctx - B + i + 1)`` (DeepGEMM ``fp8_mqa_logits`` semantics): ``B`` is
    the number of queries S and ``ctx`` the number of keys N.

    Raises:
        ValueError: ``slots`` given for an op other than store, or not one of ``STORE_SLOTS``.
    """

    op: str
    B: int | None = None
    next_n: int | None = None
    ctx: int | str | None = None
    N: int | None = None
    slots: str | None = None

    def __post_init__(self):
        if self.slots is None:
            return
        if self.op != "store":
            raise ValueError(f"slots={self.slots!r} is a store shape's field (op={self.op!r})")
        if self.slots not in STORE_SLOTS:
            raise ValueError(f"store slots={self.slots!r}: must be one of {', '.join(STORE_SLOTS)}")
        if self.slots == "random":          # one spelling of the default: equal shapes compare equal
            object.__setattr__(self, "slots", None)

    def label(self) -> str:
        """The shape in words, as the bench's progress lines print it."""
        if self.op == "store":
            return f"store N={self.N}" + (" pages" if self.slots == "pages" else "")
        if self.op == "ragged_logits":
            return f"ragged_logits S={self.B} N={self.ctx}"
        return f"paged_logits B={self.B} next_n={self.next_n} ctx={self.ctx}"


def default_shapes(spec: Spec, quick: bool = False) -> list[Shape]:
    """The shape list of ``dsagen bench`` for one spec.

    Full: paged_logits at ``B in {32, 128} x next_n in {1, 2} (those in spec.next_n; the spec's
    smallest next_n where it has neither) x ctx in
    {8192, 32768, 65536}``, plus ``B=128`` with mixed lengths per next_n; store at
    ``N in {1, 128, 16384, 65536}`` at random slots and ``N=65536`` at a prefill's slots (whole
    pages; not for a page size of 1, where the two patterns are the same); ragged_logits
    (prefill) at ``(S, N)`` = (4096, 4096) and (2048, 16384) (``Shape``'s ``B`` and ``ctx``). ``quick``:
    paged_logits ``B=32, next_n=1`` (or the spec's smallest next_n), ``ctx=8192``; store ``N in
    {128, 65536}``.
    """
    if quick:
        nn = 1 if 1 in spec.next_n else min(spec.next_n)
        return [Shape("paged_logits", B=32, next_n=nn, ctx=8192),
                Shape("store", N=128), Shape("store", N=65536)]
    out: list[Shape] = []
    for nn in [n for n in (1, 2) if n in spec.next_n] or [min(spec.next_n)]:
        for B in (32, 128):
            for ctx in (8192, 32768, 65536):
                out.append(Shape("paged_logits", B=B, next_n=nn, ctx=ctx))
        out.append(Shape("paged_logits", B=MIXED_B, next_n=nn, ctx="mixed"))
    out += [Shape("store", N=n) for n in (1, 128, 16384, 65536)]
    if spec.page_size > 1:
        out.append(Shape("store", N=65536, slots="pages"))
    out += [Shape("ragged_logits", B=S, ctx=n) for S, n in ((4096, 4096), (2048, 16384))]
    return out


def ragged_flops(spec: Spec, S: int, N: int) -> int:
    """``2 * sum(ke - ks) * num_heads * head_dim`` of a causal ragged shape (see :class:`Shape`)."""
    visible = sum(N - S + i + 1 for i in range(S))
    return 2 * visible * spec.num_heads * spec.head_dim


def context_lens_for(shape: Shape) -> list[int]:
    """Per-request context lengths of a paged_logits shape (``"mixed"``: seeded, uniform in
    ``[1, MIXED_MAX_CTX]``, the same draw in every run and for every spec)."""
    if shape.ctx == "mixed":
        g = torch.Generator().manual_seed(MIXED_SEED)
        return torch.randint(1, MIXED_MAX_CTX + 1, (shape.B,), generator=g).tolist()
    return [int(shape.ctx)] * int(shape.B)


def paged_logits_bytes(spec: Spec, B: int, next_n: int, sum_context_lens: int,
                       max_context_len: int) -> int:
    """Minimal bytes one ``paged_logits`` call moves.

    Keys + scales read once (``sum_context_lens * spec.bytes_per_token``) + q
    (``B*next_n*num_heads*head_dim`` elements of ``spec.query``: e4m3 for e4m3 keys, bf16 for
    e2m1, else the key dtype) + weights (fp32
    ``B*next_n*num_heads``) + logits written (fp32 ``B*next_n*max_context_len``).
    """
    q = B * next_n * spec.num_heads * spec.head_dim * spec.query.bits // 8
    w = B * next_n * spec.num_heads * 4
    logits = B * next_n * max_context_len * 4
    return sum_context_lens * spec.bytes_per_token + q + w + logits


def store_bytes(spec: Spec, N: int) -> int:
    """Minimal bytes one ``store`` of ``N`` bf16 keys moves: ``N*head_dim*2`` read +
    ``N*bytes_per_token`` written + ``N*8`` (int64 ``loc``) read."""
    return N * spec.head_dim * 2 + N * spec.bytes_per_token + N * 8


def fallback_peak_bytes(spec: Spec, B: int, next_n: int, max_context_len: int) -> int:
    """Conservative estimate of the extra memory :func:`dsagen.reference.fallback_paged_logits`
    allocates (gathered pages, dequantized keys, the ``[B, next_n*H, T]`` score tensors)."""
    ps = spec.page_size
    P = (max_context_len + ps - 1) // ps
    T = P * ps
    D, H = spec.head_dim, spec.num_heads
    pages = B * P * (spec.page_bytes + spec.scale_page_bytes)
    keys = B * T * (spec.key_bytes_per_token + 4 + D * (2 + 4 + 2))
    scores = B * next_n * H * T * (2 + 4 + 4 + 4)
    out = B * next_n * T * 4 * 3
    return pages + keys + scores + out


def num_sets(set_bytes: int, target: int = L2_TARGET_BYTES, min_sets: int = MIN_SETS,
             max_sets: int = MAX_SETS) -> int:
    """How many input sets to rotate among so that together they exceed ``target`` bytes
    (at least ``min_sets``, at most ``max_sets``)."""
    n = math.ceil(target / max(1, set_bytes)) if set_bytes < target else min_sets
    return int(min(max_sets, max(min_sets, n)))


def deepgemm_applies(spec: Spec) -> bool:
    """Whether ``deep_gemm.fp8_paged_mqa_logits`` reads this layout: e4m3 keys, one fp32 scale
    per token at the page tail, 64-token pages of ``64*132`` bytes, head_dim 128."""
    return (spec.key_dtype == "e4m3" and spec.scale_dtype == "fp32"
            and spec.scale_placement == "page_tail" and spec.page_size == 64
            and spec.head_dim == 128 and spec.scales_per_token == 1
            and spec.page_bytes == 64 * 132)


# --------------------------------------------------------------------------------------------
# inputs (CPU or CUDA)
# --------------------------------------------------------------------------------------------
def random_keys_on(n: int, head_dim: int, gen: torch.Generator, device,
                   dtype=torch.bfloat16) -> torch.Tensor:
    """``[n, head_dim]`` random keys generated on ``device`` (``gen`` must live there), with a
    random per-token magnitude (``randn * exp(randn) * 2``) so scales differ between tokens."""
    k = torch.randn(n, head_dim, generator=gen, device=device)
    k.mul_(torch.randn(n, 1, generator=gen, device=device).exp_().mul_(2.0))
    return k.to(dtype)


def _gen(device, seed: int) -> torch.Generator:
    return torch.Generator(device=torch.device(device)).manual_seed(seed)


StoreFn = Callable[..., None]   # store(k, kv_cache, loc) or, separate specs, (k, kv_cache, loc, kv_scales)


def make_logits_inputs(spec: Spec, store: StoreFn, context_lens: Sequence[int], next_n: int,
                       seed: int, device, chunk_tokens: int = 1 << 20,
                       pad_pages_to: int = 32) -> dict[str, Any]:
    """One fresh random input set for ``paged_logits``.

    The cache is filled with random bytes, then every slot gets a stored random key through
    ``store(k, kv_cache, loc)`` (``ops.store`` on the GPU, in chunks of ``chunk_tokens``), so keys
    and scales are valid and padding bytes are random. A ``separate`` spec gets a random
    ``kv_scales`` too, and ``store(k, kv_cache, loc, kv_scales)``. The block table (int32
    ``[B, max_pages]``, ``max_pages`` padded to a multiple of ``pad_pages_to``) holds a random
    permutation of the pages; the columns past a request's length point at random real pages.

    Returns a dict with ``q [B, next_n, num_heads, head_dim]`` (in ``spec.query``; e4m3 q is
    ``randn*8``), ``kv_cache`` uint8 ``[num_pages, page_bytes]``, ``kv_scales`` (uint8
    ``[num_pages, scale_page_bytes]`` for a separate spec, else None), ``weights`` fp32
    ``[B*next_n, num_heads]``, ``context_lens`` int32 ``[B]``, ``block_table``,
    ``max_context_len`` (int), ``sum_context_lens`` (int), ``cache_bytes`` (int, scales included).
    """
    B, ps = len(context_lens), spec.page_size
    gcpu = torch.Generator().manual_seed(seed)
    pages_per = [max(1, math.ceil(int(c) / ps)) for c in context_lens]
    num_pages = sum(pages_per)
    max_pages = max(pages_per)
    if pad_pages_to > 1:
        max_pages = -(-max_pages // pad_pages_to) * pad_pages_to
    perm = torch.randperm(num_pages, generator=gcpu).to(torch.int32)
    if len(set(pages_per)) == 1 and pages_per[0] == max_pages:
        bt = perm.view(B, max_pages).clone()
    else:
        bt = torch.randint(0, num_pages, (B, max_pages), generator=gcpu, dtype=torch.int32)
        pos = 0
        for b, n in enumerate(pages_per):
            bt[b, :n] = perm[pos:pos + n]
            pos += n
    g = _gen(device, seed)
    cache = torch.randint(0, 256, (num_pages, spec.page_bytes), generator=g, dtype=torch.uint8,
                          device=device)
    scales = (torch.randint(0, 256, (num_pages, spec.scale_page_bytes), generator=g, dtype=torch.uint8,
                            device=device) if spec.separate_scales else None)
    n_slots = num_pages * ps
    for s0 in range(0, n_slots, chunk_tokens):
        n = min(chunk_tokens, n_slots - s0)
        k = random_keys_on(n, spec.head_dim, g, device)
        store(k, cache, torch.arange(s0, s0 + n, dtype=torch.int64, device=device),
              *(() if scales is None else (scales,)))
        del k
    q = torch.randn(B, next_n, spec.num_heads, spec.head_dim, generator=g, device=device)
    if spec.key_dtype == "e4m3":
        q.mul_(8.0)
    q = q.to(spec.query.torch_dtype)
    w = torch.randn(B * next_n, spec.num_heads, generator=g, device=device)
    cl = torch.tensor([int(c) for c in context_lens], dtype=torch.int32, device=device)
    return {"q": q, "kv_cache": cache, "kv_scales": scales, "weights": w, "context_lens": cl,
            "block_table": bt.to(device), "max_context_len": int(max(context_lens)),
            "sum_context_lens": int(sum(int(c) for c in context_lens)),
            "cache_bytes": num_pages * (spec.page_bytes + spec.scale_page_bytes)}


def store_slots(N: int, num_pages: int, page_size: int, slots: str, gen: torch.Generator,
                device) -> torch.Tensor:
    """``N`` distinct slots (int64 ``[N]`` on ``device``) of a pool of ``num_pages`` pages of
    ``page_size`` tokens, drawn with ``gen`` (on its own device): ``slots="random"`` anywhere in
    the pool; ``"pages"`` token ``i`` at offset ``i % page_size`` of page ``perm[i // page_size]``
    for a random page permutation ``perm`` (a prefill's slot mapping; needs ``N <= num_pages *
    page_size``). ValueError for another ``slots``."""
    if slots not in STORE_SLOTS:
        raise ValueError(f"slots={slots!r}: must be one of {', '.join(STORE_SLOTS)}")
    if slots == "random":
        loc = torch.randperm(num_pages * page_size, generator=gen, device=gen.device)[:N]
    else:
        perm = torch.randperm(num_pages, generator=gen, device=gen.device)
        i = torch.arange(N, dtype=torch.int64, device=gen.device)
        loc = perm[i // page_size] * page_size + i % page_size
    return loc.to(device=device, dtype=torch.int64)


def make_store_inputs(spec: Spec, N: int, seed: int, device, slots: str = "random") -> dict[str, Any]:
    """One fresh random input set for ``store``: ``k`` bf16 ``[N, head_dim]``, ``kv_cache``
    (random bytes, ``ceil(2N/page_size)+1`` pages), ``kv_scales`` (random bytes, the same pages,
    separate specs; else None) and ``loc`` int64 ``[N]`` distinct slots of that pool
    (:func:`store_slots`: ``slots`` ``"random"`` or ``"pages"``). ValueError for another
    ``slots``."""
    g = _gen(device, seed)
    num_pages = math.ceil(2 * N / spec.page_size) + 1
    cache = torch.randint(0, 256, (num_pages, spec.page_bytes), generator=g, dtype=torch.uint8,
                          device=device)
    loc = store_slots(N, num_pages, spec.page_size, slots, g, device)
    k = random_keys_on(N, spec.head_dim, g, device)
    scales = (torch.randint(0, 256, (num_pages, spec.scale_page_bytes), generator=g, dtype=torch.uint8,
                            device=device) if spec.separate_scales else None)
    return {"k": k, "kv_cache": cache, "kv_scales": scales, "loc": loc.contiguous()}


def _logits_set_bytes(spec: Spec, B: int, next_n: int, context_lens: Sequence[int]) -> int:
    """Bytes one paged_logits input set occupies (what rotating it through the L2 is about)."""
    ps = spec.page_size
    pages = sum(max(1, math.ceil(int(c) / ps)) for c in context_lens)
    return (pages * (spec.page_bytes + spec.scale_page_bytes)
            + paged_logits_bytes(spec, B, next_n, 0, max(int(c) for c in context_lens)))


# --------------------------------------------------------------------------------------------
# timers
# --------------------------------------------------------------------------------------------
@dataclass
class Timing:
    """Per-call times in microseconds of one timed function: ``us`` the median, ``us_min`` /
    ``us_max`` over the ``runs`` timed calls; ``method`` ``"spin"``, ``"graph"`` or ``"host"``;
    ``spin_us`` the GPU spin before each call (0 for the host timer); ``note`` why a graph
    timing fell back to eager calls."""

    us: float               # median
    us_min: float
    us_max: float
    runs: int
    method: str
    spin_us: float = 0.0
    note: str = ""


def _timing(samples: list[float], method: str, spin_us: float = 0.0, note: str = "") -> Timing:
    return Timing(statistics.median(samples), min(samples), max(samples), len(samples), method,
                  spin_us, note)


def paired_times(timer, fns: dict[str, Callable[[int], Any]], n_sets: int, runs: int, warmup: int,
                 scrub: torch.Tensor | None = None, rounds: int = PAIRED_ROUNDS,
                 ) -> dict[str, list[float]]:
    """Time several functions in ``rounds`` rounds of whole series (``timer.time(fn, n_sets,
    runs, warmup, scrub)`` each), the order of a round cycling through the permutations of
    ``fns`` so that, within a round, each function holds each place (first, second, ...) and
    comes right after each other one equally often over the rounds when ``rounds`` is a
    multiple of their count's factorial (2 functions: 2, 3 functions: 6). Across the rounds'
    boundaries (the last series of one round before the first of the next) it is not balanced.

    Returns ``{name: [median us of round 0, round 1, ...]}``. Raises ``ValueError`` for fewer
    than one round or no functions. Used for the paired DeepGEMM comparison (module docstring):
    a series' time can depend on what ran just before it on a card at its power cap."""
    if rounds < 1 or not fns:
        raise ValueError(f"paired_times needs >= 1 round and >= 1 function (got {rounds}, {len(fns)})")
    orders = list(itertools.permutations(fns))
    out: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(rounds):
        for name in orders[r % len(orders)]:
            out[name].append(timer.time(fns[name], n_sets, runs, warmup, scrub).us)
    return out


class HostTimer:
    """Wall-clock timer (``time.perf_counter``); for CPU runs and tests only."""

    method = "host"

    def time(self, fn: Callable[[int], Any], n_sets: int, runs: int, warmup: int,
             scrub: torch.Tensor | None = None) -> Timing:
        """Call ``fn(i % n_sets)`` ``warmup`` times, then ``runs`` (>= 1) timed times; returns
        their :class:`Timing` (wall clock, microseconds). ``scrub`` is ignored."""
        for i in range(warmup):
            fn(i % n_sets)
        ts = []
        for i in range(runs):
            t0 = time.perf_counter()
            fn((warmup + i) % n_sets)
            ts.append((time.perf_counter() - t0) * 1e6)
        return _timing(ts, self.method)


class CudaTimer:
    """CUDA-event timer: each call is launched right after a ``torch.cuda._sleep`` spin that
    outlasts the host's launch of one iteration (calibrated during warm-up, at least
    ``SPIN_MIN_US``), so the median measures GPU time only.

    ``method="spin"`` (default) times eager calls; ``method="graph"`` captures one CUDA graph per
    input set and times its replay the same way (falls back to ``spin`` when capture fails).
    ValueError for another ``method``; needs a CUDA device (it calibrates the spin on it).
    """

    def __init__(self, method: str = "spin"):
        if method not in config.BENCH_METHODS:
            raise ValueError(f"unknown timing method {method!r} (spin or graph)")
        self.method = method
        self.cycles_per_us = self._calibrate()

    @staticmethod
    def _calibrate() -> float:
        """GPU clock cycles per microsecond of ``torch.cuda._sleep``."""
        cycles = 500_000
        torch.cuda._sleep(cycles)
        torch.cuda.synchronize()
        ts = []
        for _ in range(5):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            torch.cuda._sleep(cycles)
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e) * 1e3)
        return cycles / statistics.median(ts)

    def cycles(self, us: float) -> int:
        """``torch.cuda._sleep`` cycles for a spin of about ``us`` microseconds (at least 1)."""
        return max(1, int(us * self.cycles_per_us))

    def time(self, fn: Callable[[int], Any], n_sets: int, runs: int, warmup: int,
             scrub: torch.Tensor | None = None) -> Timing:
        """Time ``fn(i % n_sets)``: ``warmup`` untimed iterations (which also size the spin),
        then ``runs`` timed ones. ``scrub``: a buffer read before each spin to evict the L2.
        Returns their :class:`Timing` (CUDA-event microseconds)."""
        note = ""
        call: Callable[[int], Any] = fn
        graphs = None
        if self.method == "graph":
            try:
                graphs = self._capture(fn, n_sets, warmup)
                call = lambda k: graphs[k].replay()  # noqa: E731
            except Exception as e:  # capture is not possible for every op (host syncs ...)
                torch.cuda.synchronize()
                note = f"graph capture failed ({type(e).__name__}); timed eagerly"
                graphs = None
        warmup = max(warmup, 3)
        spin = self.cycles(SPIN_MIN_US * 2)
        host = []
        torch.cuda.synchronize()
        for i in range(warmup):
            t0 = time.perf_counter()
            if scrub is not None:
                scrub.sum()
            torch.cuda._sleep(spin)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            call(i % n_sets)
            e.record()
            host.append((time.perf_counter() - t0) * 1e6)
            torch.cuda.synchronize()   # so that a slow first call does not hide the host time
        host_us = statistics.median(host[1:] if len(host) > 1 else host)
        spin_us = min(SPIN_MAX_US, max(SPIN_MIN_US, 1.5 * host_us + 5.0))
        spin = self.cycles(spin_us)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(runs)]
        torch.cuda.synchronize()
        for i in range(runs):
            if scrub is not None:
                scrub.sum()
            torch.cuda._sleep(spin)
            events[i][0].record()
            call((warmup + i) % n_sets)
            events[i][1].record()
        torch.cuda.synchronize()
        ts = [s.elapsed_time(e) * 1e3 for s, e in events]
        del graphs
        return _timing(ts, "graph" if self.method == "graph" and not note else "spin", spin_us,
                       note)

    @staticmethod
    def _capture(fn, n_sets: int, warmup: int):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(max(2, min(warmup, n_sets))):
                fn(i % n_sets)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        pool = torch.cuda.graph_pool_handle()
        graphs = []
        for k in range(n_sets):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                fn(k)
            graphs.append(g)
        torch.cuda.synchronize()
        return graphs


# --------------------------------------------------------------------------------------------
# device facts and the copy bandwidth
# --------------------------------------------------------------------------------------------
def _git_commit() -> str | None:
    # DSAGEN_BENCH_GIT names the commit where the tree was copied without its current .git (the
    # project's device runs copy the working tree; their .git can be an older one)
    if named := config.bench_git():
        return named + " (DSAGEN_BENCH_GIT)"
    try:
        root = Path(__file__).resolve().parent.parent
        r = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                           capture_output=True, text=True, timeout=5)
        if r.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return r.stdout.strip() + ("-dirty" if dirty else "")
    except Exception:
        return None


def _nvidia_smi() -> dict[str, str]:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.max.sm,"
                            "clocks.mem,power.limit", "--format=csv,noheader", "-i",
                            str(torch.cuda.current_device())],
                           capture_output=True, text=True, timeout=10)
        vals = [v.strip() for v in r.stdout.strip().splitlines()[0].split(",")]
        keys = ["driver", "sm_clock", "sm_clock_max", "mem_clock", "power_limit"]
        return dict(zip(keys, vals))
    except Exception:
        return {}


def _deep_gemm():
    try:
        import deep_gemm  # noqa: F401
        return deep_gemm
    except Exception:
        return None


def device_meta() -> dict[str, Any]:
    """Card name, SM count, L2 (MB) and memory (GB) size, torch / CUDA versions, driver, clocks,
    git commit, date (UTC), ``deep_gemm`` version: the ``op="meta"`` row's fields. Needs a CUDA
    device (torch raises otherwise)."""
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    meta: dict[str, Any] = {
        "card": torch.cuda.get_device_name(),
        "capability": "sm_%d%d" % torch.cuda.get_device_capability(),
        "sm_count": int(p.multi_processor_count),
        "l2_mb": round(getattr(p, "L2_cache_size", 0) / 2**20, 1) or None,
        "memory_gb": round(p.total_memory / 1e9, 1),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "dsagen": __version__,
        "git": _git_commit(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    meta.update(_nvidia_smi())
    dg = _deep_gemm()
    meta["deep_gemm"] = getattr(dg, "__version__", "available") if dg is not None else None
    return meta


def measure_copy_bandwidth(timer: CudaTimer, nbytes: int = COPY_BYTES, runs: int = 30,
                           warmup: int = 3) -> dict[str, Any]:
    """Device copy bandwidth: ``dst.copy_(src)`` of ``nbytes`` (device to device), timed like the
    kernels but always eagerly after a spin (a copy captured in a CUDA graph becomes a memcpy node,
    which the H200 ran at 2716 GB/s against 4251 GB/s eagerly: not the bandwidth a kernel sees).
    Returns ``{"copy_GBps": (read + written bytes) / median time in GB/s, "copy_us",
    "copy_bytes" (read + written), "copy_runs"}``. ``nbytes`` is capped at a quarter of the free
    device memory. Needs a CUDA device."""
    free, _ = torch.cuda.mem_get_info()
    nbytes = int(min(nbytes, free // 4))
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    if timer.method == "graph":
        timer = CudaTimer("spin")
    t = timer.time(lambda _k: dst.copy_(src), 1, runs, warmup)
    del src, dst
    torch.cuda.empty_cache()
    return {"copy_GBps": round(2 * nbytes / t.us / 1e3, 1), "copy_us": round(t.us, 2),
            "copy_bytes": 2 * nbytes, "copy_runs": t.runs}


# --------------------------------------------------------------------------------------------
# table
# --------------------------------------------------------------------------------------------
_COLS = [  # (title, width, key, format)
    ("spec", 18, "spec", "s"),
    ("op", 13, "op", "s"),
    ("B", 4, "B", "d"),
    ("nn", 3, "next_n", "d"),
    ("ctx/N", 7, "ctx_or_N", "s"),
    ("us", 10, "us", ".1f"),
    ("MB", 8, "bytes", "MB"),         # the minimal bytes moved (``bytes``), in 1e6 bytes
    ("GB/s", 7, "GBps", ".0f"),
    ("%copy", 6, "pct_copy_bw", ".1f"),
    ("us_sched", 9, "us_scheduled", ".1f"),
    ("%copy_s", 7, "pct_copy_bw_scheduled", ".1f"),
    ("fallback_us", 12, "fallback_us", ".1f"),
    ("x_fb", 7, "speedup_vs_fallback", ".1f"),
    ("deepgemm_us", 12, "deepgemm_us", ".1f"),
    ("dg%copy", 8, "deepgemm_pct_copy_bw", ".1f"),
    ("x_dg", 6, "speedup_vs_deepgemm", ".2f"),
    ("x_dg_s", 6, "speedup_vs_deepgemm_scheduled", ".2f"),
    ("x_dg_u", 6, "speedup_vs_deepgemm_unclean", ".2f"),
    ("x_dg_p", 6, "speedup_vs_deepgemm_paired", ".2f"),
    ("bitwise", 8, "bitwise_20_reruns", "b"),
    ("TF/s", 6, "tflops", ".1f"),
    ("%mm", 5, "pct_matmul", ".1f"),
]


def _cell(row: dict, key: str, fmt: str) -> str:
    if key == "ctx_or_N":
        v = row.get("N") if row.get("op") == "store" else row.get("ctx")
        if v is not None and row.get("op") == "store" and row.get("slots") == "pages":
            return f"{v}p"          # a prefill's slots (whole pages)
        return "-" if v is None else str(v)
    v = row.get(key)
    if v is None:
        return "-"
    if fmt == "b":
        return "yes" if v else "NO"
    if fmt == "s":
        return str(v)
    if fmt == "MB":
        return format(v / 1e6, ".4g")
    return format(v, fmt)


def format_header() -> str:
    """The column titles of :func:`format_row`, aligned the same way."""
    parts = []
    for i, (title, w, _k, _f) in enumerate(_COLS):
        parts.append(f"{title:<{w}}" if i < 2 else f"{title:>{w}}")
    return " ".join(parts).rstrip()


def format_row(row: dict) -> str:
    """One aligned table line of a result row (``None`` prints as ``-``); an ``error`` field is
    appended."""
    parts = []
    for i, (_t, w, key, fmt) in enumerate(_COLS):
        c = _cell(row, key, fmt)
        if len(c) > w:
            c = c[:w - 1] + "~"
        parts.append(f"{c:<{w}}" if i < 2 else f"{c:>{w}}")
    line = " ".join(parts).rstrip()
    if row.get("error"):
        line += f"  ERROR: {row['error']}"
    return line


def format_table(rows: Sequence[dict]) -> str:
    """Header + one line per non-meta row."""
    return "\n".join([format_header()] + [format_row(r) for r in rows if r.get("op") != "meta"])


# --------------------------------------------------------------------------------------------
# the benchmark
# --------------------------------------------------------------------------------------------
def _free(device) -> None:
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _r(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(float(x), nd)


def _sig(x: float, digits: int = 4) -> float:
    """``x`` rounded to ``digits`` significant digits (rates span 1e-5 on a CPU to 1e3 TFLOP/s)."""
    return float(f"{float(x):.{digits}g}")


def _short(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0] if s else ''}"[:300]


class Bench:
    """Times one spec's ops over shapes and builds result rows.

    Args:
        device: ``"cuda"`` (or ``"cpu"`` with a :class:`HostTimer`, for tests).
        timer: a :class:`CudaTimer` or :class:`HostTimer`.
        copy_GBps: the copy bandwidth of this run (GB/s, read + written) for ``pct_copy_bw``.
        runs / warmup: timed / untimed calls per kernel; fallback_runs for the PyTorch fallback.
        reruns: bitwise-determinism reruns of each row's op (a store: of one input set's cache bytes).
        l2_target / max_sets: the rotated input sets total at least ``l2_target`` bytes, using
            at most ``max_sets`` sets (then an L2 scrub is added on CUDA).
        seed: seed of the random inputs.
        deepgemm: the imported ``deep_gemm`` module to time side by side on the fp8 page-tail
            layout (its ``fp8_paged_mqa_logits`` on the same inputs), or None.
        log: where progress lines go (default: print to stdout, flushed).
        settle_s: seconds the device idles (synchronized, then a host sleep) before each row,
            so that a row is not timed while the card recovers from the last (module docstring).
    """

    def __init__(self, device, timer, copy_GBps: float, runs: int = 100, warmup: int = 10,
                 fallback_runs: int = 10, reruns: int = RERUNS, l2_target: int = L2_TARGET_BYTES,
                 max_sets: int = MAX_SETS, seed: int = 0, deepgemm=None,
                 log: Callable[[str], None] | None = None, settle_s: float = 0.0):
        self.device = torch.device(device)
        self.timer = timer
        self.copy_GBps = float(copy_GBps)
        self.runs, self.warmup, self.fallback_runs, self.reruns = runs, warmup, fallback_runs, reruns
        self.l2_target, self.max_sets, self.seed = l2_target, max_sets, seed
        self.deepgemm = deepgemm
        self.settle_s = float(settle_s)
        self.log = log or (lambda s: print(s, flush=True))
        self._scrub: torch.Tensor | None = None

    # ---- helpers ---------------------------------------------------------------------------
    def _same_bits(self, call):
        """``(same, first)``: whether ``call()`` (returning a tensor, or a list of tensors) gives
        the same bits on ``reruns`` more calls as on its first (no races), and the first call's
        result, which also warmed the op up."""
        def listed(r):
            return r if isinstance(r, list) else [r]
        first = call()
        same = all(all(torch.equal(a, b) for a, b in zip(listed(call()), listed(first)))
                   for _ in range(self.reruns))
        return same, first

    def _scrub_buffer(self, total_bytes: int) -> torch.Tensor | None:
        if self.device.type != "cuda" or total_bytes >= self.l2_target:
            return None
        if self._scrub is None:
            self._scrub = torch.zeros(self.l2_target // 4, dtype=torch.float32, device=self.device)
        return self._scrub

    def _pct(self, nbytes: int, us: float | None) -> tuple[float | None, float | None]:
        if not us:
            return None, None
        gbps = nbytes / us / 1e3
        return gbps, 100.0 * gbps / self.copy_GBps if self.copy_GBps else None

    def _base_row(self, spec: Spec, shape: Shape) -> dict[str, Any]:
        return {"spec": spec.name, "spec_digest": spec.digest, "op": shape.op, "B": shape.B,
                "next_n": shape.next_n, "ctx": shape.ctx, "N": shape.N,
                "slots": (shape.slots or "random") if shape.op == "store" else None, "us": None,
                "us_min": None, "us_max": None, "runs": None, "bytes": None, "GBps": None,
                "pct_copy_bw": None, "copy_GBps": self.copy_GBps, "n_sets": None,
                "sets_mb": None, "l2_scrub": False, "method": None, "spin_us": None,
                "fallback_us": None, "speedup_vs_fallback": None, "fallback_note": None,
                "deepgemm_us": None, "deepgemm_pct_copy_bw": None, "speedup_vs_deepgemm": None,
                "deepgemm_note": None, "bitwise_20_reruns": None, "us_scheduled": None,
                "GBps_scheduled": None, "pct_copy_bw_scheduled": None, "schedule_us": None,
                "scheduled_bitwise_equal": None, "speedup_vs_deepgemm_scheduled": None,
                "us_scheduled_unclean": None, "speedup_vs_deepgemm_unclean": None,
                "us_scheduled_paired": None, "deepgemm_us_paired": None,
                "speedup_vs_deepgemm_paired": None, "speedup_vs_deepgemm_unclean_paired": None,
                "us_scheduled_unclean_paired": None, "speedup_vs_deepgemm_paired_range": None,
                "paired_rounds": None, "paired_note": None,
                "unclean_valid_equal": None, "unclean_note": None,
                "error": None}

    def _fill_timing(self, row: dict, t: Timing, nbytes: int) -> None:
        gbps, pct = self._pct(nbytes, t.us)
        row.update(us=_r(t.us), us_min=_r(t.us_min), us_max=_r(t.us_max), runs=t.runs,
                   bytes=int(nbytes), GBps=_r(gbps, 1), pct_copy_bw=_r(pct), method=t.method,
                   spin_us=_r(t.spin_us, 1))
        if t.note:
            row["timing_note"] = t.note

    def _mem_row(self, row: dict) -> None:
        if self.device.type == "cuda":
            row["peak_mem_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)

    # ---- dispatch --------------------------------------------------------------------------
    def bench(self, ops, spec: Spec, shape: Shape) -> dict[str, Any]:
        """One result row (a dict of the fields :func:`run` describes; absent figures None)
        for ``shape``, timing ``ops`` (:class:`dsagen.ops.Ops` of ``spec``). Raises nothing for
        a failing shape: the error (an unknown op, a ``next_n`` not in the spec, OOM, a kernel
        error) is caught and recorded in ``row["error"]``."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        if self.settle_s > 0:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            time.sleep(self.settle_s)
        row = self._base_row(spec, shape)
        try:
            if shape.op == "paged_logits":
                self._paged_logits(ops, spec, shape, row)
            elif shape.op == "store":
                self._store(ops, spec, shape, row)
            elif shape.op == "ragged_logits":
                self._ragged(ops, spec, shape, row)
            else:
                raise ValueError(f"unknown op {shape.op!r}")
        except Exception as e:  # one bad shape (OOM, a kernel error) must not end the run
            row["error"] = _short(e)
            self.log(f"  !! {spec.name} {shape.label()}: {row['error']}")
        finally:
            self._mem_row(row)
            _free(self.device)
        return row

    # ---- paged_logits ----------------------------------------------------------------------
    def _paged_logits(self, ops, spec: Spec, shape: Shape, row: dict) -> None:
        B, nn = int(shape.B), int(shape.next_n)
        if nn not in spec.next_n:
            raise ValueError(f"next_n={nn} is not in the spec's logits.next_n {list(spec.next_n)}")
        lens = context_lens_for(shape)
        set_bytes = _logits_set_bytes(spec, B, nn, lens)
        n = num_sets(set_bytes, self.l2_target, MIN_SETS, self.max_sets)
        n = max(MIN_SETS, min(n, SET_MEMORY_BUDGET // max(1, set_bytes)))
        self.log(f"  .. {spec.name} {shape.label()}: building {n} input sets "
                 f"({n * set_bytes / 1e9:.2f} GB)")
        sets = [make_logits_inputs(spec, ops.store, lens, nn, self.seed * 1000 + 17 * i + 1,
                                   self.device) for i in range(n)]
        max_len = sets[0]["max_context_len"]
        nbytes = paged_logits_bytes(spec, B, nn, sets[0]["sum_context_lens"], max_len)
        row.update(n_sets=n, sets_mb=round(n * set_bytes / 1e6, 1), max_context_len=max_len,
                   sum_context_lens=sets[0]["sum_context_lens"])
        if self.device.type == "cuda":   # which kernel the launch picks (dsagen.codegen)
            from .codegen import kv_evict_first_applies, paged_logits_kernel
            props = torch.cuda.get_device_properties(self.device)
            row["kernel"] = paged_logits_kernel(spec, nn, B, max_len, props.multi_processor_count,
                                                props.major, getattr(ops, "tuning", None))
            if row["kernel"].startswith("ws"):
                row["kv_evict_first"] = kv_evict_first_applies(spec, nn, B, max_len,
                                                               getattr(props, "L2_cache_size", 0),
                                                               getattr(ops, "tuning", None))
        args = [(s["q"], s["kv_cache"], s["weights"], s["context_lens"], s["block_table"])
                for s in sets]
        # kv_scales only where the spec has them (the op refuses it otherwise)
        skw = [{} if s["kv_scales"] is None else {"kv_scales": s["kv_scales"]} for s in sets]
        scrub = self._scrub_buffer(n * set_bytes)
        row["l2_scrub"] = scrub is not None

        def kernel(k):
            return ops.paged_logits(*args[k], max_len, True, **skw[k])

        # bitwise determinism on set 0, and a first call before timing
        row["bitwise_20_reruns"], first = self._same_bits(lambda: kernel(0))

        t = self.timer.time(kernel, n, self.runs, self.warmup, scrub)
        self._fill_timing(row, t, nbytes)

        # the same calls from a precomputed schedule (paged_logits_schedule: made once per decode
        # step for every layer, as DeepGEMM's metadata, whose kernel its timing excludes too),
        # and the schedule kernel itself
        ts = scheds = None
        if self.device.type == "cuda" and hasattr(ops, "paged_logits_schedule"):
            def schedule(k):
                return ops.paged_logits_schedule(sets[k]["context_lens"], sets[k]["block_table"], nn, max_len)
            scheds = [schedule(k) for k in range(n)]     # kept for the DeepGEMM comparisons below
            kernel_scheduled, kernel_unclean = _scheduled_calls(ops, args, skw, scheds, max_len)
            row["scheduled_bitwise_equal"] = bool(torch.equal(kernel_scheduled(0), first))
            ts = self.timer.time(kernel_scheduled, n, self.runs, self.warmup, scrub)
            gbps_s, pct_s = self._pct(nbytes, ts.us)
            row.update(us_scheduled=_r(ts.us), GBps_scheduled=_r(gbps_s, 1), pct_copy_bw_scheduled=_r(pct_s))
            row["schedule_us"] = _r(self.timer.time(schedule, n, self.runs, self.warmup, scrub).us)

        # the plain PyTorch fallback
        peak = fallback_peak_bytes(spec, B, nn, max_len)
        row["fallback_peak_gb_est"] = round(peak / 1e9, 1)
        if peak > FALLBACK_MAX_BYTES:
            row["fallback_note"] = f"skipped: needs ~{peak / 1e9:.0f} GB"
        else:
            def fallback(k):
                return R.fallback_paged_logits(*args[k], max_len, spec, **skw[k])
            try:
                ref = fallback(0)
                row["fallback_calc_diff"] = _calc_diff_valid(first, ref, sets[0], nn, max_len)
                del ref
                ft = self.timer.time(fallback, n, self.fallback_runs, 2, scrub)
                row["fallback_us"] = _r(ft.us)
                row["speedup_vs_fallback"] = _r(ft.us / t.us)
            except Exception as e:   # OOM or a fallback bug: keep the kernel's timing
                row["fallback_note"] = _short(e)
                _free(self.device)
        del first

        # DeepGEMM
        if self.deepgemm is not None and deepgemm_applies(spec):
            try:
                dg_call, note, clean = _deepgemm_caller(self.deepgemm, sets, nn, max_len, self.device)
                out = dg_call(0)
                ours = kernel(0)
                row["deepgemm_calc_diff"] = _calc_diff_valid(ours, out, sets[0], nn, max_len)
                del ours, out
                dt = self.timer.time(dg_call, n, self.runs, self.warmup, scrub)
                _, pct = self._pct(nbytes, dt.us)
                row.update(deepgemm_us=_r(dt.us), deepgemm_pct_copy_bw=_r(pct),
                           speedup_vs_deepgemm=_r(dt.us / t.us, 3), deepgemm_note=note)
                if ts is not None:
                    row["speedup_vs_deepgemm_scheduled"] = _r(dt.us / ts.us, 3)
                if not clean and ts is not None:
                    self._unclean(kernel_scheduled, kernel_unclean, sets[0], nn, max_len, n, scrub,
                                  dt.us, row)
                if ts is not None:
                    fns = {"dsagen": kernel_scheduled, "deepgemm": dg_call}
                    if not clean:
                        fns["dsagen_unclean"] = kernel_unclean
                    self._paired(fns, n, scrub, row)
            except Exception as e:
                row["deepgemm_note"] = _short(e)
                _free(self.device)
        elif self.deepgemm is None and deepgemm_applies(spec):
            row["deepgemm_note"] = "deep_gemm not importable"
        del sets, args, skw, scheds

    def _unclean(self, kernel_scheduled, kernel_unclean, set0: dict, nn: int, max_len: int, n: int,
                 scrub, dg_us: float, row: dict) -> None:
        """DeepGEMM ran without its clean pass (masked positions left unwritten): time dsagen's
        scheduled call with ``clean_logits=False`` too, and check that its visible logits are the
        clean scheduled call's bits. A failure goes to ``unclean_note``, not to the row's
        DeepGEMM figures."""
        try:
            mask = R.valid_mask(set0["context_lens"], nn, max_len)
            row["unclean_valid_equal"] = bool(torch.equal(kernel_unclean(0)[mask], kernel_scheduled(0)[mask]))
            del mask
            tu = self.timer.time(kernel_unclean, n, self.runs, self.warmup, scrub)
            row.update(us_scheduled_unclean=_r(tu.us), speedup_vs_deepgemm_unclean=_r(dg_us / tu.us, 3))
        except Exception as e:
            row["unclean_note"] = _short(e)
            _free(self.device)

    def _paired(self, fns: dict[str, Callable[[int], Any]], n: int, scrub, row: dict) -> None:
        """The order-balanced DeepGEMM comparison (:func:`paired_times`; module docstring) of
        ``fns``: ``"dsagen"`` (the scheduled call), ``"deepgemm"`` and, where DeepGEMM ran without
        its clean pass, ``"dsagen_unclean"``, each ``f(k)`` on input set ``k`` of ``n``. Fills
        ``us_scheduled_paired``, ``deepgemm_us_paired``, ``speedup_vs_deepgemm_paired`` (+
        ``_range``, ``paired_rounds``) and, with ``"dsagen_unclean"``,
        ``us_scheduled_unclean_paired`` and ``speedup_vs_deepgemm_unclean_paired``. A failure goes
        to ``paired_note``."""
        try:
            rounds = PAIRED_ROUNDS
            t = paired_times(self.timer, fns, n, self.runs, self.warmup, scrub, rounds)
            ratios = [b / a for a, b in zip(t["dsagen"], t["deepgemm"])]
            row.update(paired_rounds=rounds, us_scheduled_paired=_r(statistics.median(t["dsagen"])),
                       deepgemm_us_paired=_r(statistics.median(t["deepgemm"])),
                       speedup_vs_deepgemm_paired=_r(statistics.median(ratios), 3),
                       speedup_vs_deepgemm_paired_range=[_r(min(ratios), 3), _r(max(ratios), 3)])
            if "dsagen_unclean" in t:
                ru = [b / a for a, b in zip(t["dsagen_unclean"], t["deepgemm"])]
                row.update(us_scheduled_unclean_paired=_r(statistics.median(t["dsagen_unclean"])),
                           speedup_vs_deepgemm_unclean_paired=_r(statistics.median(ru), 3))
        except Exception as e:
            row["paired_note"] = _short(e)
            self.log(f"  !! {row['spec']} paired DeepGEMM timing: {row['paired_note']}")
            _free(self.device)

    # ---- ragged_logits (prefill) -----------------------------------------------------------
    def _ragged(self, ops, spec: Spec, shape: Shape, row: dict) -> None:
        """Times ``ops.ragged_logits`` on a causal prefill shape; reports TFLOP/s
        (``2*sum(ke-ks)*H*D / t``) and the same-run dense bf16 matmul rate
        (``[S*H, D] x [D, N]``) it is a percentage of."""
        S, N = int(shape.B), int(shape.ctx)
        if S > N:
            raise ValueError(f"ragged_logits: S={S} queries exceed N={N} keys")
        gen = _gen(self.device, self.seed * 1000 + 5)
        H, D = spec.num_heads, spec.head_dim
        k, sc = R.key_storage(*R.quantize(random_keys_on(N, D, gen, self.device), spec), spec)
        q = (torch.randn(S, H, D, generator=gen, device=self.device) * 4).to(spec.query.torch_dtype)
        w = torch.randn(S, H, generator=gen, device=self.device)
        ks = torch.zeros(S, dtype=torch.int32, device=self.device)
        ke = torch.arange(N - S + 1, N + 1, dtype=torch.int32, device=self.device)
        flops = ragged_flops(spec, S, N)
        row.update(n_sets=1, flops=flops)

        def kernel(_):
            return ops.ragged_logits(q, k, sc, w, ks, ke, True)

        row["bitwise_20_reruns"] = self._same_bits(lambda: kernel(0))[0]
        t = self.timer.time(kernel, 1, self.runs, self.warmup, None)
        nbytes = N * spec.bytes_per_token + S * H * (D * spec.query.bits // 8 + 4) + S * N * 4
        self._fill_timing(row, t, nbytes)
        row["tflops"] = _sig(flops / t.us / 1e6)
        a = torch.randn(S * H, D, generator=gen, device=self.device).to(torch.bfloat16)
        b = torch.randn(D, N, generator=gen, device=self.device).to(torch.bfloat16)
        mt = self.timer.time(lambda _: a @ b, 1, max(3, self.runs // 5), 2, None)
        row["matmul_tflops"] = _sig(2 * S * H * D * N / mt.us / 1e6)
        row["matmul_note"] = "dense bf16 [S*H, D] x [D, N], same run"
        row["pct_matmul"] = _r(100.0 * row["tflops"] / row["matmul_tflops"]) if row["matmul_tflops"] else None

    # ---- store -----------------------------------------------------------------------------
    def _store(self, ops, spec: Spec, shape: Shape, row: dict) -> None:
        N = int(shape.N)
        touched = store_bytes(spec, N)
        n = num_sets(touched, self.l2_target, MIN_SETS, self.max_sets)
        sets = [make_store_inputs(spec, N, self.seed * 1000 + 31 * i + 7, self.device,
                                  shape.slots or "random") for i in range(n)]
        alloc = sum(s["kv_cache"].numel() + (0 if s["kv_scales"] is None else s["kv_scales"].numel())
                    + s["k"].numel() * 2 + N * 8 for s in sets)
        self.log(f"  .. {spec.name} {shape.label()}: {n} input sets ({alloc / 1e6:.1f} MB)")
        row.update(n_sets=n, sets_mb=round(alloc / 1e6, 1))
        scrub = self._scrub_buffer(n * touched)
        row["l2_scrub"] = scrub is not None

        def kernel(k):
            s = sets[k]
            ops.store(s["k"], s["kv_cache"], s["loc"], *(() if s["kv_scales"] is None else (s["kv_scales"],)))

        # no races: the same bytes everywhere in the cache (and scales) each time set 0 is
        # stored again from the same starting bytes
        out = [sets[0][key] for key in ("kv_cache", "kv_scales") if sets[0][key] is not None]
        start = [t.clone() for t in out]

        def stored():
            for t, b in zip(out, start):
                t.copy_(b)
            kernel(0)
            return [t.clone() for t in out]
        row["bitwise_20_reruns"] = self._same_bits(stored)[0]
        del out, start
        t = self.timer.time(kernel, n, self.runs, self.warmup, scrub)
        self._fill_timing(row, t, store_bytes(spec, N))

        def fallback(k):
            s = sets[k]
            R.store(s["k"], s["kv_cache"], s["loc"], spec, kv_scales=s["kv_scales"])
        try:
            ft = self.timer.time(fallback, n, self.fallback_runs, 2, scrub)
            row["fallback_us"] = _r(ft.us)
            row["speedup_vs_fallback"] = _r(ft.us / t.us)
            row["fallback_note"] = "dsagen.reference.store"
        except Exception as e:   # keep the kernel's timing
            row["fallback_note"] = _short(e)
            _free(self.device)
        del sets


def _scheduled_calls(ops, args: list[tuple], skw: list[dict], scheds: list, max_len: int):
    """dsagen's paged-logits call on input set ``k`` from its precomputed schedule
    ``scheds[k]``: ``(clean(k), unclean(k))``, with ``clean_logits`` True and False."""
    def clean(k):
        return ops.paged_logits(*args[k], max_len, True, **skw[k], schedule=scheds[k])

    def unclean(k):
        return ops.paged_logits(*args[k], max_len, False, **skw[k], schedule=scheds[k])
    return clean, unclean


def _calc_diff_valid(a: torch.Tensor, b: torch.Tensor, inputs: dict, next_n: int,
                     max_len: int) -> float | None:
    """DeepGEMM's ``calc_diff`` over the visible logits of two results (None if not finite)."""
    mask = R.valid_mask(inputs["context_lens"], next_n, max_len)
    a, b = a[:, :max_len], b[:, :max_len]
    d = R.calc_diff(a[mask], b[mask])
    return float(f"{d:.3e}") if math.isfinite(d) else None


def _deepgemm_caller(dg, sets: list[dict], next_n: int, max_len: int, device):
    """Build ``call(k)`` running ``deep_gemm.fp8_paged_mqa_logits`` on input set ``k``, with the
    schedule metadata computed here (outside the timed region). Copes with the API variants of
    DeepGEMM releases: ``get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms)`` or
    ``(context_lens, num_sms)``; 1-D context_lens or only 2-D ``[B, next_n]`` (built with the same
    visibility); clean_logits=True or, where unsupported, False. Returns ``(call, note, clean)``
    (``clean``: whether the calls write the masked positions too)."""
    num_sms = (dg.get_num_sms() if hasattr(dg, "get_num_sms")
               else torch.cuda.get_device_properties(device).multi_processor_count)
    notes = []

    def meta_for(cl):
        try:
            return dg.get_paged_mqa_logits_metadata(cl, 64, num_sms)
        except TypeError:
            return dg.get_paged_mqa_logits_metadata(cl, num_sms)

    def two_d(cl):
        i = torch.arange(next_n, device=cl.device, dtype=torch.int32)
        return (cl[:, None] - next_n + 1 + i[None, :]).clamp(min=0).to(torch.int32).contiguous()

    def cl_for(s, two):
        return two_d(s["context_lens"]) if two else s["context_lens"]

    use_2d = False
    try:
        meta_for(sets[0]["context_lens"])
    except TypeError:
        raise
    except Exception:   # releases that take only 2-D context_lens [B, next_n]
        use_2d = True
        notes.append("2-D context_lens")
    prepared = []
    for s in sets:
        cl = cl_for(s, use_2d)
        kv = s["kv_cache"].view(s["kv_cache"].shape[0], 64, 1, 132)
        prepared.append((s["q"], kv, s["weights"], cl, s["block_table"], meta_for(cl)))
    clean = True
    try:
        dg.fp8_paged_mqa_logits(*prepared[0][:5], prepared[0][5], max_len, clean_logits=True)
    except Exception:
        clean = False
        notes.append("clean_logits=False")
    torch.cuda.synchronize()

    def call(k):
        q, kv, w, cl, bt, m = prepared[k]
        return dg.fp8_paged_mqa_logits(q, kv, w, cl, bt, m, max_len, clean_logits=clean)
    return call, ("; ".join(notes) or None), clean


# --------------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------------
def _as_shape(s) -> Shape:
    if isinstance(s, Shape):
        return s
    if isinstance(s, dict):
        return Shape(**s)
    raise TypeError(f"a shape must be a Shape or a dict, got {type(s).__name__}")


def run(specs: list[Spec], quick: bool = False, shapes=None, *, method: str | None = None,
        runs: int | None = None, seed: int = 0, tuning: dict | None = None) -> list[dict]:
    """Benchmark the generated ops of ``specs`` on the current CUDA device, in this process.

    Args:
        specs: validated specs; each is loaded with ``dsagen.load(spec, with_cuda=True)``.
        quick: the short shape list of :func:`default_shapes` (smoke test).
        shapes: override the shape list: :class:`Shape` objects or dicts of its fields
            (``{"op": "paged_logits", "B": 32, "next_n": 1, "ctx": 8192}``,
            ``{"op": "store", "N": 128}``, ``{"op": "store", "N": 65536, "slots": "pages"}``),
            used for every spec.
        method: ``"spin"`` (default; env ``DSAGEN_BENCH_METHOD``) or ``"graph"``.
        runs: timed runs per kernel (default 100, quick 50; never fewer than 50).
        seed: input seed.
        tuning: kernel tuning overrides for every spec (:func:`dsagen.codegen.default_tuning`;
            None: the defaults), recorded in the meta row.
    Returns:
        JSON-serialisable rows: first ``op="meta"`` (card, versions, date, ``copy_GBps``...),
        then one per (spec, shape) with ``us`` (median, microseconds), ``bytes``, ``GBps``,
        ``pct_copy_bw``, ``fallback_us``, ``speedup_vs_fallback``, ``deepgemm_us``,
        ``deepgemm_pct_copy_bw``, ``bitwise_20_reruns`` (every op: the same output bits, or for a
        store the same cache bytes, over ``reruns`` reruns of one input set) and more. A spec whose
        ops fail to build or load gives one ``op="load"`` row with ``error`` set instead of
        raising, so the other specs still run; a failing shape's row carries ``error`` too.
    Raises:
        RuntimeError: no CUDA device.
        TypeError, ValueError: a ``shapes`` entry that is not a :class:`Shape` or a dict of its
            fields.
        ValueError: ``method`` not ``"spin"`` or ``"graph"``, or ``DSAGEN_BENCH_METHOD`` /
            ``DSAGEN_BENCH_SETTLE`` malformed (:mod:`dsagen.config`).
    """
    if not torch.cuda.is_available():
        raise RuntimeError("dsagen bench needs a CUDA device (torch.cuda.is_available() is False; "
                           f"torch {torch.__version__}, CUDA build {torch.version.cuda})")
    from . import load

    def log(s: str) -> None:
        print(s, flush=True)

    method = method or config.bench_method()
    settle_s = config.bench_settle_s(SETTLE_S)
    runs = max(50, runs or (50 if quick else 100))
    meta = device_meta()
    log(f"dsagen bench {__version__} ({meta['git'] or 'no git'})  {meta['date']}")
    log(f"device: {meta['card']} ({meta['capability']}, {meta['sm_count']} SMs, L2 {meta['l2_mb']} MB, "
        f"{meta['memory_gb']} GB)  driver {meta.get('driver', '?')}  torch {meta['torch']}  "
        f"CUDA {meta['cuda']}  deep_gemm {meta['deep_gemm'] or 'not importable'}")
    timer = CudaTimer(method)
    cp = measure_copy_bandwidth(timer)
    log(f"copy bandwidth: {cp['copy_GBps']:.0f} GB/s (read + written, {cp['copy_bytes'] / 2**30:.0f} "
        f"GiB moved by a device-to-device copy, median of {cp['copy_runs']})")
    log(f"timing: {method}, CUDA events, spin >= {SPIN_MIN_US:.0f} us before each call "
        f"({timer.cycles_per_us:.0f} cycles/us), median of {runs} runs, inputs rotated over >= "
        f"{MIN_SETS} sets totalling >= {L2_TARGET_BYTES / 1e6:.0f} MB, the GPU idle {settle_s:g} s before each row")
    meta_row = {"op": "meta", **meta, **cp, "method": method, "runs": runs, "settle_s": settle_s,
                "sleep_cycles_per_us": round(timer.cycles_per_us, 1),
                "l2_target_mb": L2_TARGET_BYTES / 1e6, "quick": bool(quick),
                "specs": [s.name for s in specs], "tuning": tuning or {}}
    rows: list[dict] = [meta_row]
    dg = _deep_gemm()
    bench = Bench("cuda", timer, cp["copy_GBps"], runs=runs, seed=seed, deepgemm=dg, log=log,
                  settle_s=settle_s)
    shape_list = [_as_shape(s) for s in shapes] if shapes is not None else None
    for spec in specs:
        t0 = time.time()
        log(f"[{spec.name}] loading ops ({spec.summary().split(': ', 1)[1]}) ...")
        try:
            ops = load(spec, with_cuda=True, tuning=tuning)
        except Exception as e:
            err = _short(e)
            log(f"[{spec.name}] cannot load the CUDA ops: {err}")
            rows.append({"spec": spec.name, "spec_digest": spec.digest, "op": "load",
                         "error": err, "copy_GBps": cp["copy_GBps"]})
            continue
        todo = shape_list if shape_list is not None else default_shapes(spec, quick)
        log(format_header())
        for shape in todo:
            row = bench.bench(ops, spec, shape)
            rows.append(row)
            log(format_row(row))
            partial = config.bench_partial()
            if partial:   # rows so far, for runs that may be cut short
                with open(partial, "w") as f:
                    json.dump(rows, f, indent=1)
        log(f"[{spec.name}] {len(todo)} rows in {time.time() - t0:.0f} s")
    bench._scrub = None
    _free("cuda")
    log("")
    log(f"summary ({meta['card']}, copy {cp['copy_GBps']:.0f} GB/s, {meta['date']}):")
    log(format_table(rows))
    return rows


if __name__ == "__main__":  # python -m dsagen.bench SPEC...  (same as `dsagen bench`)
    from .spec import load_spec
    import json
    out = run([load_spec(p) for p in sys.argv[1:] if not p.startswith("-")],
              quick="--quick" in sys.argv)
    print(json.dumps(out, indent=1))
