// MoE grouped weight gradient for Hopper (sm_90a): the device side (launcher in
// grouped_gemm.cu; measurements in docs/notes/sm90_grouped.md).
//
//   dw[c, e] = sum over the batch entries b of c, over the assignments a of group e:
//              src[b', a / row_div, :]^T (x) dy[b'', a, :]        (float32 accumulation)
//
// One CTA per 128 x 256 tile of dw[c, e] (D rows x F columns), no split over the tokens, so
// the sum order is fixed (deterministic) and an empty expert writes zeros. The reduction
// runs over the expert's tokens 64 at a time: all 256 threads cp.async the gathered rows
// (A: 64 tokens x 128 src columns; B: 64 tokens x 256 dy columns), stored as they come, i.e.
// MN-major with the 128B swizzle, 4 stages (classic multistage: wait_group + barrier);
// warpgroup w computes rows 64w.. with m64n256k16 wgmma, both operands transposed; the
// gather of k-block i + 2 is issued while the wgmma of k-block i runs.
#pragma once

#include <cstdint>

#include "cuda/kernels/sm90/grouped_wgrad_wgmma.cuh"
#include "cuda/kernels/sm90/row_gather_gemm.cuh"

namespace pit {
namespace sm90_grouped {

constexpr int kWgThreads = 256;
constexpr int kWgStages = 4;
constexpr int kWgLookahead = kWgStages - 2;  // k-blocks loaded ahead of the MMA
constexpr int kWgTokens = 64;                          // tokens (K) per stage
constexpr int kWgStageA = kWgTokens * 128 * 2;         // 128 src columns: 16 KB
constexpr int kWgStageB = kWgTokens * 256 * 2;         // 256 dy columns: 32 KB
constexpr int kWgStageBytes = kWgStageA + kWgStageB;  // 48 KB
constexpr int kWgSmemBytes = kWgStages * kWgStageBytes + 1024;

struct WgradArgs {
  const char* src = nullptr;
  const char* dy = nullptr;
  char* dw = nullptr;
  const int32_t* lists = nullptr;   // [idx_batch, E+1, A]
  const int32_t* counts = nullptr;  // [idx_batch, E+1]
  int64_t src_batch_bytes = 0, dy_batch_bytes = 0, dw_batch_bytes = 0;  // per batch entry
  int64_t src_row_bytes = 0, dy_row_bytes = 0;                          // D * es, F * es
  int A = 0, D = 0, F = 0, E = 1, row_div = 1;
  int per_c = 1;  // batch entries per dw entry
  int src_div = 1, dy_div = 1, idx_div = 1;
  int m_tiles = 0, n_tiles = 0;
};

// The reduction's position: batch entry b (of this dw entry), first token j0 of the group.
struct WgradCursor {
  int b, b_end, j0, count;
  const int32_t* list;
  const char* src_b;
  const char* dy_b;
  __device__ __forceinline__ void Load(const WgradArgs& g, int e) {
    for (; b < b_end; ++b) {
      const int64_t ib = b / g.idx_div;
      int c = __ldg(g.counts + ib * (g.E + 1) + e);
      count = c < 0 ? 0 : (c > g.A ? g.A : c);
      if (count > 0) {
        list = g.lists + (ib * (g.E + 1) + e) * g.A;
        src_b = g.src + static_cast<int64_t>(b / g.src_div) * g.src_batch_bytes;
        dy_b = g.dy + static_cast<int64_t>(b / g.dy_div) * g.dy_batch_bytes;
        return;
      }
    }
  }
  __device__ __forceinline__ bool Done() const { return b >= b_end; }
  __device__ __forceinline__ void Next(const WgradArgs& g, int e) {
    j0 += kWgTokens;
    if (j0 >= count) {
      j0 = 0;
      ++b;
      Load(g, e);
    }
  }
};

// The list entries (assignments) of one stage that this thread copies: tokens
// (tid + 256 r) / 16 of A (r < 4) and (tid + 256 r) / 32 of B (r < 8); -1 past the count.
// Fetched one k-block ahead so their load latency hides behind the MMA.
struct StageIds {
  int a[4], b[8];
  __device__ __forceinline__ void Fetch(const WgradCursor& cur, int tid, bool done) {
    const int slots = done ? 0 : min(kWgTokens, cur.count - cur.j0);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int k = (tid + kWgThreads * r) >> 4;
      a[r] = k < slots ? __ldg(cur.list + cur.j0 + k) : -1;
    }
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      const int k = (tid + kWgThreads * r) >> 5;
      b[r] = k < slots ? __ldg(cur.list + cur.j0 + k) : -1;
    }
  }
};

// Gathers one stage: thread tid copies chunks tid + 256 r of A (16 per token row: 8 per
// 64-column block) and of B (32 per token row). Chunk q of token k's 128-byte row lands at
// (q ^ (k % 8)): the 128B swizzle of an MN-major tile whose 64-element blocks are 64 K rows
// x 128 B (8 KB) apart.
__device__ __forceinline__ void WgradLoadStage(const WgradArgs& g, const WgradCursor& cur, const StageIds& ids,
                                               int d0, int f0, uint32_t stage_s, int tid) {
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int c = tid + kWgThreads * r, k = c >> 4, ch = c & 15;
    const int col = d0 + ch * 8, a = ids.a[r];
    const bool ok = a >= 0 && a < g.A && col < g.D;
    const char* p = ok ? cur.src_b + static_cast<int64_t>(a / g.row_div) * g.src_row_bytes + col * 2 : g.src;
    sm90_rg::CpAsync16(stage_s + (ch >> 3) * 8192 + k * 128 + (((ch & 7) ^ (k & 7)) << 4), p, ok ? 16u : 0u);
  }
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    const int c = tid + kWgThreads * r, k = c >> 5, ch = c & 31;
    const int col = f0 + ch * 8, a = ids.b[r];
    const bool ok = a >= 0 && a < g.A && col < g.F;
    const char* p = ok ? cur.dy_b + static_cast<int64_t>(a) * g.dy_row_bytes + col * 2 : g.dy;
    sm90_rg::CpAsync16(stage_s + kWgStageA + (ch >> 3) * 8192 + k * 128 + (((ch & 7) ^ (k & 7)) << 4), p,
                       ok ? 16u : 0u);
  }
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void CpAsyncWaitGroup() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

template <int kKind>
__global__ void __launch_bounds__(kWgThreads, 1) GroupedWgradKernel(const WgradArgs g) {
  static_assert(kKind == sm90_rg::kBf16 || kKind == sm90_rg::kF16, "bf16 / f16 only");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) char smem_raw[];
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t base = sm90_rg::SmemAddr(smem);
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  // Tile: t = ((c * E + e) * m_tiles + mt) * n_tiles + nt.
  int t = blockIdx.x;
  const int nt = t % g.n_tiles;
  t /= g.n_tiles;
  const int mt = t % g.m_tiles;
  t /= g.m_tiles;
  const int e = t % g.E, c = t / g.E;
  const int d0 = mt * 128, f0 = nt * 256;

  // Pipeline: k-block i sits in stage i % 4; loads run 2 k-blocks ahead and one wgmma
  // group stays in flight, so at iteration i the stages of i - 1 (wgmma finishing), i,
  // i + 1 (landing) and i + 2 (being loaded) are all distinct.
  WgradCursor ld{c * g.per_c, (c + 1) * g.per_c, 0, 0, nullptr, nullptr, nullptr};
  ld.Load(g, e);
  StageIds ids;
#pragma unroll
  for (int s = 0; s < kWgLookahead; ++s) {  // a commit group per k-block, empty past the end
    ids.Fetch(ld, tid, ld.Done());
    if (!ld.Done()) {
      WgradLoadStage(g, ld, ids, d0, f0, base + s * kWgStageBytes, tid);
      ld.Next(g, e);
    }
    CpAsyncCommit();
  }
  ids.Fetch(ld, tid, ld.Done());
  WgradCursor mm = {c * g.per_c, (c + 1) * g.per_c, 0, 0, nullptr, nullptr, nullptr};
  mm.Load(g, e);
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  int stage = 0, load_stage = kWgLookahead;
  while (!mm.Done()) {
    CpAsyncWaitGroup<kWgLookahead - 1>();  // this thread's copies of `stage` have landed
    sm90_rg::FenceProxyAsync();            // ... and are visible to the async proxy (wgmma)
    __syncthreads();                       // everyone's copies; everyone's wgmma of 2 k-blocks ago done
    const uint32_t sa = base + stage * kWgStageBytes + wg * 8192;
    const uint32_t sb = base + stage * kWgStageBytes + kWgStageA;
    const uint64_t da = sm90_rg::MakeDesc(sa, 8192, 1024);
    const uint64_t db = sm90_rg::MakeDesc(sb, 8192, 1024);
    sm90_rg::WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t step = static_cast<uint64_t>(kk * 2048) >> 4;  // 16 K rows of 128 B
      if constexpr (kKind == sm90_rg::kBf16) {
        WgmmaBf16MnMn(acc, da + step, db + step);
      } else {
        WgmmaF16MnMn(acc, da + step, db + step);
      }
    }
    sm90_rg::WgmmaCommit();
    // While it runs: gather the k-block 2 ahead into the stage freed 2 k-blocks ago.
    if (!ld.Done()) {
      WgradLoadStage(g, ld, ids, d0, f0, base + load_stage * kWgStageBytes, tid);
      ld.Next(g, e);
      ids.Fetch(ld, tid, ld.Done());
    }
    CpAsyncCommit();
    if (++load_stage == kWgStages) load_stage = 0;
    sm90_rg::WgmmaWait<1>();
    if (++stage == kWgStages) stage = 0;
    mm.Next(g, e);
  }
  sm90_rg::WgmmaWait<0>();
  sm90_rg::FenceOperands(acc);
  sm90_rg::CpAsyncWaitAll();

  // Epilogue: fragment rows lane/4 (acc[4j], acc[4j+1]) and lane/4 + 8 (acc[4j+2..3]) of the
  // warp's 16, columns 8j + 2(lane%4) + {0, 1}; 4-byte stores straight from registers.
  char* dw_t = g.dw + static_cast<int64_t>(c) * g.dw_batch_bytes +
               static_cast<int64_t>(e) * g.D * g.F * 2;
  const int r0 = d0 + wg * 64 + warp * 16 + (lane >> 2);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = r0 + 8 * h;
    if (row >= g.D) continue;
    char* prow = dw_t + static_cast<int64_t>(row) * g.F * 2;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int col = f0 + 8 * j + 2 * (lane & 3);
      if (col < g.F)
        *reinterpret_cast<uint32_t*>(prow + col * 2) = sm90_rg::Pack2<kKind>(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
    }
  }
#endif
}

}  // namespace sm90_grouped
}  // namespace pit
