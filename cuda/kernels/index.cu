// Online sparsity index construction: one pass over x, one slot per live micro-tile
// in each list (flat, and per tile row / per tile column when asked for).
//
// Work is cut into items (batch b, tile row tr, chunk of `chunk_tiles` tile columns).
// A block reads its item with 16-byte loads, marks live tiles in shared memory, then
// compacts them with a block-wide scan: ONE global atomicAdd per item reserves the
// slots of all its live tiles (order is free, so no sort and no second pass). A grid of
// a few blocks per SM loops over the items.
#include <algorithm>
#include <cstdint>

#include "cuda/kernels/device_utils.cuh"
#include "cuda/kernels/index.h"

namespace pit {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxChunkTiles = 4096;      // shared-memory flags per item
constexpr int64_t kTargetElems = 16384;   // elements one item reads, about

// Non-zero test on the raw bits: +0 and -0 are zero, everything else (NaN too) is live.
__device__ __forceinline__ bool NonZero(uint8_t w) { return w != 0; }
__device__ __forceinline__ bool NonZero(uint16_t w) { return (w & 0x7fffu) != 0; }
__device__ __forceinline__ bool NonZero(uint32_t w) { return (w & 0x7fffffffu) != 0; }

template <typename Word, bool kVec>
__global__ void __launch_bounds__(kThreads) IndexKernel(IndexParams p, int chunk_tiles, int64_t num_chunks,
                                                         bool whole_vec_tile) {
  constexpr int V = kVec ? 16 / sizeof(Word) : 1;  // elements per load
  __shared__ uint8_t s_live[kMaxChunkTiles];
  __shared__ int s_scan[kThreads / 32];
  __shared__ int s_base, s_rbase;

  const Word* x = static_cast<const Word*>(p.x);
  const int tile_w = static_cast<int>(p.tile_w);
  const int64_t items = p.batch * p.tile_rows * num_chunks;
  for (int t = threadIdx.x; t < chunk_tiles; t += kThreads) s_live[t] = 0;
  __syncthreads();

  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t cc = item % num_chunks;
    const int64_t tr = (item / num_chunks) % p.tile_rows;
    const int64_t b = item / (num_chunks * p.tile_rows);
    const int64_t tc0 = cc * chunk_tiles;
    const int nct = static_cast<int>(std::min<int64_t>(chunk_tiles, p.tile_cols - tc0));
    const int64_t r0 = tr * p.tile_h;
    const int nrows = static_cast<int>(std::min<int64_t>(p.tile_h, p.rows - r0));
    const int64_t c0 = tc0 * p.tile_w;
    const int ncols = static_cast<int>(std::min<int64_t>(p.cols, (tc0 + nct) * p.tile_w) - c0);
    const int nvec = (ncols + V - 1) / V;  // exact in the vector case (cols % V == 0)

    // 1. Mark live tiles. Threads tile the item as row_threads x vec_threads.
    const int vec_threads = min(nvec, kThreads);
    const int row_threads = kThreads / vec_threads;
    const int tj = threadIdx.x % vec_threads, ti = threadIdx.x / vec_threads;
    const Word* base = x + (b * p.rows + r0) * p.cols + c0;
    if (ti < row_threads) {
      for (int i = ti; i < nrows; i += row_threads) {
        const Word* row = base + static_cast<int64_t>(i) * p.cols;
#pragma unroll 4
        for (int j = tj; j < nvec; j += vec_threads) {
          if constexpr (kVec) {
            const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + j * V));
            const Word* words = reinterpret_cast<const Word*>(&v);
            if (whole_vec_tile) {
              bool any = false;
#pragma unroll
              for (int e = 0; e < V; ++e) any |= NonZero(words[e]);
              if (any) s_live[(j * V) / tile_w] = 1;
            } else {
#pragma unroll
              for (int e = 0; e < V; ++e)
                if (NonZero(words[e])) s_live[(j * V + e) / tile_w] = 1;
            }
          } else {
            if (NonZero(row[j])) s_live[j / tile_w] = 1;
          }
        }
      }
    }
    __syncthreads();

    // 2. Compact: a block scan numbers this item's live tiles, one atomic reserves them.
    int mine = 0;
    for (int t = threadIdx.x; t < nct; t += kThreads) mine += s_live[t];
    int total = 0;
    int pos = BlockExclusiveSum<kThreads>(mine, s_scan, &total);
    if (threadIdx.x == 0 && total) {
      s_base = atomicAdd(p.count + b, total);
      if (p.row_tiles) s_rbase = atomicAdd(p.row_count + b * p.tile_rows + tr, total);
    }
    __syncthreads();
    if (mine) {
      for (int t = threadIdx.x; t < nct; t += kThreads) {
        if (!s_live[t]) continue;
        s_live[t] = 0;
        const int64_t tc = tc0 + t;
        const int64_t slot = static_cast<int64_t>(s_base) + pos;
        if (slot < p.capacity) p.tiles[b * p.capacity + slot] = static_cast<int32_t>(tr * p.tile_cols + tc);
        // Grouped lists hold every tile of their group, so they never overflow.
        if (p.row_tiles) p.row_tiles[(b * p.tile_rows + tr) * p.tile_cols + s_rbase + pos] = static_cast<int32_t>(tc);
        if (p.col_tiles) {
          const int cslot = atomicAdd(p.col_count + b * p.tile_cols + tc, 1);
          p.col_tiles[(b * p.tile_cols + tc) * p.tile_rows + cslot] = static_cast<int32_t>(tr);
        }
        ++pos;
      }
    }
    __syncthreads();  // flags cleared before the next item marks
  }
}

int64_t Gcd(int64_t a, int64_t b) { return b == 0 ? a : Gcd(b, a % b); }

template <typename Word>
cudaError_t LaunchTyped(const IndexParams& p, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(Word);
  const bool vec = p.cols % V == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0;
  // Chunk width: about kTargetElems elements, and a multiple of V columns so that
  // every item starts on a 16-byte boundary.
  const int64_t align = vec ? V / Gcd(p.tile_w, V) : 1;
  int64_t ct = std::max<int64_t>(1, kTargetElems / std::max<int64_t>(1, p.tile_h * p.tile_w));
  ct = (ct + align - 1) / align * align;
  ct = std::min(ct, (p.tile_cols + align - 1) / align * align);
  ct = std::min<int64_t>(ct, kMaxChunkTiles);
  const int64_t num_chunks = (p.tile_cols + ct - 1) / ct;
  const int64_t items = p.batch * p.tile_rows * num_chunks;
  const int grid = static_cast<int>(std::min<int64_t>(items, int64_t{DeviceSmCount()} * 8));
  const bool whole_vec_tile = vec && p.tile_w % V == 0;
  if (vec) {
    IndexKernel<Word, true><<<grid, kThreads, 0, stream>>>(p, static_cast<int>(ct), num_chunks, whole_vec_tile);
  } else {
    IndexKernel<Word, false><<<grid, kThreads, 0, stream>>>(p, static_cast<int>(ct), num_chunks, false);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchIndex(const IndexParams& p, cudaStream_t stream) {
  // Unused slots read -1 (all bits set), counts start at 0. Memsets are graph-capturable.
  auto fill = [&](int32_t* ptr, int value, int64_t n) {
    return n > 0 ? cudaMemsetAsync(ptr, value, sizeof(int32_t) * n, stream) : cudaSuccess;
  };
  cudaError_t err = fill(p.tiles, 0xff, p.batch * p.capacity);
  if (err == cudaSuccess) err = fill(p.count, 0, p.batch);
  const int64_t grid_tiles = p.batch * p.tile_rows * p.tile_cols;
  if (err == cudaSuccess && p.row_tiles) err = fill(p.row_tiles, 0xff, grid_tiles);
  if (err == cudaSuccess && p.row_tiles) err = fill(p.row_count, 0, p.batch * p.tile_rows);
  if (err == cudaSuccess && p.col_tiles) err = fill(p.col_tiles, 0xff, grid_tiles);
  if (err == cudaSuccess && p.col_tiles) err = fill(p.col_count, 0, p.batch * p.tile_cols);
  if (err != cudaSuccess) return err;
  if (grid_tiles == 0) return cudaSuccess;
  switch (p.elem_bytes) {
    case 1: return LaunchTyped<uint8_t>(p, stream);
    case 2: return LaunchTyped<uint16_t>(p, stream);
    case 4: return LaunchTyped<uint32_t>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace pit
