// Probe (not part of the library): how fast one SM can gather listed rows into shared
// memory in the 128B-swizzled K-rows layout the sm_90a kernels feed to wgmma, by cp.async
// (what the row-gather kernel's A and the weight gradient's producers do) against per-row
// TMA boxes (one 64-column x 1-row box per token and 64-column block). Build on an H100:
//   nvcc -std=c++17 -O3 -lineinfo --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I. \
//     cuda/kernels/sm90/gather_probe_bench.cu -o gather_probe
// Every CTA (one per SM) streams `stages` stages of 64 listed rows x 256 columns (bf16,
// 32 KB) through a 4-deep ring of full / empty barriers; a consumer warp only waits and
// releases (no math), so the time is the gather's own rate. Each method's first stage of
// CTA 0 is copied back and checked against the swizzled layout.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/kernels/sm90/bench_util.cuh"
#include "cuda/kernels/sm90/launch_util.h"
#include "cuda/kernels/sm90/row_gather_gemm.cuh"

namespace {

using namespace pit::sm90_rg;

constexpr int kTok = 64;                 // rows per stage
constexpr int kBlocks = 4;               // 64-column blocks per row: 256 columns
constexpr int kBlock = kTok * 128;       // 8 KB: 64 K rows x 128 B
constexpr int kStage = kBlocks * kBlock; // 32 KB
constexpr int kStageW = 6 * kBlock;      // methods 3, 4: the weight gradient's 48 KB stage
constexpr int kStages = 4;
constexpr int kFull = kStages * kStageW, kEmpty = kFull + 8 * kStages;
constexpr int kSmem = kEmpty + 8 * kStages + 1024;

struct ProbeArgs {
  const char* x;       // [rows, cols] bf16
  const int32_t* ids;  // [n_ids] row ids
  int n_ids, cols, stages;
  char* check;         // CTA 0's first stage (kStage bytes)
};

// method 0: cp.async by 4 warps (one row x 32 chunks per warp instruction, as the weight
// gradient's producers); 1: TMA row boxes from one thread; 2: TMA row boxes from lane 0 of
// each of the 4 producer warps (a quarter of the rows each); 3: the weight gradient's 48 KB
// stage (2 blocks of 2 rows x 16 chunks per instruction, then method 0's 4 blocks), the
// consumer releasing a stage only when the next one has landed (as its wgmma loop does);
// 4: method 3's stage, released at once; 5 / 6: method 3 with 8 consumer warps (as the
// weight gradient has), each thread waiting on the full barrier, 5 with and 6 without the
// fence.proxy.async that orders cp.async's writes before wgmma's reads; 7: method 3 with
// the zero-fill form (src-size a register: 16 or 0 by a runtime test, as the kernels
// write it); 8: method 3 with each row's 64-bit address shuffled instead of its id.
template <int kMethod>
__global__ void __launch_bounds__(384, 1) GatherProbe(const ProbeArgs g, const __grid_constant__ CUtensorMap map) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) char smem_raw[];
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t base = SmemAddr(smem);
  static_assert(kMethod >= 0 && kMethod <= 8, "methods 0..8");
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(base + kFull + s * 8, kMethod == 0 || kMethod >= 3 ? 128 : (kMethod == 1 ? 1 : 4));
      MbarInit(base + kEmpty + s * 8, kMethod == 5 || kMethod == 6 ? 8 : 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map)) : "memory");
  }
  __syncthreads();
  int stage = 0;
  uint32_t phase = 0;
  if (warp < 4) {
    for (int i = 0; i < g.stages; ++i) {
      const int first = (blockIdx.x * 64 + i * 64 * gridDim.x) % g.n_ids;
      MbarWait(base + kEmpty + stage * 8, phase ^ 1);
      const uint32_t ss = base + stage * (kMethod >= 3 ? kStageW : kStage);
      const uint32_t full = base + kFull + stage * 8;
      // The stage's row ids: lane l of warp w holds row 16w + l (l < 16); method 1's warp 0
      // holds rows l and l + 32.
      const int id_a = __ldg(g.ids + (first + (kMethod == 1 ? lane : warp * 16 + (lane & 15))) % g.n_ids);
      const int id_b = kMethod == 1 ? __ldg(g.ids + (first + lane + 32) % g.n_ids) : 0;
      if constexpr (kMethod >= 3) {  // the weight gradient's stage
        const uint32_t zf = kMethod == 7 && id_a < 0 ? 0u : 16u;
        const char* row_a = g.x + static_cast<int64_t>(id_a) * g.cols * 2;
        // A: 2 blocks (128 columns from byte 1024 of the row), 2 rows x 16 chunks per
        // instruction; B: 4 blocks (256 columns from byte 2048), one row x 32 chunks.
#pragma unroll
        for (int r = 0; r < 8; ++r) {
          const int tt = (lane >> 4) + 2 * r, ch = lane & 15, k = warp * 16 + tt;
          const int id = __shfl_sync(0xffffffffu, id_a, tt);
          const char* src = g.x + (static_cast<int64_t>(id) * g.cols) * 2 + 1024 + ch * 16;
          if constexpr (kMethod == 8)
            src = reinterpret_cast<const char*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(row_a), tt)) + 1024 + ch * 16;
          const uint32_t n = kMethod == 7 ? __shfl_sync(0xffffffffu, zf, tt) : 16u;
          CpAsync16(ss + (ch >> 3) * kBlock + k * 128 + (((ch & 7) ^ (k & 7)) << 4), src, n);
        }
#pragma unroll
        for (int r = 0; r < 16; ++r) {
          const int k = warp * 16 + r;
          const int id = __shfl_sync(0xffffffffu, id_a, r);
          const char* src = g.x + (static_cast<int64_t>(id) * g.cols) * 2 + 2048 + lane * 16;
          if constexpr (kMethod == 8)
            src = reinterpret_cast<const char*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(row_a), r)) + 2048 + lane * 16;
          const uint32_t n = kMethod == 7 ? __shfl_sync(0xffffffffu, zf, r) : 16u;
          CpAsync16(ss + 2 * kBlock + (lane >> 3) * kBlock + k * 128 + (((lane & 7) ^ (k & 7)) << 4), src, n);
        }
        CpAsyncArriveNoinc(full);
      } else if constexpr (kMethod == 0) {
        // warp w: rows 16w .. 16w + 15, one row (512 B) per instruction
#pragma unroll
        for (int r = 0; r < 16; ++r) {
          const int k = warp * 16 + r;
          const int id = __shfl_sync(0xffffffffu, id_a, r);
          const char* src = g.x + (static_cast<int64_t>(id) * g.cols) * 2 + lane * 16;
          CpAsync16(ss + (lane >> 3) * kBlock + k * 128 + (((lane & 7) ^ (k & 7)) << 4), src, 16u);
        }
        CpAsyncArriveNoinc(full);
      } else if (kMethod == 2 || warp == 0) {
        const int k0 = kMethod == 1 ? 0 : warp * 16, nk = kMethod == 1 ? kTok : 16;
        if (lane == 0) MbarArriveExpectTx(full, kMethod == 1 ? kStage : kStage / 4);
        for (int kk = 0; kk < nk; ++kk) {
          const int id = __shfl_sync(0xffffffffu, kk < 32 ? id_a : id_b, kk & 31);
          const int k = k0 + kk;
          if (lane == 0) {
#pragma unroll
            for (int h = 0; h < kBlocks; ++h) TmaLoad3d(ss + h * kBlock + k * 128, &map, 64 * h, id, 0, full);
          }
        }
      }
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    if constexpr (kMethod == 0 || kMethod >= 3) CpAsyncWaitAll();
  } else if (kMethod == 5 || kMethod == 6 || warp == 4) {
    // consumer: wait, (check), release (method 3: the previous stage, once this one landed)
    int prev = -1;
    for (int i = 0; i < g.stages; ++i) {
      MbarWait(base + kFull + stage * 8, phase);
      if constexpr (kMethod == 5) FenceProxyAsync();
      if (i == 0 && blockIdx.x == 0 && g.check && kMethod < 3) {
        for (int o = lane * 16; o < kStage; o += 32 * 16)
          *reinterpret_cast<uint4*>(g.check + o) = LdShared16(base + stage * kStage + o);
      }
      __syncwarp();
      if (kMethod == 3 || kMethod >= 5) {  // late release (7, 8 as 3)
        if (lane == 0 && prev >= 0) MbarArrive(base + kEmpty + prev * 8);
        prev = stage;
      } else if (lane == 0) {
        MbarArrive(base + kEmpty + stage * 8);
      }
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
  }
#endif
}

}  // namespace

int main(int argc, char** argv) {
  int rows = argc > 1 ? atoi(argv[1]) : 4096;
  const int cols = 3072, n_ids = argc > 2 ? atoi(argv[2]) : 1089, stages = 200;
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  __nv_bfloat16* x;
  CK(cudaMalloc(&x, int64_t{rows} * cols * 2));
  FillRandom<<<1024, 256, 0, s>>>(x, int64_t{rows} * cols, 7);
  std::vector<int32_t> ids(rows);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937 rng(3);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(n_ids);
  int32_t* d_ids;
  CK(cudaMalloc(&d_ids, n_ids * 4));
  CK(cudaMemcpy(d_ids, ids.data(), n_ids * 4, cudaMemcpyHostToDevice));
  char* check;
  CK(cudaMalloc(&check, kStage));
  std::vector<uint16_t> hx(int64_t{rows} * cols);
  CK(cudaMemcpy(hx.data(), x, hx.size() * 2, cudaMemcpyDeviceToHost));

  auto encode = pit::sm90::GetEncodeTiled();
  CUtensorMap map;
  cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows), 1};
  cuuint64_t strides[2] = {static_cast<cuuint64_t>(cols) * 2, static_cast<cuuint64_t>(cols) * rows * 2};
  cuuint32_t box[3] = {64, 1, 1}, es[3] = {1, 1, 1};
  if (!encode || encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, x, dims, strides, box, es,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    printf("tensor map encode failed\n");
    return 1;
  }
  auto kernels = {GatherProbe<0>, GatherProbe<1>, GatherProbe<2>, GatherProbe<3>,
                  GatherProbe<4>, GatherProbe<5>, GatherProbe<6>, GatherProbe<7>, GatherProbe<8>};
  const char* names[] = {"cp.async (4 warps)", "TMA rows (1 thread)", "TMA rows (4 threads)", "wgrad stage, late",
                         "wgrad stage, at once", "wgrad, 8 warps, fence", "wgrad, 8 warps", "wgrad, zero-fill form",
                         "wgrad, 64-bit shuffles"};
  int m = 0, fails = 0;
  printf("rows %d, listed %d, %d SMs, %d stages of %d B per CTA\n", rows, n_ids, sms, stages, kStage);
  for (auto kern : kernels) {
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
    ProbeArgs g{reinterpret_cast<const char*>(x), d_ids, n_ids, cols, stages, check};
    CK(cudaMemsetAsync(check, 0xFF, kStage, s));
    kern<<<sms, 384, kSmem, s>>>(g, map);
    CK(cudaStreamSynchronize(s));
    // check CTA 0's first stage: token k (ids[k]), block h, chunk c at h*kBlock + k*128 + ((c ^ (k & 7)) * 16)
    std::vector<uint16_t> hc(kStage / 2);
    CK(cudaMemcpy(hc.data(), check, kStage, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int k = 0; k < kTok && m < 3; ++k)
      for (int h = 0; h < kBlocks; ++h)
        for (int c = 0; c < 8; ++c)
          for (int e = 0; e < 8; ++e) {
            const uint16_t want = hx[int64_t{ids[k]} * cols + h * 64 + c * 8 + e];
            const uint16_t got = hc[(h * kBlock + k * 128 + ((c ^ (k & 7)) * 16)) / 2 + e];
            bad += want != got;
          }
    fails += bad != 0;
    g.check = nullptr;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> t;
    for (int r = 0; r < 12; ++r) {
      CK(cudaEventRecord(e0, s));
      kern<<<sms, 384, kSmem, s>>>(g, map);
      CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (r >= 2) t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    const double ms = t[t.size() / 2];
    const double per_sm = double(stages) * (m >= 3 ? kStageW : kStage) / (ms * 1e-3) / 1e9;
    printf("%-22s layout %s (%d bad), %.3f ms, %.2f us per stage, %.1f GB/s per SM, %.0f GB/s total\n", names[m],
           bad ? "WRONG" : "ok", bad, ms, ms * 1e3 / stages, per_sm, per_sm * sms);
    ++m;
  }
  printf("%s\n", fails ? "FAILED" : "PASSED");
  return fails ? 1 : 0;
}
