// pit_row_sum on sm_90a: one launch. A cluster of kCluster CTAs owns kLanes 16-byte
// column vectors; CTA rank r takes the list slots r * kRows + y, stepping kCluster * kRows
// (row_sum::kUnroll of them in flight per thread). Each CTA adds its kRows rows of threads in
// order through shared memory; then rank 0 adds the kCluster CTAs' sums in rank order
// from their shared memory (DSMEM) and writes the result: the same bits on every run, no
// partial sums in global memory and no second kernel.
#include "cuda/kernels/sm90/row_sum_sm90.h"

#include <cooperative_groups.h>

#include <cstdint>

#include "cuda/kernels/elem_types.cuh"
#include "cuda/kernels/row_sum.cuh"
#include "cuda/kernels/sm90/launch_util.h"

namespace pit {
namespace {

namespace cg = cooperative_groups;
using gemm::Elem;
using gemm::LoadF;
using gemm::StoreF;

constexpr int kCluster = 8;  // CTAs per cluster: the list's slices (portable cluster size)
constexpr int kLanes = 8;    // 16-byte column vectors per CTA (128 contiguous bytes a row)
constexpr int kRows = 32;    // rows of threads per CTA

template <typename T, int V, bool kConcat>
__global__ void __launch_bounds__(kLanes * kRows) RowSumClusterKernel(const RowSumParams p) {
  constexpr int kCols = kLanes * V;  // columns per cluster
  __shared__ float part[kRows][kCols + 1];
  __shared__ float block_sum[kCols];
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int x = threadIdx.x, y = threadIdx.y, t = y * kLanes + x;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x / kCluster) * kCols, n = p.cols;
  const int64_t c = col0 + static_cast<int64_t>(x) * V;
  for (int64_t b = blockIdx.z; b < p.batch; b += gridDim.z) {
    float acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0.f;
    if (c < n)
      row_sum::AddListedRows<T, V, kConcat>(p, b, c, static_cast<int64_t>(rank) * kRows + y,
                                            static_cast<int64_t>(kCluster) * kRows, acc);
#pragma unroll
    for (int i = 0; i < V; ++i) part[y][x * V + i] = acc[i];
    __syncthreads();
    if (t < kCols) {  // this CTA's sum of column t, its rows of threads in order
      float s = part[0][t];
      for (int k = 1; k < kRows; ++k) s += part[k][t];
      block_sum[t] = s;
    }
    cluster.sync();  // every CTA's block_sum is ready
    if (rank == 0 && t < kCols && col0 + t < n) {
      float s = 0.f;
      for (int r = 0; r < kCluster; ++r) s += cluster.map_shared_rank(block_sum, r)[t];
      float v[1] = {s};
      StoreF<T, 1>(static_cast<T*>(p.sums) + b * n + col0 + t, v);
    }
    cluster.sync();  // rank 0 has read every peer's block_sum (part and block_sum are reused)
  }
}

template <typename T>
cudaError_t Launch(const RowSumParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(typename Elem<T>::Word));
  if (!row_sum::Vectorizable(p, sizeof(typename Elem<T>::Word))) return cudaErrorNotSupported;
  const int64_t col_blocks = (p.cols + kLanes * kVec - 1) / (kLanes * kVec);
  if (col_blocks * kCluster > 0x7fffffff) return cudaErrorNotSupported;
  sm90::ClusterLaunch launch(kCluster, kLanes * kRows, 0, stream, static_cast<unsigned>(col_blocks * kCluster));
  launch.cfg.blockDim = dim3(kLanes, kRows);
  launch.cfg.gridDim.z = static_cast<unsigned>(p.batch < 65535 ? p.batch : 65535);
  if (p.part_cols > 0) return cudaLaunchKernelEx(&launch.cfg, RowSumClusterKernel<T, kVec, true>, p);
  return cudaLaunchKernelEx(&launch.cfg, RowSumClusterKernel<T, kVec, false>, p);
}

}  // namespace

cudaError_t LaunchRowSumSm90(const RowSumParams& p, cudaStream_t stream) {
  const sm90::DeviceInfo* info = sm90::GetDeviceInfo();
  if (info == nullptr || !info->sm90) return cudaErrorNotSupported;
  if (p.batch * p.cols == 0) return cudaSuccess;
  return WithFloatType(p.dtype, [&](auto t) { return Launch<decltype(t)>(p, stream); });
}

}  // namespace pit
