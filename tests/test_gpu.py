"""The generated CUDA kernels, on a device that one of the spec's targets matches.

Skipped without CUDA (torch.cuda.is_available()) or when the device matches no target.
"""
from __future__ import annotations

import pytest
import torch

from dsagen import reference as R
from dsagen.verify import logits_tolerance, make_cache, random_keys, random_q, verify

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


def rel_err(x, ref) -> float:
    x, ref = x.double(), ref.double()
    den = float(torch.linalg.vector_norm(ref))
    return float(torch.linalg.vector_norm(x - ref)) / (den or 1.0)


@pytest.fixture
def any_cuda_ops(dsagen_spec, dsagen_ops):
    from dsagen.ops import cuda_archs
    if not cuda_archs(dsagen_spec):
        cap = "sm_%d%d" % torch.cuda.get_device_capability()
        pytest.skip(f"device {cap} matches none of the targets {list(dsagen_spec.targets)}")
    assert dsagen_ops.has_cuda
    return dsagen_ops


@pytest.fixture
def cuda_ops(dsagen_spec, any_cuda_ops):
    """The CUDA ops, for tests that pass no kv_scales: a ``scale.placement: separate`` spec is
    skipped (its CUDA checks: test_verify_cuda and the GPU tests of test_separate.py)."""
    if dsagen_spec.separate_scales:
        pytest.skip("scale.placement separate: this test passes no kv_scales")
    return any_cuda_ops


def _inputs(spec, lens, next_n, gen, two_d=False):
    cache, bt, _ = make_cache(spec, lens, gen, "cuda")
    B = len(lens)
    q = random_q(spec, B, next_n, gen, "cuda")
    w = torch.randn(B * next_n, spec.num_heads, generator=gen).cuda()
    if two_d:
        cl = torch.tensor([[max(1, c - d) for d in range(next_n)][::-1] for c in lens], dtype=torch.int32)
    else:
        cl = torch.tensor(lens, dtype=torch.int32)
    return q, cache, w, cl.cuda(), bt


def test_timed_fallbacks_do_not_synchronize(dsagen_spec, gen):
    """The PyTorch fallbacks that ``dsagen bench`` times after a launch-hiding GPU spin
    (``reference.store``, ``reference.fallback_paged_logits``) never synchronize the host on
    CUDA tensors: a sync would uncover their launches and inflate the quoted speed-ups."""
    spec = dsagen_spec
    cache, bt, sc = make_cache(spec, [300, 77], gen, "cuda")
    q = random_q(spec, 2, 2, gen, "cuda")
    w = torch.randn(4, spec.num_heads, generator=gen).cuda()
    cl = torch.tensor([300, 77], dtype=torch.int32).cuda()
    n = 128
    k = random_keys(n, spec.head_dim, gen, "cuda")
    loc = torch.randperm(cache.shape[0] * spec.page_size, generator=gen)[:n].cuda()
    ref_cache, ref_sc = cache.cpu(), None if sc is None else sc.cpu()       # copies, before the store
    torch.cuda.synchronize()
    mode = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        R.store(k, cache, loc, spec, kv_scales=sc)
        out = R.fallback_paged_logits(q, cache, w, cl, bt, 300, spec, kv_scales=sc)
    finally:
        torch.cuda.set_sync_debug_mode(mode)
    # the same bytes as the CPU store, and the fallback's logits as the float64 reference's
    R.store(k.cpu(), ref_cache, loc.cpu(), spec, kv_scales=ref_sc)
    assert torch.equal(cache.cpu(), ref_cache) and (sc is None or torch.equal(sc.cpu(), ref_sc))
    ref = R.paged_logits(q.cpu(), ref_cache, w.cpu(), cl.cpu(), bt.cpu(), 300, True, spec,
                         compute_dtype=torch.float64, kv_scales=ref_sc)
    assert torch.equal(torch.isneginf(out.cpu()), torch.isneginf(ref))
    v = torch.isfinite(ref)
    assert bool(v.any()) and rel_err(out.cpu()[v], ref[v]) < 2e-2      # keys rounded to bf16 on the way
    # the e2m1 decode (computed, not looked up) is exact on the device too
    codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(R._e2m1_values(codes.cuda()).cpu(), R._e2m1_values(codes))


def test_verify_cuda(dsagen_spec, any_cuda_ops, seed, repro):
    """The verification sweep on CUDA passes; where the TMA kernel's L2 evict-first hint covers
    only calls with small logits (tuning ``kv_evict_first`` a fraction of the L2), the sweep also
    ran the instantiation without it (the large calls' kernel) at every next_n."""
    from dsagen.codegen import _kv_evict_first, effective_tuning, ws_stages
    spec, ops = dsagen_spec, any_cuda_ops
    rep = verify(spec, ops, "cuda", seed=seed, quick=False, reruns=3)
    assert rep.passed, f"{repro}\n{rep.table()}"
    unhinted = [r for r in rep.rows if r.shape.endswith("no L2 hint")]
    expected = (torch.cuda.get_device_capability()[0] == 9
                and _kv_evict_first(effective_tuning(spec, ops.tuning)) > 0)
    for next_n in spec.next_n:
        has = [r for r in unhinted if f"next_n={next_n} " in r.shape]
        assert bool(has) == (expected and ws_stages(spec, next_n, ops.tuning) > 0), (next_n, rep.table())


def _store_slots(spec, n, slots, gen):
    """``n`` distinct slots of a pool of about ``2n`` tokens: random, or whole pages in a random
    order (the last one partly), as a prefill writes them. Returns (num_pages, loc)."""
    num_pages = 2 * n // spec.page_size + 2
    if slots == "random":
        return num_pages, torch.randperm(num_pages * spec.page_size, generator=gen)[:n]
    pages = torch.randperm(num_pages, generator=gen)[:(n + spec.page_size - 1) // spec.page_size]
    return num_pages, (pages[:, None] * spec.page_size + torch.arange(spec.page_size)).flatten()[:n]


def _store_both(spec, ops, n, slots, gen, repro, k_dtype=torch.bfloat16):
    """Store the same random keys (``k_dtype``) into the same poisoned (random-byte) cache on the
    CPU and on CUDA; every byte must agree (the CPU store follows the reference's quantization)."""
    num_pages, loc = _store_slots(spec, n, slots, gen)
    cache = torch.randint(0, 256, (num_pages, spec.page_bytes), generator=gen, dtype=torch.uint8)
    k = random_keys(n, spec.head_dim, gen, "cpu", dtype=k_dtype)
    on_cpu = cache.clone()
    ops.store(k, on_cpu, loc)
    on_gpu = cache.cuda()
    ops.store(k.cuda(), on_gpu, loc.cuda())
    torch.cuda.synchronize()
    got = on_gpu.cpu()
    assert torch.equal(got, on_cpu), f"n={n} {slots}: {int((got != on_cpu).sum())} bytes differ {repro}"


@pytest.mark.parametrize("k_dtype", [torch.bfloat16, torch.float32, torch.float16], ids=str)
def test_cuda_store_equals_cpu_store(dsagen_spec, cuda_ops, gen, repro, k_dtype):
    _store_both(dsagen_spec, cuda_ops, 5000, "random", gen, repro, k_dtype)


@pytest.mark.parametrize("slots", ["random", "pages"])
def test_cuda_store_large_call_equals_cpu_store(dsagen_spec, cuda_ops, gen, repro, slots):
    """A prefill-sized call (100000 tokens): more than one grid step of the store kernel."""
    _store_both(dsagen_spec, cuda_ops, 100_000, slots, gen, repro)


def test_store_prefetch_tuning_equals_cpu_store(shipped, gen, repro):
    """The ``store_prefetch`` tuning (off by default) only moves the scale sectors into the L2
    earlier: fp8_e4m3_page64 built with it (bound 0, so every call prefetches) stores the same
    bytes as the CPU store, for a decode-sized and a prefill-sized call, at both slot patterns."""
    import dsagen
    from dsagen.ops import cuda_archs
    spec = shipped["fp8_e4m3_page64"]
    if not cuda_archs(spec):
        pytest.skip("the device matches none of the spec's targets")
    ops = dsagen.load(spec, tuning={"store_prefetch": True, "store_prefetch_min_n": 0}, with_cuda=True)
    assert ops.has_cuda
    for n in (100, 100_000):
        for slots in ("random", "pages"):
            _store_both(spec, ops, n, slots, gen, repro)


# the portable path (what sm_100a and every device but sm_90 run), forced on an sm_90 device by
# ``kernel`` "simt": its tensor-core kernel ``paged_logits_mma`` (tuning ``portable`` "mma", the
# default) in its e4m3 m16n8k32 form (``mma_widen`` false), in its default ``mma_widen`` form
# (e4m3 keys and q widened to f16 once, f16 MMAs), that form with its keys loaded a warp step
# ahead (``mma_prefetch``, off by default) and the CUDA-core kernel (``portable`` "simt", also
# the mma kernel's fallback)
PORTABLE_TUNINGS = {"mma": {"kernel": "simt", "portable": "mma", "mma_widen": False},
                    "mma_widen": {"kernel": "simt", "portable": "mma", "mma_widen": True},
                    "mma_prefetch": {"kernel": "simt", "portable": "mma", "mma_widen": True,
                                     "mma_prefetch": True},
                    "simt": {"kernel": "simt", "portable": "simt"}}


@pytest.mark.parametrize("portable", ["mma", "mma_widen", "mma_prefetch", "simt"])
def test_portable_kernels_verify(dsagen_spec, seed, repro, portable):
    """The portable path's kernels pass the CUDA verification sweep (fresh random inputs,
    NaN-poisoned outputs, float64 reference; the full sweep for ``paged_logits_mma``, the quick
    one for the slow CUDA-core kernel) on every layout they apply to, and every paged-logits call
    of the sweep ran the kernel named (the launch's choice, as
    :func:`dsagen.codegen.paged_logits_kernel` reports it)."""
    from dsagen.codegen import mma_applies
    if portable != "simt" and not mma_applies(dsagen_spec):
        pytest.skip("paged_logits_mma does not apply to this layout (block scales or e2m1 keys)")
    _check_portable_verifies(dsagen_spec, portable, seed, repro)


def _check_portable_verifies(spec, portable: str, seed: int, repro: str) -> None:
    """Skips where ``portable`` (a PORTABLE_TUNINGS key) changes nothing or no target matches;
    else asserts that the launch picks the kernel named at every next_n, in the form named, and
    that its CUDA verification sweep passes (3 bit-identical reruns)."""
    import dsagen
    from dsagen.codegen import mma_prefetches, mma_widens, paged_logits_kernel
    from dsagen.ops import cuda_archs
    tuning = PORTABLE_TUNINGS[portable]
    if portable in ("mma_widen", "mma_prefetch") and spec.key_dtype != "e4m3":
        pytest.skip(f"{portable} changes e4m3 keys only")
    if not cuda_archs(spec):
        pytest.skip("the device matches none of the spec's targets")
    props = torch.cuda.get_device_properties(0)
    for nn in spec.next_n:
        assert paged_logits_kernel(spec, nn, 64, 4096, props.multi_processor_count, props.major,
                                   tuning) == portable.split("_")[0], nn
    if portable != "simt":   # the mma kernel's form named is the one rendered
        assert mma_widens(spec, tuning) == (portable != "mma")
        assert mma_prefetches(spec, tuning) == (portable == "mma_prefetch")
    ops = dsagen.load(spec, tuning=tuning, with_cuda=True)
    assert ops.has_cuda
    rep = verify(spec, ops, "cuda", seed=seed, quick=portable == "simt", reruns=3)
    assert rep.passed, f"{repro}\n{rep.table()}"


# shapes of the portable mma kernel that no shipped spec or variant has: 128 heads (shipped
# specs have 64, the variants 8-64) at head_dim 64, 128 and 256 (next_n up to 4), one scale per
# token (the scaled head_dim 256 variants have two, which takes the CUDA-core kernel)
MMA_128_HEADS = [("fp8_e4m3_page64", 128, [1, 2, 4]), ("fp8_e4m3_page64", 64, [1, 2, 4]),
                 ("fp8_e4m3_page64", 256, [1, 2]), ("bf16_page64", 128, [1, 2]),
                 ("bf16_page64", 256, [1, 2])]


@pytest.mark.parametrize("portable", ["mma", "mma_widen"])
@pytest.mark.parametrize("base,head_dim,next_n", MMA_128_HEADS,
                         ids=[f"{b}-d{d}" for b, d, _ in MMA_128_HEADS])
def test_portable_mma_128_heads(shipped, base, head_dim, next_n, portable, seed, repro):
    """``paged_logits_mma`` with 128 heads: the launch picks it at every next_n, and its full
    CUDA verification sweep passes (fresh random inputs, NaN-poisoned outputs, float64
    reference, 3 bit-identical reruns), in the form named."""
    from dsagen.spec import Spec
    d = shipped[base].to_dict()
    d.pop("page_stride_bytes", None)
    d.update(name=f"{base}_d{head_dim}_h128", head_dim=head_dim,
             logits={"num_heads": 128, "next_n": next_n})
    d["scale"]["block"] = head_dim
    _check_portable_verifies(Spec.from_dict(d, source=f"<{d['name']}>"), portable, seed, repro)


@pytest.mark.parametrize("two_d", [False, True], ids=["ctx1d", "ctx2d"])
def test_bitwise_identical_reruns_and_close_to_cpu(dsagen_spec, cuda_ops, gen, repro, two_d):
    spec = dsagen_spec
    lens = [1, 63, 65, 4097, 9000] + torch.randint(1, 6000, (27,), generator=gen).tolist()
    for next_n in spec.next_n:
        q, cache, w, cl, bt = _inputs(spec, lens, next_n, gen, two_d)
        max_len = max(lens)
        first = cuda_ops.paged_logits(q, cache, w, cl, bt, max_len)
        torch.cuda.synchronize()
        for i in range(20):
            again = cuda_ops.paged_logits(q, cache, w, cl, bt, max_len)
            assert torch.equal(again, first), f"rerun {i} differs (next_n={next_n}) {repro}"
        cpu = cuda_ops.paged_logits(q.cpu(), cache.cpu(), w.cpu(), cl.cpu(), bt.cpu(), max_len)
        first = first.cpu()
        assert torch.equal(torch.isneginf(first), torch.isneginf(cpu)), repro
        v = torch.isfinite(cpu)
        # fp8 tensor cores are not fp32-exact (DeepGEMM itself measured 1.3e-4): the bar is
        # the verification's for this kernel (dsagen.verify.logits_tolerance)
        assert rel_err(first[v], cpu[v]) < logits_tolerance(spec, "cuda", next_n)[0], repro


def test_small_work_and_main_kernels(dsagen_spec, cuda_ops, gen, repro):
    """Where tuning `small` gives a small-work kernel, the same inputs run on it (max_context_len =
    the longest length) and on the main kernel (max_context_len past its bound): both within the
    verification bar of the CPU backend, -inf past each length, every column written."""
    from dsagen.codegen import small_work_max_len
    from dsagen.verify import _poisoned_alloc
    spec = dsagen_spec
    lens = [1, 63, 65, 4097, 9000] + torch.randint(1, 6000, (27,), generator=gen).tolist()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bound = small_work_max_len(spec, spec.next_n[0], len(lens), sms, cuda_ops.tuning)
    if bound is None:
        pytest.skip("no small-work kernel for this spec")
    assert bound >= max(lens)
    big = bound + 1
    for next_n in spec.next_n:
        # the block table covers max_context_len columns (request 0's pages), as DeepGEMM's contract
        q, cache, w, _, bt = _inputs(spec, [big] + lens[1:], next_n, gen)
        cl = torch.tensor(lens, dtype=torch.int32).cuda()
        cpu = cuda_ops.paged_logits(q.cpu(), cache.cpu(), w.cpu(), cl.cpu(), bt.cpu(), max(lens))
        for max_len in (max(lens), big):
            _poisoned_alloc((len(lens) * next_n, max_len), "cuda")   # NaN where the op reuses it
            out = cuda_ops.paged_logits(q, cache, w, cl, bt, max_len).cpu()
            assert out.shape == (len(lens) * next_n, max_len), repro
            assert not torch.isnan(out).any(), repro
            assert torch.isneginf(out[:, max(lens):]).all(), repro
            got = out[:, :max(lens)]
            assert torch.equal(torch.isneginf(got), torch.isneginf(cpu)), (max_len, repro)
            v = torch.isfinite(cpu)
            assert rel_err(got[v], cpu[v]) < logits_tolerance(spec, "cuda", next_n)[0], (max_len, repro)


def test_many_short_requests(dsagen_spec, cuda_ops, gen, repro):
    """2400 requests of 1..64 tokens (one tile each) then 800 of 1..300: every CTA of the
    persistent grid walks several requests, so the kernels' q buffers are refilled while
    earlier requests' tiles are in flight (the FP4 kernel's one or two q slots among them).
    Within the verification bar, every element written, bitwise over reruns."""
    from dsagen.verify import check_logits
    for next_n in dsagen_spec.next_n:
        for lens in (torch.randint(1, 65, (2400,), generator=gen).tolist(),
                     torch.randint(1, 301, (800,), generator=gen).tolist()):
            row = check_logits(cuda_ops, dsagen_spec, lens, next_n, gen, "cuda", reruns=3)
            assert row.passed and row.deterministic, (next_n, len(lens), row.note, repro)


def test_one_column_block_table_of_any_stride_on_cuda(dsagen_spec, cuda_ops, gen, repro):
    """A ``[B, 1]`` block table with column stride B (``pages[None].T``, which torch calls
    contiguous) gives the same bits as a plain one, with the kernel's own schedule and with a
    precomputed one (the kernels index rows by ``stride(0)``): 3 requests (against the
    reference too) and 6000 (past the small-work kernel's bound on sm_90, so both kernels)."""
    from dsagen.codegen import paged_logits_kernel
    spec = dsagen_spec
    props = torch.cuda.get_device_properties(0)
    ran = set()
    for lens in ([spec.page_size, 5, 17], torch.randint(1, spec.page_size + 1, (6000,), generator=gen).tolist()):
        B = len(lens)
        cache, bt, _ = make_cache(spec, lens, gen, "cuda")
        plain = bt[:, :1].contiguous()
        odd = plain[:, 0].clone()[None].T
        assert odd.stride() == (1, B)
        cl = torch.tensor(lens, dtype=torch.int32, device="cuda")
        for n in spec.next_n:
            ran.add(paged_logits_kernel(spec, n, B, spec.page_size, props.multi_processor_count, props.major,
                                        cuda_ops.tuning))
            q = random_q(spec, B, n, gen, "cuda")
            w = torch.randn(B * n, spec.num_heads, generator=gen).cuda()
            want = cuda_ops.paged_logits(q, cache, w, cl, plain, spec.page_size)
            sched = cuda_ops.paged_logits_schedule(cl, odd, n, spec.page_size)
            for got in (cuda_ops.paged_logits(q, cache, w, cl, odd, spec.page_size),
                        cuda_ops.paged_logits(q, cache, w, cl, odd, spec.page_size, schedule=sched)):
                assert torch.equal(got, want), (B, n, repro)
            ref = R.paged_logits(q[:3].cpu(), cache.cpu(), w[:3 * n].cpu(), cl[:3].cpu(), plain[:3].cpu(),
                                 spec.page_size, True, spec, compute_dtype=torch.float64)
            v = torch.isfinite(ref)
            assert torch.equal(torch.isneginf(want[:3 * n].cpu()), ~v) and int(v.sum()) > 0
            assert rel_err(want[:3 * n].cpu()[v], ref[v]) < logits_tolerance(spec, "cuda", n, cuda_ops.tuning)[0], \
                (B, n, repro)
    if "ws (small)" in ran:
        assert "ws" in ran, ran


def test_precomputed_schedule_gives_the_same_bits(dsagen_spec, cuda_ops, gen, repro):
    """paged_logits from a paged_logits_schedule equals, bitwise, the call that computes its
    own schedule: on the small-work and the main kernel, one and two schedule passes (B=600),
    2-D context_lens. The TMA kernel does use it (a schedule whose block-table windows are
    changed gives other logits). A schedule made for another max_context_len (whose clamped
    lengths differ), next_n or batch, or zeros, is ignored (still the same bits). A stale one,
    made for longer lengths with the same batch and max_context_len, is used: wrong logits, but
    the call completes (producers and math warpgroups follow the same row)."""
    from dsagen.codegen import paged_logits_kernel
    from dsagen.ops import SCHEDULE_ROW
    from dsagen.verify import _poisoned_alloc
    spec, ops = dsagen_spec, cuda_ops
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    cases = [([1, 63, 65, 4097, 9000] + torch.randint(1, 6000, (27,), generator=gen).tolist(), False, None),
             ([1, 63, 65, 4097, 9000] + torch.randint(1, 6000, (27,), generator=gen).tolist(), False, 70000),
             (torch.randint(0, 300, (600,), generator=gen).tolist(), False, None),
             (torch.randint(0, 300, (600,), generator=gen).tolist(), False, 70000),
             (torch.randint(1, 3000, (40,), generator=gen).tolist(), True, None),
             (torch.randint(1, 3000, (40,), generator=gen).tolist(), True, 70000),
             ([8192] * 32, False, None)]
    kernels = set()
    for next_n in spec.next_n:
        for lens, two_d, max_len in cases:
            max_len = max_len or max(lens)
            q, cache, w, cl, bt = _inputs(spec, [max(max_len, lens[0])] + lens[1:], next_n, gen, two_d)
            if not two_d:
                cl = torch.tensor(lens, dtype=torch.int32, device="cuda")
            kernel = paged_logits_kernel(spec, next_n, len(lens), max_len, sms, props.major, ops.tuning)
            kernels.add(kernel)
            want = ops.paged_logits(q, cache, w, cl, bt, max_len)
            sched = ops.paged_logits_schedule(cl, bt, next_n, max_len)
            assert sched.dtype == torch.int32 and tuple(sched.shape) == (sms, SCHEDULE_ROW), repro
            # rows of a TMA-kernel schedule carry a tag (column 5); the other kernels get zeros
            assert bool((sched[:, 5] != 0).all()) == kernel.startswith("ws"), (kernel, repro)
            _poisoned_alloc(tuple(want.shape), "cuda")
            got = ops.paged_logits(q, cache, w, cl, bt, max_len, schedule=sched)
            assert torch.equal(got, want), (next_n, len(lens), two_d, max_len, kernel, repro)
            if kernel.startswith("ws"):
                # the kernel reads the row: other pages in the windows give other logits
                moved = sched.clone()
                moved[:, 8:] = (moved[:, 8:] + 1) % cache.shape[0]
                _poisoned_alloc(tuple(want.shape), "cuda")
                assert not torch.equal(ops.paged_logits(q, cache, w, cl, bt, max_len, schedule=moved),
                                       want), (kernel, repro)
                # stale (longer lengths, same batch and max_context_len): the call completes
                longer = torch.full_like(cl, max_len)
                _poisoned_alloc(tuple(want.shape), "cuda")
                stale = ops.paged_logits(q, cache, w, cl, bt, max_len,
                                         schedule=ops.paged_logits_schedule(longer, bt, next_n, max_len))
                torch.cuda.synchronize()
                assert stale.shape == want.shape, repro
            # a max_context_len that clamps the lengths: another schedule, which must be ignored
            others = [torch.zeros_like(sched), ops.paged_logits_schedule(cl, bt, next_n, max(1, max_len // 2))]
            if len(spec.next_n) > 1 and not two_d:
                other_n = [m for m in spec.next_n if m != next_n][0]
                others.append(ops.paged_logits_schedule(cl, bt, other_n, max_len))
            if len(lens) > 1:
                others.append(ops.paged_logits_schedule(cl[:-1], bt[:-1], next_n, max_len))
            for other in others:
                _poisoned_alloc(tuple(want.shape), "cuda")
                assert torch.equal(ops.paged_logits(q, cache, w, cl, bt, max_len, schedule=other), want), repro
    # where the spec has the TMA kernels, both ran (the schedule path was exercised)
    from dsagen.codegen import small_work_max_len, ws_stages
    if props.major == 9 and ws_stages(spec, spec.next_n[0], ops.tuning) > 0:
        assert "ws" in kernels, kernels
        if small_work_max_len(spec, spec.next_n[0], 32, sms, ops.tuning) is not None:
            assert "ws (small)" in kernels, kernels


def test_store_is_deterministic(dsagen_spec, cuda_ops, gen):
    spec = dsagen_spec
    n = 4096
    cache = torch.randint(0, 256, (n // spec.page_size + 1, spec.page_bytes), generator=gen,
                          dtype=torch.uint8).cuda()
    loc = torch.randperm(n, generator=gen).cuda()
    k = random_keys(n, spec.head_dim, gen, "cuda")
    first = cache.clone()
    cuda_ops.store(k, first, loc)
    for _ in range(20):
        again = cache.clone()
        cuda_ops.store(k, again, loc)
        assert torch.equal(again, first)


def test_cuda_graph_capture(dsagen_spec, cuda_ops, gen, repro):
    """The ops launch on torch's current stream with no host sync, so they can be captured."""
    spec, ops = dsagen_spec, cuda_ops
    next_n = spec.next_n[-1]
    lens = [700, 65, 1]
    q, cache, w, cl, bt = _inputs(spec, lens, next_n, gen)
    k = random_keys(50, spec.head_dim, gen, "cuda")
    loc = torch.randperm(cache.shape[0] * spec.page_size, generator=gen)[:50].cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):          # warm up outside the capture
        ops.paged_logits(q, cache, w, cl, bt, 700)
        ops.store(k, cache.clone(), loc)
    torch.cuda.current_stream().wait_stream(side)
    target = cache.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ops.paged_logits(q, cache, w, cl, bt, 700)
        ops.store(k, target, loc)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ops.paged_logits(q, cache, w, cl, bt, 700)), repro
    eager = cache.clone()
    ops.store(k, eager, loc)
    assert torch.equal(target, eager), repro
    # replay with new values in the captured input buffers
    q.copy_(random_q(spec, len(lens), next_n, gen, "cuda"))
    w.copy_(torch.randn(w.shape, generator=gen))
    g.replay()
    torch.cuda.synchronize()
    ref = R.paged_logits(q, cache, w, cl, bt, 700, True, spec, compute_dtype=torch.float64)
    v = torch.isfinite(ref)
    assert torch.equal(torch.isneginf(out), ~v)
    # the verification's bar for this kernel (fp8 tensor cores: dsagen.verify.logits_tolerance)
    assert rel_err(out[v], ref[v]) < logits_tolerance(spec, "cuda", next_n, ops.tuning)[0], repro


@pytest.mark.parametrize("with_schedule", [False, True], ids=["own_schedule", "precomputed_schedule"])
def test_decode_step_graph_replayed_with_other_context_lengths(dsagen_spec, cuda_ops, gen, repro, with_schedule):
    """store + paged_logits + top-k captured once in a CUDA graph, replayed after the captured
    context_lens / keys / queries buffers were refilled: each replay equals the eager step
    (which computes its own schedule; with_schedule: the graph also holds paged_logits_schedule
    and paged_logits starts from it)."""
    from dsagen.serving import topk
    spec, ops = dsagen_spec, cuda_ops
    n = spec.next_n[0]
    max_len = 1500
    q, cache, w, cl, bt = _inputs(spec, [max_len, 700, 3], n, gen)
    k = random_keys(3, spec.head_dim, gen, "cuda")
    loc = torch.zeros(3, dtype=torch.int64, device="cuda")
    lens_rows = torch.zeros(3 * n, dtype=torch.int32, device="cuda")

    def step(c, sched=False):
        ops.store(k, c, loc)
        s = ops.paged_logits_schedule(cl, bt, n, max_len) if sched else None
        logits = ops.paged_logits(q, c, w, cl, bt, max_len, schedule=s)
        return logits, topk(logits, lens_rows, 512)

    def refill(lens):
        cl.copy_(torch.tensor(lens, dtype=torch.int32))
        lens_rows.copy_(cl.repeat_interleave(n))
        q.copy_(random_q(spec, 3, n, gen, "cuda"))
        w.copy_(torch.randn(w.shape, generator=gen))
        k.copy_(random_keys(3, spec.head_dim, gen, "cuda"))
        # the new token of each request goes to its last position
        loc.copy_(torch.tensor([int(bt[b, (c - 1) // spec.page_size]) * spec.page_size + (c - 1) % spec.page_size
                                for b, c in enumerate(lens)]))

    refill([1200, 600, 2])
    graph_cache = cache.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(cache.clone(), with_schedule)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out_logits, out_idx = step(graph_cache, with_schedule)
    for lens in ([1200, 600, 2], [1500, 64, 1], [65, 1400, 3]):
        refill(lens)
        eager_cache = graph_cache.clone()
        g.replay()
        want_logits, want_idx = step(eager_cache)
        torch.cuda.synchronize()
        assert torch.equal(graph_cache, eager_cache), (lens, repro)
        assert torch.equal(out_logits, want_logits), (lens, repro)
        assert torch.equal(out_idx, want_idx), (lens, repro)


def test_opcheck_and_compile_on_cuda(dsagen_spec, cuda_ops, gen):
    from dsagen.verify import ragged_inputs
    spec, ops = dsagen_spec, cuda_ops
    ns = getattr(torch.ops, ops.namespace)
    n = spec.next_n[0]
    q, cache, w, cl, bt = _inputs(spec, [300, 5], n, gen)
    k = random_keys(3, spec.head_dim, gen, "cuda")
    loc = torch.tensor([0, 5, 9], device="cuda")
    utils = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    torch.library.opcheck(ns.store.default, (k, cache.clone(), loc), test_utils=utils)
    torch.library.opcheck(ns.paged_logits.default, (q, cache, w, cl, bt, 300, True), test_utils=utils)
    torch.library.opcheck(ns.paged_logits_schedule.default, (cl, bt, n, 300), test_utils=utils)
    sched = ops.paged_logits_schedule(cl, bt, n, 300)
    torch.library.opcheck(ns.paged_logits.default, (q, cache, w, cl, bt, 300, True, None, sched),
                          test_utils=utils)
    rq, rk, rsc, rw = ragged_inputs(spec, 4, 50, gen, "cuda")
    ks = torch.tensor([0, 3, 9, 49], dtype=torch.int32, device="cuda")
    ke = torch.tensor([50, 3, 20, 50], dtype=torch.int32, device="cuda")
    torch.library.opcheck(ns.ragged_logits.default, (rq, rk, rsc, rw, ks, ke, True), test_utils=utils)
    f = torch.compile(lambda *a: ops.paged_logits(*a), fullgraph=True)
    assert torch.equal(f(q, cache, w, cl, bt, 300), ops.paged_logits(q, cache, w, cl, bt, 300))
    fs = torch.compile(lambda q, c, w, cl, bt: ops.paged_logits(
        q, c, w, cl, bt, 300, schedule=ops.paged_logits_schedule(cl, bt, n, 300)), fullgraph=True)
    assert torch.equal(fs(q, cache, w, cl, bt), ops.paged_logits(q, cache, w, cl, bt, 300))
