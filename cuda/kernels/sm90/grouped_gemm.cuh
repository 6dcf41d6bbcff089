// MoE grouped GEMM for Hopper (sm_90a): the device side. See grouped_gemm.cu for the
// launcher and docs/notes/sm90_grouped.md for the measurements.
//
//   y[b, a, :] = src[b', a / row_div, :] @ op(W[b'', e])   for a in group e < E,
//   y[b, a, :] = 0                                          for a in group E (dropped).
//
// The row-gather GEMM of row_gather_gemm.cuh with three changes, reusing its PTX helpers,
// wgmma wrappers and B loader:
//  - the row tiles come from the device-side counts: every CTA prefix-sums
//    ceil(ceil(count / 128) / cluster) over the batch * E groups into shared memory at
//    start, so the work list is sum_e ceil(count_e / 128) row tiles x the column tiles
//    and an expert costs only its own tiles (no host read of the counts);
//  - B is W[b'', e]: the tensor map's third coordinate is b'' * E + e;
//  - list entry a gathers A row a / row_div and writes y row a.
// Layout (3 A stages, 5 B stages, epilogue through the freed A stage) and roles (WG0: B by
// TMA on warp 2, zero-fill of group E on warps 0, 1, 3; WG1, WG2: cp.async gather of their
// A rows + m64n256 wgmma + epilogue) are those of the row-gather kernel's final
// configuration. A consumer warpgroup whose 64 rows all lie past its expert's count skips
// its wgmma (small experts: half the math). Each expert's work is walked in bands of a few
// row tiles x all column tiles, row tiles fastest inside a band, so the W column slabs and
// the gathered rows that the grid touches at once both stay in L2. The launcher uses single
// CTAs; 2-CTA clusters (W multicast) remain as a bench experiment.
#pragma once

#include <cstdint>

#include "cuda/kernels/device_utils.cuh"
#include "cuda/kernels/epilogue.cuh"
#include "cuda/kernels/sm90/grouped_gemm.h"
#include "cuda/kernels/sm90/row_gather_gemm.cuh"

namespace pit {
namespace sm90_grouped {

using sm90_rg::kBf16;
using sm90_rg::kBKBytes;
using sm90_rg::kBM;
using sm90_rg::kBN;
using sm90_rg::kF16;
using sm90_rg::kStageABytes;
using sm90_rg::kStageBBytes;
using sm90_rg::kTf32;

constexpr int kThreads = 384;
constexpr int kMaxGroups = 4096;  // batch * E: the prefix table lives in shared memory
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;

// Shared memory from the 1024-aligned base. The names kBOffset / kFullB / kEmptyB /
// kStagesB / kBN / kStageBBytes / kStageBPitch are what sm90_rg::IssueB reads from its Cfg.
struct Layout {
  static constexpr int kStagesA = 3, kStagesB = 5;
  static constexpr int kBN = sm90_rg::kBN, kStageBBytes = sm90_rg::kStageBBytes, kStageBPitch = kStageBBytes;
  static constexpr int kLoadN = kBN;  // B columns a stage loads (sm90_rg::IssueB)
  static constexpr int kAOffset = 0;
  static constexpr int kBOffset = kStagesA * kStageABytes;
  static constexpr int kFullA = kBOffset + kStagesB * kStageBBytes;  // [2 consumer WGs][kStagesA]
  static constexpr int kFullB = kFullA + 8 * 2 * kStagesA;
  static constexpr int kEmptyB = kFullB + 8 * kStagesB;
  static constexpr int kScanOffset = kEmptyB + 8 * kStagesB;  // 12 warp totals of the prefix scan
  static constexpr int kPrefixOffset = kScanOffset + 64;      // int[kMaxGroups + 1]
  static constexpr int kSmemBytes = kPrefixOffset + 4 * (kMaxGroups + 1) + 1024;  // + align slack
  static_assert(kSmemBytes <= 232448, "over the 227 KB opt-in limit");
};

struct Args {
  const char* src = nullptr;        // bytes
  char* y = nullptr;                // bytes
  const int32_t* lists = nullptr;   // [idx_batch, E+1, A]
  const int32_t* counts = nullptr;  // [idx_batch, E+1]
  int64_t src_batch_bytes = 0;      // (A / row_div) * D * es
  int64_t y_batch_bytes = 0;        // A * F * es
  int64_t src_row_bytes = 0;        // D * es
  int64_t y_row_bytes = 0;          // F * es
  int A = 0, F = 0, E = 1, row_div = 1;
  int batch = 1, src_div = 1, w_div = 1, idx_div = 1;  // entry b reads src[b / src_div] ...
  int groups = 0;                                      // batch * E
  int n_tiles = 0, num_kb = 0;
  int band = 0;      // > 0: walk each group in bands of `band` items, row tiles fastest inside
  int diag = 0;      // experiments only: kDiagNoStore (timing), kDiagLag (a stress test): grouped_gemm.h
  int relu = 0;      // y = max(y, 0) before rounding (the FFN's activation)
};

using sm90_rg::SmemAddr;

// Timestamps of the forward for the bench (Args::diag & kDiagStampFwd, bench builds only):
// slot 0 entry, 1 prefix built, 2 + i end of tile i's epilogue (i < 19), 21 first B stage
// landed, 22 tiles walked, 23 consumer done (consumer warpgroup 0, thread 0).
__device__ __forceinline__ void FwdStamp(const Args& g, int slot, unsigned long long v = ~0ull) {
#ifdef PIT_RG_EXPERIMENTS
  if (g.diag & kDiagStampFwd) sm90_rg::Stamp<sm90_rg::kDiagStamp>(slot, v);
#endif
}

// Count of group (b, e) of batch entry b's index, clamped to [0, A].
__device__ __forceinline__ int GroupCount(const Args& g, int b, int e) {
  int c = __ldg(g.counts + static_cast<int64_t>(b / g.idx_div) * (g.E + 1) + e);
  return c < 0 ? 0 : (c > g.A ? g.A : c);
}

// Work items of group q = b * E + e: cluster-sized sets of row tiles.
template <int kCluster>
__device__ __forceinline__ int GroupItems(const Args& g, int q) {
  const int b = q / g.E;
  const int tiles = (GroupCount(g, b, q - b * g.E) + kBM - 1) / kBM;
  return (tiles + kCluster - 1) / kCluster;
}

// prefix[q] = items of groups < q, prefix[groups] = all items (every thread of the CTA).
template <int kCluster>
__device__ __forceinline__ void BuildPrefix(const Args& g, int* prefix, int* scratch) {
  const int tid = threadIdx.x;
  const int per = (g.groups + kThreads - 1) / kThreads;
  const int beg = min(tid * per, g.groups), end = min(beg + per, g.groups);
  int local = 0;
  for (int q = beg; q < end; ++q) local += GroupItems<kCluster>(g, q);
  int total;
  int run = BlockExclusiveSumOnce<kThreads>(local, scratch, &total);
  for (int q = beg; q < end; ++q) {
    prefix[q] = run;
    run += GroupItems<kCluster>(g, q);
  }
  if (tid == 0) prefix[g.groups] = total;
}

struct Tile {
  int b, e;
  int m0;    // first list slot of the tile within its group
  int n0;    // first column
  int live;  // the group's count
  const int32_t* list;
};

// The walk over work items t = item * n_tiles + column tile, item = (group, row-tile
// set). `q` caches the group of the previous call (t only grows along a walk).
template <int kCluster>
struct Walker {
  int first, step, rank, total, q = 0;
  __device__ __forceinline__ Walker(const int* prefix, const Args& g) {
    const sm90_rg::Walk<kCluster> w;
    first = w.first, step = w.step, rank = w.rank;
    total = prefix[g.groups] * g.n_tiles;
  }
  __device__ __forceinline__ void Decode(const Args& g, const int* prefix, int t, Tile& tile) {
    int mg, nt;
    if (g.band > 0) {
      // Bands of `band` items (row-tile sets) of one group, row tiles fastest inside a band.
      while (prefix[q + 1] * g.n_tiles <= t) ++q;
      const int items = prefix[q + 1] - prefix[q], local = t - prefix[q] * g.n_tiles;
      const int band0 = local / (g.band * g.n_tiles) * g.band;  // first item of the band
      const int in_band = min(g.band, items - band0), rem = local - band0 * g.n_tiles;
      nt = rem / in_band;
      mg = band0 + (rem - nt * in_band);
    } else {
      const int item = t / g.n_tiles;
      while (prefix[q + 1] <= item) ++q;
      mg = item - prefix[q];
      nt = t - item * g.n_tiles;
    }
    tile.b = q / g.E;
    tile.e = q - tile.b * g.E;
    tile.m0 = (mg * kCluster + rank) * kBM;
    tile.n0 = nt * kBN;
    tile.live = GroupCount(g, tile.b, tile.e);
    tile.list = g.lists + (static_cast<int64_t>(tile.b / g.idx_div) * (g.E + 1) + tile.e) * g.A;
  }
};

// Assignment (y row) of list slot j of the tile's group, or -1 (past the count, bad id).
__device__ __forceinline__ int AssignmentOf(const Args& g, const Tile& tile, int j) {
  if (j >= tile.live) return -1;
  const int a = __ldg(tile.list + j);
  return (a < 0 || a >= g.A) ? -1 : a;
}

// Zero rows of the dropped assignments (group E). One unit = one listed assignment of
// one batch entry; units are dealt round-robin over all zero-fill warps of the grid,
// continuing across batch entries. Next() writes one row with the whole warp.
struct ZeroFill {
  int b = -1, u = 0, units = 0, offset = 0;
  int worker, G;
  __device__ __forceinline__ ZeroFill(int k, int per_cta) : worker(blockIdx.x * per_cta + k), G(gridDim.x * per_cta) {}
  __device__ __forceinline__ bool Next(const Args& g, int lane) {
    for (;;) {
      if (b >= 0 && u < units) break;
      if (b >= 0) offset = (offset + units % G) % G;
      if (++b >= g.batch) return false;
      units = GroupCount(g, b, g.E);
      u = worker - offset;
      if (u < 0) u += G;
    }
    const int32_t* list = g.lists + (static_cast<int64_t>(b / g.idx_div) * (g.E + 1) + g.E) * g.A;
    const int a = __ldg(list + u);
    u += G;
    if (a < 0 || a >= g.A) return true;
    char* dst = g.y + static_cast<int64_t>(b) * g.y_batch_bytes + static_cast<int64_t>(a) * g.y_row_bytes;
    for (int64_t x = lane * 16; x < g.y_row_bytes; x += 32 * 16)
      __stcs(reinterpret_cast<int4*>(dst + x), make_int4(0, 0, 0, 0));
    return true;
  }
};

// B tiles by TMA (lane 0 of the B warp), W[b / w_div, e]: sm90_rg::IssueB with the
// tensor map's third coordinate b'' * E + e.
template <int kKind, bool kTransW, int kCluster>
__device__ __forceinline__ void LoadB(const Args& g, const int* prefix, const CUtensorMap* map, char* smem, int lane) {
  const uint32_t base = SmemAddr(smem);
  Walker<kCluster> w(prefix, g);
  sm90_rg::Pipe<Layout::kStagesB> pipe;
  for (int t = w.first; t < w.total; t += w.step) {
    Tile tile;
    w.Decode(g, prefix, t, tile);
    const int bb = (tile.b / g.w_div) * g.E + tile.e;
    for (int kb = 0; kb < g.num_kb; ++kb) {
      if (lane == 0)
        sm90_rg::IssueB<Layout, kKind, kTransW, kCluster, 0>(map, base, tile.n0, bb, kb, pipe.stage, pipe.phase,
                                                             w.rank);
      __syncwarp();
      pipe.Next();
    }
  }
}

// Consumer-side gather of A: each consumer thread owns 16-byte chunk (lane % 8) of rows
// warp*16 + lane/8 + 4i (i < 4) of its warpgroup's 64 rows, and walks the same work
// sequence as the compute loop, kStagesA k-blocks ahead.
template <int kCluster>
struct ALoader {
  Walker<kCluster> w;
  int t, kb = 0, stage = 0;
  bool valid = false;
  const char* a_b = nullptr;
  int64_t off[4];  // source row byte offsets (or -1: no row)
  __device__ __forceinline__ ALoader(const int* prefix, const Args& g) : w(prefix, g) {}
  __device__ __forceinline__ void Start(const Args& g, const int* prefix, int wg, int warp, int lane) {
    t = w.first - w.step;
    NextTile(g, prefix, wg, warp, lane);
  }
  __device__ __forceinline__ void NextTile(const Args& g, const int* prefix, int wg, int warp, int lane) {
    t += w.step;
    valid = t < w.total;
    if (!valid) return;
    Tile tile;
    w.Decode(g, prefix, t, tile);
    a_b = g.src + static_cast<int64_t>(tile.b / g.src_div) * g.src_batch_bytes;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int a = AssignmentOf(g, tile, tile.m0 + wg * 64 + warp * 16 + (lane >> 3) + 4 * i);
      off[i] = a < 0 ? int64_t{-1} : static_cast<int64_t>(a / g.row_div) * g.src_row_bytes;
    }
  }
  __device__ __forceinline__ void Issue(const Args& g, const int* prefix, uint32_t base, int wg, int warp, int lane) {
    if (!valid) return;
    const int chunk = lane & 7;
    const int64_t kbyte = static_cast<int64_t>(kb) * kBKBytes + chunk * 16;
    const bool k_ok = kbyte < g.src_row_bytes;
    const uint32_t sa = base + Layout::kAOffset + stage * kStageABytes + wg * (64 * kBKBytes);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int rl = warp * 16 + (lane >> 3) + 4 * i;
      const bool ok = k_ok && off[i] >= 0;
      sm90_rg::CpAsync16(sa + rl * kBKBytes + ((chunk ^ (rl & 7)) << 4), ok ? a_b + off[i] + kbyte : g.src,
                         ok ? 16u : 0u);
    }
    sm90_rg::CpAsyncArriveNoinc(base + Layout::kFullA + (wg * Layout::kStagesA + stage) * 8);
    if (++stage == Layout::kStagesA) stage = 0;
    if (++kb == g.num_kb) {
      kb = 0;
      NextTile(g, prefix, wg, warp, lane);
    }
  }
};

// Consumer warpgroup wg (0/1): rows wg*64 .. wg*64+63 of each tile.
template <int kKind, bool kTransW, int kCluster>
__device__ __forceinline__ void Consume(const Args& g, const int* prefix, char* smem, int wg, int tid) {
  using L = Layout;
  const uint32_t base = SmemAddr(smem);
  const int warp = tid >> 5, lane = tid & 31;
  Walker<kCluster> w(prefix, g);
  sm90_rg::Pipe<L::kStagesA> pa;
  sm90_rg::Pipe<L::kStagesB> pb;
  float acc[128];
  ALoader<kCluster> loader(prefix, g);
  loader.Start(g, prefix, wg, warp, lane);
  for (int s = 0; s < L::kStagesA; ++s) loader.Issue(g, prefix, base, wg, warp, lane);  // fill every stage
  int walked = 0;
  for (int t = w.first; t < w.total; t += w.step) {
    Tile tile;
    w.Decode(g, prefix, t, tile);
    // y rows this lane writes. fp32 y: the accumulator fragment rows lane/4 and lane/4 + 8,
    // looked up here; 16-bit y (staged): rows lane/8 + 4i of the warp's 16, looked up in the
    // epilogue (measured: 1-1.5 % faster for 16-bit types, 1 % slower for tf32; loads still
    // in flight at a tile's first wgmma seem to hold it back: docs/notes/sm90_grouped.md, run 23).
    const int wrow = tile.m0 + wg * 64 + warp * 16;
    int rows[4];
    if constexpr (kKind == kTf32) {
      rows[0] = AssignmentOf(g, tile, wrow + (lane >> 2));
      rows[1] = AssignmentOf(g, tile, wrow + (lane >> 2) + 8);
    }
    // Warpgroup-uniform: none of its 64 rows is listed -> no math (its stores are skipped too).
    const bool math = tile.m0 + wg * 64 < tile.live;
    if ((g.diag & kDiagLag) && !math && wg == 1 && warp != 0) {
      __nanosleep(10000);
      __nanosleep(10000);
    }
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    int prev_a = -1, prev_b = -1;
    for (int kb = 0; kb < g.num_kb; ++kb) {
      sm90_rg::MbarWait(base + L::kFullA + (wg * L::kStagesA + pa.stage) * 8, pa.phase);
      sm90_rg::MbarWait(base + L::kFullB + pb.stage * 8, pb.phase);
      if (walked == 0 && kb == 0 && wg == 0 && tid == 0) FwdStamp(g, 21);
      if (math) {
        // cp.async writes are generic-proxy writes that wgmma reads through the async proxy.
        sm90_rg::FenceProxyAsync();
        const uint32_t sa = base + L::kAOffset + pa.stage * kStageABytes + wg * (64 * kBKBytes);
        const uint32_t sb = base + L::kBOffset + pb.stage * kStageBBytes;
        const uint64_t da = sm90_rg::MakeDesc(sa, 16, 1024);
        const uint64_t db = kTransW ? sm90_rg::MakeDesc(sb, 16, 1024) : sm90_rg::MakeDesc(sb, 8192, 1024);
        sm90_rg::WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          // A: +32 bytes of K per step inside the swizzle row. B: the same when K-major;
          // when N-major, +16 K rows = 2048 bytes.
          const uint64_t a_step = static_cast<uint64_t>(kk * 32) >> 4;
          const uint64_t b_step = static_cast<uint64_t>(kTransW ? kk * 32 : kk * 2048) >> 4;
          sm90_rg::Mma<kKind, kTransW>(acc, da + a_step, db + b_step);
        }
        sm90_rg::WgmmaCommit();
        sm90_rg::WgmmaWait<1>();
      }
      // The previous step's stage is free: refill its A, release its B. Every warp releases
      // B for itself: a warpgroup without rows in the tile skips its wgmma, so nothing keeps
      // its warps in step, and one release per warpgroup let the stage be refilled before a
      // late warp had waited on it (that warp then waited on the wrong phase: a hang).
      if (prev_a >= 0) loader.Issue(g, prefix, base, wg, warp, lane);
      if (prev_a >= 0 && lane == 0) sm90_rg::ArriveEveryCta<kCluster>(base + L::kEmptyB + prev_b * 8);
      prev_a = pa.stage, prev_b = pb.stage;
      pa.Next(), pb.Next();
    }
    sm90_rg::WgmmaWait<0>();
    sm90_rg::FenceOperands(acc);
    if (g.relu) {  // uniform branch; 128 FMNMX per thread
#pragma unroll
      for (int i = 0; i < 128; ++i) acc[i] = ActivateT<static_cast<int>(Activation::kRelu)>(acc[i]);
    }
    if (lane == 0) sm90_rg::ArriveEveryCta<kCluster>(base + L::kEmptyB + prev_b * 8);

    // Epilogue. The thread holds cols n0 + 8j + 2(lane%4) + {0,1} of fragment rows lane/4
    // (acc[4j], acc[4j+1]) and lane/4 + 8 (acc[4j+2], acc[4j+3]).
    char* y_b = g.y + static_cast<int64_t>(tile.b) * g.y_batch_bytes;
    if (math && !(g.diag & kDiagNoStore)) {
      if constexpr (kKind == kTf32) {
        // fp32 y: 8-byte stores straight from registers.
        char* p0 = rows[0] >= 0 ? y_b + rows[0] * g.y_row_bytes : nullptr;
        char* p1 = rows[1] >= 0 ? y_b + rows[1] * g.y_row_bytes : nullptr;
        const int col0 = tile.n0 + 2 * (lane & 3);
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          const int col = col0 + 8 * j;
          if (col < g.F) {
            const int64_t off = static_cast<int64_t>(col) * 4;
            if (p0) *reinterpret_cast<float2*>(p0 + off) = make_float2(acc[4 * j], acc[4 * j + 1]);
            if (p1) *reinterpret_cast<float2*>(p1 + off) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
          }
        }
      } else {
        // 16-bit y: through the warp's 16 rows of the A stage freed last (128 B rows, the
        // 16-byte chunk XOR-swizzled by row % 8), 64 columns at a time, then 16-byte stores
        // (8 lanes cover one row's 128 contiguous bytes).
        const uint32_t stage_s =
            base + L::kAOffset + prev_a * kStageABytes + wg * (64 * kBKBytes) + warp * (16 * kBKBytes);
#pragma unroll
        for (int i = 0; i < 4; ++i) rows[i] = AssignmentOf(g, tile, wrow + (lane >> 3) + 4 * i);
        char* p[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) p[i] = rows[i] >= 0 ? y_b + rows[i] * g.y_row_bytes : nullptr;
        const int fr = lane >> 2, fq = lane & 3;
#pragma unroll
        for (int ch = 0; ch < 4; ++ch) {
          if (tile.n0 + 64 * ch >= g.F) break;
          __syncwarp();  // the previous chunk's reads are done
#pragma unroll
          for (int jj = 0; jj < 8; ++jj) {
            const int j = ch * 8 + jj;
            const uint32_t o0 = fr * kBKBytes + ((jj ^ (fr & 7)) << 4) + fq * 4;
            const uint32_t o1 = (fr + 8) * kBKBytes + ((jj ^ ((fr + 8) & 7)) << 4) + fq * 4;
            asm volatile("st.shared.b32 [%0], %1;" ::"r"(stage_s + o0),
                         "r"(sm90_rg::Pack2<kKind>(acc[4 * j], acc[4 * j + 1]))
                         : "memory");
            asm volatile("st.shared.b32 [%0], %1;" ::"r"(stage_s + o1),
                         "r"(sm90_rg::Pack2<kKind>(acc[4 * j + 2], acc[4 * j + 3]))
                         : "memory");
          }
          __syncwarp();
          const int col = tile.n0 + 64 * ch + 8 * (lane & 7);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int r = (lane >> 3) + 4 * i;
            const uint4 v = sm90_rg::LdShared16(stage_s + r * kBKBytes + (((lane & 7) ^ (r & 7)) << 4));
            if (p[i] && col < g.F) *reinterpret_cast<uint4*>(p[i] + static_cast<int64_t>(col) * 2) = v;
          }
        }
      }
    }
    if constexpr (kKind != kTf32) __syncwarp();  // the warp's staging reads are done before its refill lands there
    loader.Issue(g, prefix, base, wg, warp, lane);
    if (wg == 0 && tid == 0 && walked < 19) FwdStamp(g, 2 + walked);
    ++walked;
  }
  if (wg == 0 && tid == 0) FwdStamp(g, 22, walked), FwdStamp(g, 23);
  sm90_rg::CpAsyncWaitAll();
}

// kCluster: CTAs per cluster along the row tiles of one expert (1 or 2; B multicast when 2).
template <int kKind, bool kTransW, int kCluster>
__global__ void __launch_bounds__(kThreads, 1)
    GroupedGemmKernel(const __grid_constant__ CUtensorMap map_w, const Args g) {
  static_assert(kKind != kTf32 || kTransW, "tf32 wgmma needs K-major W (trans_w)");
  static_assert(kCluster == 1 || kCluster == 2, "cluster of 1 or 2 CTAs");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using L = Layout;
  extern __shared__ __align__(16) char smem_raw[];
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  int* prefix = reinterpret_cast<int*>(smem + L::kPrefixOffset);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    const uint32_t base = SmemAddr(smem);
    for (int s = 0; s < L::kStagesA; ++s) {
      sm90_rg::MbarInit(base + L::kFullA + s * 8, 128);                  // warpgroup 0's cp.async (noinc)
      sm90_rg::MbarInit(base + L::kFullA + (L::kStagesA + s) * 8, 128);  // warpgroup 1's
    }
    for (int s = 0; s < L::kStagesB; ++s) {
      sm90_rg::MbarInit(base + L::kFullB + s * 8, 1);              // the TMA lane (+ bytes)
      sm90_rg::MbarInit(base + L::kEmptyB + s * 8, 8 * kCluster);  // lane 0 of every consumer warp of the cluster
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_w)) : "memory");
  }
  if (threadIdx.x == 0) FwdStamp(g, 0);
  BuildPrefix<kCluster>(g, prefix, reinterpret_cast<int*>(smem + L::kScanOffset));
  if constexpr (kCluster == 1) {
    __syncthreads();
    if (threadIdx.x == 0) FwdStamp(g, 1);
  } else {
    sm90_rg::ClusterSync();  // the peers' barriers are initialized before any multicast or remote arrive
  }
  if (warp < 4) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
    if (warp == 2) {
      LoadB<kKind, kTransW, kCluster>(g, prefix, &map_w, smem, lane);
    } else {
      ZeroFill zf(warp == 3 ? 2 : warp, 3);  // warps 0, 1, 3
      while (zf.Next(g, lane)) {
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
    const int wg = (warp >> 2) - 1;
    Consume<kKind, kTransW, kCluster>(g, prefix, smem, wg, threadIdx.x - 128 * (wg + 1));
  }
  // No CTA may leave while a peer can still multicast into it or arrive on its barriers.
  if constexpr (kCluster > 1) {
    __syncwarp();
    sm90_rg::ClusterSync();
  }
#endif
}

}  // namespace sm90_grouped
}  // namespace pit
