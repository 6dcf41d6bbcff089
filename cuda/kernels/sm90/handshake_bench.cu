// Standalone sm_90a microbenchmark (not part of the library): what one pipeline stage's
// handshake costs between a producer warp and two consumer warpgroups, the structure of
// the weight-block and weight-gradient kernels (docs/notes/sm90_wblock.md: with nothing
// loaded, computed or stored, their stages still took ~0.2-0.6 us each; not explained).
//
// Each CTA: warp 0 is the producer, warps 1-8 two consumer warpgroups. Per stage the
// producer waits for the stage's empty barrier, then either arrives on its full barrier
// (bytes 0) or arms it with expect_tx and issues one bulk copy of `bytes` from an
// L2-resident buffer (the completion a TMA load brings); every consumer warp waits for
// the full barrier and lane 0 arrives on the empty one (count 8), as the kernels do.
// Variants of the wait: 0 try_wait.parity in a loop (the kernels' MbarWait), 1 the same
// with a suspend-time hint, 2 test_wait.parity spinning.
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I. \
//     cuda/kernels/sm90/handshake_bench.cu -o hs_bench && ./hs_bench
// prints ns per stage (median over CTAs of the consumer's wall time / stages).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "cuda/kernels/sm90/bench_util.cuh"
#include "cuda/kernels/sm90/row_gather_gemm.cuh"  // the kernels' mbarrier helpers (sm90_rg)

namespace {

constexpr int kThreads = 32 + 256;

using pit::sm90_rg::MbarArrive;
using pit::sm90_rg::MbarArriveExpectTx;
using pit::sm90_rg::MbarInit;
using pit::sm90_rg::MbarWait;
using pit::sm90_rg::SmemAddr;

__device__ __forceinline__ uint64_t Now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// kWait 0: the kernels' MbarWait (try_wait in a loop); 1: the same with a suspend-time hint;
// 2: test_wait spinning.
template <int kWait>
__device__ __forceinline__ void Wait(uint32_t bar, uint32_t parity) {
  if constexpr (kWait == 0) {
    MbarWait(bar, parity);
  } else {
    uint32_t done = 0;
    do {
      if constexpr (kWait == 1) {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done) : "r"(bar), "r"(parity), "r"(0x989680u) : "memory");
      } else {
        asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
      }
    } while (!done);
  }
}

template <int kWait, int kStages>
__global__ void __launch_bounds__(kThreads) HandshakeKernel(const char* src, int64_t src_bytes, int bytes, int stages,
                                                            uint64_t* ns) {
  extern __shared__ __align__(128) char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + kStages;
  char* buf = smem + 1024;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(SmemAddr(full + s), 1);
      MbarInit(SmemAddr(empty + s), 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == 0) {
    if (lane == 0) {
      const int64_t span = src_bytes - bytes;
      int64_t off = (static_cast<int64_t>(blockIdx.x) * 4096) % (span > 0 ? span : 1);
      for (int i = 0; i < stages; ++i) {
        const int s = i % kStages;
        if (i >= kStages) Wait<kWait>(SmemAddr(empty + s), ((i / kStages) - 1) & 1);
        if (bytes > 0) {
          MbarArriveExpectTx(SmemAddr(full + s), bytes);
          asm volatile(
              "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                  SmemAddr(buf + s * bytes)),
              "l"(src + off), "r"(bytes), "r"(SmemAddr(full + s))
              : "memory");
          off = (off + bytes) % (span > 0 ? span : 1);
          off &= ~int64_t{15};
        } else {
          MbarArrive(SmemAddr(full + s));
        }
      }
    }
    return;
  }
  const uint64_t t0 = Now();
  for (int i = 0; i < stages; ++i) {
    const int s = i % kStages;
    Wait<kWait>(SmemAddr(full + s), (i / kStages) & 1);
    __syncwarp();
    if (lane == 0) MbarArrive(SmemAddr(empty + s));
  }
  if (threadIdx.x == 32) ns[blockIdx.x] = Now() - t0;
}

template <int kWait>
double Run(const char* src, int64_t src_bytes, int bytes, int stages, int ctas, uint64_t* d_ns) {
  constexpr int kStages = 4;
  auto kernel = HandshakeKernel<kWait, kStages>;
  const int smem = 1024 + kStages * std::max(bytes, 16);
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  std::vector<double> med;
  for (int rep = 0; rep < 5; ++rep) {
    kernel<<<ctas, kThreads, smem>>>(src, src_bytes, bytes, stages, d_ns);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<uint64_t> ns(ctas);
    CK(cudaMemcpy(ns.data(), d_ns, ctas * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    std::sort(ns.begin(), ns.end());
    med.push_back(static_cast<double>(ns[ctas / 2]) / stages);
  }
  std::sort(med.begin(), med.end());
  return med[med.size() / 2];
}

}  // namespace

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int64_t src_bytes = 16 << 20;  // L2-resident
  char* src = nullptr;
  uint64_t* d_ns = nullptr;
  CK(cudaMalloc(&src, src_bytes));
  CK(cudaMemset(src, 1, src_bytes));
  CK(cudaMalloc(&d_ns, 4 * sms * sizeof(uint64_t)));
  const int stages = 2000;
  printf("handshake_bench on %s (%d SMs): ns per stage, median over CTAs; 4 stages in flight\n", prop.name, sms);
  printf("%-8s %-10s %14s %14s %14s\n", "bytes", "CTAs", "try_wait", "try_wait+hint", "test_wait");
  for (int bytes : {0, 4096, 8192, 24576, 49152}) {
    for (int per_sm : {1, 2}) {
      if (per_sm == 2 && bytes > 24576) continue;  // shared memory: one CTA an SM
      const int ctas = sms * per_sm;
      const double a = Run<0>(src, src_bytes, bytes, stages, ctas, d_ns);
      const double b = Run<1>(src, src_bytes, bytes, stages, ctas, d_ns);
      const double c = Run<2>(src, src_bytes, bytes, stages, ctas, d_ns);
      printf("%-8d %-10d %14.1f %14.1f %14.1f\n", bytes, ctas, a, b, c);
    }
  }
  CK(cudaFree(src));
  CK(cudaFree(d_ns));
  return 0;
}
