// sm_90a pit_stile_matmul for (32, 64) weight blocks at training sizes (host side and
// covered cases: wblock_gemm.cu; notes: docs/notes/sm90_wblock.md).
//
//   forward  C[M, N] = x[M, K] @ (w o mask)[K, N]     groups: 64-column blocks of w (of C),
//                                                     entries: 32-row blocks of w (k);
//   dx       C[M, K] = dy[M, N] @ (w o mask)^T        groups: 32-row blocks of w (of C),
//                                                     entries: 64-column blocks of w (n).
//
// A CTA owns a 128 x 128 tile of C: 2 (forward) or 4 (dx) groups. It merges their lists
// into one list of the entries any of them holds, in entry order (so the sum order is
// fixed), each with a bit per group. Per entry, the TMA warp loads the A slab (128 rows x
// 32 or 64 columns of the dense operand: whole tiles, no row gather) and only the listed
// w blocks; the two consumer warpgroups (64 rows each) run m64n64 / m64n32 wgmma for the
// listed blocks only. Entries no group lists cost nothing; a tile without any writes its
// zeros. The epilogue stages the tile in shared memory (128-byte swizzle) and stores it by
// TMA, which also clips the edges. Non-persistent (2 CTAs per SM): one CTA's epilogue and
// list merge overlap another's main loop.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/kernels/sm90/row_gather_gemm.cuh"  // PTX helpers (sm90_rg)
#include "cuda/kernels/sm90/wblock_wgmma.cuh"

namespace pit {
namespace sm90_wblock {

using sm90_rg::kBf16;
using sm90_rg::kF16;

constexpr int kBM = 128;           // rows of C per CTA: two consumer warpgroups of 64
constexpr int kBN = 128;           // columns of C per CTA
constexpr int kThreads = 288;      // warps 0-7: consumers; warp 8: TMA
constexpr int kMaxEntries = 1024;  // reduction blocks one CTA can merge (K <= 32768 / N <= 65536)
constexpr int kBlockBytes = 32 * 64 * 2;  // one (32, 64) w block

template <bool kDx>
struct Layout {
  static constexpr int kRed = kDx ? 64 : 32;  // reduction depth of one entry
  static constexpr int kGW = kDx ? 32 : 64;   // columns of C per group
  static constexpr int kG = kBN / kGW;        // groups per CTA
  static constexpr int kAccs = kGW / 2;       // fp32 accumulators per thread per group
  static constexpr int kABytes = kBM * kRed * 2;
  static constexpr int kStageBytes = kABytes + kG * kBlockBytes;  // 16 / 32 KB
  static constexpr int kStages = kDx ? 3 : 5;
  static constexpr int kMaskOffset = kStages * kStageBytes;          // uint32 [kMaxEntries]
  static constexpr int kListOffset = kMaskOffset + 4 * kMaxEntries;  // int32 [kMaxEntries]
  static constexpr int kFull = kListOffset + 4 * kMaxEntries;        // mbarriers
  static constexpr int kEmpty = kFull + 8 * kStages;
  static constexpr int kScratch = kEmpty + 8 * kStages;  // int32 [kThreads / 32]
  static constexpr int kBytes = kScratch + 64 + 1024;    // + alignment slack
  static_assert(kStages * kStageBytes >= kBM * kBN * 2, "the epilogue stages C in the A/B stages");
};

struct Args {
  const int32_t* lists;   // [idx batch, groups, capacity]
  const int32_t* counts;  // [idx batch, groups], clamped to capacity
  int groups, capacity, entries;
  int c_cols;                 // columns of C (boxes past them are not stored)
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
    if constexpr (kKind == kBf16) WgmmaBf16N32<0, 0>(acc, da, db);
    else WgmmaF16N32<0, 0>(acc, da, db);
  } else {
    if constexpr (kKind == kBf16) WgmmaBf16N64<0, 1>(acc, da, db);
    else WgmmaF16N64<0, 1>(acc, da, db);
  }
}

__device__ __forceinline__ void TmaStore3d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(src)
               : "memory");
}

// The union of the CTA's groups' lists, compacted in entry order: entry | group bits << 24.
// Every thread takes part; returns the number of entries.
template <class L>
__device__ __forceinline__ int MergeLists(const Args& g, char* smem, int group0, int b) {
  uint32_t* mask = reinterpret_cast<uint32_t*>(smem + L::kMaskOffset);
  int* list = reinterpret_cast<int*>(smem + L::kListOffset);
  int* scratch = reinterpret_cast<int*>(smem + L::kScratch);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  for (int e = tid; e < g.entries; e += kThreads) mask[e] = 0;
  __syncthreads();
  const int64_t ib = b / g.idx_div;
#pragma unroll
  for (int q = 0; q < L::kG; ++q) {
    const int grp = group0 + q;
    if (grp < g.groups) {
      const int64_t row = ib * g.groups + grp;
      // The count and the list entries load at once (the loop runs to the capacity and the
      // count only masks), so a CTA waits for one round trip to global memory, not two.
      const int cnt = g.counts[row];
      const int32_t* lst = g.lists + row * g.capacity;
      for (int i = tid; i < g.capacity; i += kThreads) {
        const int e = lst[i];
        if (i < cnt && e >= 0 && e < g.entries) atomicOr(&mask[e], 1u << q);
      }
    }
  }
  __syncthreads();
  int total = 0;
  for (int e0 = 0; e0 < g.entries; e0 += kThreads) {
    const int e = e0 + tid;
    const uint32_t m = e < g.entries ? mask[e] : 0u;
    const unsigned live = __ballot_sync(~0u, m != 0);
    if (lane == 0) scratch[warp] = __popc(live);
    __syncthreads();
    int before = total, all = total;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) {
      const int c = scratch[w];
      before += w < warp ? c : 0;
      all += c;
    }
    if (m != 0) list[before + __popc(live & ((1u << lane) - 1))] = e | static_cast<int>(m << 24);
    total = all;
    __syncthreads();
  }
  return total;
}

// ptxas serializes the wgmma here (C7520: they sit behind a branch on the group's bit).
// Running every group's wgmma on each merged entry instead, an unlisted block's on a zero
// block, measured slower at 10-50 % density (docs/notes/sm90_wblock.md).
template <int kKind, bool kDx>
__global__ void __launch_bounds__(kThreads, 2)
    WeightBlockGemmKernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w,
                          const __grid_constant__ CUtensorMap map_c, const Args g) {
  using L = Layout<kDx>;
  extern __shared__ char smem_raw[];
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t base = sm90_rg::SmemAddr(smem);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int n0 = blockIdx.x * kBN, m0 = blockIdx.y * kBM, b = blockIdx.z;
  const int group0 = blockIdx.x * L::kG;

  if (tid == 0) {
    for (int s = 0; s < L::kStages; ++s) {
      sm90_rg::MbarInit(base + L::kFull + 8 * s, 1);   // the TMA lane (+ bytes)
      sm90_rg::MbarInit(base + L::kEmpty + 8 * s, 2);  // the two consumer warpgroups
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_a)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_w)) : "memory");
  }
  const int n = MergeLists<L>(g, smem, group0, b);  // (its __syncthreads also publish the barriers)
  const int* list = reinterpret_cast<const int*>(smem + L::kListOffset);

  if (warp == kThreads / 32 - 1) {
    // TMA producer.
    if (lane == 0) {
      const int ab = b / g.a_div, wb = b / g.b_div;
      for (int u = 0; u < n; ++u) {
        const int s = u % L::kStages;
        const uint32_t phase = (u / L::kStages) & 1;
        const int v = list[u];
        const int e = v & 0xFFFFFF;
        const uint32_t bits = static_cast<uint32_t>(v) >> 24;
        const uint32_t full = base + L::kFull + 8 * s;
        const uint32_t st = base + s * L::kStageBytes;
        sm90_rg::MbarWait(base + L::kEmpty + 8 * s, phase ^ 1);
        sm90_rg::MbarArriveExpectTx(full, L::kABytes + __popc(bits) * kBlockBytes);
        sm90_rg::TmaLoad3d(st, &map_a, e * L::kRed, m0, ab, full);
#pragma unroll
        for (int q = 0; q < L::kG; ++q) {
          if (!((bits >> q) & 1)) continue;
          const int grp = group0 + q;
          // w [rows, cols] in (32, 64) blocks: forward (k block e, n block grp); dx (grp, e).
          if constexpr (kDx) sm90_rg::TmaLoad3d(st + L::kABytes + q * kBlockBytes, &map_w, e * 64, grp * 32, wb, full);
          else sm90_rg::TmaLoad3d(st + L::kABytes + q * kBlockBytes, &map_w, grp * 64, e * 32, wb, full);
        }
      }
    }
    return;
  }

  // Consumers: warpgroup wg owns rows m0 + 64 wg .. + 63.
  const int wg = warp / 4;
  float acc[L::kG][L::kAccs];
#pragma unroll
  for (int q = 0; q < L::kG; ++q)
#pragma unroll
    for (int i = 0; i < L::kAccs; ++i) acc[q][i] = 0.f;
  int prev = -1;
  for (int u = 0; u < n; ++u) {
    const int s = u % L::kStages;
    const uint32_t bits = static_cast<uint32_t>(list[u]) >> 24;
    sm90_rg::MbarWait(base + L::kFull + 8 * s, (u / L::kStages) & 1);
    const uint32_t st = base + s * L::kStageBytes;
    const uint32_t sa = st + wg * 64 * L::kRed * 2;
    sm90_rg::WgmmaFence();
#pragma unroll
    for (int q = 0; q < L::kG; ++q) {
      if (!((bits >> q) & 1)) continue;
      const uint32_t sb = st + L::kABytes + q * kBlockBytes;
#pragma unroll
      for (int kk = 0; kk < L::kRed / 16; ++kk) {
        // A: +32 bytes of k per step inside the swizzled row. B: the same when K-major (dx);
        // N-major (forward): +16 k rows of 128 bytes.
        const uint64_t da = kDx ? sm90_rg::MakeDesc(sa + kk * 32, 16, 1024) : MakeDesc64(sa + kk * 32);
        const uint64_t db = kDx ? sm90_rg::MakeDesc(sb + kk * 32, 16, 1024) : sm90_rg::MakeDesc(sb + kk * 2048, 8192, 1024);
        Mma<kKind, kDx>(acc[q], da, db);
      }
    }
    sm90_rg::WgmmaCommit();
    sm90_rg::WgmmaWait<1>();
    if (prev >= 0 && tid % 128 == 0) sm90_rg::MbarArrive(base + L::kEmpty + 8 * prev);
    prev = s;
  }
  sm90_rg::WgmmaWait<0>();
#pragma unroll
  for (int q = 0; q < L::kG; ++q)
#pragma unroll
    for (int i = 0; i < L::kAccs; ++i) asm volatile("" : "+f"(acc[q][i])::"memory");

  // Epilogue: both warpgroups are past their last wgmma, and every TMA load was consumed,
  // so the stages are free. C goes there as kBN / 64 boxes of [128 rows][128 bytes],
  // 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r % 8): conflict-free here).
  asm volatile("bar.sync 1, 256;" ::: "memory");
  const int r0 = wg * 64 + (warp % 4) * 16 + lane / 4;
#pragma unroll
  for (int q = 0; q < L::kG; ++q) {
#pragma unroll
    for (int j = 0; j < L::kGW / 8; ++j) {
      const int col = q * L::kGW + 8 * j + 2 * (lane % 4);
      const int box = col / 64, chunk = (col % 64) / 8;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = r0 + 8 * h;
        const uint32_t addr = base + box * (kBM * 128) + r * 128 + ((chunk ^ (r % 8)) * 16) + (col % 8) * 2;
        const uint32_t v = sm90_rg::Pack2<kKind>(acc[q][4 * j + 2 * h], acc[q][4 * j + 2 * h + 1]);
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
      }
    }
  }
  sm90_rg::FenceProxyAsync();
  asm volatile("bar.sync 1, 256;" ::: "memory");
  if (tid == 0) {
#pragma unroll
    for (int box = 0; box < kBN / 64; ++box)
      if (n0 + box * 64 < g.c_cols) TmaStore3d(&map_c, base + box * (kBM * 128), n0 + box * 64, m0, b);
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  }
}

}  // namespace sm90_wblock
}  // namespace pit
