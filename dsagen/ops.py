"""Load a spec's generated ops and expose them as Python callables.

The ops are registered with ``torch.library`` under the namespace ``dsagen_<name>_<digest>``:
``store`` mutates ``kv_cache`` (and ``kv_scales``) and returns nothing. Every op has a fake
(meta) implementation, so it traces under ``torch.compile``; it checks that the inputs share
one device, as the real op does.

Schemas (the same for every spec)::

    store(Tensor k, Tensor(a!) kv_cache, Tensor loc, Tensor(b!)? kv_scales=None) -> ()
    paged_logits(Tensor q, Tensor kv_cache, Tensor weights, Tensor context_lens,
                 Tensor block_table, int max_context_len, bool clean_logits,
                 Tensor? kv_scales=None, Tensor? schedule=None) -> Tensor
    paged_logits_schedule(Tensor context_lens, Tensor block_table, int next_n,
                          int max_context_len) -> Tensor
    ragged_logits(Tensor q, Tensor k, Tensor? k_scale, Tensor weights, Tensor ks, Tensor ke,
                  bool clean_logits) -> Tensor

``kv_scales`` is the scales' own tensor of a ``scale.placement: separate`` spec, contiguous uint8
``[num_pages, spec.scale_page_bytes]`` with ``kv_cache``'s ``num_pages`` on its device (token ``t``
of page ``p`` has its scales at ``kv_scales[p, t*scale_bytes_per_token:]``); :meth:`Ops.new_scales`
allocates it. It is required for separate specs and must be None for the others (scales in
``kv_cache``); either mistake raises a RuntimeError naming ``kv_scales``.
"""
from __future__ import annotations

import contextlib
import operator
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from . import jit
from .codegen import SCHEDULE_ROW, namespace, render
from .spec import Spec, load_spec

_LOCK = threading.Lock()
_LOADED: dict[str, "Ops"] = {}
# open Ops.poisoned_outputs blocks per namespace, and the switch's value before the first
_POISON_LOCK = threading.Lock()
_POISON_DEPTH: dict[str, int] = {}
_POISON_PREV: dict[str, bool] = {}


def arch_split(spec: Spec) -> tuple[list[str], list[str], list[str]]:
    """The spec's targets in three lists, each in the spec's order: ``(run, compile_only,
    left_out)``. ``run``: those the current CUDA device runs (``sm_90a`` on Hopper, ``sm_100a`` on
    Blackwell; empty without a matching device); ``compile_only``: the others that
    ``DSAGEN_ARCH_LIST`` keeps (``dsagen compile`` and the pytest plugin's ``nvcc`` item compile
    them with nvcc, nothing run); ``left_out``: those ``DSAGEN_ARCH_LIST`` leaves out.
    Raises :class:`dsagen.config.ConfigError` (a ValueError) where ``DSAGEN_ARCH_LIST`` is
    malformed, with or without a device."""
    from . import config
    allowed = config.arch_list()
    kept = [t for t in spec.targets if allowed is None or t in allowed]
    local = None
    if torch.cuda.is_available() and torch.version.cuda is not None:
        major, minor = torch.cuda.get_device_capability()
        local = f"sm_{major}{minor}a"
    run = [t for t in kept if t == local]
    return run, [t for t in kept if t not in run], [t for t in spec.targets if t not in kept]


def cuda_archs(spec: Spec) -> list[str]:
    """The spec's targets (narrowed by ``DSAGEN_ARCH_LIST``) that the current CUDA device runs:
    ``sm_90a`` on Hopper, ``sm_100a`` on Blackwell; empty without a matching device.
    Raises as :func:`arch_split`."""
    return arch_split(spec)[0]


@dataclass
class Ops:
    """The built ops of one spec, as :func:`load` returns them (one object per spec, tuning and
    ``with_cuda`` in a process).

    Attributes:
        spec: the layout the ops were built for.
        namespace: the ``torch.ops`` namespace they are registered under
            (``dsagen_<name>_<digest>``, plus ``_t<hash>`` for a non-default tuning).
        library: path of the loaded shared library in the build cache.
        has_cuda: whether the CUDA kernels were built (the CPU kernels always are).
        tuning: the kernel tuning overrides the ops were built with (None: the defaults).

    The methods take and return torch tensors; semantics per method (DeepGEMM
    ``fp8_paged_mqa_logits`` / ``fp8_mqa_logits`` for the logits, DESIGN.md section 2 for the
    store)."""

    spec: Spec
    namespace: str
    library: Path
    has_cuda: bool
    tuning: dict | None = None     # kernel tuning overrides the ops were built with

    @property
    def _ops(self):
        return getattr(torch.ops, self.namespace)

    def new_cache(self, num_pages: int, device="cpu") -> torch.Tensor:
        """A zeroed ``kv_cache``: uint8 ``[num_pages, spec.page_bytes]`` on ``device`` (for a
        ``separate`` spec it holds only the keys; allocate the scales with :meth:`new_scales`)."""
        return torch.zeros(num_pages, self.spec.page_bytes, dtype=torch.uint8, device=device)

    def new_scales(self, num_pages: int, device="cpu") -> torch.Tensor | None:
        """A zeroed ``kv_scales`` for a ``scale.placement: separate`` spec: uint8
        ``[num_pages, spec.scale_page_bytes]`` on ``device``; None for the other placements
        (their scales are in ``kv_cache``), so ``ops.store(k, cache, loc, ops.new_scales(...))``
        style code works for every spec."""
        if not self.spec.separate_scales:
            return None
        return torch.zeros(num_pages, self.spec.scale_page_bytes, dtype=torch.uint8, device=device)

    def store(self, k: torch.Tensor, kv_cache: torch.Tensor, loc: torch.Tensor,
              kv_scales: torch.Tensor | None = None) -> None:
        """Quantize ``k`` (bf16/fp16/fp32 ``[N, head_dim]``) into slots ``loc`` (int64 ``[N]``) of
        ``kv_cache`` (and, for a separate spec, ``kv_scales``) in place; matches
        :func:`dsagen.reference.store` byte for byte for finite keys (for a NaN element the
        stored bytes may differ: the sign and payload of a NaN, and e2m1 has no NaN code).

        Quantization per DESIGN.md section 2 (per block ``amax / max``, round to nearest even,
        saturating; ``pow2`` / ue8m0 scales rounded up to a power of two).

        Args:
            k: bf16, fp16 or fp32 ``[N, head_dim]``.
            kv_cache: contiguous uint8 ``[num_pages, spec.page_bytes]`` (on CUDA aligned to the
                kernel's key vectors, as every fresh allocation is).
            loc: int64 ``[N]`` slot ids, ``slot = page * page_size + offset`` in
                ``[0, num_pages * page_size)``, distinct (with duplicates one of the tokens wins).
            kv_scales: ``separate`` specs: contiguous uint8 ``[num_pages, spec.scale_page_bytes]``
                (:meth:`new_scales`); None for the other placements.
        Raises:
            RuntimeError: shapes, dtypes, devices or (CUDA) alignment do not match the spec;
                ``kv_scales`` missing for a separate spec or given for another; on the CPU
                backend, a slot id out of range. On CUDA slot ids are not checked (that would
                need a host sync): an out-of-range one is undefined behaviour.
        """
        self._ops.store(k, kv_cache, loc, kv_scales)

    def paged_logits(self, q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                     context_lens: torch.Tensor, block_table: torch.Tensor, max_context_len: int,
                     clean_logits: bool = True, kv_scales: torch.Tensor | None = None,
                     schedule: torch.Tensor | None = None) -> torch.Tensor:
        """Indexer logits over the paged cache; DeepGEMM ``fp8_paged_mqa_logits`` semantics.

        ``logits[b*next_n+i, j] = k_scale[j] * sum_h weights[b*next_n+i, h] * relu(q[b,i,h] . k[j])``
        where key ``j`` of request ``b`` is in slot ``block_table[b, j // page_size] * page_size +
        j % page_size``. Row ``b*next_n+i`` sees ``j < context_lens[b] - next_n + i + 1`` with 1-D
        ``context_lens`` (token counts; causal over the ``next_n`` draft positions), ``j <
        context_lens[b, i]`` with 2-D ones, never past ``max_context_len``. With block scales
        (``scale.block`` < ``head_dim``, e.g. the e2m1 layouts' 32-element blocks) each block of
        the key is scaled before the dot product: ``q[b,i,h] . (k[j] * scale[j, block])``
        replaces ``k_scale[j] * (q[b,i,h] . k[j])``; unscaled layouts (bf16, fp16) use 1.

        Args:
            q: ``[B, next_n, num_heads, head_dim]`` in ``spec.query``: e4m3 for e4m3 layouts,
                bf16 for e2m1 (FP4) layouts, else the key dtype.
            kv_cache: uint8 ``[num_pages, page_bytes]``.
            weights: fp32 ``[B*next_n, num_heads]`` (query scales folded in by the caller).
            context_lens: int32 ``[B]`` or ``[B, next_n]``.
            block_table: int32 ``[B, max_pages]`` page ids into ``kv_cache`` (unit column
                stride, any stride with one column; rows at any stride; columns past a
                request's length are never read).
            max_context_len: columns of the result, in ``[0, max_pages * page_size]``.
            clean_logits: write ``-inf`` where a key is not visible; without it those entries are
                unspecified (DeepGEMM's rule) and may be non-finite (the sm_90a TMA kernel scores
                whole 64-token tiles, including stale rows of a request's last page).
            kv_scales: ``separate`` specs: uint8 ``[num_pages, spec.scale_page_bytes]``; None
                for the other placements.
            schedule: optional, what :meth:`paged_logits_schedule` returned for these
                ``context_lens``, ``block_table``, next_n and ``max_context_len`` (made once
                per decode step and shared by every layer, as DeepGEMM's schedule metadata):
                the sm_90a TMA kernel then starts from it instead of computing its schedule.
                The result is bitwise the same as without it. A schedule made for other lengths
                or another block table gives wrong logits: it is not checked against them (one
                made for another batch size, ``max_context_len``, next_n, ``context_lens`` rank,
                page size or kernel is detected and ignored). Where such a schedule covers
                block-table entries past the current lengths that are not valid page ids, the
                behaviour is undefined, as for any out-of-range page id on CUDA. Each CTA's
                producers and math warpgroups follow the same row, so it cannot leave the
                kernel waiting. The other kernels ignore it.
        Returns:
            fp32 ``[B*next_n, max_context_len]``.
        Raises:
            RuntimeError: shapes or dtypes do not match the spec, next_n is not in the spec,
                the tensors are not all on one device, ``block_table`` has more than one
                column and a column stride other than 1, ``kv_scales`` is missing for a
                separate spec or given for another, or
                ``schedule`` is not a contiguous, 16-byte aligned int32 ``[num_sms, kSchedRow]``
                tensor of this device (its row count this device's SM count),
                ``max_context_len`` is out of range, ``kv_cache`` is not contiguous, or (CUDA)
                the launch failed; on the CPU backend, a page id a request reads is out of
                range (on CUDA page ids are not checked: undefined behaviour).
            TypeError: ``max_context_len`` is not an integer or ``clean_logits`` not a bool.
        """
        return self._ops.paged_logits(q, kv_cache, weights, context_lens, block_table,
                                      _int_arg("max_context_len", max_context_len),
                                      _bool_arg("clean_logits", clean_logits), kv_scales, schedule)

    def paged_logits_schedule(self, context_lens: torch.Tensor, block_table: torch.Tensor,
                              next_n: int, max_context_len: int) -> torch.Tensor:
        """The paged-logits schedule for one decode step, to pass as ``schedule=`` to every
        layer's :meth:`paged_logits` call of that step (the layers share ``context_lens`` and
        ``block_table``). The role of DeepGEMM's ``get_paged_mqa_logits_metadata``, computed
        by one small kernel on the device (no host sync; CUDA-graph capturable).

        Each of the ``num_sms`` rows is one CTA's share of the persistent grid: its first and
        last schedule units, first request and that request's length, a tag of the kernel and
        inputs it was made for, and the block-table entries of its first tiles.

        Args:
            context_lens: int32 ``[B]`` or ``[B, next_n]``, as for :meth:`paged_logits`.
            block_table: int32 ``[B, max_pages]``.
            next_n, max_context_len: those of the :meth:`paged_logits` calls.
        Returns:
            int32 ``[num_sms, S]`` on CUDA (``S`` = ``kSchedRow`` of the generated layout, 136),
            16-byte aligned; ``[0, S]`` on the CPU backend, whose kernel needs none. Zeros
            (ignored by the kernel) where the launch rule would not pick the sm_90a TMA kernel
            for these lengths (no sm_90 device, a spec without it, or tuning ``sched`` off).
        Raises:
            RuntimeError: next_n not in the spec, or shapes, dtypes or devices wrong.
            TypeError: ``next_n`` or ``max_context_len`` is not an integer.
        """
        return self._ops.paged_logits_schedule(context_lens, block_table, _int_arg("next_n", next_n),
                                               _int_arg("max_context_len", max_context_len))

    def set_poison_outputs(self, on: bool) -> bool:
        """Debug switch of this extension (every spec's ops have their own): while on,
        :meth:`paged_logits` and :meth:`ragged_logits` fill their fp32 output with NaN before
        the kernel runs (one extra fill per call), so that an entry a kernel leaves unwritten
        reads NaN instead of whatever the allocator's block held. :func:`dsagen.verify.verify`
        turns it on for its sweep. Off by default; serving code never needs it. Returns the
        previous setting."""
        return bool(self._ops.set_poison_outputs(bool(on)))

    @contextlib.contextmanager
    def poisoned_outputs(self):
        """``with ops.poisoned_outputs(): ...``: :meth:`set_poison_outputs` on inside the block.
        Blocks may nest or overlap across threads (a count of open blocks per extension): the
        switch is on while any is open and goes back to what it was before the first one when
        the last one closes. The switch is process-wide for the extension: other threads'
        calls meanwhile pay the fill too, and a CUDA graph captured meanwhile keeps the fill in
        every replay."""
        with _POISON_LOCK:
            depth = _POISON_DEPTH.get(self.namespace, 0)
            if depth == 0:
                _POISON_PREV[self.namespace] = self.set_poison_outputs(True)
            _POISON_DEPTH[self.namespace] = depth + 1
        try:
            yield self
        finally:
            with _POISON_LOCK:
                depth = _POISON_DEPTH[self.namespace] - 1
                _POISON_DEPTH[self.namespace] = depth
                if depth == 0:
                    self.set_poison_outputs(_POISON_PREV.pop(self.namespace))

    def ragged_logits(self, q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor | None,
                      weights: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor,
                      clean_logits: bool = True) -> torch.Tensor:
        """Prefill indexer logits over contiguous keys; DeepGEMM ``fp8_mqa_logits`` semantics.

        ``logits[s, n] = k_scale[n] * sum_h weights[s, h] * relu(q[s, h] . k[n])`` for
        ``ks[s] <= n < ke[s]``, else ``-inf`` (with ``clean_logits``; otherwise unspecified).
        With block scales each block of ``k[n]`` is scaled before the dot product, as in
        :meth:`paged_logits`.

        Args:
            q: ``[S, num_heads, head_dim]`` in ``spec.query``.
            k: ``[N, head_dim]`` in the key dtype, or uint8 ``[N, key_bytes_per_token]`` (the
                only form for e2m1): what :meth:`dsagen.serving.IndexerKCache.gather` returns.
            k_scale: fp32 ``[N]`` or ``[N, scales_per_token]``; None for unscaled layouts.
            weights: fp32 ``[S, num_heads]``.
            ks, ke: int32 ``[S]`` key ranges (chunked prefill: offsets into ``k``).
            clean_logits: write ``-inf`` outside ``[ks, ke)``.
        Returns:
            fp32 ``[S, N]``.
        Raises:
            RuntimeError: shapes, dtypes or devices do not match the spec.
            TypeError: ``clean_logits`` is not a bool.
        """
        return self._ops.ragged_logits(q, k, k_scale, weights, ks, ke, _bool_arg("clean_logits", clean_logits))


def _int_arg(name: str, v) -> int:
    """``v`` as a Python int where it is one (a numpy integer or a one-element integer tensor
    too); TypeError naming ``name`` for a bool (of Python, numpy or torch), a float or anything
    else (never truncated)."""
    if isinstance(v, bool) or str(getattr(v, "dtype", "")) in ("bool", "torch.bool"):
        raise TypeError(f"{name} must be an integer, got a bool {v!r}")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(v).__name__} {v!r}") from None


def _bool_arg(name: str, v) -> bool:
    """``v`` as a Python bool where it is a bool, 0 or 1 (numpy and one-element tensors too);
    TypeError naming ``name`` otherwise (a string such as ``"no"`` is not read as True, nor is a
    tensor of several elements)."""
    if isinstance(v, bool):
        return v
    item = v
    if isinstance(v, torch.Tensor) or type(v).__module__ == "numpy":
        n = v.numel() if isinstance(v, torch.Tensor) else getattr(v, "size", 1)
        if n != 1:
            raise TypeError(f"{name} must be a bool, got a {type(v).__name__} of {n} elements")
        item = v.item()
    if isinstance(item, bool) or (isinstance(item, int) and item in (0, 1)):
        return bool(item)
    raise TypeError(f"{name} must be a bool, got {type(v).__name__} {v!r}")


def _one_device(ns: str, op: str, **tensors) -> None:
    """RuntimeError, as the real op raises, where the given tensors (None skipped) are not all on
    one device: the fake (meta / torch.compile) forms of the ops check it too, so a call with
    one input on the meta device is an error rather than an unfilled result."""
    devs = {k: t.device for k, t in tensors.items() if t is not None}
    if len(set(devs.values())) > 1:
        raise RuntimeError(f"{ns}.{op}: {', '.join(devs)} must be on one device (got "
                           f"{', '.join(f'{k} on {d}' for k, d in devs.items())})")


def _register_fake(ns: str) -> None:
    @torch.library.register_fake(f"{ns}::paged_logits")
    def _fake(q, kv_cache, weights, context_lens, block_table, max_context_len, clean_logits,
              kv_scales=None, schedule=None):
        _one_device(ns, "paged_logits", q=q, kv_cache=kv_cache, weights=weights, context_lens=context_lens,
                    block_table=block_table, kv_scales=kv_scales, schedule=schedule)
        return q.new_empty((q.shape[0] * q.shape[1], max_context_len), dtype=torch.float32)

    @torch.library.register_fake(f"{ns}::store")
    def _fake_store(k, kv_cache, loc, kv_scales=None):
        _one_device(ns, "store", k=k, kv_cache=kv_cache, loc=loc, kv_scales=kv_scales)
        return None

    @torch.library.register_fake(f"{ns}::paged_logits_schedule")
    def _fake_schedule(context_lens, block_table, next_n, max_context_len):
        _one_device(ns, "paged_logits_schedule", context_lens=context_lens, block_table=block_table)
        dev = block_table.device
        rows = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 0
        return block_table.new_empty((rows, SCHEDULE_ROW), dtype=torch.int32)

    @torch.library.register_fake(f"{ns}::ragged_logits")
    def _fake_ragged(q, k, k_scale, weights, ks, ke, clean_logits):
        _one_device(ns, "ragged_logits", q=q, k=k, k_scale=k_scale, weights=weights, ks=ks, ke=ke)
        return q.new_empty((q.shape[0], k.shape[0]), dtype=torch.float32)


def load(spec: Spec | str | Path, *, with_cuda: bool | None = None,
         tuning: dict | None = None) -> Ops:
    """Build (or load from the cache) and register the ops of ``spec``.

    Args:
        spec: a :class:`Spec` or the path of a YAML spec.
        with_cuda: build the CUDA kernels; default: when a CUDA device that a spec target
            matches is present.
        tuning: kernel tuning overrides (see :func:`dsagen.codegen.default_tuning`).
    Returns:
        :class:`Ops` with ``store``, ``paged_logits``, ``paged_logits_schedule``,
        ``ragged_logits``, ``new_cache`` and ``new_scales``.
    Raises:
        dsagen.SpecError: bad spec file.  dsagen.jit.BuildError: compilation failed or the
        cache is not writable.  dsagen.jit.JitDisabledError: ``DSAGEN_DISABLE_JIT`` is set and
        the build is not cached.  dsagen.jit.CaptureError: called during CUDA-graph capture.
        ValueError: a tuning key or value that :func:`dsagen.codegen.default_tuning` does not
        allow, or (:class:`dsagen.config.ConfigError`) a malformed ``DSAGEN_*`` variable such
        as ``DSAGEN_ARCH_LIST``.  RuntimeError: ``with_cuda=True`` with no CUDA device that a target matches, or
        the spec already loaded in this process with the other ``with_cuda`` (a torch.library
        namespace is registered once).
    """
    if not isinstance(spec, Spec):
        spec = load_spec(spec)
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise jit.CaptureError(f"dsagen.load({spec.name}) called while a CUDA graph is being captured: "
                               "load (and build) every spec before capturing")
    archs = cuda_archs(spec)
    if with_cuda is None:
        with_cuda = bool(archs)
    if with_cuda and not archs:
        raise RuntimeError(f"{spec.name}: no CUDA device matching targets {list(spec.targets)}")
    ns = namespace(spec, tuning)
    with _LOCK:
        key = f"{ns}:{with_cuda}"
        if key in _LOADED:
            return _LOADED[key]
        if not with_cuda and f"{ns}:True" in _LOADED:   # the CUDA build has the CPU kernels too
            return _LOADED[f"{ns}:True"]
        for k, v in _LOADED.items():
            if k.startswith(ns + ":"):
                raise RuntimeError(f"{spec.name} is already loaded with with_cuda={v.has_cuda} in this "
                                   f"process; a torch.library namespace can be registered once")
        built = jit.build_extension(ns, render(spec, tuning), archs, with_cuda)
        if not built.loaded:   # a fresh build is loaded by torch's extension builder already
            torch.ops.load_library(str(built.library))
        _register_fake(ns)
        ops = Ops(spec, ns, built.library, with_cuda, tuning)
        _LOADED[key] = ops
        return ops
