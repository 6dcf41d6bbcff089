// pit_row_sum on the GPU: column sums over the listed rows only (a padded batch's bias
// gradient reads its live rows, not every row). On sm_90 with 16-byte aligned rows the
// one-launch cluster kernel runs (sm90/row_sum_sm90.cu); elsewhere these two: block
// (32, kSplit), lane x owns one 16-byte column vector, the kSplit rows of threads take
// interleaved list slots of the block's slice; the rows are added in a fixed order, then
// the slices in order (a second kernel when the list is split), so the sums are the same
// on every run.
#include "cuda/kernels/row_sum.h"

#include <cstdint>

#include "cuda/kernels/elem_types.cuh"
#include "cuda/kernels/row_sum.cuh"
#include "cuda/kernels/sm90/row_sum_sm90.h"

namespace pit {
namespace {

using gemm::Elem;
using gemm::LoadF;
using gemm::StoreF;

constexpr int kSplit = 8;           // rows of threads per block
constexpr int kFinishThreads = 256;  // columns per block of the slice sum

// Slice s = blockIdx.y of the list of entry b: the slots s * kSplit + y, stepping by
// slices * kSplit. With one slice the block writes the sums (one rounding), otherwise
// its float32 partial sums to work[b, s].
template <typename T, int V, bool kConcat>
__global__ void __launch_bounds__(32 * kSplit) RowSumKernel(const RowSumParams p) {
  __shared__ float part[kSplit][32 * V + 1];
  const int x = threadIdx.x, y = threadIdx.y;
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * 32 + x) * V, n = p.cols;
  for (int64_t b = blockIdx.z; b < p.batch; b += gridDim.z) {
    float acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0.f;
    if (c < n)
      row_sum::AddListedRows<T, V, kConcat>(p, b, c, static_cast<int64_t>(blockIdx.y) * kSplit + y,
                                            static_cast<int64_t>(p.slices) * kSplit, acc);
#pragma unroll
    for (int i = 0; i < V; ++i) part[y][x * V + i] = acc[i];
    __syncthreads();
    if (y == 0 && c < n) {
#pragma unroll
      for (int i = 0; i < V; ++i) {
        float s = part[0][x * V + i];
#pragma unroll
        for (int k = 1; k < kSplit; ++k) s += part[k][x * V + i];
        acc[i] = s;
      }
      if (p.slices == 1) {
        StoreF<T, V>(static_cast<T*>(p.sums) + b * n + c, acc);
      } else {
        float* w = p.work + (b * p.slices + blockIdx.y) * n + c;
#pragma unroll
        for (int i = 0; i < V; ++i) w[i] = acc[i];
      }
    }
    __syncthreads();  // part is reused by the next entry
  }
}

// sums[b, i] = work[b, 0, i] + work[b, 1, i] + ..., in slice order.
template <typename T>
__global__ void __launch_bounds__(kFinishThreads) RowSumFinishKernel(const RowSumParams p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kFinishThreads + threadIdx.x, n = p.cols;
  if (i >= n) return;
  for (int64_t b = blockIdx.y; b < p.batch; b += gridDim.y) {
    const float* w = p.work + b * p.slices * n + i;
    float s = 0.f;
    for (int64_t k = 0; k < p.slices; ++k) s += w[k * n];
    float v[1] = {s};
    StoreF<T, 1>(static_cast<T*>(p.sums) + b * n + i, v);
  }
}

unsigned GridDim(int64_t v) { return static_cast<unsigned>(v < 65535 ? v : 65535); }

template <typename T>
cudaError_t Launch(const RowSumParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(typename Elem<T>::Word));
  const bool vec = row_sum::Vectorizable(p, sizeof(typename Elem<T>::Word));
  const int v = vec ? kVec : 1;
  const dim3 grid(static_cast<unsigned>((p.cols + 32 * v - 1) / (32 * v)), static_cast<unsigned>(p.slices),
                  GridDim(p.batch));
  const dim3 block(32, kSplit);
  const bool concat = p.part_cols > 0;
  if (vec && concat)
    RowSumKernel<T, kVec, true><<<grid, block, 0, stream>>>(p);
  else if (vec)
    RowSumKernel<T, kVec, false><<<grid, block, 0, stream>>>(p);
  else if (concat)
    RowSumKernel<T, 1, true><<<grid, block, 0, stream>>>(p);
  else
    RowSumKernel<T, 1, false><<<grid, block, 0, stream>>>(p);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || p.slices == 1) return e;
  const dim3 fgrid(static_cast<unsigned>((p.cols + kFinishThreads - 1) / kFinishThreads), GridDim(p.batch));
  RowSumFinishKernel<T><<<fgrid, kFinishThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchRowSum(const RowSumParams& p, cudaStream_t stream) {
  if (p.batch * p.cols == 0) return cudaSuccess;
  // Hopper: one launch, the slices added in the cluster (no work, no second kernel).
  const cudaError_t e = LaunchRowSumSm90(p, stream);
  if (e != cudaErrorNotSupported) return e;
  return WithFloatType(p.dtype, [&](auto t) { return Launch<decltype(t)>(p, stream); });
}

}  // namespace pit
