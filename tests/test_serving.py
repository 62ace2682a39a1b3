"""Multi-layer pool (each layer reads its own keys and scales) and the deterministic top-k."""
from __future__ import annotations

import pytest
import torch

from dsagen import reference as R
from dsagen.serving import IndexerKCache, topk
from dsagen.verify import REL_L2_TOL, logits_tolerance, random_keys, random_q


def test_three_layer_pool_each_layer_reads_its_own_scales(dsagen_spec, dsagen_ops, gen, device):
    spec = dsagen_spec
    ps = spec.page_size
    lens = [700, 530]                       # longer than index_topk 512
    pages = [-(-n // ps) for n in lens]
    pool = IndexerKCache(spec, num_layers=3, num_pages=sum(pages) + 2, device=device, ops=dsagen_ops)
    assert pool.pool.numel() == 3 * pool.layer_stride >= 3 * (sum(pages) + 2) * spec.page_bytes
    assert pool.layer_stride % 256 == 0 and pool.layer_stride - (sum(pages) + 2) * spec.page_bytes < 256
    assert all(pool.layer(i).data_ptr() % 16 == 0 and pool.layer(i).is_contiguous() for i in range(3))
    if spec.separate_scales:   # a second pool for the scales, one view per layer
        sbytes = (sum(pages) + 2) * spec.scale_page_bytes
        assert pool.scale_pool.numel() == 3 * pool.scale_layer_stride >= 3 * sbytes
        assert pool.scale_layer_stride % 256 == 0 and pool.scale_layer_stride - sbytes < 256
        assert pool.nbytes == 3 * (pool.layer_stride + pool.scale_layer_stride)
        assert all(pool.layer_scales(i).shape == (sum(pages) + 2, spec.scale_page_bytes)
                   and pool.layer_scales(i).data_ptr() % 16 == 0 and pool.layer_scales(i).is_contiguous()
                   for i in range(3))
    else:
        assert pool.scale_pool is None and pool.layer_scales(0) is None
        assert pool.nbytes == 3 * pool.layer_stride
    assert pool.bytes_per_token == spec.bytes_per_token
    perm = torch.randperm(sum(pages) + 2, generator=gen)[:sum(pages)].to(torch.int32)
    bt = torch.zeros(2, max(pages), dtype=torch.int32)
    bt[0, :pages[0]], bt[1, :pages[1]] = perm[:pages[0]], perm[pages[0]:]
    slots = torch.cat([(bt[b, :pages[b]].long()[:, None] * ps + torch.arange(ps)).reshape(-1)[:lens[b]]
                       for b in range(2)])
    keys = []
    for layer in range(3):
        # each layer's keys have a different magnitude, so their scales differ (fp16 keys are
        # stored unscaled: x100 overflowed its 65504 for about 1 draw in 1000, x16 needs ~1e-6 odds)
        step = 4.0 if spec.key_dtype == "fp16" else 10.0
        k = random_keys(len(slots), spec.head_dim, gen, "cpu") * step ** layer
        pool.store(layer, k.to(device), slots.to(device))
        keys.append(k)
    q = random_q(spec, 2, spec.next_n[0], gen, "cpu")
    w = torch.randn(2 * spec.next_n[0], spec.num_heads, generator=gen)
    cl = torch.tensor(lens, dtype=torch.int32)
    outs = []
    for layer in range(3):
        alone, alone_sc = R.new_cache(spec, sum(pages) + 2), R.new_scales(spec, sum(pages) + 2)
        R.store(keys[layer], alone, slots, spec, kv_scales=alone_sc)
        assert torch.equal(pool.layer(layer).cpu(), alone)    # the layer holds exactly its keys
        if alone_sc is not None:                              # and its scales
            assert torch.equal(pool.layer_scales(layer).cpu(), alone_sc)
        ref = R.paged_logits(q, alone, w, cl, bt, max(lens), True, spec, compute_dtype=torch.float64,
                             kv_scales=alone_sc)
        got = pool.paged_logits(layer, *(t.to(device) for t in (q, w, cl, bt)), max(lens)).cpu()
        v = torch.isfinite(ref)
        assert torch.equal(torch.isneginf(got), ~v)
        err = float((got[v].double() - ref[v]).norm() / ref[v].norm())
        assert err < logits_tolerance(spec, device, spec.next_n[0])[0], (layer, err)
        outs.append(got)
    assert not torch.equal(outs[0], outs[1])
    # out=: filled in place (poisoned first: every element written), and refused when misshaped
    # or of another dtype instead of broadcast or converted into
    rows = 2 * spec.next_n[0]
    args = [t.to(device) for t in (q, w, cl, bt)]
    dst = torch.full((rows, max(lens)), float("nan"), device=device)
    assert pool.paged_logits(2, *args, max(lens), out=dst) is dst
    assert torch.equal(dst.cpu(), outs[2])
    for bad in (torch.empty(2 * rows, max(lens)), torch.empty(1, max(lens)), torch.empty(rows, 1, max(lens)),
                torch.empty(rows, max(lens), dtype=torch.bfloat16), torch.empty(rows, max(lens), dtype=torch.int32)):
        with pytest.raises(RuntimeError, match="out must be fp32"):
            pool.paged_logits(2, *args, max(lens), out=bad.to(device))
    kq, sc = pool.gather(2, bt.to(device), torch.tensor([0, lens[0], lens[0] + lens[1]], device=device))
    sc2 = pool.layer_scales(2)
    want_kq, want_sc = R.read_tokens(pool.layer(2).cpu(), slots, spec, kv_scales=None if sc2 is None else sc2.cpu())
    assert torch.equal(R.decode_keys(kq.cpu(), spec), want_kq.float())
    assert (sc is None and want_sc is None) or torch.equal(sc.cpu(), want_sc)


def test_chunked_prefill_gather_then_ragged_logits(dsagen_spec, dsagen_ops, gen, repro, device):
    """Two requests gathered one after the other; this chunk's queries are request 0's last 30
    tokens and request 1's last 50 (a 140-token prefix already cached), so request 1's queries
    see keys from offset len0 on. Ragged logits of the gathered keys must equal float64 logits of
    the dequantized cached keys, and the paged op's logits of the same rows (2-D context_lens)."""
    spec, ops = dsagen_spec, dsagen_ops
    ps = spec.page_size
    lens = [90, 190]
    pages = [-(-n // ps) for n in lens]
    pool = IndexerKCache(spec, num_layers=2, num_pages=sum(pages) + 3, device=device, ops=ops)
    perm = torch.randperm(sum(pages) + 3, generator=gen)[:sum(pages)].to(torch.int32)
    bt = torch.zeros(2, max(pages), dtype=torch.int32)
    bt[0, :pages[0]], bt[1, :pages[1]] = perm[:pages[0]], perm[pages[0]:]
    slots = [(bt[b, :pages[b]].long()[:, None] * ps + torch.arange(ps)).reshape(-1)[:lens[b]] for b in range(2)]
    for layer in range(2):
        pool.store(layer, random_keys(sum(lens), spec.head_dim, gen, device), torch.cat(slots).to(device))
    k, sc = pool.gather(1, bt.to(device), torch.tensor([0, lens[0], sum(lens)], device=device))
    assert k.shape[0] == sum(lens)
    rows = [(0, lens[0] - 30 + i + 1) for i in range(30)] + \
           [(lens[0], lens[0] + 140 + i + 1) for i in range(50)]
    ks = torch.tensor([r[0] for r in rows], dtype=torch.int32)
    ke = torch.tensor([r[1] for r in rows], dtype=torch.int32)
    S = len(rows)
    q = random_q(spec, S, 1, gen, "cpu")[:, 0]
    w = torch.randn(S, spec.num_heads, generator=gen)
    out = pool.ragged_logits(*(t.to(device) for t in (q, k)), sc, *(t.to(device) for t in (w, ks, ke))).cpu()
    assert out.shape == (S, sum(lens)) and out.dtype == torch.float32
    # independent: float64 over the dequantized keys of the cached slots
    sc1 = pool.layer_scales(1)
    deq = R.dequantize(pool.layer(1).cpu(), torch.cat(slots), spec,
                       kv_scales=None if sc1 is None else sc1.cpu()).double()
    s = torch.relu(torch.einsum("shd,nd->shn", q.double(), deq))
    want = (s * w.double()[:, :, None]).sum(1)
    n = torch.arange(sum(lens))
    valid = (n[None, :] >= ks[:, None]) & (n[None, :] < ke[:, None])
    assert torch.equal(torch.isneginf(out), ~valid), repro
    err = float((out[valid].double() - want[valid]).norm() / want[valid].norm())
    assert err < 1e-4, (err, repro)
    # the paged op agrees: request b's row i with 2-D context_lens = its visible length
    for b, (lo, cnt) in enumerate(((0, 30), (30, 50))):
        cl = torch.tensor([[int(ke[lo + i] - ks[lo + i])] for i in range(cnt)], dtype=torch.int32)
        paged = pool.paged_logits(1, q[lo:lo + cnt, None].contiguous().to(device), w[lo:lo + cnt].to(device),
                                  cl.to(device), bt[b:b + 1].expand(cnt, -1).contiguous().to(device),
                                  lens[b]).cpu() if 1 in spec.next_n else None
        if paged is None:
            continue
        off = 0 if b == 0 else lens[0]
        got = out[lo:lo + cnt, off:off + lens[b]]
        v = torch.isfinite(paged)
        assert torch.equal(torch.isneginf(got), ~v), repro
        # two fp32 kernels agree to 1e-5; the fp8 tensor-core paged kernel to its own bar
        paged_tol = logits_tolerance(spec, device, 1)[0]
        tol = 1e-5 if paged_tol == REL_L2_TOL else paged_tol
        assert float((got[v].double() - paged[v].double()).norm() / paged[v].double().norm()) < tol


def test_topk_semantics(gen):
    logits = torch.randn(5, 3000, generator=gen)
    logits[1, 100:200] = 7.0                   # ties
    lengths = torch.tensor([3000, 2500, 300, 0, 1], dtype=torch.int32)
    logits[4, 0] = float("-inf")               # a row with no finite valid entry
    out = topk(logits, lengths, 512)
    assert out.dtype == torch.int32 and out.shape == (5, 512)
    want0 = torch.sort(logits[0], descending=True, stable=True).indices[:512]
    assert torch.equal(out[0].long(), want0)
    assert torch.equal(out[1, :100].long(), torch.arange(100, 200))   # ties: smaller index first
    assert (out[1] < 2500).all()
    assert (out[2, :300] >= 0).all() and (out[2, :300] < 300).all() and (out[2, 300:] == -1).all()
    assert set(out[2, :300].tolist()) == set(range(300))
    assert (out[3] == -1).all() and (out[4] == -1).all()
    for k in (1024, 2048):
        again = topk(logits, lengths, k)
        assert torch.equal(again, topk(logits, lengths, k))
        assert torch.equal(again[:, :512], out)


def test_topk_never_selects_nan_and_checks_its_arguments(gen):
    logits = torch.randn(2, 50, generator=gen)
    logits[0, 3] = float("nan")
    logits[1, :] = float("nan")
    out = topk(logits, torch.tensor([50, 50]), 8)
    assert 3 not in out[0].tolist() and (out[0] >= 0).all() and (out[1] == -1).all()
    import numpy as np
    assert torch.equal(topk(logits, torch.tensor([50, 50]), np.int64(8)), out)
    assert torch.equal(topk(logits, torch.tensor([50, 50]), torch.tensor(8)), out)
    for bad in (0, -2, 1.5, True, None, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="index_topk"):
            topk(logits, torch.tensor([50, 50]), bad)
    with pytest.raises(ValueError, match="lengths must be"):
        topk(logits, torch.tensor([[50, 50]]), 8)
    with pytest.raises(ValueError, match="logits must be"):
        topk(logits[0], torch.tensor([50]), 8)
    for bad_lengths in ([50, 50], torch.tensor([50.0, 50.0]), torch.tensor([True, True])):
        with pytest.raises(ValueError, match="lengths must be an integer"):
            topk(logits, bad_lengths, 8)
    with pytest.raises(ValueError, match="logits must be a floating-point"):
        topk(logits.long(), torch.tensor([50, 50]), 8)


def test_pool_sizes_and_layer_ids_are_checked(dsagen_spec, dsagen_ops, gen):
    """Pool sizes or a layer id that are not integers (bools, of torch too, included) are a
    TypeError naming them; sizes < 1 a ValueError, a layer out of range an IndexError (never a
    slice error); max_context_len is checked, not truncated, before ``out`` is."""
    import numpy as np
    for layers, pages, what in ((2.0, 4, "num_layers"), ("2", 4, "num_layers"), (True, 4, "num_layers"),
                                (torch.tensor(True), 4, "num_layers"), (2, 4.5, "num_pages")):
        with pytest.raises(TypeError, match=f"{what} must be an integer"):
            IndexerKCache(dsagen_spec, layers, pages, ops=dsagen_ops)
    for layers, pages in ((2, 0), (0, 4), (-1, 4)):
        with pytest.raises(ValueError, match="num_layers and num_pages must be >= 1"):
            IndexerKCache(dsagen_spec, layers, pages, ops=dsagen_ops)
    pool = IndexerKCache(dsagen_spec, np.int64(2), torch.tensor(3), ops=dsagen_ops)
    assert (pool.num_layers, pool.num_pages) == (2, 3) and type(pool.num_layers) is int
    assert tuple(pool.layer(np.int32(1)).shape) == (3, dsagen_spec.page_bytes)
    for get in (pool.layer, pool.layer_scales):
        for bad in (1.5, 1.0, True, "1", None, torch.tensor(False)):
            with pytest.raises(TypeError, match="layer must be an integer"):
                get(bad)
        for bad in (2, -1):
            with pytest.raises(IndexError, match=r"not in \[0, 2\)"):
                get(bad)
    n = dsagen_spec.next_n[0]
    q = random_q(dsagen_spec, 1, n, gen, "cpu")
    w = torch.randn(n, dsagen_spec.num_heads, generator=gen)
    cl, bt = torch.tensor([70], dtype=torch.int32), torch.tensor([[0, 1]], dtype=torch.int32)
    for bad in (70.9, None, True):
        with pytest.raises(TypeError, match="max_context_len must be an integer"):
            pool.paged_logits(0, q, w, cl, bt, bad, out=torch.empty(n, 70))


def test_pool_refuses_ops_of_another_spec(dsagen_spec, dsagen_ops):
    """``ops`` built for a spec of another layout (the same page bytes, e.g. page-tail against
    interleaved scales) would store and read the pool in one layout and gather it in another:
    a ValueError. Ops of the same layout under another name are taken."""
    from types import SimpleNamespace
    spec = dsagen_spec
    # the same kernels: another name, description, target list, an explicit default page
    # stride, fewer next_n in the pool's spec
    same = [spec.with_(name="renamed", description="same layout"), spec.with_(targets=["sm_90a"]),
            spec.with_(next_n=[spec.next_n[0]])]
    if spec.page_bytes % 16 == 0:                   # (an explicit stride is a multiple of 16)
        same.append(spec.with_(page_stride_bytes=spec.page_bytes))
    for s in same:
        assert IndexerKCache(s, 1, 2, ops=dsagen_ops).ops is dsagen_ops
    others = [spec.with_(num_heads=spec.num_heads // 2 if spec.num_heads > 8 else 16),
              spec.with_(page_stride_bytes=-(-spec.page_bytes // 16) * 16 + 16)]
    if spec.scale_placement == "page_tail" and spec.scale_dtype != "none":
        others.append(spec.with_(scale_placement="interleaved"))     # the same page bytes
    for ops in [SimpleNamespace(spec=o) for o in others] + [object()]:
        with pytest.raises(ValueError, match=f"ops: built for spec .* not for '{spec.name}'"):
            IndexerKCache(spec, 1, 2, ops=ops)
    # (and the other way round: the pool's spec differs from the ops', or asks a next_n they lack)
    with pytest.raises(ValueError, match="ops: built for spec"):
        IndexerKCache(others[0], 1, 2, ops=dsagen_ops)
    if tuple(spec.next_n) != (1, 2, 3, 4):
        with pytest.raises(ValueError, match="ops: built for spec"):
            IndexerKCache(spec.with_(next_n=[1, 2, 3, 4]), 1, 2, ops=dsagen_ops)


def test_pool_refuses_a_cuda_device_without_cuda_kernels(dsagen_spec, dsagen_ops):
    """A CUDA pool whose ops have no CUDA kernels (no target matches the device, or no device)
    is refused when made, not at every op call."""
    from dataclasses import replace
    cpu_only = replace(dsagen_ops, has_cuda=False)
    for device in ("cuda", "cuda:0", torch.device("cuda")):
        with pytest.raises(RuntimeError, match="have no CUDA kernels"):
            IndexerKCache(dsagen_spec, 1, 2, device=device, ops=cpu_only)
    assert IndexerKCache(dsagen_spec, 1, 2, device="cpu", ops=cpu_only).pool.device.type == "cpu"
    # device=None is torch's default device, as before the check
    assert IndexerKCache(dsagen_spec, 1, 2, device=None, ops=cpu_only).pool.device.type == "cpu"


def test_pool_paged_logits_out_does_not_hide_a_bad_q(dsagen_spec, dsagen_ops, gen):
    """With ``out`` given, a q of the wrong rank is reported as q (the op's error), not as a bad
    ``out``."""
    spec = dsagen_spec
    pool = IndexerKCache(spec, 1, 2, ops=dsagen_ops)
    q = random_q(spec, 1, spec.next_n[0], gen, "cpu")[:, 0]          # [B, H, D]: one rank short
    out = torch.empty(spec.next_n[0], spec.page_size)
    with pytest.raises(RuntimeError, match="q must be"):
        pool.paged_logits(0, q, torch.randn(spec.next_n[0], spec.num_heads), torch.tensor([3], dtype=torch.int32),
                          torch.zeros(1, 1, dtype=torch.int32), spec.page_size, out=out)


def test_gather_refuses_invalid_page_ids(dsagen_spec, dsagen_ops, gen):
    """A -1 (block-table padding) or out-of-range page id where a request's keys are read is a
    ValueError, not the keys of another page."""
    spec = dsagen_spec
    pool = IndexerKCache(spec, 1, 4, ops=dsagen_ops)
    ps = spec.page_size
    ok = torch.tensor([[0, 1, 2, 3]], dtype=torch.int32)
    k, _ = pool.gather(0, ok, torch.tensor([0, 2 * ps]))
    assert k.shape[0] == 2 * ps
    for bad_id in (-1, 4):
        bt = ok.clone()
        bt[0, 1] = bad_id
        with pytest.raises(ValueError, match=f"page id {bad_id}"):
            pool.gather(0, bt, torch.tensor([0, 2 * ps]))
    with pytest.raises(ValueError, match="block_table has 4 columns"):
        pool.gather(0, ok, torch.tensor([0, 4 * ps + 1]))


@pytest.mark.parametrize("cu, says", [([10, 100], "start at 0"), ([0, 100, 50], r"1 <= B\+1 <= 2"),
                                      ([], r"1 <= B\+1 <= 2"), ([[0, 5]], r"1 <= B\+1 <= 2"),
                                      ([0.0, 5.0], "integer")])
def test_gather_refuses_malformed_cu_seq_lens(dsagen_spec, dsagen_ops, cu, says):
    """cu_seq_lens that are not B+1 prefix sums from 0 are a ValueError naming them, not a torch
    error from inside the gather."""
    pool = IndexerKCache(dsagen_spec, 1, 4, ops=dsagen_ops)
    ok = torch.tensor([[0, 1, 2, 3]], dtype=torch.int32)
    with pytest.raises(ValueError, match=f"cu_seq_lens must .*{says}"):
        pool.gather(0, ok, torch.tensor(cu))
    two = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    with pytest.raises(ValueError, match="never decrease"):
        pool.gather(0, two, torch.tensor([0, 9, 5]))
    n = dsagen_spec.page_size + 1
    k, _ = pool.gather(0, two, torch.tensor([0, n, n]))      # an empty request is fine
    assert k.shape[0] == n
    # a padded max-batch table: only the first B rows are read (the -1 row never is)
    padded = torch.tensor([[0, 1], [2, 3], [-1, -1]], dtype=torch.int32)
    k3, _ = pool.gather(0, padded, torch.tensor([0, n, 2 * n]))
    k2, _ = pool.gather(0, two, torch.tensor([0, n, 2 * n]))
    assert torch.equal(k3.view(torch.uint8), k2.view(torch.uint8))
    k1, _ = pool.gather(0, padded, torch.tensor([0, n]))
    assert torch.equal(k1.view(torch.uint8), k2[:n].view(torch.uint8))
