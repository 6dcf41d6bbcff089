// The column-sum walk shared by pit_row_sum's kernels (row_sum.cu, sm90/row_sum_sm90.cu).
#pragma once

#include <cstdint>

#include "cuda/common/row_sum_params.h"
#include "cuda/kernels/elem_types.cuh"
#include "cuda/kernels/row_blocks.cuh"

namespace pit {
namespace row_sum {

constexpr int kUnroll = 4;  // list slots a thread loads at a time

// Whether 16-byte column vectors fit every operand: row lengths (x's, or the parts' and
// cat's) and addresses.
inline bool Vectorizable(const RowSumParams& p, int64_t word_bytes) {
  auto aligned = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) % 16) == 0; };
  bool ok = (p.cols * word_bytes) % 16 == 0 && aligned(p.x) && aligned(p.sums) && aligned(p.cat);
  if (p.part_cols > 0) {
    ok = ok && (p.part_cols * word_bytes) % 16 == 0;
    for (const void* q : p.parts) ok = ok && aligned(q);
  }
  return ok;
}

// acc[V] += columns c .. c + V - 1 of the rows of batch entry b listed in the live slots
// first, first + step, ...: kUnroll slots at a time, their ids, then (single-row blocks)
// their rows, all loads in flight together; the sums add in slot order. kConcat
// (pit_row_concat_sum: p.part_cols > 0, V columns never straddle two parts): the columns
// come from their part, and the rows read are written to p.cat too. (A template
// parameter: the plain sum's kernel kept its 64 registers; with the runtime branch 79.)
template <typename T, int V, bool kConcat = false>
__device__ __forceinline__ void AddListedRows(const RowSumParams& p, int64_t b, int64_t c, int64_t first,
                                              int64_t step, float (&acc)[V]) {
  const int64_t n = p.cols;
  int64_t live = __ldg(p.count + b);
  live = live < 0 ? 0 : (live > p.capacity ? p.capacity : live);
  const T* xb;
  int64_t stride = n;  // between x's rows
  T* cb = nullptr;
  if constexpr (kConcat) {
    const int64_t k = c / p.part_cols;
    stride = p.part_cols;
    xb = static_cast<const T*>(p.parts[k]) + b * p.rows * stride + (c - k * stride);
    cb = static_cast<T*>(p.cat) + b * p.rows * n + c;
  } else {
    xb = static_cast<const T*>(p.x) + b * p.rows * n + c;
  }
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
          gemm::LoadF<T, V>(xb + ids[u] * stride, v[u]);
        } else {
#pragma unroll
          for (int i = 0; i < V; ++i) v[u][i] = 0.f;
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int i = 0; i < V; ++i) acc[i] += v[u][i];
      if constexpr (kConcat) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (ids[u] >= 0) gemm::StoreF<T, V>(cb + ids[u] * n, v[u]);  // exact: the values as loaded
      }
      continue;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (ids[u] < 0) continue;
      const int64_t r0 = ids[u] * p.tile_h, r1 = r0 + p.tile_h < p.rows ? r0 + p.tile_h : p.rows;
      for (int64_t r = r0; r < r1; ++r) {
        float v[V];
        gemm::LoadF<T, V>(xb + r * stride, v);
#pragma unroll
        for (int i = 0; i < V; ++i) acc[i] += v[i];
        if constexpr (kConcat) gemm::StoreF<T, V>(cb + r * n, v);
      }
    }
  }
}

}  // namespace row_sum
}  // namespace pit
