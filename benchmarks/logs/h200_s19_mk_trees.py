# Nineteenth session (development record, not part of the package): builds the template trees that
# benchmarks/tree_ab.py timed in calls 2-4 from a checkout of 8248273's templates in ab_head/
# (`git archive 8248273 templates | tar -x -C ab_head`): ab_desc (the keys' descriptor moved by the
# stage offset), ab_ring (that plus the two-counter stage ring), ab_uni (the lane-0 broadcasts
# alone), ab_desc_uni (call 4's "this"); the last block writes the committed template (e81e378:
# all three). Call 4's ab_all had, besides all three, call 1's keys_first refactor of the producer
# (load_q lambda, off): its SCHED=true kernels have the same SASS as e81e378's.
import shutil, os, sys
root='/work/main'
base=open(f'{root}/ab_head/templates/paged_logits.cu.jinja').read()
def rep(s,old,new):
    assert s.count(old)==1,(old[:80],s.count(old))
    return s.replace(old,new)
def uni(s):
    s=rep(s,'    const int w = warp / 4 - 1, wlane = tid & 127;','    const int w = __shfl_sync(0xffffffffu, warp / 4 - 1, 0), wlane = tid & 127;')
    s=rep(s,'      const int tile_end = min(u_end * kMathWGs, (len + kTile - 1) / kTile);','      const int tile_end = __shfl_sync(0xffffffffu, min(u_end * kMathWGs, (len + kTile - 1) / kTile), 0);')
    s=rep(s,'      for (int tile = u * kMathWGs + w; tile < tile_end; tile += kMathWGs) {','      for (int tile = __shfl_sync(0xffffffffu, u * kMathWGs + w, 0); tile < tile_end; tile += kMathWGs) {')
    return s
def desc(s):
    s=rep(s,'''__device__ __forceinline__ uint64_t gmma_desc_add(uint64_t desc, uint32_t bytes) {
  return (desc & 0xffffffff00000000ull) | uint32_t(uint32_t(desc) + (bytes >> 4));
}
''','''__device__ __forceinline__ uint64_t gmma_desc_add(uint64_t desc, uint32_t bytes) {
  return (desc & 0xffffffff00000000ull) | uint32_t(uint32_t(desc) + (bytes >> 4));
}
struct SmemDesc {
  uint64_t d;
};
__device__ __forceinline__ uint64_t gmma_desc(SmemDesc x) { return x.d; }
''')
    s=rep(s,'''template <int ROWS, int BUFS>
__device__ __forceinline__ void mma_rows(uint32_t a_base,''','''template <int ROWS, int BUFS, typename A>
__device__ __forceinline__ void mma_rows(A a_base,''')
    s=rep(s,'''template <int G, int R, typename Epi>
__device__ __forceinline__ void mma_chains(uint32_t a_base,''','''template <int G, int R, typename A, typename Epi>
__device__ __forceinline__ void mma_chains(A a_base,''')
    s=rep(s,'''template <int NEXT_N, bool FUSE = false, int S = 8, typename Release>
__device__ __forceinline__ void tile_logits(uint32_t a_base,''','''template <int NEXT_N, bool FUSE = false, int S = 8, typename A, typename Release>
__device__ __forceinline__ void tile_logits(A a_base,''')
    s=rep(s,'''template <int N>
__device__ __forceinline__ void tile_mma_issue(uint32_t a_base,''','''template <int N, typename A>
__device__ __forceinline__ void tile_mma_issue(A a_base,''')
    s=rep(s,'tile_logits<NEXT_N, kFuse<NEXT_N>, kWRegsFor<NEXT_N> ? 2 : 8>(sk_w + stage * kTileBytes,','tile_logits<NEXT_N, kFuse<NEXT_N>, kWRegsFor<NEXT_N> ? 2 : 8>(SmemDesc{gmma_desc_add(desc_sk, stage * kTileBytes)},')
    s=rep(s,'tile_mma_issue<N>(sk_w + st[x] * kTileBytes, q_addr, acc[x]);','tile_mma_issue<N>(SmemDesc{gmma_desc_add(desc_sk, st[x] * kTileBytes)}, q_addr, acc[x]);')
    s=rep(s,'''    const uint32_t empty_w = opaque(smem_u32(empty + w * STAGES));
''','''    const uint32_t empty_w = opaque(smem_u32(empty + w * STAGES));
    const uint64_t desc_sk = gmma_desc(sk_w);
''')
    return s
def ring(s):
    s=rep(s,'''  return stage;
}

// kv_map: the key bytes''','''  return stage;
}
struct StageRing {
  uint32_t stage, parity;
  __device__ __forceinline__ static StageRing at(uint32_t count, int stages) { return {count % stages, (count / stages) & 1}; }
};
template <int STAGES, int H>
__device__ __forceinline__ uint32_t wait_tile(uint32_t full_w, uint32_t skey, StageRing& ring, float (&sc)[H]) {
  const uint32_t stage = ring.stage;
  mbar_wait(full_w + stage * 8, ring.parity);
#pragma unroll
  for (int k = 0; k < H; ++k) {
    sc[k] = 1.f;
    if (kQuantized)
      asm volatile("ld.shared.f32 %0, [%1];\\n" : "=f"(sc[k]) : "r"(skey + stage * kTile * 4 + 32 * k) : "memory");
  }
  if (++ring.stage == STAGES) {
    ring.stage = 0;
    ring.parity ^= 1;
  }
  return stage;
}

// kv_map: the key bytes''')
    s=rep(s,'''{% macro tile_body(q_addr, w_src) %}
        float sc[LaneSums<NEXT_N>::kHeld];
        const uint32_t stage = wait_tile<STAGES>(full_w, skey, count, sc);''','''{% macro tile_body(q_addr, w_src, at="count") %}
        float sc[LaneSums<NEXT_N>::kHeld];
        const uint32_t stage = wait_tile<STAGES>(full_w, skey, {{ at }}, sc);''')
    import re
    m=re.search(r'      for \(int tile = (.*?); tile < tile_end; tile \+= kMathWGs\) \{\n\{\{ tile_body\("q_addr", "w_src"\)\}\}\n      \}',s)
    assert m
    s=s[:m.start()]+'      StageRing ring = StageRing::at(count, STAGES);\n'+f'      for (int tile = {m.group(1)}; tile < tile_end; tile += kMathWGs) {{\n{{{{ tile_body("q_addr", "w_src", "ring")}}}}\n      }}'+s[m.end():]
    return s
for name,fs in (('ab_desc',[desc]),('ab_ring',[desc,ring]),('ab_uni',[uni])):
    s=base
    for f in fs: s=f(s)
    d=f'{root}/{name}/templates'
    shutil.rmtree(f'{root}/{name}',ignore_errors=True)
    shutil.copytree(f'{root}/ab_head/templates',d)
    open(f'{d}/paged_logits.cu.jinja','w').write(s)
    print(name,'ok')
for name,fs in (('ab_desc_uni',[desc,uni]),):
    s=base
    for f in fs: s=f(s)
    d=f'{root}/{name}/templates'
    shutil.rmtree(f'{root}/{name}',ignore_errors=True)
    shutil.copytree(f'{root}/ab_head/templates',d)
    open(f'{d}/paged_logits.cu.jinja','w').write(s)
    print(name,'ok')
s=base
for f in (desc,uni,ring): s=f(s)
def rep2(old,new):
    global s
    assert s.count(old)==1,old
    s=s.replace(old,new)
rep2('''struct SmemDesc {
  uint64_t d;
};''','''// An operand given by its WGMMA descriptor (built once before a tile loop, then moved on with
// gmma_desc_add) where the WGMMA helpers below take a shared-memory address: the loop then
// adds the stage offset to the descriptor instead of rebuilding it from the address.
struct SmemDesc {
  uint64_t d;
};''')
rep2('''    const uint64_t desc_sk = gmma_desc(sk_w);
''','''    const uint64_t desc_sk = gmma_desc(sk_w);           // the WGMMA descriptor of this warpgroup's stage 0
''')
rep2('''    const int w = __shfl_sync(0xffffffffu, warp / 4 - 1, 0), wlane = tid & 127;''','''    // (w, the plain tile loop's start and its bound are broadcast from lane 0: ptxas then knows
    // them to be the same in the warp and keeps that loop's descriptors in uniform registers)
    const int w = __shfl_sync(0xffffffffu, warp / 4 - 1, 0), wlane = tid & 127;''')
rep2('''struct StageRing {''','''// The stage ring of a math warpgroup's tiles as wait_tile derives it from the tile count (stage
// count % STAGES, parity (count / STAGES) & 1), kept as two counters that the plain tile loop
// steps with an add and a compare instead of a division.
struct StageRing {''')
rep2('''template <int STAGES, int H>
__device__ __forceinline__ uint32_t wait_tile(uint32_t full_w, uint32_t skey, StageRing& ring,''','''// wait_tile for the tile at `ring`, which it then steps to the next tile.
template <int STAGES, int H>
__device__ __forceinline__ uint32_t wait_tile(uint32_t full_w, uint32_t skey, StageRing& ring,''')
open(f'{root}/templates/paged_logits.cu.jinja','w').write(s)
print('final written')
