// The column-sum walk shared by pit_row_sum's kernels (row_sum.cu, sm90/row_sum_sm90.cu).
#pragma once

#include <cstdint>

#include "cuda/common/row_sum_params.h"
#include "cuda/kernels/elem_types.cuh"
#include "cuda/kernels/row_blocks.cuh"

namespace pit {
namespace row_sum {

constexpr int kUnroll = 4;  // list slots a thread loads at a time

// acc[V] += columns c .. c + V - 1 of the rows of batch entry b listed in the live slots
// first, first + step, ...: kUnroll slots at a time, their ids, then (single-row blocks)
// their rows, all loads in flight together; the sums add in slot order.
template <typename T, int V>
__device__ __forceinline__ void AddListedRows(const RowSumParams& p, int64_t b, int64_t c, int64_t first,
                                              int64_t step, float (&acc)[V]) {
  const int64_t n = p.cols;
  int64_t live = __ldg(p.count + b);
  live = live < 0 ? 0 : (live > p.capacity ? p.capacity : live);
  const T* xb = static_cast<const T*>(p.x) + b * p.rows * n + c;
  const int32_t* list = p.tiles + b * p.capacity;
  for (int64_t slot = first; slot < live; slot += kUnroll * step) {
    int64_t ids[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t s = slot + u * step;
      ids[u] = s < live ? EntryBlock(__ldg(list + s), true) : -1;
      if (ids[u] >= p.tile_rows) ids[u] = -1;  // not a row block of x
    }
    if (p.tile_h == 1) {
      float v[kUnroll][V];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (ids[u] >= 0) {
          gemm::LoadF<T, V>(xb + ids[u] * n, v[u]);
        } else {
#pragma unroll
          for (int i = 0; i < V; ++i) v[u][i] = 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int i = 0; i < V; ++i) acc[i] += v[u][i];
      continue;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (ids[u] < 0) continue;
      const int64_t r0 = ids[u] * p.tile_h, r1 = r0 + p.tile_h < p.rows ? r0 + p.tile_h : p.rows;
      for (int64_t r = r0; r < r1; ++r) {
        float v[V];
        gemm::LoadF<T, V>(xb + r * n, v);
#pragma unroll
        for (int i = 0; i < V; ++i) acc[i] += v[i];
      }
    }
  }
}

}  // namespace row_sum
}  // namespace pit
