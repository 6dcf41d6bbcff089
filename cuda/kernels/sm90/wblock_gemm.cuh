// sm_90a pit_stile_matmul for (32, 64) weight blocks at training sizes (host side and
// covered cases: wblock_gemm.cu; notes: docs/notes/sm90_wblock.md).
//
//   forward  C[M, N] = x[M, K] @ (w o mask)[K, N]     groups: 64-column blocks of w (of C),
//                                                     entries: 32-row blocks of w (k);
//   dx       C[M, K] = dy[M, N] @ (w o mask)^T        groups: 32-row blocks of w (of C),
//                                                     entries: 64-column blocks of w (n).
//
// A CTA owns one group's 256-row tile of C (256 x 64 forward, 256 x 32 dx) and walks that
// group's list as stored: per listed entry, the TMA warp loads the A slab (256 rows x 32 or
// 64 columns of the dense operand: whole tiles, no row gather) and the w block; the two
// consumer warpgroups (128 rows each, two m64 halves) run m64n64 / m64n32 wgmma on it.
// Unlisted blocks cost nothing; a group without entries writes its zeros. The epilogue
// stages the tile in shared memory (swizzled as C's tensor map) and stores it by TMA,
// which also clips the edges. Non-persistent (2 CTAs per SM): one CTA's start and epilogue
// overlap another's main loop. (An earlier form merged 2-4 groups' lists per 128 x 128
// tile; docs/notes/sm90_wblock.md has why this one replaced it.)
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/kernels/sm90/row_gather_gemm.cuh"  // PTX helpers (sm90_rg)
#include "cuda/kernels/sm90/wgmma.cuh"

namespace pit {
namespace sm90_wblock {

using sm90_rg::kBf16;
using sm90_rg::kF16;

constexpr int kBlockBytes = 32 * 64 * 2;  // one (32, 64) w block

struct Args {
  const int32_t* lists;   // [idx batch, groups, capacity]
  const int32_t* counts;  // [idx batch, groups], clamped to capacity
  int groups, capacity, entries;
  int a_div, b_div, idx_div;  // batch entry b reads a[b / a_div], w[b / b_div], lists[b / idx_div]
};

// 128-byte-swizzle descriptors are sm90_rg::MakeDesc; this is the 64-byte one (K-major rows
// of 64 bytes, 8-row atoms of 512 bytes).
__device__ __forceinline__ uint64_t MakeDesc64(uint32_t saddr) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((saddr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>(1) << 16;         // lbo: unused for swizzled K-major
  d |= static_cast<uint64_t>(512 >> 4) << 32;  // sbo
  d |= static_cast<uint64_t>(2) << 62;         // SWIZZLE_64B
  return d;
}

template <int kKind, bool kDx>
__device__ __forceinline__ void Mma(float* acc, uint64_t da, uint64_t db) {
  // Forward: B is a w block [32 k][64 n], N-major. dx: a w block [32 (C columns)][64 k], K-major.
  if constexpr (kDx) {
    if constexpr (kKind == kBf16) sm90::WgmmaBf16N32<0, 0>(acc, da, db);
    else sm90::WgmmaF16N32<0, 0>(acc, da, db);
  } else {
    if constexpr (kKind == kBf16) sm90::WgmmaBf16N64<0, 1>(acc, da, db);
    else sm90::WgmmaF16N64<0, 1>(acc, da, db);
  }
}

__device__ __forceinline__ void TmaStore3d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(src)
               : "memory");
}

constexpr int kBM = 256;
constexpr int kThreads = 288;  // warps 0-7: consumers; warp 8: TMA

template <bool kDx>
struct Layout {
  static constexpr int kRed = kDx ? 64 : 32;  // reduction depth of one entry
  static constexpr int kGW = kDx ? 32 : 64;   // columns of C (one group)
  static constexpr int kAccs = kGW / 2;       // fp32 accumulators per thread per m64 half
  static constexpr int kABytes = kBM * kRed * 2;              // 16 / 32 KB
  static constexpr int kStageBytes = kABytes + kBlockBytes;  // 20 / 36 KB
  static constexpr int kStages = kDx ? 3 : 5;
  static constexpr int kFull = kStages * kStageBytes;
  static constexpr int kEmpty = kFull + 8 * kStages;
  static constexpr int kBytes = kEmpty + 8 * kStages + 1024;  // + alignment slack
  static_assert(kStages * kStageBytes >= kBM * kGW * 2, "the epilogue stages C in the A/B stages");
};

template <int kKind, bool kDx>
__global__ void __launch_bounds__(kThreads, 2)
    WeightBlockGemmKernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w,
                          const __grid_constant__ CUtensorMap map_c, const Args g) {
  using L = Layout<kDx>;
  extern __shared__ char smem_raw[];
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t base = sm90_rg::SmemAddr(smem);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int grp = blockIdx.x, m0 = blockIdx.y * kBM, b = blockIdx.z;
  const int64_t row = static_cast<int64_t>(b / g.idx_div) * g.groups + grp;

  if (tid == 0) {
    for (int s = 0; s < L::kStages; ++s) {
      sm90_rg::MbarInit(base + L::kFull + 8 * s, 1);   // the TMA lane (+ bytes)
      sm90_rg::MbarInit(base + L::kEmpty + 8 * s, 2);  // the two consumer warpgroups
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_a)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_w)) : "memory");
  }
  const int cnt = min(max(g.counts[row], 0), g.capacity);  // every thread: one L2 round trip
  __syncthreads();

  if (warp == kThreads / 32 - 1) {
    // TMA producer: the warp reads 32 list entries at a time, lane 0 issues their loads.
    const int32_t* lst = g.lists + row * g.capacity;
    const int ab = b / g.a_div, wb = b / g.b_div;
    for (int u0 = 0; u0 < cnt; u0 += 32) {
      const int mine = u0 + lane < cnt ? lst[u0 + lane] : 0;
      const int nn = min(32, cnt - u0);
      for (int j = 0; j < nn; ++j) {
        int e = __shfl_sync(~0u, mine, j);
        // An entry outside the reduction (not from pit_jax's builders) loads boxes past the
        // edge: TMA fills them with zeros, so it adds nothing.
        if (e < 0 || e >= g.entries) e = g.entries;
        const int u = u0 + j, s = u % L::kStages;
        if (lane == 0) {
          const uint32_t full = base + L::kFull + 8 * s;
          const uint32_t st = base + s * L::kStageBytes;
          sm90_rg::MbarWait(base + L::kEmpty + 8 * s, ((u / L::kStages) & 1) ^ 1);
          sm90_rg::MbarArriveExpectTx(full, L::kStageBytes);
          sm90_rg::TmaLoad3d(st, &map_a, e * L::kRed, m0, ab, full);
          // w [rows, cols] in (32, 64) blocks: forward (k block e, n block grp); dx (grp, e).
          if constexpr (kDx) sm90_rg::TmaLoad3d(st + L::kABytes, &map_w, e * 64, grp * 32, wb, full);
          else sm90_rg::TmaLoad3d(st + L::kABytes, &map_w, grp * 64, e * 32, wb, full);
        }
        __syncwarp();
      }
    }
    return;
  }

  // Consumers: warpgroup wg owns rows m0 + 128 wg .. + 127, as two m64 halves.
  const int wg = warp / 4;
  float acc[2][L::kAccs];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < L::kAccs; ++i) acc[h][i] = 0.f;
  int prev = -1;
  for (int u = 0; u < cnt; ++u) {
    const int s = u % L::kStages;
    sm90_rg::MbarWait(base + L::kFull + 8 * s, (u / L::kStages) & 1);
    const uint32_t st = base + s * L::kStageBytes;
    const uint32_t sa = st + wg * 128 * L::kRed * 2, sb = st + L::kABytes;
    sm90_rg::WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < L::kRed / 16; ++kk) {
      // A: +32 bytes of k per step inside the swizzled row, the second m64 half 64 rows
      // further. B: the same when K-major (dx); N-major (forward): +16 k rows of 128 bytes.
      const uint64_t db = kDx ? sm90_rg::MakeDesc(sb + kk * 32, 16, 1024) : sm90_rg::MakeDesc(sb + kk * 2048, 8192, 1024);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t ah = sa + h * 64 * L::kRed * 2 + kk * 32;
        Mma<kKind, kDx>(acc[h], kDx ? sm90_rg::MakeDesc(ah, 16, 1024) : MakeDesc64(ah), db);
      }
    }
    sm90_rg::WgmmaCommit();
    sm90_rg::WgmmaWait<1>();
    if (prev >= 0 && tid % 128 == 0) sm90_rg::MbarArrive(base + L::kEmpty + 8 * prev);
    prev = s;
  }
  sm90_rg::WgmmaWait<0>();
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < L::kAccs; ++i) asm volatile("" : "+f"(acc[h][i])::"memory");

  // Epilogue: both warpgroups are past their last wgmma and every load was consumed, so
  // the stages are free. C goes there as one [256 rows][kGW * 2 bytes] box, swizzled as
  // its tensor map (128 bytes: chunk c of row r at c ^ (r % 8); 64 bytes: c ^ (r / 2 % 4)).
  asm volatile("bar.sync 1, 256;" ::: "memory");
  constexpr int kRowBytes = L::kGW * 2;
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    const int r0 = wg * 128 + m * 64 + (warp % 4) * 16 + lane / 4;
#pragma unroll
    for (int j = 0; j < L::kGW / 8; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = r0 + 8 * h;
        const int chunk = kDx ? (j ^ ((r >> 1) & 3)) : (j ^ (r % 8));
        const uint32_t addr = base + r * kRowBytes + chunk * 16 + (lane % 4) * 4;
        const uint32_t v = sm90_rg::Pack2<kKind>(acc[m][4 * j + 2 * h], acc[m][4 * j + 2 * h + 1]);
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
      }
    }
  }
  sm90_rg::FenceProxyAsync();
  asm volatile("bar.sync 1, 256;" ::: "memory");
  if (tid == 0) {
    TmaStore3d(&map_c, base, grp * L::kGW, m0, b);
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  }
}

}  // namespace sm90_wblock
}  // namespace pit
