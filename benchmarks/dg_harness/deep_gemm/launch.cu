// dsagen benchmark harness (not part of the package): launches the sm90 paged-MQA-logits kernel
// and its schedule kernel from a DeepGEMM include tree (DG_INCLUDE), with DeepGEMM's sm90 launch
// parameters (3 q stages, 3 kv stages, 4 math warpgroups, split_kv 256, 128 TMA threads).
// The tensor maps and launches below are this harness's own host code.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <deep_gemm/impls/sm90_fp8_paged_mqa_logits.cuh>

namespace {
constexpr uint32_t kHeads = 64, kDim = 128, kBlockKV = 64, kMathWGs = 4, kSplitKV = kBlockKV * kMathWGs;
constexpr uint32_t kQStages = 3, kKVStages = 3, kTMAThreads = 128, kMathThreads = kMathWGs * 128;
constexpr uint32_t kSMs = 132;

constexpr int align_up(int x, int a) { return (x + a - 1) / a * a; }

int smem_bytes(int next_n) {
    const int swz = kDim * 8;
    const int q_pipe = kQStages * (next_n * kHeads * kDim + align_up(next_n * kHeads * 4, swz)) + align_up(kQStages * 16, swz);
    const int kv_pipe = kKVStages * (kBlockKV * kDim + align_up(kBlockKV * 4, swz)) + align_up(kKVStages * 16, swz);
    return q_pipe + kMathWGs * kv_pipe + kMathWGs * 16 + 4;
}

template <uint32_t kNextN>
int launch_logits(uint32_t batch, uint64_t logits_stride, uint64_t bt_stride, const uint32_t* cl, float* logits,
                  const uint32_t* bt, const uint32_t* meta, const CUtensorMap* maps, cudaStream_t stream) {
    auto kernel = &deep_gemm::sm90_fp8_paged_mqa_logits<kNextN, kHeads, kDim, kBlockKV, false, kQStages, kKVStages,
                                                        kSplitKV, kTMAThreads, kMathThreads>;
    const int smem = smem_bytes(kNextN);
    static bool attr = false;
    if (!attr) {
        if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) return 1;
        attr = true;
    }
    kernel<<<kSMs, kTMAThreads + kMathThreads, smem, stream>>>(batch, logits_stride, bt_stride, cl, logits, bt, meta,
                                                              maps[0], maps[1], maps[2], maps[3]);
    return cudaGetLastError() == cudaSuccess ? 0 : 2;
}

template <uint32_t kAligned>
int launch_meta(uint32_t batch, uint32_t next_n, const uint32_t* cl, uint32_t* meta, cudaStream_t stream) {
    deep_gemm::smxx_paged_mqa_logits_metadata<kAligned, kSplitKV, kSMs><<<1, 32, 0, stream>>>(batch, next_n, false, cl, meta);
    return cudaGetLastError() == cudaSuccess ? 0 : 2;
}

int encode(CUtensorMap* m, CUtensorMapDataType t, uint32_t rank, void* base, const uint64_t* dims,
           const uint64_t* strides_bytes, const uint32_t* box, CUtensorMapSwizzle swz) {
    using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    static Encode fn = nullptr;
    if (fn == nullptr) {   // through the runtime, so that the library needs no libcuda.so link
        cudaDriverEntryPointQueryResult q;
        void* p = nullptr;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess || p == nullptr)
            return 9;
        fn = reinterpret_cast<Encode>(p);
    }
    uint32_t elem[3] = {1, 1, 1};
    CUresult r = fn(m, t, rank, base, dims, strides_bytes, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                        swz, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? 0 : 10 + int(r);
}
}  // namespace

extern "C" {
// maps: 4 CUtensorMap (q, kv, kv scales, weights) written for one input set.
int dgh_encode(void* maps_out, void* q, void* kv_cache, void* weights, uint32_t batch, uint32_t next_n,
               uint32_t num_pages, uint32_t page_bytes) {
    auto* maps = reinterpret_cast<CUtensorMap*>(maps_out);
    const uint64_t rows = uint64_t(next_n) * kHeads;
    uint64_t qd[2] = {kDim, batch * rows}, qs[1] = {kDim};
    uint32_t qb[2] = {kDim, uint32_t(rows)};
    uint64_t kd[3] = {kDim, kBlockKV, num_pages}, ks[2] = {kDim, page_bytes};
    uint32_t kb[3] = {kDim, kBlockKV, 1};
    uint64_t sd[2] = {kBlockKV, num_pages}, ss[1] = {page_bytes};
    uint32_t sb[2] = {kBlockKV, 1};
    uint64_t wd[2] = {rows, batch}, ws[1] = {rows * 4};
    uint32_t wb[2] = {uint32_t(rows), 1};
    int e = encode(&maps[0], CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, q, qd, qs, qb, CU_TENSOR_MAP_SWIZZLE_128B);
    if (!e) e = encode(&maps[1], CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, kv_cache, kd, ks, kb, CU_TENSOR_MAP_SWIZZLE_128B);
    if (!e) e = encode(&maps[2], CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, static_cast<uint8_t*>(kv_cache) + kBlockKV * kDim,
                       sd, ss, sb, CU_TENSOR_MAP_SWIZZLE_NONE);
    if (!e) e = encode(&maps[3], CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, weights, wd, ws, wb, CU_TENSOR_MAP_SWIZZLE_NONE);
    return e;
}

int dgh_logits(uint32_t next_n, uint32_t batch, uint64_t logits_stride, uint64_t bt_stride, const void* cl, void* logits,
               const void* bt, const void* meta, const void* maps, void* stream) {
    auto s = static_cast<cudaStream_t>(stream);
    auto* m = static_cast<const CUtensorMap*>(maps);
    auto* c = static_cast<const uint32_t*>(cl);
    auto* b = static_cast<const uint32_t*>(bt);
    auto* me = static_cast<const uint32_t*>(meta);
    auto* l = static_cast<float*>(logits);
    if (next_n == 1) return launch_logits<1>(batch, logits_stride, bt_stride, c, l, b, me, m, s);
    if (next_n == 2) return launch_logits<2>(batch, logits_stride, bt_stride, c, l, b, me, m, s);
    return 3;
}

int dgh_meta(uint32_t batch, uint32_t next_n, const void* cl, void* meta, void* stream) {
    auto s = static_cast<cudaStream_t>(stream);
    auto* c = static_cast<const uint32_t*>(cl);
    auto* m = static_cast<uint32_t*>(meta);
    if (batch <= 32) return launch_meta<32>(batch, next_n, c, m, s);
    if (batch <= 128) return launch_meta<128>(batch, next_n, c, m, s);
    return 3;
}
}
