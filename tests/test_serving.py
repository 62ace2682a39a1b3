"""Multi-layer pool (each layer reads its own keys and scales) and the deterministic top-k."""
from __future__ import annotations

import torch

from dsagen import reference as R
from dsagen.serving import IndexerKCache, topk
from dsagen.verify import random_keys, random_q


def test_three_layer_pool_each_layer_reads_its_own_scales(dsagen_spec, dsagen_ops, gen):
    spec = dsagen_spec
    ps = spec.page_size
    lens = [700, 530]                       # longer than index_topk 512
    pages = [-(-n // ps) for n in lens]
    pool = IndexerKCache(spec, num_layers=3, num_pages=sum(pages) + 2, ops=dsagen_ops)
    assert pool.nbytes == 3 * (sum(pages) + 2) * spec.page_bytes
    assert pool.bytes_per_token == spec.bytes_per_token
    perm = torch.randperm(sum(pages) + 2, generator=gen)[:sum(pages)].to(torch.int32)
    bt = torch.zeros(2, max(pages), dtype=torch.int32)
    bt[0, :pages[0]], bt[1, :pages[1]] = perm[:pages[0]], perm[pages[0]:]
    slots = torch.cat([(bt[b, :pages[b]].long()[:, None] * ps + torch.arange(ps)).reshape(-1)[:lens[b]]
                       for b in range(2)])
    keys = []
    for layer in range(3):
        # each layer's keys have a different magnitude, so their scales differ
        k = random_keys(len(slots), spec.head_dim, gen, "cpu") * (10.0 ** layer)
        pool.store(layer, k, slots)
        keys.append(k)
    q = random_q(spec, 2, spec.next_n[0], gen, "cpu")
    w = torch.randn(2 * spec.next_n[0], spec.num_heads, generator=gen)
    cl = torch.tensor(lens, dtype=torch.int32)
    outs = []
    for layer in range(3):
        alone = R.new_cache(spec, sum(pages) + 2)
        R.store(keys[layer], alone, slots, spec)
        assert torch.equal(pool.layer(layer), alone)          # the layer holds exactly its keys
        ref = R.paged_logits(q, alone, w, cl, bt, max(lens), True, spec, compute_dtype=torch.float64)
        got = pool.paged_logits(layer, q, w, cl, bt, max(lens))
        v = torch.isfinite(ref)
        assert torch.equal(torch.isneginf(got), ~v)
        err = float((got[v].double() - ref[v]).norm() / ref[v].norm())
        assert err < 1e-4, (layer, err)
        outs.append(got)
    assert not torch.equal(outs[0], outs[1])
    kq, sc = pool.gather(2, bt, torch.tensor([0, lens[0], lens[0] + lens[1]]))
    want_kq, want_sc = R.read_tokens(pool.layer(2), slots, spec)
    assert torch.equal(kq.view(torch.uint8), want_kq.view(torch.uint8))
    assert (sc is None and want_sc is None) or torch.equal(sc, want_sc)


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
