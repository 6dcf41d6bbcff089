// Standalone timing harness (not part of the library): pit_sread_live's packing
// (LaunchSread, live_only) of x [16384, 4096] bf16 at 10 / 30 / 50 % live rows, against a
// plain copy kernel moving the same bytes (what the packing could reach). Build:
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I. \
//     cuda/kernels/sm90/sread_live_bench.cu cuda/kernels/sread_swrite.cu -o sread_live_bench
// Results: benchmarks/results/pack_bench_NVIDIA_H200_2026-11-29.txt (the 8 / 16 vectors a lane
// there: kUnroll in sread_swrite.cu changed for the build, not kept).
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>
#include <cuda_runtime.h>
#include "cuda/kernels/sread_swrite.h"
#include "cuda/common/moe_params.h"

__global__ void CopyKernel(const uint4* s, uint4* d, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) d[i] = s[i];
}

int main() {
  const int64_t M = 16384, K = 4096;
  void *x, *packed;
  int32_t *tiles, *count;
  cudaMalloc(&x, M * K * 2);
  cudaMalloc(&packed, M * K * 2);
  cudaMalloc(&tiles, M * 4);
  cudaMalloc(&count, 4);
  cudaMemset(x, 1, M * K * 2);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::mt19937 rng(1);
  for (double f : {0.1, 0.3, 0.5}) {
    const int L = static_cast<int>(f * M + 0.5);
    std::vector<int32_t> ids(M);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int i = L; i < M; ++i) ids[i] = -1 - ids[i];
    cudaMemcpy(tiles, ids.data(), M * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(count, &L, 4, cudaMemcpyHostToDevice);
    pit::PackLaunch p;
    p.dtype = pit::DType::kBF16;
    p.rows = M, p.cols = K, p.tile_h = 1, p.tile_w = K, p.tile_rows = M, p.tile_cols = 1, p.capacity = M;
    p.tiles = tiles, p.count = count, p.src = x, p.dst = packed, p.live_only = true, p.live_pad_rows = pit::kPackedRowPad;
    // The median of 30 event-timed launches, ms.
    auto median_ms = [&](auto&& launch) {
      std::vector<float> ts;
      for (int r = 0; r < 30; ++r) {
        cudaEventRecord(e0);
        launch();
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float t;
        cudaEventElapsedTime(&t, e0, e1);
        ts.push_back(t);
      }
      std::sort(ts.begin(), ts.end());
      return ts[15];
    };
    const int64_t n16 = int64_t{L} * K * 2 / 16;
    const float pack = median_ms([&] { pit::LaunchSread(p, 0); });
    const float copy = median_ms([&] {
      CopyKernel<<<sms * 8, 256>>>(static_cast<const uint4*>(x), static_cast<uint4*>(packed), n16);
    });
    const double bytes = 2.0 * L * K * 2;
    printf("live %2.0f%%: pack %.1f us (%.0f GB/s), plain copy of the live bytes %.1f us (%.0f GB/s) %s\n", f * 100,
           pack * 1e3, bytes / (pack * 1e-3) / 1e9, copy * 1e3, bytes / (copy * 1e-3) / 1e9,
           cudaGetErrorString(cudaGetLastError()));
  }
  return 0;
}
