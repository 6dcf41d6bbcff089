// The generic kernels of the MoE grouped products (docs/kernels.md, "MoE"), built from
// the tile loaders and math engines of sparse_gemm_kernel.cuh (same shared-memory
// layouts, mma.sync for bf16/f16, exact FFMA for float32, the same two-stage pipeline).
//
// Grouped matmul: one block computes BM gathered assignment rows x BN columns of y.
//   The row tiles of group e are ceil(count_e / BM); a batch entry and column tile get
//   row_slots = ceil(A / BM) + E + 1 blocks, an upper bound on sum_e ceil(count_e / BM).
//   Block `slot` finds its (group, tile) from a block-wide prefix sum over the counts
//   and exits at once when the slot lies past the total. Rows: position p of the tile
//   is assignment a = lists[e][p], which reads src row a / row_div and writes y row a.
//   Group E (dropped) is scheduled like an expert and writes zeros.
// Grouped wgrad: one block computes a BM x BN tile (D x F) of dw[c, e]; its reduction
//   runs over the batch entries that sum into c, and for each over the expert's list
//   in BK-chunks (positions -> src rows a / row_div and dy rows a, through two small
//   shared tables per stage). Deterministic, no atomics; empty experts write zeros.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "cuda/kernels/device_utils.cuh"
#include "cuda/kernels/epilogue.cuh"
#include "cuda/kernels/sparse_gemm_kernel.cuh"

namespace pit {
namespace gemm {

// Everything a block needs; built by the host launchers (grouped_gemm.cu).
struct GroupedArgs {
  const void* src = nullptr;  // [src_batch, A / row_div, D]
  const void* w = nullptr;    // matmul: [w_batch, E, D, F] (or [.., E, F, D] with trans_w)
  const void* dy = nullptr;   // wgrad: [dy_batch, A, F]
  void* out = nullptr;        // matmul: y [batch, A, F]; wgrad: dw [dw_batch, E, D, F]
  const int32_t* lists = nullptr;   // [idx_batch, E+1, A]
  const int32_t* counts = nullptr;  // [idx_batch, E+1]
  int A = 0, D = 0, F = 0, E = 0, row_div = 1;
  int64_t src_stride = 0, w_stride = 0, dy_stride = 0;  // elements per batch entry
  int src_div = 1, w_div = 1, dy_div = 1, idx_div = 1;  // entry b reads src[b / src_div], ...
  int group = 1;      // wgrad: full-batch entries summed into one dw entry
  int row_slots = 0;  // matmul: row-tile slots per (batch entry, column tile)
  int blocks_m = 1, blocks_n = 1;
  bool src_vec = false, w_vec = false, dy_vec = false;  // 16-byte loads are aligned
  bool out_vec = false;                                 // kCV-wide stores are aligned
  bool relu = false;                                    // matmul: y = max(y, 0) before rounding
};

// Rounds the block's float32 accumulators once to T (after max(., 0) with `relu`) and
// stores them: local tile row r goes to out[row_of(r) * ld + n] (skipped when
// row_of(r) < 0), columns [n_lo, n_hi).
template <class Cfg, typename T, class Math, class RowOf>
__device__ __forceinline__ void StoreTile(const Math& math, typename Elem<T>::Word* out, int64_t ld, RowOf row_of,
                                          int n_lo, int n_hi, bool vec, bool relu = false) {
  using Word = typename Elem<T>::Word;
  auto act = [relu](float v) { return relu ? ActivateT<static_cast<int>(Activation::kRelu)>(v) : v; };
  auto at = [&](int row, int n) -> Word& { return out[static_cast<int64_t>(row) * ld + n]; };
  if constexpr (Cfg::kMma) {
    math.ForEachPair(row_of, n_lo, [&](int row, int n, float v0, float v1) {
      StorePair<T>(&at(row, n), 1, vec, n, n_hi, act(v0), act(v1));  // vec: ld even, n even
    });
  } else {
    math.ForEachQuad(row_of, n_lo, [&](int row, int n, float v0, float v1, float v2, float v3) {
      StoreQuad<T>(&at(row, n), 1, vec, n, n_hi, act(v0), act(v1), act(v2), act(v3));  // vec: ld % 4 == 0, n % 4 == 0
    });
  }
}

// kBK: W is stored [F, D] (trans_w), i.e. K-contiguous along the reduction.
template <class Cfg, typename T, bool kBK>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) GroupedMatmulKernel(const GroupedArgs g) {
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, kThreads = Cfg::kThreads;
  using Word = typename Elem<T>::Word;
  using S = std::conditional_t<Cfg::kMma, uint16_t, float>;
  using LoaderA = TileLoader<Cfg, T, true, BM>;  // src rows [.., D]: K-contiguous
  using LoaderB = TileLoader<Cfg, T, kBK, BN>;
  using Math = std::conditional_t<Cfg::kMma, MmaMath<Cfg, T, true, kBK>, SimtMath<Cfg>>;
  static_assert(!Cfg::kMma || sizeof(T) == 2, "tensor cores for 16-bit operands only");

  __shared__ __align__(16) S s_a[2][LoaderA::Tile::kSize];
  __shared__ __align__(16) S s_b[2][LoaderB::Tile::kSize];
  __shared__ int s_arow[BM];  // assignment (y row) of each tile row, or -1
  __shared__ int64_t s_scan[kThreads / 32];
  __shared__ int s_found[2];  // (group, tile) of this block's slot
  const int tid = static_cast<int>(threadIdx.x);

  // 1. (batch entry, slot, column tile) -> (group, row tile); all block-uniform.
  const int per_b = g.row_slots * g.blocks_n;
  const int bid = static_cast<int>(blockIdx.x);
  const int b = bid / per_b;
  const int slot = (bid - b * per_b) / g.blocks_n;
  const int ni = bid - b * per_b - slot * g.blocks_n;
  const int G = g.E + 1;
  const int64_t ie = b / g.idx_div;
  const int32_t* counts = g.counts + ie * G;
  if (tid == 0) s_found[0] = -1;  // ordered before the writes below by the scan's barriers
  int64_t before = 0;             // row tiles of the groups already scanned
  for (int g0 = 0; g0 < G; g0 += kThreads) {
    const int grp = g0 + tid;
    const int64_t tiles = grp < G ? (LiveCount(counts, grp, g.A) + BM - 1) / BM : 0;
    int64_t total;
    // 64 bits: tile counts of garbage counts can exceed 2^31 and must not wrap. s_scan is
    // rewritten by the next pass only after the barrier below.
    const int64_t first = before + BlockExclusiveSumOnce<kThreads>(tiles, s_scan, &total);
    if (slot >= first && slot < first + tiles) {  // exactly one thread of the block, at most
      s_found[0] = grp;
      s_found[1] = static_cast<int>(slot - first);
    }
    __syncthreads();
    if (s_found[0] >= 0) break;
    before += total;
  }
  const int e = s_found[0];
  if (e < 0) return;  // past the total row tiles: nothing to do
  const int64_t p0 = static_cast<int64_t>(s_found[1]) * BM;
  const int n_e = LiveCount(counts, e, g.A);
  const int32_t* list = g.lists + (ie * G + e) * static_cast<int64_t>(g.A);
  const int n_lo = ni * BN, n_hi = min(g.F, n_lo + BN);
  for (int r = tid; r < BM; r += kThreads) {
    int a = -1;
    if (p0 + r < n_e) {
      const int v = __ldg(list + p0 + r);
      if (v >= 0 && v < g.A) a = v;  // a hand-written index may hold other ids: skip them
    }
    s_arow[r] = a;
  }
  __syncthreads();

  // 2. K loop over D (group E: no product, its rows are written as zeros).
  Math math;
  math.Zero();
  const int nk = e < g.E ? (g.D + BK - 1) / BK : 0;
  if (nk > 0) {
    LoaderA la;
    LoaderB lb;
    const int ldb = kBK ? g.D : g.F;
    la.InitRows([&](int line) { const int a = s_arow[line]; return a >= 0 ? a / g.row_div : -1; }, g.D);
    lb.InitRows([&](int line) { return n_lo + line < n_hi ? n_lo + line : -1; }, ldb);
    const Word* A = static_cast<const Word*>(g.src) + static_cast<int64_t>(b / g.src_div) * g.src_stride;
    const Word* B = static_cast<const Word*>(g.w) + static_cast<int64_t>(b / g.w_div) * g.w_stride +
                    static_cast<int64_t>(e) * g.D * g.F;
    la.template Load<false>(A, g.D, g.D, 0, nullptr, g.src_vec, 0, 0);
    lb.template Load<false>(B, ldb, g.D, 0, nullptr, g.w_vec, n_lo, n_hi);
    la.Store(s_a[0]);
    lb.Store(s_b[0]);
    __syncthreads();
    for (int kc = 0; kc < nk; ++kc) {
      const int s = kc & 1;
      const bool has_next = kc + 1 < nk;
      if (has_next) {  // global loads of the next chunk overlap this chunk's math
        la.template Load<false>(A, g.D, g.D, kc + 1, nullptr, g.src_vec, 0, 0);
        lb.template Load<false>(B, ldb, g.D, kc + 1, nullptr, g.w_vec, n_lo, n_hi);
      }
      math.Step(s_a[s], s_b[s]);
      if (has_next) {  // the other stage was last read before the previous barrier
        la.Store(s_a[s ^ 1]);
        lb.Store(s_b[s ^ 1]);
      }
      __syncthreads();
    }
  }

  // 3. Scatter the rows to y[b, a].
  Word* Y = static_cast<Word*>(g.out) + static_cast<int64_t>(b) * g.A * g.F;
  StoreTile<Cfg, T>(math, Y, g.F, [&](int r) { return s_arow[r]; }, n_lo, n_hi, g.out_vec, g.relu);
}

// Position in the reduction of a wgrad block: batch entry j of its group, chunk kc of
// the expert's list there (entries with an empty list are skipped).
struct ListChunk {
  int j = -1, kc = 0, nk = 0;
  bool valid = true;
};

template <class Cfg, typename T>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) GroupedWgradKernel(const GroupedArgs g) {
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK;
  using Word = typename Elem<T>::Word;
  using S = std::conditional_t<Cfg::kMma, uint16_t, float>;
  using LoaderA = TileLoader<Cfg, T, false, BM>;  // src^T: stored [rows = K][D = M]
  using LoaderB = TileLoader<Cfg, T, false, BN>;  // dy: stored [rows = K][F = N]
  using Math = std::conditional_t<Cfg::kMma, MmaMath<Cfg, T, false, false>, SimtMath<Cfg>>;
  static_assert(!Cfg::kMma || sizeof(T) == 2, "tensor cores for 16-bit operands only");

  __shared__ __align__(16) S s_a[2][LoaderA::Tile::kSize];
  __shared__ __align__(16) S s_b[2][LoaderB::Tile::kSize];
  __shared__ int s_srow[2][BK];  // per stage: src row of each chunk position, or -1
  __shared__ int s_dyrow[2][BK];  // per stage: dy row (the assignment), or -1
  const int tid = static_cast<int>(threadIdx.x);

  // 1. This block's tile: dw entry c, expert e, rows [m_lo, m_hi) of D, cols [n_lo, n_hi) of F.
  const int per_e = g.blocks_m * g.blocks_n;
  const int per_c = g.E * per_e;
  const int bid = static_cast<int>(blockIdx.x);
  const int c = bid / per_c;
  const int e = (bid - c * per_c) / per_e;
  const int mi = (bid - c * per_c - e * per_e) / g.blocks_n;
  const int ni = bid - c * per_c - e * per_e - mi * g.blocks_n;
  const int m_lo = mi * BM, m_hi = min(g.D, m_lo + BM);
  const int n_lo = ni * BN, n_hi = min(g.F, n_lo + BN);
  const int G = g.E + 1;

  auto list_of = [&](int j) -> int64_t { return static_cast<int64_t>((c * g.group + j) / g.idx_div) * G + e; };
  auto next_entry = [&](ListChunk& it) {
    do {
      if (++it.j >= g.group) {
        it.valid = false;
        return;
      }
      it.nk = (LiveCount(g.counts, list_of(it.j), g.A) + BK - 1) / BK;
    } while (it.nk == 0);
    it.kc = 0;
  };
  auto advance = [&](ListChunk& it) {
    if (!it.valid) return;
    if (++it.kc < it.nk) return;
    next_entry(it);
  };
  auto fill_rows = [&](int stage, const ListChunk& it) {
    if (tid >= BK) return;
    const int64_t list = list_of(it.j);
    const int p = it.kc * BK + tid;
    int a = -1;
    if (p < LiveCount(g.counts, list, g.A)) {
      const int v = __ldg(g.lists + list * g.A + p);
      if (v >= 0 && v < g.A) a = v;
    }
    s_dyrow[stage][tid] = a;
    s_srow[stage][tid] = a >= 0 ? a / g.row_div : -1;
  };

  ListChunk cur;
  next_entry(cur);
  ListChunk nxt = cur;
  advance(nxt);
  if (cur.valid) {
    fill_rows(0, cur);
    if (nxt.valid) fill_rows(1, nxt);
  }
  __syncthreads();

  LoaderA la;
  LoaderB lb;
  la.InitRows([](int) { return -1; }, g.D);  // not K-contiguous: rows come from the tables
  lb.InitRows([](int) { return -1; }, g.F);
  auto load = [&](const ListChunk& it, int stage) {
    const int b = c * g.group + it.j;
    const Word* A = static_cast<const Word*>(g.src) + static_cast<int64_t>(b / g.src_div) * g.src_stride;
    const Word* B = static_cast<const Word*>(g.dy) + static_cast<int64_t>(b / g.dy_div) * g.dy_stride;
    la.template Load<true>(A, g.D, 0, it.kc, s_srow[stage], g.src_vec, m_lo, m_hi);
    lb.template Load<true>(B, g.F, 0, it.kc, s_dyrow[stage], g.dy_vec, n_lo, n_hi);
  };

  // 2. Two-stage pipeline over the chunks (as in SparseGemmKernel).
  Math math;
  math.Zero();
  if (cur.valid) {
    load(cur, 0);
    la.Store(s_a[0]);
    lb.Store(s_b[0]);
    __syncthreads();
    int s = 0;  // stage (and tables) of the chunk being multiplied
    for (;;) {
      const bool has_next = nxt.valid;
      if (has_next) load(nxt, s ^ 1);
      math.Step(s_a[s], s_b[s]);
      if (has_next) {
        la.Store(s_a[s ^ 1]);
        lb.Store(s_b[s ^ 1]);
      }
      ListChunk after = nxt;
      advance(after);
      // The chunk after next reuses this stage's tables: their last reader (the load of
      // the current chunk) finished before the previous barrier.
      if (after.valid) fill_rows(s, after);
      __syncthreads();
      if (!has_next) break;
      s ^= 1;
      nxt = after;
    }
  }

  // 3. dw[c, e] rows [m_lo, m_hi): every element is written (zeros for an empty expert).
  Word* W = static_cast<Word*>(g.out) + (static_cast<int64_t>(c) * g.E + e) * g.D * g.F;
  StoreTile<Cfg, T>(math, W, g.F, [&](int r) { return m_lo + r < m_hi ? m_lo + r : -1; }, n_lo, n_hi, g.out_vec);
}

}  // namespace gemm
}  // namespace pit
