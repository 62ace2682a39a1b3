"""Render a :class:`~dsagen.spec.Spec` into C++/CUDA sources with Jinja (StrictUndefined).

``render(spec)`` returns ``{file name: text}``; ``write_generated(spec, out_dir)`` writes them,
touching only files whose text changed. The sources are deterministic (no paths, no dates), so
``generated/<name>/`` can be compared with a fresh render.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from .dtypes import AMAX_FLOOR_LITERAL
from .spec import MAX_SMEM_BYTES, Spec

# int32 per CTA row of a paged_logits_schedule (kSchedRow in layout.h): a header of 8, then 32
# block-table entries for each of up to 4 producer warps of paged_logits_ws
SCHEDULE_ROW = 8 + 32 * 4

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"
GENERATED_DIR = Path(__file__).resolve().parent.parent / "generated"

CPU_SOURCES = ("bindings.cpp", "cpu_ops.cpp")
CUDA_SOURCES = ("store.cu", "paged_logits.cu", "paged_logits_small.cu")
HEADERS = ("layout.h",)

JINJA_CACHE = "jinja-bytecode"   # under the cache root; not a build entry
RENDER_MEMO = "rendered"         # under the cache root; not a build entry
RENDER_MEMO_MAX = 256            # memoized renders kept (~0.25 MB each); the least recently used go

_env = None   # jinja2 is imported on the first render that misses the memo (~30 ms)


def _bytecode_cache():
    """Compiled templates cached under the build cache (keyed by template checksum by Jinja),
    which takes template compilation (~45 ms) off a render."""
    import jinja2
    from . import config
    d = config.cache_root() / JINJA_CACHE
    try:
        d.mkdir(parents=True, exist_ok=True)
        if not os.access(d, os.W_OK):
            raise OSError
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(str(d))


def _environment():
    global _env
    if _env is None:
        import jinja2
        _env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True,
            trim_blocks=True,
            lstrip_blocks=True,
            bytecode_cache=_bytecode_cache(),
        )
    return _env


def _render_digest(spec: Spec, tune: dict[str, Any], ns: str) -> str:
    """Hash of everything a render depends on: the spec, the tuning, the namespace, the template
    texts and the Python sources that build the template context."""
    h = hashlib.sha256(json.dumps([spec.to_dict(), tune, ns], sort_keys=True).encode())
    here = Path(__file__).resolve().parent
    for p in sorted(TEMPLATE_DIR.glob("*.jinja")) + [here / "codegen.py", here / "spec.py", here / "dtypes.py"]:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:32]


def _js(v: Any) -> str:
    """A value as canonical JSON (dict keys sorted), for comparing tunings."""
    return json.dumps(v, sort_keys=True)


def namespace(spec: Spec, tuning: dict[str, Any] | None = None) -> str:
    """C++ namespace and torch.library namespace of a spec's ops (unique per spec content and
    per tuning whose :func:`effective_tuning` differs from the defaults: a tuning that spells
    out default values shares the defaults' namespace, one whose given values equal the
    defaults' but whose effective tuning differs does not, and neither does one whose
    small-work kernel (:func:`small_tuning`) differs from the defaults'; values compare as JSON,
    so 1 is not True)."""
    ns = f"dsagen_{spec.name}_{spec.digest}"
    base = default_tuning(spec)
    extra = {k: v for k, v in effective_tuning(spec, tuning).items()
             if k not in base or _js(v) != _js(base[k])}
    # the small-work kernel's own effective tuning (it follows the keys the tuning gives)
    small = small_tuning(spec, tuning)
    if _js(small) != _js(small_tuning(spec)):
        extra["small:effective"] = small
    if extra:
        ns += "_t" + hashlib.sha256(json.dumps(extra, sort_keys=True).encode()).hexdigest()[:6]
    return ns


def uses_wgmma(spec: Spec) -> bool:
    """Whether the sm_90a tensor-core (WGMMA) paged-logits kernel applies to this layout
    (not to ``separate`` scales: that kernel reads them from kv_cache; the portable kernel runs)."""
    return (spec.key_dtype in ("e4m3", "bf16", "fp16") and not spec.separate_scales
            and spec.scale_dtype in ("fp32", "none") and spec.scales_per_token <= 1
            and spec.key_bytes_per_token % 128 == 0
            and spec.key_align >= 4)


def mma_applies(spec: Spec) -> bool:
    """Whether the portable tensor-core kernel (``paged_logits_mma``, tuning ``portable``
    ``"mma"``: warp-level ``mma.sync``, e4m3 m16n8k32 or bf16/f16 m16n8k16, which every device
    of compute capability 8.9 or later has, sm_90a and sm_100a alike) can score this layout:
    e4m3, bf16 or fp16 keys (q of the same type), key rows of 32 bytes or a multiple of 64 at 4-byte
    aligned offsets, and at most one scale per token (fp32 or ue8m0, in any placement).
    Block scales and e2m1 keys take the CUDA-core kernel."""
    return (spec.key_dtype in ("e4m3", "bf16", "fp16") and spec.scales_per_token <= 1
            and (spec.key_bytes_per_token == 32 or spec.key_bytes_per_token % 64 == 0)
            and spec.key_align % 4 == 0)


def mma_smem_bytes(spec: Spec, next_n: int, tuning: dict[str, Any] | None = None) -> int:
    """Dynamic shared memory of one ``paged_logits_mma`` CTA (``mma_smem_bytes`` in
    paged_logits.cu): a request's ``next_n * num_heads`` q rows in B-fragment order (twice their
    bytes where tuning ``mma_widen`` widens e4m3 q to f16) and their fp32 weights."""
    widen = 2 if mma_widens(spec, tuning) else 1
    return _mma_q_bytes(spec, next_n, widen)


def _mma_q_bytes(spec: Spec, next_n: int, widen: int) -> int:
    """Bytes of one request's q rows (``widen`` times their stored width) and fp32 weights."""
    return next_n * spec.num_heads * (spec.key_bytes_per_token * widen + 4)


def mma_widens(spec: Spec, tuning: dict[str, Any] | None = None) -> bool:
    """Whether ``paged_logits_mma`` widens e4m3 keys and q to f16 once and scores them with f16
    m16n8k16 MMAs rather than issuing e4m3 m16n8k32 ``mma.sync``: tuning ``mma_widen`` (the
    default) on an e4m3 layout whose widened q of the largest ``next_n`` fits in
    ``MAX_SMEM_BYTES`` (elsewhere the unwidened form keeps the layout on the mma kernel).
    ValueError where ``mma_widen`` is not a bool."""
    return (_mma_widen(effective_tuning(spec, tuning)) and spec.key_dtype == "e4m3"
            and _mma_q_bytes(spec, max(spec.next_n), 2) <= MAX_SMEM_BYTES)


def _mma_widen(tune: dict[str, Any]) -> bool:
    """The tuning ``mma_widen`` (a bool); ValueError otherwise."""
    return _bool_tuning(tune, "mma_widen")


def _bool_tuning(tune: dict[str, Any], key: str) -> bool:
    """The bool tuning ``key``; ValueError naming it otherwise."""
    v = tune[key]
    if not isinstance(v, bool):
        raise ValueError(f"tuning {key}={v!r}: must be true or false")
    return v


def mma_prefetches(spec: Spec, tuning: dict[str, Any] | None = None) -> bool:
    """Whether ``paged_logits_mma`` loads each warp step's keys one step ahead (tuning
    ``mma_prefetch``): only in its widened form (:func:`mma_widens`), whose raw key registers are
    dead once widened and so hold the next step's keys during this one's MMAs. ValueError where
    ``mma_prefetch`` is not a bool."""
    return _bool_tuning(effective_tuning(spec, tuning), "mma_prefetch") and mma_widens(spec, tuning)


def portable_kernel(spec: Spec, next_n: int, tuning: dict[str, Any] | None = None) -> str:
    """The kernel of the portable path at ``next_n`` (what runs where no sm_90a kernel does):
    ``"mma"`` under tuning ``portable`` "mma" (the default) where :func:`mma_applies` and a
    request's q fits in ``MAX_SMEM_BYTES``, else ``"simt"``. ValueError for an invalid
    ``portable``, ``mma_widen`` or ``mma_prefetch``."""
    tune = effective_tuning(spec, tuning)
    _check_portable(tune)   # whichever kernel runs
    if (_portable(tune) == "mma" and mma_applies(spec)
            and mma_smem_bytes(spec, next_n, tune) <= MAX_SMEM_BYTES):
        return "mma"
    return "simt"


def _check_portable(tune: dict[str, Any]) -> None:
    """ValueError naming the tuning where ``portable``, ``mma_widen`` or ``mma_prefetch`` (the
    portable path's tunings) is invalid."""
    _portable(tune)
    _mma_widen(tune)
    _bool_tuning(tune, "mma_prefetch")


def _portable(tune: dict[str, Any]) -> str:
    """The tuning ``portable`` (``"simt"`` or ``"mma"``); ValueError otherwise."""
    v = tune["portable"]
    if v not in ("simt", "mma"):
        raise ValueError(f"tuning portable={v!r}: must be 'simt' or 'mma'")
    return v


# paged_logits_e2m1 runs where next_n * num_heads <= 128 (next_n 1 and 2 at 64 heads, the shapes
# verified on the H200); launch() does not instantiate it for a larger next_n
E2M1_MAX_ROWS = 128


def uses_e2m1_mma(spec: Spec) -> bool:
    """Whether the sm_90a tensor-core kernel for FP4 keys (``paged_logits_e2m1``: each thread
    dequantizes its keys into the A registers of a bf16 WGMMA) applies: e2m1 keys of head_dim 128
    with one ue8m0 byte per 32 elements, the token's 4 bytes contiguous in kv_cache, bf16 q,
    64-token tiles inside a page, 16-byte aligned key rows and 64 heads, the configuration run on
    the H200 (other head counts take the CUDA-core kernel; so does next_n > 2, see
    :data:`E2M1_MAX_ROWS`)."""
    lay = spec.layout
    return (spec.key_dtype == "e2m1" and spec.scale_dtype == "ue8m0" and spec.scale_block == 32
            and spec.head_dim == 128 and not spec.separate_scales and spec.query.name == "bf16"
            and spec.page_size % 64 == 0 and spec.num_heads == 64
            and lay.key_token_stride % 16 == 0 and lay.page_stride % 16 == 0 and spec.key_align >= 16
            and lay.scale_token_stride == 4 and lay.scale_base % 4 == 0)


def e2m1_q_slots(spec: Spec, next_n: int) -> int:
    """q (and weight) buffers per CTA of ``paged_logits_e2m1`` at ``next_n``: 2 (the next
    request's q is fetched while the current one is scored) where ``next_n * num_heads <= 64``,
    else 1, so that one CTA's q buffers stay within 32 KB. On the H200 (2026-12-04, 64 heads,
    next_n 2) a second 32 KB buffer left 2 CTAs per SM in shared memory instead of 4 and was
    5-11 % slower (B=128 ctx 32768: 372.5 vs 335.5 us); at next_n 1 both fit 5 CTAs."""
    return 2 if next_n * spec.num_heads <= 64 else 1


def e2m1_smem_bytes(spec: Spec, next_n: int, stages: int, q_slots: int | None = None) -> int:
    """Dynamic shared memory of ``paged_logits_e2m1`` (``e2m1_smem_bytes`` in paged_logits.cu):
    alignment slack, ``q_slots`` (default :func:`e2m1_q_slots`) bf16 q buffers and weight
    buffers, ``stages`` packed key tiles and their scale words."""
    q_slots = e2m1_q_slots(spec, next_n) if q_slots is None else q_slots
    n = next_n * spec.num_heads
    return 1024 + q_slots * (n * 2 * spec.head_dim + n * 4) + stages * (64 * spec.key_bytes_per_token + 64 * 4)


def wgmma_smem_bytes(spec: Spec, next_n: int, stages: int) -> int:
    """Dynamic shared memory of the sm_90a kernel (``wgmma_smem_bytes`` in paged_logits.cu):
    alignment slack, key tiles, two q buffers, tile scales, two weight buffers."""
    row, n = spec.key_bytes_per_token, next_n * spec.num_heads
    return 1024 + stages * 64 * row + 2 * n * row + stages * 64 * 4 + 2 * n * 4


def uses_ws(spec: Spec) -> bool:
    """Whether the warp-specialized TMA kernel (``paged_logits_ws``) applies to this layout: a
    WGMMA layout whose key rows and pages TMA can address (16-byte strides), 64-token tiles that
    lie inside one page (page_size a multiple of 64), and, when quantized, one fp32 scale per
    token stored contiguously at a 16-byte aligned page tail (a tile's 64 scales are one bulk copy)."""
    lay = spec.layout
    return (uses_wgmma(spec) and spec.page_size % 64 == 0
            and lay.key_token_stride % 16 == 0 and lay.page_stride % 16 == 0
            and (not spec.quantized or (lay.scale_token_stride == 4 and lay.scale_base % 16 == 0)))


def ws_smem_bytes(spec: Spec, next_n: int, math_wgs: int, stages: int) -> int:
    """Dynamic shared memory of ``paged_logits_ws``: alignment slack, ``math_wgs * stages`` key
    tiles and their scales, two q and weight buffers, the mbarriers (the template lays it out
    in the same order)."""
    row, n, tiles = spec.key_bytes_per_token, next_n * spec.num_heads, math_wgs * stages
    return 1024 + tiles * 64 * row + 2 * n * row + tiles * 64 * 4 + 2 * n * 4 + (2 * tiles + 4) * 8


def effective_tuning(spec: Spec, tuning: dict[str, Any] | None = None) -> dict[str, Any]:
    """:func:`default_tuning` of ``spec`` updated with ``tuning``. The defaults' ``maxnreg`` and
    explicit ``wregs`` bound belong to their ``math_wgs`` and register count: a tuning that
    changes ``math_wgs`` without setting ``maxnreg`` gets ``maxnreg`` 0, and one that changes
    either without setting ``wregs`` gets the register-accounted ``wregs`` (True); one that
    changes the tile shape or registers (``kernel``, ``promote``, ``chains``, ``fuse``,
    ``loop``, ``math_wgs``, ``maxnreg``, ``wregs``) without setting ``mma_ahead`` gets it off;
    one that changes a paged-kernel key (``_SMALL_KEYS``) without setting ``small`` gets no
    small-work kernel (``small`` ``{}``). ``ws_stages``, also inside ``small``, is put in the
    canonical form of :func:`_norm_ws_stages` (ValueError naming the tuning where it is not
    valid for the spec). ValueError for a key that :func:`default_tuning` does not have (a typo
    would otherwise build the default kernels under a new namespace) or an unknown ``kernel``."""
    base, given = default_tuning(spec), tuning or {}
    if not isinstance(given, dict):
        raise ValueError(f"tuning {given!r}: must be a dict")
    unknown = sorted(map(str, set(given) - set(base)))
    if unknown:
        raise ValueError(f"tuning: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                         f"(the keys are dsagen.codegen.default_tuning's: {', '.join(sorted(base))})")
    tune = {**base, **given}
    _check_scalars(tune)
    if tune["kernel"] not in ("ws", "wgmma", "simt"):
        raise ValueError(f"tuning kernel={tune['kernel']!r}: must be 'ws', 'wgmma' or 'simt'")
    tune["ws_stages"] = _norm_ws_stages(spec, tune["ws_stages"])
    small = tune.get("small")
    if isinstance(small, dict) and "ws_stages" in small:
        try:
            tune["small"] = {**small, "ws_stages": _norm_ws_stages(spec, small["ws_stages"])}
        except ValueError as e:
            raise ValueError(f"tuning small={small!r}: {e}") from None
    if tune["math_wgs"] != base["math_wgs"] and "maxnreg" not in given:
        tune["maxnreg"] = 0
    if (tune["math_wgs"], tune["maxnreg"]) != (base["math_wgs"], base["maxnreg"]) and "wregs" not in given:
        tune["wregs"] = True
    # the default mma_ahead belongs to the default tile shape and registers
    if "mma_ahead" not in given and any(tune[k] != base[k] for k in _AHEAD_DEPENDS):
        tune["mma_ahead"] = False
    # the default small-work kernel belongs to the default main kernel: a tuning that changes a
    # paged-kernel key without setting `small` times that one kernel at every size
    if "small" not in given and any(_js(tune[k]) != _js(base[k]) for k in _SMALL_KEYS):
        tune["small"] = {}
    return tune


# the plain integer and bool tunings: (key, smallest, largest, a bool allowed); the others
# (kernel, ws_stages, small, loop, ...) have their own checks
_SCALAR_TUNINGS = (("stages", 1, 64, False), ("promote", 0, 64, True), ("fuse", 0, 256, False),
                   ("chains", 0, 2, False), ("maxnreg", 0, 256, False), ("wregs", 0, 256, True),
                   ("mma_ahead", 0, 256, True), ("math_wgs", 1, 4, False), ("store_passes", 1, 4, False),
                   ("math", None, None, True), ("sched", None, None, True))


def _check_scalars(tune: dict[str, Any]) -> None:
    """ValueError naming the tuning where one of :data:`_SCALAR_TUNINGS` is not an integer in
    its range (or, where allowed, a bool; ``math`` and ``sched`` only a bool), before any
    arithmetic on it or a namespace is made for it."""
    for key, lo, hi, bool_ok in _SCALAR_TUNINGS:
        v = tune[key]
        if isinstance(v, bool):
            if bool_ok:
                continue
        elif lo is not None and isinstance(v, int) and lo <= v <= hi:
            continue
        what = "true or false" if lo is None else (
            f"an integer from {lo} to {hi}" + (" or true/false" if bool_ok else ""))
        raise ValueError(f"tuning {key}={v!r}: must be {what}")


_AHEAD_DEPENDS = ("kernel", "promote", "chains", "fuse", "loop", "math_wgs", "maxnreg", "wregs")


def ws_stages(spec: Spec, next_n: int, tuning: dict[str, Any] | None = None) -> int:
    """Key tiles in flight per math warpgroup of ``paged_logits_ws`` at ``next_n``: the tuning's
    ``ws_stages`` (an integer, or its entry for ``next_n``), fewer where shared memory (227 KiB)
    is short; 0 where the kernel does not apply (layout, tuning, or fewer than 2 stages fit).
    ValueError (from :func:`effective_tuning`) where ``ws_stages`` is not valid for the spec."""
    tune = effective_tuning(spec, tuning)
    if tune["kernel"] != "ws" or not uses_ws(spec):
        return 0
    v = tune["ws_stages"]
    if isinstance(v, dict) and next_n not in v:
        raise ValueError(f"tuning ws_stages={v!r}: no entry for next_n={next_n}")
    s = v[next_n] if isinstance(v, dict) else v
    while s >= 2 and ws_smem_bytes(spec, next_n, int(tune["math_wgs"]), s) > MAX_SMEM_BYTES:
        s -= 1
    return s if s >= 2 else 0


def _norm_ws_stages(spec: Spec, v: Any) -> int | dict[int, int]:
    """The tuning ``ws_stages`` in canonical form: an integer from 0 to 64 for every next_n, or a
    dict with one such integer for each next_n of the spec (keys: ints, or their decimal digits
    as JSON object keys), given back as that integer where all entries are equal (so a dict that
    spells out one count is that count) and otherwise with int keys in order. ValueError naming
    the tuning where a count is not such an integer (bool, str and float included), a key is not
    a next_n of the spec or appears twice, or a next_n of the spec has no entry."""
    def count(x: Any) -> int:
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= 64:
            raise ValueError(f"tuning ws_stages={v!r}: a stage count must be an integer from 0 to 64 "
                             f"(or a dict from next_n to one)")
        return x
    if not isinstance(v, dict):
        return count(v)
    by_nn: dict[int, int] = {}
    for k, x in v.items():
        ok = (isinstance(k, int) and not isinstance(k, bool)) or (isinstance(k, str) and k.isascii() and k.isdigit())
        nn = int(k) if ok else None
        if nn not in spec.next_n:
            raise ValueError(f"tuning ws_stages={v!r}: keys must be next_n values of the spec "
                             f"({spec.next_n}), got {k!r}")
        if nn in by_nn:
            raise ValueError(f"tuning ws_stages={v!r}: next_n={nn} given twice")
        by_nn[nn] = count(x)
    for nn in spec.next_n:
        if nn not in by_nn:
            raise ValueError(f"tuning ws_stages={v!r}: no entry for next_n={nn}")
    counts = set(by_nn.values())
    return counts.pop() if len(counts) == 1 else dict(sorted(by_nn.items()))


def wgmma_kernel_applies(spec: Spec, next_n: int, tuning: dict[str, Any] | None = None) -> bool:
    """Whether paged logits of ``spec`` at ``next_n`` run on a tensor-core (WGMMA) kernel on an
    sm_90 device (with 16-byte aligned q, weights and kv_cache, as every fresh allocation is):
    the layout allows it, the tuning selects it (``ws`` or ``wgmma``) and its shared memory fits
    in 227 KiB; otherwise the CUDA-core kernel runs. For FP4 keys (:func:`uses_e2m1_mma`) that
    kernel is ``paged_logits_e2m1``, reported as ``"wgmma"``."""
    tune = effective_tuning(spec, tuning)
    if tune["kernel"] not in ("ws", "wgmma"):
        return False
    if uses_e2m1_mma(spec):
        return (next_n * spec.num_heads <= E2M1_MAX_ROWS
                and e2m1_smem_bytes(spec, next_n, int(tune["stages"])) <= MAX_SMEM_BYTES)
    if not uses_wgmma(spec):
        return False
    return (ws_stages(spec, next_n, tune) > 0
            or wgmma_smem_bytes(spec, next_n, int(tune["stages"])) <= MAX_SMEM_BYTES)


def small_work_max_len(spec: Spec, next_n: int, batch: int, sms: int,
                       tuning: dict[str, Any] | None = None) -> int | None:
    """Largest ``max_context_len`` at which a call of ``batch`` requests on an sm_90 device of
    ``sms`` SMs runs the small-work kernel (tuning ``small``: ``batch * ceil(max_context_len /
    64) <= small_tiles * sms``, the launch's test), or None where there is none at ``next_n``."""
    small = small_tuning(spec, tuning)
    if small is None or ws_stages(spec, next_n, small) == 0 or batch < 1:
        return None
    return 64 * (int(effective_tuning(spec, tuning)["small_tiles"]) * sms // batch)


def paged_logits_kernel(spec: Spec, next_n: int, batch: int, max_context_len: int, sms: int,
                        major: int, tuning: dict[str, Any] | None = None) -> str:
    """Which paged-logits kernel a call runs on a device of compute capability ``major`` with
    ``sms`` SMs (the launch's choice, given 16-byte aligned q, weights and kv_cache, as every
    fresh allocation is): ``"ws (small)"`` (the small-work kernel of tuning ``small``), ``"ws"``,
    ``"wgmma"``, or :func:`portable_kernel`'s ``"mma"`` / ``"simt"`` on every device but sm_90,
    and on sm_90 where no sm_90a kernel applies or the tuning's ``kernel`` is ``"simt"``."""
    if major != 9 or not wgmma_kernel_applies(spec, next_n, tuning):
        return portable_kernel(spec, next_n, tuning)
    bound = small_work_max_len(spec, next_n, batch, sms, tuning)
    if bound is not None and max_context_len <= bound:
        return "ws (small)"
    return "ws" if ws_stages(spec, next_n, tuning) > 0 else "wgmma"


def kv_evict_first_applies(spec: Spec, next_n: int, batch: int, max_context_len: int, l2_bytes: int,
                           tuning: dict[str, Any] | None = None) -> bool:
    """Whether a ``paged_logits_ws`` call gives its key and scale copies the L2 evict-first
    policy (tuning ``kv_evict_first``; the launch's rule: the logits, ``batch * next_n *
    max_context_len * 4`` bytes, at most that fraction of the device's L2 of ``l2_bytes``)."""
    frac = _kv_evict_first(effective_tuning(spec, tuning))
    if frac == 0:
        return False
    return frac < 0 or batch * next_n * max_context_len * 4 <= frac * max(1, l2_bytes)


def default_tuning(spec: Spec) -> dict[str, Any]:
    """Tuning of the sm_90a kernels.

    ``kernel``: ``ws`` (warp-specialized: ``math_wgs`` WGMMA warpgroups, each fed by its own
    TMA producer warp, ``ws_stages`` tiles in flight each; the default where :func:`uses_ws`;
    ``ws_stages`` 3 for 8-bit keys, else 4 (an integer for every next_n, or a dict from next_n
    to one, e.g. ``{"1": 3, "2": 4}``); on the H200, fp8, with the sixteenth session's
    epilogue, interleaved, one device call: 3 was 0.5-3.8 % faster than 4 at B=128 ctx 8192, B=32
    ctx 32768 and B=128 ctx 32768 next_n 1, 0.6 % slower at B=128 ctx 32768 next_n 2; 5 slower
    everywhere; see benchmarks/RESULTS.md, sixteenth session),
    ``wgmma`` (one warpgroup per CTA that both copies with cp.async and computes, ``stages``
    tiles in flight; the other WGMMA layouts, and where ``ws`` does not fit in shared memory) or
    ``simt`` (the portable fp32 CUDA-core kernel everywhere).

    ``promote``: sum each WGMMA K step in fp32 on the CUDA cores every ``promote`` K steps of
    32 bytes (True = 1, False/0 = never). Hopper's fp8 tensor-core accumulator is not full fp32:
    relative L2 error on the H200 1.1e-4..1.5e-4 without promotion (DeepGEMM's
    ``fp8_paged_mqa_logits`` measured 1.3e-4 against the same reference), 6.9e-5..8.2e-5 every 2
    steps, 4.2e-5..4.9e-5 every step; all inside the fp8 bar of :mod:`dsagen.verify`. 0 by
    default: every 2 steps cost 30 % at next_n 2 (B=128 ctx 32768: 242.8 vs 186.1 us).

    ``fuse``: where ``next_n * num_heads <= fuse`` (and the accumulators fit in the math
    warpgroups' registers, :func:`_fuse_max_n`), every next_n position's accumulators are in
    flight at once (128: next_n 2 at 64 heads). ``chains``: without promotion, the WGMMA chains
    per next_n position (1 or 2, each its own commit group so an epilogue overlaps the next
    chain) or 0 = one chain over every fused position (N = next_n * num_heads), the fastest on
    the H200 (fp8 next_n 2, B=128 ctx 32768: 199 us vs 218 us with 1 chain, 255 us with 2).
    ``math_wgs``: 1 to 4 (default 3 with up to 64 heads, else 2; 2 for 16-bit keys with up to
    64 heads where next_n * num_heads <= 128, with ``maxnreg`` 232 and ``mma_ahead``: on the H200
    bf16 next_n 2 0.9-4.4 % faster at B=32 ctx 8192 / 32768 and B=128 ctx 8192 than the 4
    warpgroups of 112 registers that were the default before (interleaved, three leases),
    next_n 1 from 2.0 % faster to 0.9 % slower; with 4,
    warpgroup 0 is all producer warps, which write the -inf tail after their tiles; for fp8 keys
    4 measured 3-4 % slower than 3 on the H200 at next_n 2, and 2 slower at next_n 2 with B=128).
    ``wregs``: the math warpgroups hold their head weights in registers (read once per request,
    where ``next_n * num_heads <= 128`` and the registers hold them, :func:`_wregs_max_n`) instead of reading them from shared memory every tile
    (fp8 next_n 2: 199.8 -> 186.1 us); an integer above 1 is that bound on N itself, without the
    register accounting (it may spill). ``maxnreg``: registers per thread of the math warpgroups
    by ``setmaxnreg``, at least the launch's (0: off; warpgroup 0 keeps 40, or less where the launch's registers
    require: 32 at 4 math warpgroups and ``maxnreg`` 112). ``store_passes``: tokens each store thread
    converts per grid step (1 to 4). ``store_lanes``: lanes per token of the store kernel (2, 4,
    8, 16 or 32; a value above head_dim / 8 is lowered to it). Default 4 where a lane's
    8-element chunk is stored in 8- or 16-byte vectors (each lane converts 32 elements of a 128-element key, so the
    per-scale work of fp8 keys is shared by 4x the elements of 16 lanes; H200, N=65536: bf16
    12.2 us against 13.1 at 16 lanes, fp8 13.7 / 14.1 us at random slots and 11.5 / 13.5 us at
    whole pages), else 16 (1- to 4-byte vectors: keys at a 132-byte token stride, e2m1 chunks; at 4
    lanes their stores touched each 32-byte sector twice and N=65536 took 26.7-27.3 us against
    18.5-19.1 us at 16; e2m1's 4 scale blocks per lane cost 1.8 us at N<=128).
    ``store_prefetch``: in calls of at least ``store_prefetch_min_n`` tokens (default 4096), each
    token's first scale-writing lane issues an L2 prefetch of its scale address, so that the
    4-byte (partial-sector) scale write finds the sector in the L2; issued when a step is
    converted (True; False, the default: none). Quantized specs only (a no-op without scales).
    Issued right after the step's loads instead, it stalled the thread until the slots arrived
    (H200, fp8 N=65536 whole pages 11.5 -> 13.0 us; that form was dropped). H200
    (benchmarks/RESULTS.md, thirty-first session), N=65536: random slots fp8_e4m3_page64 13.57-13.79 -> 12.80-13.02 us and
    fp8_e4m3_ue8m0_page64 13.63-13.92 -> 12.80-13.02 us (``store_time.py``, interleaved, three /
    two leases; 13.5-13.7 -> 13.1 us in one ``dsagen bench`` run, across leases), but whole
    pages, a prefill's pattern, 0.0-0.1 us slower there and 0.2-0.4 us in that bench run;
    fp4_e2m1_page64 3.6-3.9 % slower at both. A form that skipped the prefetch for warps of
    consecutive slots was within 0.03 us of no prefetch at random slots and slower at whole
    pages (12.13 against 11.49 us). So it stays off.
    ``loop``: how the math warpgroups of ``ws`` walk their tiles: ``request`` (per request, a
    plain loop over its tiles with the request's values set once: 239 instead of about 280
    instructions per tile and warp at fp8 next_n 2; H200, same process, B=128 ctx 32768 next_n 2:
    164.3 vs 172.8 us, next_n 1 0.3-0.6 % faster; the default) or ``unit`` (one loop over the
    schedule's units, re-deriving them per tile: fewer registers; in the 4-warpgroup 16-bit
    configuration of 112 registers ``request`` spilled at next_n 2 and bf16 B=128 ctx 32768
    next_n 2 took 363.5 us instead of 282).
    ``mma_ahead``: with ``loop`` request, each math warpgroup issues its next tile's WGMMA chain
    before the epilogue of the current one, so that the tensor core and the CUDA cores of one
    warpgroup work at once (two accumulator sets per thread: N registers at N = next_n *
    num_heads); needs one chain per tile (no promotion; ``chains`` 0, or next_n 1), and the
    registers of ``maxnreg`` (see :func:`_fuse_max_n`); True, or an integer bound on N (64: next_n 1
    only at 64 heads). A tile's chain goes ahead only when its keys have already arrived (else the
    epilogue runs first). Default: ``num_heads`` (next_n 1) for 8-bit keys with up to 64 heads
    (H200, interleaved: next_n 1 0.4-1.5 % faster), True for the 2-warpgroup 16-bit configuration
    above, else off.
    ``small``: tuning overrides of a second ``ws`` kernel for little work, built into the same
    extension (``paged_logits_small.cu``; ``{}``: none): a call whose upper bound on the work,
    ``batch * ceil(max_context_len / 64)`` tiles (no host sync: the lengths stay on the device),
    is at most ``small_tiles`` tiles per SM runs it. Default for 8-bit keys with up to 64 heads:
    ``{"math_wgs": 2, "maxnreg": 232, "ws_stages": 4}`` up to 40 tiles per SM (the 4 stages it
    was measured with, whatever the main kernel's; H200: 2.5-5.3 % faster at B=4,
    16 and 32 ctx 8192 and B=8 ctx 32768, 31 tiles per SM or fewer; at 62 tiles per SM next_n 2
    was 1.8 % slower, at 46-54 0.8-1.5 %, at 39 the same). The
    overrides apply on top of the tuning's other keys, with :func:`effective_tuning`'s rules
    (see :func:`small_tuning`). A serving stack that passes a ``max_context_len`` far above the
    batch's lengths gets the main kernel.
    ``sched``: the ``ws`` kernel can start from a schedule precomputed by
    ``paged_logits_schedule`` (True, the default: a second instantiation of the kernel, launched
    when a schedule is given; calls without one run the same code as with False); False builds
    only the kernel that computes its own schedule (the argument is then ignored and the schedule
    op returns zeros).
    ``kv_evict_first``: the ``ws`` kernel's key and scale copies (read once) carry the L2
    evict-first cache policy where the call's logits (``B * next_n * max_context_len * 4`` bytes)
    are at most this fraction of the device's L2 (True: always; False or 0: never, the copies
    without a cache hint). The logits then stay in the L2: the next kernel reads them there, and
    the previous call's logits buffer is overwritten there instead of being written back. Default
    0.5 (H200, fp8_e4m3_page64, interleaved A/B, with a schedule: 0.8-2.0 us faster at B=32 and 128 ctx 8192 and
    B=32 ctx 32768, 5-6 % at B=32 ctx 8192; 1.1-1.3 % slower at B=128 ctx 32768 next_n 2, whose 33.6
    MB of logits do not fit; see benchmarks/RESULTS.md, fifteenth session).
    ``lean_loop``: the ``ws`` kernel's math warpgroups take their index, the plain tile loop's
    first tile and its bound from lane 0 (ptxas then keeps that loop's WGMMA descriptors in
    uniform registers), and the plain loop (next_n 2 of the 3-warpgroup fp8 kernel, both next_n
    of the small-work kernel) keeps its stage ring as two counters. True: in every
    instantiation; False: in none; ``"unhinted"`` (default): in those whose key copies carry no
    evict-first hint (``kv_evict_first``: the calls whose logits exceed that share of the L2,
    the large ones; every instantiation where the hint is off). No instantiation is added. H200,
    fp8_e4m3_page64, interleaved A/B from a schedule: the lean form everywhere (the nineteenth
    session's kernels) was 1.9-2.6 % faster at B=128 ctx 32768 next_n 2 and 0.8-2.3 % slower at
    next_n 2 of B=128 ctx 8192 and B=32 ctx 32768 than the kernels before it; ``"unhinted"``
    was 2.2-2.7 / 1.4-2.4 % faster than the lean form everywhere at those two (two A/B calls)
    and the same at B=128 ctx 32768, where no lean form at all was 2.0 % slower (see
    benchmarks/RESULTS.md, nineteenth and twentieth sessions).
    ``portable``: the kernel that runs where no sm_90a kernel does (every device but sm_90, and
    sm_90 where the layout has none or ``kernel`` is ``"simt"``): ``"mma"`` (the default:
    ``paged_logits_mma``, warp-level ``mma.sync`` tensor-core tiles, where :func:`mma_applies`;
    elsewhere the CUDA-core kernel) or ``"simt"`` (the fp32 CUDA-core kernel everywhere). On the
    H200 (2026-12-05, ``benchmarks/RESULTS.md``, thirty-sixth session) the mma kernel passed the
    full CUDA verification sweep on every shipped layout it applies to and ran 14-28x faster
    than the CUDA-core kernel (14-30 % of copy bandwidth for fp8 keys, 30-67 % for bf16 keys);
    ``{"kernel": "simt"}`` runs the portable path on the H200. sm_100a, where it is the only
    tensor-core kernel, has not been run (no Blackwell GPU is lent).
    ``mma_widen`` (default True): ``paged_logits_mma`` on e4m3 keys widens each key word and q to
    f16 once (exact) and issues f16 m16n8k16 MMAs, where the widened q (twice the bytes) of the
    largest ``next_n`` fits in shared memory. sm_90a and sm_100a have no warp-level fp8 MMA: ptxas
    lowers each e4m3 m16n8k32 ``mma.sync`` to two f16 HMMAs that convert both operands again (144
    F2FP conversions to 32 HMMAs in the next_n 1 kernel's SASS for sm_90a and sm_100a, nvcc 13.0),
    where the widened form converts each key once (64 to 16 HMMAs per 8 heads, 0.5 per HMMA
    across the 8 head tiles). On an H100 (2026-12-05, ``benchmarks/RESULTS.md``, thirty-seventh
    session) it passed the full CUDA verification sweep on the four shipped e4m3 layouts and was
    1.21-1.45x faster than the unwidened kernel (H=64, D=128, B 32/128, ctx 8192/32768, next_n
    1/2; two runs; 1.20-1.46x in the thirty-eighth session's three), and it passed on separate
    scales and at head_dim 32/64 with 16 heads, next_n 1-4. ``False`` keeps the e4m3
    m16n8k32 form. sm_100a has not run either form.
    ``mma_prefetch`` (default False): the widened ``paged_logits_mma`` issues each warp step's
    key loads one step ahead, into the raw key registers that widening has just freed, so they
    are in flight during the step's MMAs (and the first step's while q is staged) instead of
    after them. No effect elsewhere. On an H100 (thirty-eighth session, two runs) it passed the
    full CUDA verification sweep but was 1.12-1.46x slower than the default: at 138-142
    registers 3 CTAs fit per SM instead of 4, which the earlier loads do not make up for.
    ``math: False`` (never a default) makes the ``ws`` kernel compute nothing: a benchmark probe
    of its data path alone, whose results are wrong by design.
    """
    # 16-bit keys with up to 64 heads where every next_n * num_heads <= 128: 2 math warpgroups
    # given 232 registers each by setmaxnreg, each with two tiles' accumulators (mma_ahead) and its
    # weights in registers (H200, interleaved against the 4-warpgroup configuration of 112
    # registers that was the default before: see benchmarks/RESULTS.md, tenth session). Larger
    # next_n * num_heads keep 3 (their q leaves no room for more); fp8 keys keep 3 (2 measured
    # slower at next_n 2 with B=128, and 4 3-4 % slower).
    wide = spec.key.bits == 16 and spec.num_heads <= 64 and max(spec.next_n) * spec.num_heads <= 128
    # 8-bit keys with up to 64 heads: the next tile's chain goes ahead of the epilogue at next_n 1
    # (N = num_heads: two accumulator sets fit the 3 math warpgroups' 128 registers)
    ahead = True if wide else spec.num_heads if spec.key.bits == 8 and spec.num_heads <= 64 else False
    # 8-bit keys with up to 64 heads: little work (at most 40 tiles of 64 tokens per SM) runs on
    # 2 math warpgroups of 232 registers, whose schedule units of 128 tokens spread it more evenly
    # (H200, interleaved: B=32 ctx 8192 next_n 1 / 2 16.96 -> 16.13 / 18.08 -> 17.54 us, B=16
    # and B=8 ctx 32768 likewise; at 62 tiles per SM next_n 2 was 1.8 % slower)
    small = ({"math_wgs": 2, "maxnreg": 232, "ws_stages": 4}
             if spec.key.bits == 8 and spec.num_heads <= 64 and uses_ws(spec) else {})
    # FP4 keys (paged_logits_e2m1) also take 2 stages: on the H200 (2026-12-04, an earlier form
    # of the kernel, benchmarks/logs/h200_s33_call2_paged_fp4_v2.log) 3 stages were 0.1-1.9 %
    # slower at 5 of 6 shapes (B=128 ctx 32768: 241.6 vs 237.2 us next_n 1, 380.3 vs 377.1 us
    # next_n 2) and 2.2 % faster at B=32 ctx 8192 next_n 1; an unlogged sweep of the first form
    # found 4 and 6 stages slower than 3
    return {"stages": 4 if spec.key.bits == 8 else 2, "promote": 0,
            "kernel": "ws" if uses_ws(spec) else "wgmma",
            # 3 math warpgroups (512 threads: <= 128 registers each) spill with more than 64 heads
            "math_wgs": 2 if wide else 3 if spec.num_heads <= 64 else 2,
            "ws_stages": 3 if spec.key.bits == 8 else 4,
            "math": True, "fuse": 128, "maxnreg": 232 if wide else 0, "chains": 0,
            "wregs": True, "loop": "request", "mma_ahead": ahead,
            "small": small, "small_tiles": 40,
            "store_passes": 1, "sched": True, "kv_evict_first": 0.5, "lean_loop": "unhinted",
            "store_lanes": 4 if _store_vec(spec) >= 8 else 16,
            # off: it speeds up random slots but slows whole pages, a prefill's pattern (see
            # the docstring)
            "store_prefetch": False,
            "store_prefetch_min_n": 4096,
            # verified on the H200 (thirty-sixth session: the full CUDA sweep on the six shipped
            # layouts it applies to) and 14-28x faster there than the CUDA-core kernel
            "portable": "mma",
            # verified on an H100 (thirty-seventh session: the full CUDA sweep on the four shipped
            # e4m3 layouts) and 1.21-1.45x faster there than the unwidened e4m3 mma kernel
            "mma_widen": True,
            # verified on an H100 (thirty-eighth session) but 1.12-1.46x slower there than
            # without it (3 CTAs per SM at 138-142 registers, against 4): off
            "mma_prefetch": False}


def _store_prefetch(tune: dict[str, Any]) -> bool:
    """The ``store_prefetch`` tuning (a bool); ValueError otherwise, or when
    ``store_prefetch_min_n`` is not an integer >= 0."""
    v = tune["store_prefetch"]
    n = tune["store_prefetch_min_n"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"tuning store_prefetch_min_n={n!r}: must be an integer >= 0")
    if not isinstance(v, bool):
        raise ValueError(f"tuning store_prefetch={v!r}: must be true or false")
    return v


def _store_vec(spec: Spec) -> int:
    """Bytes of the store kernel's widest aligned key store: an 8-element chunk (``key.bits``
    bytes) as far as the key's alignment in ``kv_cache`` allows."""
    return math.gcd(spec.key.bits, spec.key_align)


def _check_counts(tune: dict[str, Any]) -> None:
    """ValueError naming the tuning when ``store_lanes`` is not one of 2, 4, 8, 16, 32, or a
    tuning with its own check below is invalid (the plain integers and bools,
    :data:`_SCALAR_TUNINGS`, are checked by :func:`effective_tuning`)."""
    v = tune["store_lanes"]
    if isinstance(v, bool) or v not in (2, 4, 8, 16, 32):
        raise ValueError(f"tuning store_lanes={v!r}: must be 2, 4, 8, 16 or 32")
    _kv_evict_first(tune)
    _store_prefetch(tune)
    _check_portable(tune)
    _loop(tune)
    _lean_loop(tune)


_SMALL_KEYS = ("stages", "promote", "kernel", "math_wgs", "ws_stages", "fuse", "maxnreg", "chains",
               "wregs", "loop", "mma_ahead")   # what tuning `small` may override


def small_tuning(spec: Spec, tuning: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Effective tuning of the small-work ``ws`` kernel (tuning ``small``), or None where there is
    none (``small`` empty, ``small_tiles`` 0, or equal to the main kernel's tuning): the
    :func:`effective_tuning` of the keys the tuning gives (``small`` and ``small_tiles`` left
    out) with the ``small`` overrides on top, its rules applied to them all (so a given
    ``{"math": False}`` reaches both kernels, and the default ``mma_ahead`` is off there as for
    any tuning that changes ``math_wgs``). ValueError, naming ``small``, where ``small`` is not a
    dict of paged-kernel keys, ``small_tiles`` not an integer in [0, 2^20], or the small tuning
    is invalid or not a ``ws`` kernel of this layout."""
    tune = effective_tuning(spec, tuning)
    small, tiles = tune["small"], tune["small_tiles"]
    if not isinstance(small, dict) or any(k not in _SMALL_KEYS for k in small):
        raise ValueError(f"tuning small={small!r}: must be a dict of paged-kernel tuning keys "
                         f"({', '.join(_SMALL_KEYS)})")
    if isinstance(tiles, bool) or not isinstance(tiles, int) or not 0 <= tiles <= 1 << 20:
        raise ValueError(f"tuning small_tiles={tiles!r}: must be an integer from 0 (off) to 2^20")
    if not small or tiles == 0:
        return None
    given = {k: v for k, v in (tuning or {}).items() if k not in ("small", "small_tiles")}
    try:                                  # the small tuning's own errors name `small`
        sub = effective_tuning(spec, {**given, **small, "small": {}})
    except ValueError as e:
        raise ValueError(f"tuning small={small!r}: {e}") from None
    if _js(sub) == _js({**tune, "small": {}}):
        return None
    try:                                  # every check its render makes
        _check_counts(sub)
        _context(spec, sub, "")
        ok = sub["kernel"] == "ws" and any(ws_stages(spec, nn, sub) for nn in spec.next_n)
    except (ValueError, TypeError) as e:
        raise ValueError(f"tuning small={small!r}: {e}") from None
    if not ok and "small" not in (tuning or {}):
        return None                       # the default overrides, on a layout they do not fit
    if not ok:
        raise ValueError(f"tuning small={small!r}: the small-work kernel must be a paged_logits_ws "
                         f"kernel (kernel 'ws', ws_stages >= 2 that fit in shared memory) on a "
                         f"layout it applies to (dsagen.codegen.uses_ws: {uses_ws(spec)})")
    return sub


def _mma_ahead_max_n(spec: Spec, tune: dict[str, Any]) -> int:
    """Largest N = next_n * num_heads at which tuning ``mma_ahead`` applies (True: every next_n
    of the spec; an integer above 1: that bound on N; False/0: off). ValueError where it applies
    to a next_n whose tile is not one WGMMA chain (promotion, ``chains`` 1 or 2 at next_n > 1,
    N above what ``fuse`` keeps in flight) or ``loop`` is not ``request``."""
    v = tune.get("mma_ahead")
    if not v:
        return 0
    bound = 256 if v is True else int(v)
    if _loop(tune) != "request":
        raise ValueError("tuning mma_ahead needs loop='request'")
    for nn in spec.next_n:
        if nn * spec.num_heads <= bound and not _one_chain(spec, tune, nn):
            raise ValueError(f"tuning mma_ahead: a tile at next_n={nn} is not one WGMMA chain "
                             f"(promote={tune['promote']!r}, chains={tune['chains']!r}, fuse up to "
                             f"N={_fuse_max_n(spec, tune)} with the math warpgroups' {_math_regs(tune)} "
                             f"registers; two accumulator sets need N registers per thread)")
    return bound


def _one_chain(spec: Spec, tune: dict[str, Any], next_n: int) -> bool:
    """Whether a tile at ``next_n`` is one WGMMA chain of all next_n * num_heads query rows
    (no promotion; ``chains`` 0 where ``fuse`` keeps the positions in flight, or next_n 1)."""
    chains = _chains(spec, tune)
    return not _promote_steps(spec, tune) and (
        (next_n == 1 and chains <= 1)
        or (next_n > 1 and chains == 0 and next_n * spec.num_heads <= _fuse_max_n(spec, tune)))


def _kv_evict_first(tune: dict[str, Any]) -> float:
    """Tuning ``kv_evict_first`` as the template takes it: 0.0 off, -1.0 always, else the largest
    logits output (bytes) that gets the hint, as a fraction of the device's L2. ValueError where
    it is not a bool, 0 or a number in (0, 16]."""
    v = tune["kv_evict_first"]
    if isinstance(v, bool):
        return -1.0 if v else 0.0
    if not isinstance(v, (int, float)) or not 0 <= v <= 16 or v != v:
        raise ValueError(f"tuning kv_evict_first={v!r}: must be true, false (or 0) or a fraction "
                         f"of the L2 in (0, 16]")
    return float(v)


def _lean_loop(tune: dict[str, Any]) -> str:
    """The tuning ``lean_loop`` as the template's ``kLean`` (a C++ bool expression of the kernel's
    template arguments): ``"true"``, ``"false"``, or for ``"unhinted"`` ``"!HINT"`` where the
    evict-first hint exists (else ``"true"``). ValueError where it is not True, False or
    ``"unhinted"``."""
    v = tune["lean_loop"]
    if v is True or v is False:
        return "true" if v else "false"
    if v != "unhinted":
        raise ValueError(f"tuning lean_loop={v!r}: must be true, false or 'unhinted'")
    return "!HINT" if _kv_evict_first(tune) != 0 else "true"


def _loop(tune: dict[str, Any]) -> str:
    """The tuning ``loop`` (``request`` or ``unit``); ValueError otherwise."""
    v = tune["loop"]
    if v not in ("request", "unit"):
        raise ValueError(f"tuning loop={v!r}: must be 'request' or 'unit'")
    return v


def _chains(spec: Spec, tune: dict[str, Any]) -> int:
    """WGMMA chains per next_n position without promotion (tuning ``chains``: 1 or 2; 1 where
    the heads do not split into chains of a multiple of 8; 0 = one chain over every position's
    rows where ``fuse`` applies, else one per position)."""
    c = tune["chains"]        # 0, 1 or 2 (effective_tuning's check)
    return c if c == 0 or spec.num_heads % (8 * c) == 0 else 1


def _promote_steps(spec: Spec, tune: dict[str, Any]) -> int:
    """K steps (32 bytes each) per fp32 promotion of the fp8 WGMMA accumulator: tuning
    ``promote`` True = 1, False = 0 (none), or a count; made a divisor of the K steps."""
    if spec.key_dtype != "e4m3" or not tune["promote"]:
        return 0
    return math.gcd(int(tune["promote"]), spec.key_bytes_per_token // 32)


def _launch_regs(tune: dict[str, Any]) -> int:
    """Registers per thread of the warp-specialized kernel's launch: the most that
    ``128 * (1 + math_wgs)`` threads of one CTA per SM can each hold (ptxas compiles to that
    bound, and allocates all of it where ``setmaxnreg`` is used)."""
    return min(255, 65536 // (128 * (1 + int(tune["math_wgs"]))) // 8 * 8)


def _math_regs(tune: dict[str, Any]) -> int:
    """Registers per thread the math warpgroups' code is compiled within: the launch bound, or
    ``maxnreg`` where set (ptxas compiles the code after ``setmaxnreg.inc`` to its count: at 4
    math warpgroups and ``maxnreg`` 112 the math loop's SASS uses registers up to R109 under a
    launch bound of 96)."""
    return int(tune["maxnreg"]) or _launch_regs(tune)


def _fuse_max_n(spec: Spec, tune: dict[str, Any]) -> int:
    """Largest N = next_n * num_heads whose accumulators tuning ``fuse`` keeps in flight at
    once (one WGMMA chain with promotion; chains of ``num_heads / chains`` rows without):
    ``fuse``, at most 256 (WGMMA's N), and small enough that the N/2 accumulators per thread (N
    with a promotion buffer) leave 32 (40 with promotion) of the math warpgroups' registers for
    the rest (96 per thread at 4 math warpgroups, 128 at 3, 168 at 2, or ``maxnreg`` where set:
    ptxas compiles the code after ``setmaxnreg.inc`` to that count): beyond that ptxas spills,
    or cannot allocate the instruction at all (N=256 at 3 math warpgroups)."""
    regs = _math_regs(tune)
    promote = bool(_promote_steps(spec, tune))
    # accumulator registers per unit of N: a promotion buffer or (mma_ahead) a second tile's set
    ahead = tune.get("mma_ahead")
    ahead_fused = ahead is True or (bool(ahead) and int(ahead) > spec.num_heads)
    per_n = 1.0 if promote or ahead_fused else 0.5
    rest = 40 if promote else 32                     # what the rest of the math code keeps
    return min(256, int(tune["fuse"]), int((regs - rest) / per_n) // 8 * 8)


def _wregs_max_n(spec: Spec, tune: dict[str, Any]) -> int:
    """Largest N = next_n * num_heads (at most 128) at which tuning ``wregs`` keeps the N/4
    head weights of a thread in registers: the next_n values of the spec up to it each fit, with
    that next_n's accumulators (:func:`_fuse_max_n`'s accounting) and 32 other registers (40
    with promotion, ``chains`` 2 or fewer than 128 registers), in the math warpgroups'
    registers; 0 = off. Beyond that ptxas spilled (a review compiled the tunings)."""
    if not tune["wregs"]:
        return 0
    if not isinstance(tune["wregs"], bool) and int(tune["wregs"]) > 1:
        return min(128, int(tune["wregs"]))      # an explicit N bound: no register accounting
    regs = _math_regs(tune)
    promote = bool(_promote_steps(spec, tune))
    rest = 32 if regs >= 128 and not promote and _chains(spec, tune) != 2 else 40
    fuse_max, h, best = _fuse_max_n(spec, tune), spec.num_heads, 0
    for nn in sorted(spec.next_n):
        n = nn * h
        if n > 128:
            break
        ahead = tune.get("mma_ahead")
        if ahead is True or (bool(ahead) and n <= int(ahead)):
            acc = n                               # two tiles' chains (no promotion)
        elif nn > 1 and n <= fuse_max:
            acc = n if promote else n // 2        # one chain (with its promotion buffer)
        else:
            acc = 3 * h // 2 if promote else h // 2   # one position at a time (two buffers)
        if acc + n // 4 + rest > regs:
            break
        best = n
    return best


def _mma_ns(spec: Spec, tune: dict[str, Any]) -> list[int]:
    """WGMMA N sizes the kernels use: num_heads, and next_n * num_heads where ``fuse`` allows
    (with promotion, or ``chains`` 0); ``num_heads / chains`` without promotion otherwise."""
    cap = _fuse_max_n(spec, tune)
    if not _promote_steps(spec, tune) and _chains(spec, tune):   # chains of num_heads / chains rows
        return [spec.num_heads // _chains(spec, tune)]
    return sorted({spec.num_heads} | {nn * spec.num_heads for nn in spec.next_n
                                      if nn > 1 and nn * spec.num_heads <= cap})


def _ws_regs(tune: dict[str, Any]) -> tuple[int, int] | None:
    """Registers per thread of warpgroup 0 and of the math warpgroups under tuning ``maxnreg``
    (setmaxnreg; None when 0). Raises ValueError when the register file (64 K) cannot hold them."""
    regs, wgs = int(tune["maxnreg"]), int(tune["math_wgs"])
    if regs == 0:
        return None
    # setmaxnreg moves registers inside the CTA's launch allocation: what warpgroup 0 gives up
    # must cover what the math warpgroups take; warpgroup 0 keeps 40 where that allows, else
    # down to 24
    pool = (1 + wgs) * _launch_regs(tune)
    producer = min(40, (pool - wgs * regs) // 8 * 8)
    # setmaxnreg.inc to fewer registers than the warps already hold is undefined (PTX ISA)
    launch = -(-_launch_regs(tune) // 8) * 8
    if regs < launch:
        raise ValueError(f"tuning maxnreg={regs}: below the {launch} registers per thread that "
                         f"the launch of {wgs} math warpgroups already gives (setmaxnreg only "
                         f"raises them); use 0 (off) or at least {launch}")
    if regs % 8 or not 24 <= regs <= 256 or producer < 24:
        raise ValueError(f"tuning maxnreg={regs}: must be a multiple of 8 in [24, 256] with "
                         f"24 + {wgs}*maxnreg <= {pool}: warpgroup 0 keeps at least 24 registers per "
                         f"thread, and the launch gives each of the {1 + wgs} warpgroups "
                         f"{_launch_regs(tune)}")
    return producer, regs


def _mma_op(spec: Spec):
    def op(n: int) -> str:
        if spec.key_dtype == "e4m3":
            return f"MMA_64x{n}x32_F32E4M3E4M3_SS_TN<>"
        ab = "BF16BF16" if spec.key_dtype == "bf16" else "F16F16"
        major = "cute::SM90::GMMA::Major::K"
        return f"MMA_64x{n}x16_F32{ab}_SS<{major}, {major}>"
    return op


def _context(spec: Spec, tune: dict[str, Any], ns: str) -> dict[str, Any]:
    """The template context of ``spec`` under the effective tuning ``tune`` in namespace ``ns``."""
    return {
        "spec": spec,
        "ns": ns,
        "amax_floor": AMAX_FLOOR_LITERAL,
        "lay": spec.layout,
        "q_scalar": spec.query.aten,
        "q_dtype_name": f"torch.{spec.query.torch_name}",
        "store_vec": _store_vec(spec),
        # kv_cache alignment the store kernel needs: its key vectors, and fp32 scales in kv_cache
        "store_align": math.lcm(_store_vec(spec),
                                4 if spec.scale_dtype == "fp32" and not spec.separate_scales else 1),
        "wgmma": uses_wgmma(spec) and tune["kernel"] in ("ws", "wgmma"),
        "ws_stages": {nn: ws_stages(spec, nn, tune) for nn in spec.next_n},
        "math_wgs": int(tune["math_wgs"]),
        "request_loop": _loop(tune) == "request",
        "mma_ahead_max_n": _mma_ahead_max_n(spec, tune),
        "ws_math": bool(tune["math"]),
        "ws_smem": {nn: ws_smem_bytes(spec, nn, int(tune["math_wgs"]), ws_stages(spec, nn, tune))
                    for nn in spec.next_n},
        "wgmma_smem": {nn: wgmma_smem_bytes(spec, nn, int(tune["stages"])) for nn in spec.next_n},
        "e2m1_mma": uses_e2m1_mma(spec) and tune["kernel"] in ("ws", "wgmma"),
        "portable_mma": _portable(tune) == "mma" and mma_applies(spec),
        "mma_smem": {nn: mma_smem_bytes(spec, nn, tune) for nn in spec.next_n},
        "mma_widen": mma_widens(spec, tune),
        "mma_prefetch": mma_prefetches(spec, tune),
        "e2m1_q_slots": {nn: e2m1_q_slots(spec, nn) for nn in spec.next_n},
        "e2m1_max_rows": E2M1_MAX_ROWS,
        "e2m1_smem": {nn: e2m1_smem_bytes(spec, nn, int(tune["stages"])) for nn in spec.next_n},
        "stages": int(tune["stages"]),
        "promote": _promote_steps(spec, tune),
        "fuse": _fuse_max_n(spec, tune) > 0,
        "fuse_max_n": max(0, _fuse_max_n(spec, tune)),
        "mma_ns": _mma_ns(spec, tune),
        "chains": _chains(spec, tune),
        "store_passes": int(tune["store_passes"]),
        "store_lanes": min(int(tune["store_lanes"]), spec.head_dim // 8),
        "store_prefetch": _store_prefetch(tune) if spec.quantized else False,
        "store_prefetch_min_n": int(tune["store_prefetch_min_n"]),
        "wregs_max_n": _wregs_max_n(spec, tune),
        "ws_regs": _ws_regs(tune),
        "sched": bool(tune["sched"]),
        "kv_evict_first": _kv_evict_first(tune) != 0,
        "kv_evict_first_l2": _kv_evict_first(tune),
        "lean_loop": _lean_loop(tune),
        "sched_row": SCHEDULE_ROW,
        "k_step_bytes": 32,
        "mma_op": _mma_op(spec),
    }


def render(spec: Spec, tuning: dict[str, Any] | None = None) -> dict[str, str]:
    """Render every source of ``spec``. Returns ``{file name: text}``.

    A render is memoized under the cache root (``rendered/<digest>.json``, the digest covering
    the spec, the tuning, the templates and this module's sources), so a warm ``dsagen.load``
    neither imports Jinja nor renders. A read-only or missing cache root just renders.

    Raises:
        ValueError: a ``tuning`` key or value that :func:`default_tuning` does not allow.
    """
    from . import config
    tune = effective_tuning(spec, tuning)
    _check_counts(tune)
    small = small_tuning(spec, tuning)
    ns = namespace(spec, tuning)
    memo = config.cache_root() / RENDER_MEMO / f"{_render_digest(spec, {**tune, 'small:effective': small}, ns)}.json"
    try:
        out = json.loads(memo.read_text())
        if isinstance(out, dict) and set(out) == set(HEADERS + CPU_SOURCES + CUDA_SOURCES):
            try:
                os.utime(memo)           # its mtime is its last use (see _trim_render_memo)
            except OSError:
                pass
            return out
    except (OSError, ValueError):
        pass
    ctx = _context(spec, tune, ns)
    ctx.update(small=small is not None, small_tiles=int(tune["small_tiles"]), small_part=False)
    out = {}
    for name in HEADERS + CPU_SOURCES + CUDA_SOURCES:
        if name == "paged_logits_small.cu":
            continue
        out[name] = _environment().get_template(name + ".jinja").render(**ctx)
    # the small-work kernel (tuning `small`): the same template under its own tuning, in the
    # nested namespace ns::small, with only its launch entry (an empty unit when there is none)
    if small is not None:                 # (small_tuning made the context's checks)
        sctx = _context(spec, small, ns + "::small")
        sctx.update(small=False, small_tiles=0, small_part=True)
        out["paged_logits_small.cu"] = _environment().get_template("paged_logits.cu.jinja").render(**sctx)
    else:
        out["paged_logits_small.cu"] = (f"// Generated by dsagen from spec '{spec.name}' -- do not edit.\n"
                                        "// No small-work paged-logits kernel for this spec and tuning "
                                        "(tuning `small`).\n")
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=memo.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(out, f)
        os.replace(tmp, memo)
        _trim_render_memo(memo.parent)
    except OSError:
        pass
    return out


def _trim_render_memo(d: Path, keep: int = RENDER_MEMO_MAX) -> None:
    """Bound the render memo: past ``keep`` files, remove the least recently used (by mtime,
    which a hit refreshes) down to three quarters of ``keep``. Every template or tuning change
    leaves renders that no digest will ask for again; this is what removes them."""
    files = list(d.glob("*.json"))
    if len(files) <= keep:
        return
    def mtime(f: Path) -> float:
        try:
            return f.stat().st_mtime
        except OSError:
            return 0.0
    files.sort(key=mtime)
    for f in files[:len(files) - keep * 3 // 4]:
        try:
            f.unlink()
        except OSError:
            pass


def write_generated(spec: Spec, out_dir: Path | None = None,
                    tuning: dict[str, Any] | None = None) -> Path:
    """Write the rendered sources to ``out_dir`` (default ``generated/<name>/``, made with its
    parents); unchanged files are not touched. Returns the directory.

    Raises:
        ValueError: a bad ``tuning`` (as :func:`render`).  OSError: the folder or a file cannot
            be written.
    """
    d = Path(out_dir) if out_dir else GENERATED_DIR / spec.name
    d.mkdir(parents=True, exist_ok=True)
    for name, text in render(spec, tuning).items():
        p = d / name
        if not p.exists() or p.read_text() != text:
            p.write_text(text)
    return d
