// pit_row_activation(_bwd) on the GPU: one warp per list slot and segment of the row
// (kIters 16-byte vectors a lane, all loaded before any is used), 16-byte vectors along the
// row where rows are 16-byte aligned. A live slot reads its rows once (z, and dy for the
// derivative) and writes them once; the dead slots (the list's tail at full capacity)
// write the fill value (the backward: zeros), so padding rows are never read nor activated
// and no memset runs first.
#include "cuda/kernels/row_activation.h"

#include <cstdint>

#include "cuda/kernels/elem_types.cuh"
#include "cuda/kernels/epilogue.cuh"
#include "cuda/kernels/row_blocks.cuh"

namespace pit {
namespace {

using gemm::Elem;
using gemm::LoadF;
using gemm::LoadWords;
using gemm::StoreF;
using gemm::ToFloats;
using gemm::Words;

constexpr int kWarps = 8;
// Vectors a lane loads before using any: a warp's segment is 32 * kIters vectors of the row.
// One warp walking a whole row (BERT's 3072 columns: 12 vectors a lane, each iteration's
// loads issued after the previous one's math) took 13.5 us a GELU backward at BERT b32; with
// each vector converted at its load ptxas still waited for one before issuing the next
// (H200, alone: 9.4 us; the words loaded first, then converted: 7.2 us).
constexpr int kIters = 4;

// kBwd false: y = act(z) on live rows, fill on dead-tail rows; true: dz = dy * act'(z) on
// live rows, zeros on dead-tail rows (fill is null). Without a dead tail the other rows
// were zeroed or filled before. Warp w takes segment w % segs of list slot w / segs.
template <typename T, int V, int kAct, bool kBwd>
__global__ void __launch_bounds__(kWarps * 32) RowActivationKernel(const RowActivationParams p, bool dead_tail,
                                                                   int64_t segs) {
  const int lane = threadIdx.x & 31;
  const int64_t gw = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int64_t unit = gw / segs, seg = gw - unit * segs;
  if (unit >= p.batch * p.capacity) return;
  bool live;
  int64_t id;
  if (!SlotBlock(p, unit, dead_tail, &live, &id)) return;
  if (kBwd && !live && !p.dead_zeros) return;  // dz's dead rows: left unwritten
  const int64_t b = unit / p.capacity, n = p.cols;
  const int64_t c0 = seg * (32 * kIters * V) + static_cast<int64_t>(lane) * V;
  const int64_t r0 = id * p.tile_h, r1 = r0 + p.tile_h < p.rows ? r0 + p.tile_h : p.rows;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t off = (b * p.rows + r) * n;
    T* out = static_cast<T*>(p.out) + off;
    // Every vector's words loaded before any is converted: all of the lane's loads in flight at once.
    Words<T, V> zw[kIters], gw[kIters];
    const T* src = live ? static_cast<const T*>(p.z) + off : static_cast<const T*>(p.fill);
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int64_t c = c0 + it * 32 * V;
      if (c < n && src) LoadWords<T, V>(src + c, zw[it]);  // a dead-tail row: the fill value
      if constexpr (kBwd) {
        if (c < n && live) LoadWords<T, V>(static_cast<const T*>(p.dy) + off + c, gw[it]);
      }
    }
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int64_t c = c0 + it * 32 * V;
      if (c >= n) continue;
      float v[V];
      if (src) {
        ToFloats<T, V>(zw[it], v);
      } else {  // a dead-tail row without a fill value: zeros (always so in the backward)
#pragma unroll
        for (int i = 0; i < V; ++i) v[i] = 0.f;
      }
      if (live) {
        if constexpr (kBwd) {
          float g[V];
          ToFloats<T, V>(gw[it], g);
#pragma unroll
          for (int i = 0; i < V; ++i) v[i] = g[i] * ActivateGradT<kAct>(v[i]);
        } else {
#pragma unroll
          for (int i = 0; i < V; ++i) v[i] = ActivateT<kAct>(v[i]);
        }
      }
      StoreF<T, V>(out + c, v);
    }
  }
}

// Every row = fill (for a list too short to name the dead blocks).
template <typename T, int V>
__global__ void FillRowsKernel(const RowActivationParams p) {
  const int64_t vecs = p.cols / V, total = p.batch * p.rows * vecs;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / vecs, c = (i - row * vecs) * V;
    float v[V];
    LoadF<T, V>(static_cast<const T*>(p.fill) + c, v);
    StoreF<T, V>(static_cast<T*>(p.out) + row * p.cols + c, v);
  }
}

bool Aligned(const void* q) { return q == nullptr || (reinterpret_cast<uintptr_t>(q) % 16) == 0; }

template <typename T, int V, bool kBwd>
cudaError_t LaunchAct(const RowActivationParams& p, bool dead_tail, cudaStream_t stream) {
  const int64_t units = p.batch * p.capacity;
  const int64_t segs = p.cols > 0 ? (p.cols + 32 * kIters * V - 1) / (32 * kIters * V) : 1;
  const int64_t blocks = (units * segs + kWarps - 1) / kWarps;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(blocks)), block(kWarps * 32);
  switch (p.act) {
    case Activation::kRelu:
      RowActivationKernel<T, V, static_cast<int>(Activation::kRelu), kBwd><<<grid, block, 0, stream>>>(p, dead_tail, segs);
      break;
    case Activation::kGeluTanh:
      RowActivationKernel<T, V, static_cast<int>(Activation::kGeluTanh), kBwd><<<grid, block, 0, stream>>>(p, dead_tail, segs);
      break;
    case Activation::kGeluErf:
      RowActivationKernel<T, V, static_cast<int>(Activation::kGeluErf), kBwd><<<grid, block, 0, stream>>>(p, dead_tail, segs);
      break;
    case Activation::kSilu:
      RowActivationKernel<T, V, static_cast<int>(Activation::kSilu), kBwd><<<grid, block, 0, stream>>>(p, dead_tail, segs);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <typename T, bool kBwd>
cudaError_t Launch(const RowActivationParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(typename Elem<T>::Word));
  const bool vec = (p.cols * static_cast<int64_t>(sizeof(typename Elem<T>::Word))) % 16 == 0 && Aligned(p.z) &&
                   Aligned(p.fill) && Aligned(p.dy) && Aligned(p.out);
  const int64_t bytes = p.batch * p.rows * p.cols * DTypeBytes(p.dtype);
  // The list's tail names the dead blocks only when it can hold every block; then every
  // row is written once by its slot (no memset first).
  const bool dead_tail = p.capacity == p.tile_rows;
  if (!dead_tail && ((kBwd && p.dead_zeros) || (!kBwd && !p.fill))) {
    cudaError_t e = cudaMemsetAsync(p.out, 0, static_cast<size_t>(bytes), stream);
    if (e != cudaSuccess) return e;
  } else if (!dead_tail && !kBwd) {
    const int64_t total = p.batch * p.rows * (vec ? p.cols / kVec : p.cols);
    const unsigned blocks = static_cast<unsigned>(total / 256 + 1 < 4096 ? total / 256 + 1 : 4096);
    if (vec)
      FillRowsKernel<T, kVec><<<blocks, 256, 0, stream>>>(p);
    else
      FillRowsKernel<T, 1><<<blocks, 256, 0, stream>>>(p);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  if (p.batch * p.capacity == 0) return cudaSuccess;
  return vec ? LaunchAct<T, kVec, kBwd>(p, dead_tail, stream) : LaunchAct<T, 1, kBwd>(p, dead_tail, stream);
}

template <bool kBwd>
cudaError_t LaunchFor(const RowActivationParams& p, cudaStream_t stream) {
  if (p.batch * p.rows * p.cols == 0) return cudaSuccess;
  return WithFloatType(p.dtype, [&](auto t) { return Launch<decltype(t), kBwd>(p, stream); });
}

}  // namespace

cudaError_t LaunchRowActivation(const RowActivationParams& p, cudaStream_t stream) {
  return LaunchFor<false>(p, stream);
}

cudaError_t LaunchRowActivationBwd(const RowActivationParams& p, cudaStream_t stream) {
  return LaunchFor<true>(p, stream);
}

}  // namespace pit
