// Online sparsity index construction: one pass over x, one slot per micro-tile in
// each list, order free (so no sort and no second pass over x).
//
// Two launches: a tiny init kernel (zeroes the counters, fills -1 where a list is not
// a full permutation) and the pass itself. The pass cuts x into items (a block's, or in
// the walk and rows modes a warp's: batch entry, one or more tile rows, a chunk of tile
// columns), reads each with 16-byte loads, many in flight per thread, decides which
// tiles are live, and numbers them with one scan: one atomicAdd per item reserves the
// slots of all its live tiles (and one more its dead tiles, which fill the flat list
// from the back).
//
// Ways to decide liveness (16-byte aligned rows unless noted):
//  - narrow walk, when a 16-byte vector covers whole tiles of 8 or more rows (32x1): a
//    warp ORs 32 column vectors down one tile row and numbers its tiles with warp sums
//    and ballots and one atomicAdd per list, no shared memory and no block barrier;
//  - register mode, the same tiles with fewer rows (1x8): each thread ORs its column
//    vectors, a block-wide scan numbers them;
//  - rows mode when tiles span whole rows (the M axis's token rows): a warp per few
//    tiles, no shared memory;
//  - wide walk, when tiles are whole vectors wide, at most 32 of them (32x64, 1x64): a
//    warp walks a strip of tiles down one tile column and numbers them like the narrow
//    walk;
//  - shared mode otherwise (unaligned or very wide tiles): flags in shared memory.
#include <algorithm>
#include <cstdint>

#include "cuda/kernels/device_utils.cuh"
#include "cuda/kernels/index.h"

namespace pit {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxFlags = 4096;          // shared-mode tiles per item
constexpr int64_t kTargetElems = 32768;  // elements one item reads, about
constexpr int kMaxBits = 64;             // register-mode tiles per thread

// Bits of a 32-bit word that make one of its elements non-zero (sign bits excluded:
// -0 counts as zero, NaN as live).
template <typename Word>
__device__ __forceinline__ constexpr uint32_t ValueBits() {
  if constexpr (sizeof(Word) == 1) return 0xffffffffu;
  if constexpr (sizeof(Word) == 2) return 0x7fff7fffu;
  return 0x7fffffffu;
}

template <typename Word>
__device__ __forceinline__ bool NonZero(Word w) {
  if constexpr (sizeof(Word) == 1) return w != 0;
  if constexpr (sizeof(Word) == 2) return (w & 0x7fffu) != 0;
  return (w & 0x7fffffffu) != 0;
}

template <typename Word>
__device__ __forceinline__ uint4 LoadMasked(const Word* ptr) {
  uint4 v = __ldg(reinterpret_cast<const uint4*>(ptr));
  constexpr uint32_t m = ValueBits<Word>();
  v.x &= m, v.y &= m, v.z &= m, v.w &= m;
  return v;
}

// Whether any element in [first, first + n) of the vector `v` (V elements) is non-zero.
template <typename Word>
__device__ __forceinline__ bool AnyIn(const uint4& v, int first, int n) {
  const Word* w = reinterpret_cast<const Word*>(&v);
  bool any = false;
#pragma unroll
  for (int e = 0; e < 16 / static_cast<int>(sizeof(Word)); ++e) any |= (e >= first && e < first + n && w[e] != 0);
  return any;
}

// Bit t set when tile t of the vector (tiles of w elements) holds a non-zero.
template <typename Word>
__device__ __forceinline__ uint32_t TileBits(const uint4& v, int w, int tpv) {
  uint32_t bits = 0;
  for (int t = 0; t < tpv; ++t)
    if (AnyIn<Word>(v, t * w, w)) bits |= 1u << t;
  return bits;
}

// Sets the n elements of every entry's array (entry b's at `at(b)`) to v. Batched, the
// entries are one run of batch * n elements; split, element i % n of entry i / n (one
// loop over all entries: a loop per entry measured twice as slow, 7 against 3.4 us for 12
// entries of 1152 tiles on the H200).
template <typename At>
__device__ __forceinline__ void Fill(const IndexParams& p, At at, int64_t n, int32_t v, int64_t start, int64_t stride) {
  if (!p.split) {
    int32_t* a = at(0);
    for (int64_t i = start; i < p.batch * n; i += stride) a[i] = v;
  } else {
    for (int64_t i = start; i < p.split * n; i += stride) at(i / n)[i % n] = v;
  }
}

__global__ void InitKernel(IndexParams p) {
  const int64_t start = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t per_matrix = p.tile_rows * p.tile_cols;
  for (int64_t i = start; i < p.batch; i += stride) p.dead[i] = 0;
  Fill(p, [&](int64_t b) { return p.Count(b); }, 1, 0, start, stride);
  if (!p.full_capacity()) Fill(p, [&](int64_t b) { return p.Tiles(b); }, p.capacity, -1, start, stride);
  if (p.row_tiles) {
    Fill(p, [&](int64_t b) { return p.RowCount(b); }, p.tile_rows, 0, start, stride);
    Fill(p, [&](int64_t b) { return p.RowTiles(b); }, per_matrix, -1, start, stride);
  }
  if (p.col_tiles) {
    Fill(p, [&](int64_t b) { return p.ColCount(b); }, p.tile_cols, 0, start, stride);
    Fill(p, [&](int64_t b) { return p.ColTiles(b); }, per_matrix, -1, start, stride);
  }
}

// Geometry of one launch, fixed on the host.
struct Plan {
  bool reg_mode;
  int vpt;            // register mode: vectors per thread along the columns
  int chunk_tiles;    // tile columns per item
  int item_rows;      // tile rows per item (shared mode; 1 in register mode)
  int64_t num_chunks, row_groups, items;
};

// Numbers the tiles one block decided on and writes them to every list.
// `for_each(fn)` calls fn(tile_row, tile_col, live) for each of this thread's tiles.
template <typename ForEach>
__device__ __forceinline__ void Compact(const IndexParams& p, int64_t b, int64_t first_row, bool one_row,
                                        ForEach for_each, int* s_scan, int* s_base) {
  const bool record_dead = p.full_capacity();
  int n_live = 0, n_dead = 0;
  for_each([&](int64_t, int64_t, bool live) { live ? ++n_live : ++n_dead; });
  if (!record_dead) n_dead = 0;
  int total = 0;
  // Live and dead counts scanned together: 16 bits each (an item has < 2^16 tiles).
  const int excl = BlockExclusiveSum<kThreads>(n_live | (n_dead << 16), s_scan, &total);
  const int live_total = total & 0xffff, dead_total = total >> 16;
  if (threadIdx.x == 0) {
    s_base[0] = live_total ? atomicAdd(p.Count(b), live_total) : 0;
    s_base[1] = dead_total ? atomicAdd(p.dead + b, dead_total) : 0;
    s_base[2] = (p.row_tiles && one_row && live_total) ? atomicAdd(p.RowCount(b) + first_row, live_total)
                                                       : 0;
  }
  __syncthreads();
  int li = excl & 0xffff, di = excl >> 16;
  const int64_t base_live = s_base[0], base_dead = s_base[1], base_row = s_base[2];
  for_each([&](int64_t tr, int64_t tc, bool live) {
    const int32_t id = static_cast<int32_t>(tr * p.tile_cols + tc);
    if (!live) {
      if (record_dead) p.Tiles(b)[p.capacity - 1 - (base_dead + di)] = -1 - id;
      ++di;
      return;
    }
    const int64_t slot = base_live + li;
    if (slot < p.capacity) p.Tiles(b)[slot] = id;
    if (p.row_tiles) {
      const int64_t rslot = one_row ? base_row + li : atomicAdd(p.RowCount(b) + tr, 1);
      p.RowTiles(b)[tr * p.tile_cols + rslot] = static_cast<int32_t>(tc);
    }
    if (p.col_tiles) p.ColTiles(b)[tc * p.tile_rows + atomicAdd(p.ColCount(b) + tc, 1)] = static_cast<int32_t>(tr);
    ++li;
  });
}

// Register mode: V % tile_w == 0, rows 16-byte aligned. Thread t owns vectors
// t, t + kThreads, ... (vpt of them) of the item's column chunk, across its tile row.
template <typename Word>
__global__ void __launch_bounds__(kThreads) IndexRegKernel(IndexParams p, Plan plan) {
  constexpr int V = 16 / sizeof(Word);
  __shared__ int s_scan[kThreads / 32];
  __shared__ int s_base[3];
  const Word* x = static_cast<const Word*>(p.x);
  const int w = static_cast<int>(p.tile_w);
  const int tiles_per_vec = V / w;
  const int64_t chunk_cols = int64_t{kThreads} * V * plan.vpt;

  for (int64_t item = blockIdx.x; item < plan.items; item += gridDim.x) {
    const int64_t cc = item % plan.num_chunks;
    const int64_t tr = (item / plan.num_chunks) % p.tile_rows;
    const int64_t b = item / (plan.num_chunks * p.tile_rows);
    const int64_t r0 = tr * p.tile_h;
    const int nrows = static_cast<int>(std::min<int64_t>(p.tile_h, p.rows - r0));
    const Word* base = x + (b * p.rows + r0) * p.cols + cc * chunk_cols;
    const int64_t cols_left = p.cols - cc * chunk_cols;  // multiple of V

    uint64_t live = 0, valid = 0;
    for (int u = 0; u < plan.vpt; ++u) {
      const int64_t col = (threadIdx.x + int64_t{u} * kThreads) * V;
      if (col >= cols_left) break;
      uint4 acc = make_uint4(0, 0, 0, 0);
#pragma unroll 8
      for (int i = 0; i < nrows; ++i) {
        const uint4 v = LoadMasked(base + i * p.cols + col);
        acc.x |= v.x, acc.y |= v.y, acc.z |= v.z, acc.w |= v.w;
      }
      for (int t = 0; t < tiles_per_vec; ++t) {
        const uint64_t bit = uint64_t{1} << (u * tiles_per_vec + t);
        valid |= bit;
        if (AnyIn<Word>(acc, t * w, w)) live |= bit;
      }
    }
    const int64_t tc_first = cc * chunk_cols / w;
    Compact(
        p, b, tr, true,
        [&](auto fn) {
          for (uint64_t rest = valid; rest; rest &= rest - 1) {
            const int q = __ffsll(static_cast<long long>(rest)) - 1;
            const int u = q / tiles_per_vec, t = q - u * tiles_per_vec;
            fn(tr, tc_first + (threadIdx.x + int64_t{u} * kThreads) * tiles_per_vec + t, (live >> q) & 1);
          }
        },
        s_scan, s_base);
    __syncthreads();  // s_base is rewritten by the next item
  }
}

// Shared mode: any tile shape. An item is item_rows tile rows x chunk_tiles tile
// columns; flags live in shared memory.
template <typename Word, bool kVec>
__global__ void __launch_bounds__(kThreads) IndexSharedKernel(IndexParams p, Plan plan, bool whole_vec_tile) {
  constexpr int V = kVec ? 16 / sizeof(Word) : 1;
  constexpr int kUnroll = 4;
  __shared__ uint8_t s_live[kMaxFlags];
  __shared__ int s_scan[kThreads / 32];
  __shared__ int s_base[3];
  const Word* x = static_cast<const Word*>(p.x);
  const int h = static_cast<int>(p.tile_h), w = static_cast<int>(p.tile_w);
  const int ct = plan.chunk_tiles;
  for (int t = threadIdx.x; t < plan.item_rows * ct; t += kThreads) s_live[t] = 0;
  __syncthreads();

  for (int64_t item = blockIdx.x; item < plan.items; item += gridDim.x) {
    const int64_t cc = item % plan.num_chunks;
    const int64_t rg = (item / plan.num_chunks) % plan.row_groups;
    const int64_t b = item / (plan.num_chunks * plan.row_groups);
    const int64_t tr0 = rg * plan.item_rows, tc0 = cc * ct;
    const int ntr = static_cast<int>(std::min<int64_t>(plan.item_rows, p.tile_rows - tr0));
    const int nct = static_cast<int>(std::min<int64_t>(ct, p.tile_cols - tc0));
    const int64_t r0 = tr0 * h, c0 = tc0 * w;
    const int nrows = static_cast<int>(std::min<int64_t>(int64_t{ntr} * h, p.rows - r0));
    const int ncols = static_cast<int>(std::min<int64_t>(p.cols, (tc0 + nct) * w) - c0);
    const int nvec = (ncols + V - 1) / V;  // exact in the vector case (cols % V == 0)
    const Word* base = x + (b * p.rows + r0) * p.cols + c0;
    const int64_t pairs = int64_t{nrows} * nvec;

    // 1. Mark live tiles: kUnroll independent loads in flight before any test.
    for (int64_t q0 = threadIdx.x; q0 < pairs; q0 += int64_t{kThreads} * kUnroll) {
      uint4 v[kUnroll];
      Word s[kUnroll];
      int flag_row[kUnroll], col[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int64_t q = q0 + int64_t{k} * kThreads;
        flag_row[k] = -1;
        if (q < pairs) {
          const int i = static_cast<int>(q / nvec), j = static_cast<int>(q - int64_t{i} * nvec);
          flag_row[k] = (i / h) * ct;
          col[k] = j * V;
          if constexpr (kVec) {
            v[k] = LoadMasked(base + int64_t{i} * p.cols + j * V);
          } else {
            s[k] = base[int64_t{i} * p.cols + j];
          }
        }
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        if (flag_row[k] < 0) continue;
        if constexpr (kVec) {
          if (whole_vec_tile) {
            if (v[k].x | v[k].y | v[k].z | v[k].w) s_live[flag_row[k] + col[k] / w] = 1;
          } else {
            const Word* words = reinterpret_cast<const Word*>(&v[k]);
#pragma unroll
            for (int e = 0; e < V; ++e)
              if (words[e]) s_live[flag_row[k] + (col[k] + e) / w] = 1;
          }
        } else {
          if (NonZero(s[k])) s_live[flag_row[k] + col[k] / w] = 1;
        }
      }
    }
    __syncthreads();

    // 2. Number and write them; clear the flags for the next item.
    Compact(
        p, b, tr0, ntr == 1,
        [&](auto fn) {
          for (int t = threadIdx.x; t < ntr * ct; t += kThreads) {
            const int ri = t / ct, ci = t - ri * ct;
            if (ci < nct) fn(tr0 + ri, tc0 + ci, s_live[t] != 0);
          }
        },
        s_scan, s_base);
    for (int t = threadIdx.x; t < ntr * ct; t += kThreads) s_live[t] = 0;
    __syncthreads();
  }
}

// Rows mode: tiles span whole rows (tile_cols == 1; e.g. the M axis's token rows), rows
// 16-byte aligned. A warp decides kWarpTiles consecutive tiles of one batch entry with
// kRowLoads independent 16-byte loads in flight per lane, no shared memory and no block
// barrier (the shared mode's per-item barrier and scan left its loads idle; see
// docs/notes/index_kernel.md), then numbers its live tiles with one atomicAdd per list.
//
// A live tile is usually live in its first bytes (a token row of activations), so the warp
// first probes the first 32 * kProbeLoads vectors of each of its tiles, all tiles' loads in
// flight together, and reads the rest only of the tiles still dead: at half the rows live
// the pass reads about half of x instead of all of it. A dead tile pays one more round
// trip, which the other warps' loads hide (no barrier waits on it).
constexpr int kWarpTiles = 4;
constexpr int kRowLoads = 16;
constexpr int kProbeLoads = 1;

template <typename Word>
__global__ void __launch_bounds__(kThreads) IndexRowsKernel(IndexParams p, int64_t groups_per_entry) {
  constexpr int V = 16 / sizeof(Word);
  const Word* x = static_cast<const Word*>(p.x);
  const int lane = threadIdx.x & 31;
  const int64_t nwarps = (int64_t{gridDim.x} * kThreads) >> 5;
  const int64_t groups = p.batch * groups_per_entry;
  const int nvec = static_cast<int>(p.cols / V);
  const bool record_dead = p.full_capacity();
  for (int64_t gi = (blockIdx.x * int64_t{kThreads} + threadIdx.x) >> 5; gi < groups; gi += nwarps) {
    const int64_t b = gi / groups_per_entry;
    const int64_t tr0 = (gi - b * groups_per_entry) * kWarpTiles;
    const int ntr = static_cast<int>(std::min<int64_t>(kWarpTiles, p.tile_rows - tr0));
    // The probe: the first vectors of each tile's first row.
    uint4 probe[kWarpTiles][kProbeLoads];
#pragma unroll
    for (int t = 0; t < kWarpTiles; ++t) {
      const Word* row = x + (b * p.rows + (tr0 + t) * p.tile_h) * p.cols;
#pragma unroll
      for (int k = 0; k < kProbeLoads; ++k) {
        const int j = lane + 32 * k;
        probe[t][k] = t < ntr && j < nvec ? LoadMasked(row + j * V) : make_uint4(0, 0, 0, 0);
      }
    }
    uint32_t live = 0;
#pragma unroll
    for (int t = 0; t < kWarpTiles; ++t) {
      uint32_t acc = 0;
#pragma unroll
      for (int k = 0; k < kProbeLoads; ++k) acc |= probe[t][k].x | probe[t][k].y | probe[t][k].z | probe[t][k].w;
      if (__any_sync(0xffffffffu, acc != 0)) live |= 1u << t;
    }
    // The rest, of the tiles the probe found dead (warp-uniform: `live` is).
    for (int t = 0; t < ntr; ++t) {
      if ((live >> t) & 1) continue;
      const int64_t r0 = (tr0 + t) * p.tile_h;
      const int nrows = static_cast<int>(std::min<int64_t>(p.tile_h, p.rows - r0));
      uint32_t acc = 0;
      for (int i = 0; i < nrows; ++i) {
        const Word* row = x + (b * p.rows + r0 + i) * p.cols;
        for (int j0 = lane + (i == 0 ? 32 * kProbeLoads : 0); j0 < nvec; j0 += 32 * kRowLoads) {
          uint4 v[kRowLoads];
#pragma unroll
          for (int k = 0; k < kRowLoads; ++k)
            v[k] = j0 + 32 * k < nvec ? LoadMasked(row + (j0 + 32 * k) * V) : make_uint4(0, 0, 0, 0);
#pragma unroll
          for (int k = 0; k < kRowLoads; ++k) acc |= v[k].x | v[k].y | v[k].z | v[k].w;
        }
      }
      if (__any_sync(0xffffffffu, acc != 0)) live |= 1u << t;
    }
    const int n_live = __popc(live), n_dead = record_dead ? ntr - n_live : 0;
    int base_live = 0, base_dead = 0, base_col = 0;
    if (lane == 0) {
      if (n_live) base_live = atomicAdd(p.Count(b), n_live);
      if (n_dead) base_dead = atomicAdd(p.dead + b, n_dead);
      if (p.col_tiles && n_live) base_col = atomicAdd(p.ColCount(b), n_live);  // the one tile column
    }
    base_live = __shfl_sync(0xffffffffu, base_live, 0);
    base_dead = __shfl_sync(0xffffffffu, base_dead, 0);
    base_col = __shfl_sync(0xffffffffu, base_col, 0);
    if (lane < ntr) {
      const int32_t id = static_cast<int32_t>(tr0 + lane);  // tile_cols == 1: the tile row
      const int below = __popc(live & ((1u << lane) - 1));
      if ((live >> lane) & 1) {
        const int64_t slot = base_live + below;
        if (slot < p.capacity) p.Tiles(b)[slot] = id;
        if (p.row_tiles) {  // each tile row holds its one tile
          p.RowTiles(b)[tr0 + lane] = 0;
          p.RowCount(b)[tr0 + lane] = 1;
        }
        if (p.col_tiles) p.ColTiles(b)[base_col + below] = id;
      } else if (record_dead) {
        p.Tiles(b)[p.capacity - 1 - (base_dead + lane - below)] = -1 - id;
      }
    }
  }
}

// The walk modes (docs/notes/index_kernel.md, "Walk modes"): each warp owns a unit of
// tiles whose loads it keeps in flight kWalkLoads at a time, decides them with warp
// reductions and numbers them with one atomicAdd per list; warps never wait for each
// other (the register and shared modes' block scan and barrier per item: 2.5-5x the read
// floor on the H200 for 32x1, 32x64 and 1x64 tiles of a 4096^2 matrix).
constexpr int kWalkLoads = 16;   // 16-byte loads in flight per lane

// Lane 0 reserves n_live slots in the flat list (and in one more list at `extra`, when
// given) and n_dead dead slots; every lane gets the bases.
__device__ __forceinline__ void ReserveWarpSlots(const IndexParams& p, int64_t b, int n_live, int n_dead,
                                                 int32_t* extra, int lane, int& base_live, int& base_dead,
                                                 int& base_extra) {
  base_live = base_dead = base_extra = 0;
  if (lane == 0) {
    if (n_live) base_live = atomicAdd(p.Count(b), n_live);
    if (n_dead) base_dead = atomicAdd(p.dead + b, n_dead);
    if (extra && n_live) base_extra = atomicAdd(extra, n_live);
  }
  base_live = __shfl_sync(0xffffffffu, base_live, 0);
  base_dead = __shfl_sync(0xffffffffu, base_dead, 0);
  base_extra = __shfl_sync(0xffffffffu, base_extra, 0);
}

// Narrow walk: V % tile_w == 0, tile_h >= 8. A unit is one tile row of one batch entry
// across 32 consecutive vectors, lane = vector (2 or 4 rows a load, i.e. more units of
// fewer loads each, measured slower: 32x1 bf16 4096^2 17.4 / 25.2 us against 14.7). V /
// tile_w tiles a vector, all in one tile row, so the row list takes one atomicAdd a unit.
template <typename Word>
__global__ void __launch_bounds__(kThreads) IndexNarrowWalkKernel(IndexParams p, int64_t chunks) {
  constexpr int V = 16 / sizeof(Word);
  const Word* x = static_cast<const Word*>(p.x);
  const int lane = threadIdx.x & 31;
  const int w = static_cast<int>(p.tile_w), tpv = V / w;
  const int64_t nvec = p.cols / V;
  const int64_t units = p.batch * p.tile_rows * chunks;
  const int64_t nwarps = (int64_t{gridDim.x} * kThreads) >> 5;
  const bool record_dead = p.full_capacity();
  for (int64_t u = (blockIdx.x * int64_t{kThreads} + threadIdx.x) >> 5; u < units; u += nwarps) {
    const int64_t cc = u % chunks;
    const int64_t tr = (u / chunks) % p.tile_rows;
    const int64_t b = u / (chunks * p.tile_rows);
    const int64_t r0 = tr * p.tile_h;
    const int nrows = static_cast<int>(std::min<int64_t>(p.tile_h, p.rows - r0));
    const int64_t cv = cc * 32 + lane;
    const bool col_ok = cv < nvec;
    const Word* base = x + (b * p.rows + r0) * p.cols + cv * V;
    uint4 acc = make_uint4(0, 0, 0, 0);
    if (col_ok) {
      int i = 0;
      for (; i + kWalkLoads <= nrows; i += kWalkLoads) {  // unpredicated
        uint4 v[kWalkLoads];
#pragma unroll
        for (int k = 0; k < kWalkLoads; ++k) v[k] = LoadMasked(base + int64_t{i + k} * p.cols);
#pragma unroll
        for (int k = 0; k < kWalkLoads; ++k) acc.x |= v[k].x, acc.y |= v[k].y, acc.z |= v[k].z, acc.w |= v[k].w;
      }
#pragma unroll 4
      for (; i < nrows; ++i) {
        const uint4 v = LoadMasked(base + int64_t{i} * p.cols);
        acc.x |= v.x, acc.y |= v.y, acc.z |= v.z, acc.w |= v.w;
      }
    }
    const uint32_t live = col_ok ? TileBits<Word>(acc, w, tpv) : 0u;
    const int n_live = __reduce_add_sync(0xffffffffu, __popc(live));
    const int n_dead = record_dead ? __reduce_add_sync(0xffffffffu, col_ok ? tpv : 0) - n_live : 0;
    int base_live, base_dead, base_row;
    ReserveWarpSlots(p, b, n_live, n_dead, p.row_tiles ? p.RowCount(b) + tr : nullptr, lane, base_live, base_dead,
                     base_row);
    // Tile t of every lane in one pass: consecutive slots across the lanes, so each pass's
    // stores are coalesced (the lists are order-free).
    const uint32_t below_me = (1u << lane) - 1;
    int done_live = 0, done_dead = 0;
    for (int t = 0; t < tpv; ++t) {
      const bool is_live = (live >> t) & 1;
      const uint32_t lb = __ballot_sync(0xffffffffu, is_live);
      const uint32_t db = __ballot_sync(0xffffffffu, col_ok && !is_live);
      const int64_t tc = cv * tpv + t;
      const int32_t id = static_cast<int32_t>(tr * p.tile_cols + tc);
      if (is_live) {
        const int li = done_live + __popc(lb & below_me);
        const int64_t slot = base_live + li;
        if (slot < p.capacity) p.Tiles(b)[slot] = id;
        if (p.row_tiles) p.RowTiles(b)[tr * p.tile_cols + base_row + li] = static_cast<int32_t>(tc);
        if (p.col_tiles) p.ColTiles(b)[tc * p.tile_rows + atomicAdd(p.ColCount(b) + tc, 1)] = static_cast<int32_t>(tr);
      } else if (col_ok && record_dead) {
        p.Tiles(b)[p.capacity - 1 - (base_dead + done_dead + __popc(db & below_me))] = -1 - id;
      }
      done_live += __popc(lb);
      done_dead += __popc(db);
    }
  }
}

// Wide walk: tile_w = wv vectors, wv dividing 32. A unit is a strip of up to
// 32 * kStripWords tiles down one tile column of one batch entry; the lanes cover 32 / wv
// rows x wv vectors a load. The flat and column lists take one atomicAdd a strip.
constexpr int kMaxStripWords = 4;

struct WideWalkPlan {
  int wv, strip;
  int64_t strips_per_col, units;
};

template <typename Word, int kStripWords>
__global__ void __launch_bounds__(kThreads) IndexWideWalkKernel(IndexParams p, WideWalkPlan plan) {
  constexpr int V = 16 / sizeof(Word);
  const Word* x = static_cast<const Word*>(p.x);
  const int lane = threadIdx.x & 31;
  const int rpl = 32 / plan.wv;  // rows a load
  const int lr = lane / plan.wv, lv = lane - lr * plan.wv;
  const int h = static_cast<int>(p.tile_h);
  const int64_t nvec = p.cols / V;
  const int64_t nwarps = (int64_t{gridDim.x} * kThreads) >> 5;
  const bool record_dead = p.full_capacity();
  for (int64_t u = (blockIdx.x * int64_t{kThreads} + threadIdx.x) >> 5; u < plan.units; u += nwarps) {
    const int64_t tc = u % p.tile_cols;
    const int64_t s = (u / p.tile_cols) % plan.strips_per_col;
    const int64_t b = u / (p.tile_cols * plan.strips_per_col);
    const int64_t tr0 = s * plan.strip;
    const int ntr = static_cast<int>(std::min<int64_t>(plan.strip, p.tile_rows - tr0));
    const int64_t r0 = tr0 * h;
    const int nrows = static_cast<int>(std::min<int64_t>(int64_t{ntr} * h, p.rows - r0));
    const int64_t cv = tc * plan.wv + lv;
    const bool col_ok = cv < nvec;
    const Word* base = x + (b * p.rows + r0) * p.cols + cv * V;
    uint32_t bits[kStripWords] = {};  // bit t of word q: a non-zero seen in the strip's tile 32 q + t
    if (col_ok) {
      for (int i0 = lr; i0 < nrows; i0 += rpl * kWalkLoads) {
        uint4 v[kWalkLoads];
#pragma unroll
        for (int k = 0; k < kWalkLoads; ++k) {
          const int i = i0 + rpl * k;
          v[k] = i < nrows ? LoadMasked(base + int64_t{i} * p.cols) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int k = 0; k < kWalkLoads; ++k) {
          // A branch per load (not a select): ptxas then issues all the loads first.
          if (v[k].x | v[k].y | v[k].z | v[k].w) {
            const int t = (i0 + rpl * k) / h;
#pragma unroll
            for (int q = 0; q < kStripWords; ++q) bits[q] |= (t >> 5) == q ? 1u << (t & 31) : 0u;
          }
        }
      }
    }
    uint32_t live[kStripWords];
    int n_live = 0;
#pragma unroll
    for (int q = 0; q < kStripWords; ++q) {
      live[q] = __reduce_or_sync(0xffffffffu, bits[q]);
      n_live += __popc(live[q]);
    }
    const int n_dead = record_dead ? ntr - n_live : 0;
    int base_live, base_dead, base_col;
    ReserveWarpSlots(p, b, n_live, n_dead, p.col_tiles ? p.ColCount(b) + tc : nullptr, lane, base_live, base_dead,
                     base_col);
    int before = 0;  // live tiles in the words before q
#pragma unroll
    for (int q = 0; q < kStripWords; ++q) {
      const int t = 32 * q + lane;
      if (t < ntr) {
        const int64_t tr = tr0 + t;
        const int32_t id = static_cast<int32_t>(tr * p.tile_cols + tc);
        const int below = before + __popc(live[q] & ((1u << lane) - 1));
        if ((live[q] >> lane) & 1) {
          const int64_t slot = base_live + below;
          if (slot < p.capacity) p.Tiles(b)[slot] = id;
          if (p.row_tiles)
            p.RowTiles(b)[tr * p.tile_cols + atomicAdd(p.RowCount(b) + tr, 1)] = static_cast<int32_t>(tc);
          if (p.col_tiles) p.ColTiles(b)[tc * p.tile_rows + base_col + below] = static_cast<int32_t>(tr);
        } else if (record_dead) {
          p.Tiles(b)[p.capacity - 1 - (base_dead + t - below)] = -1 - id;
        }
      }
      before += __popc(live[q]);
    }
  }
}

// PIT_JAX_INDEX_WALK=0 turns the walk modes off (the register and shared modes run):
// for A/B timing.
bool WalkModesOn() {
  static const bool on = EnvFlag("PIT_JAX_INDEX_WALK", true);
  return on;
}

int64_t Gcd(int64_t a, int64_t b) { return b == 0 ? a : Gcd(b, a % b); }

template <typename Word>
cudaError_t LaunchTyped(const IndexParams& p, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(Word);
  const bool vec = p.cols % V == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0;
  const int blocks = DeviceSmCount() * 8;
  const int warps_per_block = kThreads / 32;
  const bool walk = WalkModesOn();
  if (walk && vec && V % p.tile_w == 0 && p.tile_h >= 8) {
    const int64_t chunks = (p.cols / V + 31) / 32;
    const int64_t units = p.batch * p.tile_rows * chunks;
    const int grid = static_cast<int>(std::clamp<int64_t>((units + warps_per_block - 1) / warps_per_block, 1, blocks));
    IndexNarrowWalkKernel<Word><<<grid, kThreads, 0, stream>>>(p, chunks);
    return cudaGetLastError();
  }
  Plan plan{};
  if (vec && V % p.tile_w == 0) {
    const int tiles_per_vec = static_cast<int>(V / p.tile_w);
    const int64_t vectors = p.cols / V;
    // Enough loads per thread to hide latency (tile_h rows x vpt vectors), bits permitting.
    int64_t vpt = std::max<int64_t>(1, (8 + p.tile_h - 1) / p.tile_h);
    vpt = std::min<int64_t>({vpt, kMaxBits / tiles_per_vec, (vectors + kThreads - 1) / kThreads});
    plan.reg_mode = true;
    plan.vpt = static_cast<int>(std::max<int64_t>(1, vpt));
    plan.item_rows = 1;
    plan.num_chunks = (vectors + int64_t{kThreads} * plan.vpt - 1) / (int64_t{kThreads} * plan.vpt);
    plan.row_groups = p.tile_rows;
    plan.items = p.batch * p.tile_rows * plan.num_chunks;
    IndexRegKernel<Word><<<static_cast<int>(std::min<int64_t>(plan.items, blocks)), kThreads, 0, stream>>>(p, plan);
    return cudaGetLastError();
  }
  if (vec && p.tile_cols == 1) {
    const int64_t groups_per_entry = (p.tile_rows + kWarpTiles - 1) / kWarpTiles;
    const int64_t warps = p.batch * groups_per_entry;
    const int grid = static_cast<int>(std::clamp<int64_t>((warps + kThreads / 32 - 1) / (kThreads / 32), 1, blocks));
    IndexRowsKernel<Word><<<grid, kThreads, 0, stream>>>(p, groups_per_entry);
    return cudaGetLastError();
  }
  if (walk && vec && p.tile_w % V == 0 && 32 % (p.tile_w / V) == 0) {
    WideWalkPlan wp{};
    wp.wv = static_cast<int>(p.tile_w / V);
    // One round of units: about as many strips as warps fit on the GPU at once (two blocks
    // an SM at the kernel's ~105 registers), so that no SM idles at the end of a second
    // round; longer strips where there are more tiles (H200, 4096^2 bf16: 32x64 strips of
    // 2 / 4 / 8 tiles 13.8 / 12.2 / 15.1 us, this rule's 4; 1x64 strips of 32 / 64 / 128
    // tiles 20.7 / 15.0 / 13.8 us, this rule's 125).
    const int64_t target_units = int64_t{DeviceSmCount()} * 2 * warps_per_block;
    const int64_t strips_wanted = std::max<int64_t>(1, target_units / std::max<int64_t>(1, p.batch * p.tile_cols));
    int64_t strip = (p.tile_rows + strips_wanted - 1) / strips_wanted;
    wp.strip = static_cast<int>(std::clamp<int64_t>(strip, 1, 32 * kMaxStripWords));
    const int words = (wp.strip + 31) / 32;
    wp.strips_per_col = (p.tile_rows + wp.strip - 1) / wp.strip;
    wp.units = p.batch * wp.strips_per_col * p.tile_cols;
    const int grid = static_cast<int>(std::clamp<int64_t>((wp.units + warps_per_block - 1) / warps_per_block, 1, blocks));
    if (words == 1) IndexWideWalkKernel<Word, 1><<<grid, kThreads, 0, stream>>>(p, wp);
    else if (words == 2) IndexWideWalkKernel<Word, 2><<<grid, kThreads, 0, stream>>>(p, wp);
    else IndexWideWalkKernel<Word, 4><<<grid, kThreads, 0, stream>>>(p, wp);
    return cudaGetLastError();
  }
  // Shared mode. Chunk width: about `target` elements per tile row, a multiple of V
  // columns so every item starts on a 16-byte boundary; then as many tile rows as fit.
  // Small inputs (a row mask of a few thousand tokens) are cut into smaller items, at
  // least one element per thread, so that the grid spreads over the GPU: a 16K-row mask
  // in 4 items of 4096 rows took 15 us, latency-bound in 4 blocks.
  const int64_t elems = p.batch * p.rows * p.cols;
  const int64_t target = std::clamp<int64_t>(elems / (2 * int64_t{DeviceSmCount()}), kThreads, kTargetElems);
  const int64_t align = vec ? V / Gcd(p.tile_w, V) : 1;
  int64_t ct = std::max<int64_t>(1, target / std::max<int64_t>(1, p.tile_h * p.tile_w));
  ct = (ct + align - 1) / align * align;
  ct = std::min(ct, (p.tile_cols + align - 1) / align * align);
  ct = std::min<int64_t>(ct, kMaxFlags);
  int64_t rows_per_item = target / std::max<int64_t>(1, p.tile_h * p.tile_w * ct);
  rows_per_item = std::clamp<int64_t>(rows_per_item, 1, std::min<int64_t>(kMaxFlags / ct, p.tile_rows));
  plan.reg_mode = false;
  plan.chunk_tiles = static_cast<int>(ct);
  plan.item_rows = static_cast<int>(rows_per_item);
  plan.num_chunks = (p.tile_cols + ct - 1) / ct;
  plan.row_groups = (p.tile_rows + rows_per_item - 1) / rows_per_item;
  plan.items = p.batch * plan.row_groups * plan.num_chunks;
  const int grid = static_cast<int>(std::min<int64_t>(plan.items, blocks));
  if (vec) {
    IndexSharedKernel<Word, true><<<grid, kThreads, 0, stream>>>(p, plan, p.tile_w % V == 0);
  } else {
    IndexSharedKernel<Word, false><<<grid, kThreads, 0, stream>>>(p, plan, false);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchIndex(const IndexParams& p, cudaStream_t stream) {
  // One small launch replaces up to six memsets.
  const int64_t largest = std::max({p.batch * p.capacity, p.row_tiles || p.col_tiles ? p.batch * p.tile_rows * p.tile_cols : 0,
                                    p.batch * std::max(p.tile_rows, p.tile_cols)});
  // Row and column offsets inside an item are 32-bit (pit_jax.index refuses larger x).
  if (p.rows >= (int64_t{1} << 31) || p.cols >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  const int init_blocks = static_cast<int>(std::clamp<int64_t>((largest + 1023) / 1024, 1, 1024));
  InitKernel<<<init_blocks, 256, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || p.batch * p.tile_rows * p.tile_cols == 0) return err;
  switch (p.elem_bytes) {
    case 1: return LaunchTyped<uint8_t>(p, stream);
    case 2: return LaunchTyped<uint16_t>(p, stream);
    case 4: return LaunchTyped<uint32_t>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace pit
