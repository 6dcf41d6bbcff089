// Host launchers of the MoE grouped products: the Hopper kernels first, then the generic
// kernels of grouped_gemm_kernel.cuh (tile configuration per dtype and size, 16-byte
// access flags, grids from static bounds; no host sync, no host reads).
#include <algorithm>
#include <climits>
#include <cstdint>

#include "cuda/kernels/device_utils.cuh"
#include "cuda/kernels/grouped_gemm.h"
#include "cuda/kernels/grouped_gemm_kernel.cuh"
#include "cuda/kernels/sm90/grouped_gemm.h"

namespace pit {
namespace {

using gemm::GroupedArgs;

// The tiles of sparse_gemm.cu: float32 on exact FFMA (allow_tf32 only permits TF32, so
// exact is always correct), bf16/f16 on mma.sync; small tiles for narrow problems.
using SimtLarge = gemm::SimtCfg<128, 128, 16, 8, 8, 1>;
using SimtSmall = gemm::SimtCfg<64, 64, 16, 4, 4, 3>;
using MmaLarge = gemm::MmaCfg<128, 128, 32, 2, 4, 2>;
using MmaSmall = gemm::MmaCfg<64, 64, 32, 2, 2, 4>;

bool Aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
bool Fits(int64_t v) { return v >= 0 && v <= INT_MAX; }

// Entry b of a batch of `batch` reads entry b / Div(batch, n) of an operand with n entries.
int Div(int64_t batch, int64_t n) { return static_cast<int>(batch > 0 && n > 0 ? batch / n : 1); }

// -- grouped matmul --------------------------------------------------------------------

template <class Cfg, typename T>
cudaError_t RunMatmul(GroupedArgs g, const GroupedMatmulParams& p, cudaStream_t stream) {
  const int64_t row_slots = (p.A + Cfg::BM - 1) / Cfg::BM + p.E + 1;  // >= sum_e ceil(count_e / BM)
  const int64_t blocks_n = (p.F + Cfg::BN - 1) / Cfg::BN;
  const int64_t blocks = p.batch * row_slots * blocks_n;
  if (!Fits(row_slots * blocks_n) || !Fits(blocks)) return cudaErrorInvalidValue;
  if (blocks == 0) return cudaSuccess;
  g.row_slots = static_cast<int>(row_slots);
  g.blocks_n = static_cast<int>(blocks_n);
  constexpr int V = 16 / sizeof(T);
  g.src_vec = Aligned(p.src.data, 16) && p.D % V == 0;
  g.w_vec = Aligned(p.w, 16) && (p.trans_w ? p.D : p.F) % V == 0;  // loads run along W's stored rows
  g.out_vec = p.F % Cfg::kCV == 0 && Aligned(p.y, Cfg::kCV * sizeof(T));
  if (p.trans_w) {
    gemm::GroupedMatmulKernel<Cfg, T, true><<<static_cast<int>(blocks), Cfg::kThreads, 0, stream>>>(g);
  } else {
    gemm::GroupedMatmulKernel<Cfg, T, false><<<static_cast<int>(blocks), Cfg::kThreads, 0, stream>>>(g);
  }
  return cudaGetLastError();
}

// Large tiles when the experts average a large tile's rows, F is wider than a small
// tile and the live tiles still give every SM a block.
template <class Large, class Small, typename T>
cudaError_t PickMatmul(const GroupedArgs& g, const GroupedMatmulParams& p, cudaStream_t stream) {
  const int64_t live_tiles = p.batch * ((p.A + Large::BM - 1) / Large::BM) * ((p.F + Large::BN - 1) / Large::BN);
  const bool large = p.A >= p.E * Large::BM && p.F > Small::BN && live_tiles >= DeviceSmCount();
  return large ? RunMatmul<Large, T>(g, p, stream) : RunMatmul<Small, T>(g, p, stream);
}

// -- grouped wgrad ---------------------------------------------------------------------

template <class Cfg, typename T>
cudaError_t RunWgrad(GroupedArgs g, const GroupedWgradParams& p, cudaStream_t stream) {
  const int64_t blocks_m = (p.D + Cfg::BM - 1) / Cfg::BM, blocks_n = (p.F + Cfg::BN - 1) / Cfg::BN;
  const int64_t blocks = p.dw_batch * p.E * blocks_m * blocks_n;
  if (!Fits(p.E * blocks_m * blocks_n) || !Fits(blocks)) return cudaErrorInvalidValue;
  if (blocks == 0) return cudaSuccess;
  g.blocks_m = static_cast<int>(blocks_m);
  g.blocks_n = static_cast<int>(blocks_n);
  constexpr int V = 16 / sizeof(T);
  // Loads run along src's D and dy's F from tile starts that are multiples of BM / BN.
  g.src_vec = Aligned(p.src.data, 16) && p.D % V == 0;
  g.dy_vec = Aligned(p.dy.data, 16) && p.F % V == 0;
  g.out_vec = p.F % Cfg::kCV == 0 && Aligned(p.dw, Cfg::kCV * sizeof(T));
  gemm::GroupedWgradKernel<Cfg, T><<<static_cast<int>(blocks), Cfg::kThreads, 0, stream>>>(g);
  return cudaGetLastError();
}

template <class Large, class Small, typename T>
cudaError_t PickWgrad(const GroupedArgs& g, const GroupedWgradParams& p, cudaStream_t stream) {
  const int64_t large_blocks =
      p.dw_batch * p.E * ((p.D + Large::BM - 1) / Large::BM) * ((p.F + Large::BN - 1) / Large::BN);
  const bool large = p.D > Small::BM && p.F > Small::BN && large_blocks >= DeviceSmCount();
  return large ? RunWgrad<Large, T>(g, p, stream) : RunWgrad<Small, T>(g, p, stream);
}

}  // namespace

cudaError_t LaunchGroupedMatmul(const GroupedMatmulParams& p, cudaStream_t stream) {
  // The fast path launches nothing and returns cudaErrorNotSupported when it does not
  // cover the call (another architecture, dtype or shape).
  const cudaError_t fast = LaunchGroupedGemmSm90(p, stream);
  if (fast != cudaErrorNotSupported) return fast;
  if (!Fits(p.A) || !Fits(p.D) || !Fits(p.F) || !Fits(p.E + 1) || !Fits(p.batch) || p.E < 1 || p.row_div < 1 ||
      !Fits(p.row_div) || !Fits(p.src.batch) || !Fits(p.w_batch) ||
      !Fits(p.index.batch))
    return cudaErrorInvalidValue;
  if (p.batch == 0 || p.A == 0 || p.F == 0) return cudaSuccess;  // y is empty
  if (p.src.batch <= 0 || p.w_batch <= 0 || p.index.batch <= 0) return cudaErrorInvalidValue;
  GroupedArgs g;
  g.src = p.src.data;
  g.w = p.w;
  g.out = p.y;
  g.relu = p.relu;
  g.lists = p.index.lists;
  g.counts = p.index.counts;
  g.A = static_cast<int>(p.A);
  g.D = static_cast<int>(p.D);
  g.F = static_cast<int>(p.F);
  g.E = static_cast<int>(p.E);
  g.row_div = static_cast<int>(p.row_div);
  g.src_stride = p.src.rows * p.D;
  g.w_stride = p.E * p.D * p.F;
  g.src_div = Div(p.batch, p.src.batch);
  g.w_div = Div(p.batch, p.w_batch);
  g.idx_div = Div(p.batch, p.index.batch);
  switch (p.dtype) {
    case DType::kF32: return PickMatmul<SimtLarge, SimtSmall, float>(g, p, stream);
    case DType::kBF16: return PickMatmul<MmaLarge, MmaSmall, __nv_bfloat16>(g, p, stream);
    case DType::kF16: return PickMatmul<MmaLarge, MmaSmall, __half>(g, p, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchGroupedWgrad(const GroupedWgradParams& p, cudaStream_t stream) {
  const cudaError_t fast = LaunchGroupedWgradSm90(p, stream);
  if (fast != cudaErrorNotSupported) return fast;
  if (!Fits(p.A) || !Fits(p.D) || !Fits(p.F) || !Fits(p.E + 1) || !Fits(p.batch) || p.E < 1 || p.row_div < 1 ||
      !Fits(p.row_div) || !Fits(p.dw_batch) || !Fits(p.src.batch) || !Fits(p.dy.batch) || !Fits(p.index.batch))
    return cudaErrorInvalidValue;
  if (p.dw_batch == 0 || p.D == 0 || p.F == 0) return cudaSuccess;  // dw is empty
  // An empty full batch sums nothing: every block writes zeros (group == 0).
  if (p.batch > 0 && (p.src.batch <= 0 || p.dy.batch <= 0 || p.index.batch <= 0 || p.batch % p.dw_batch != 0))
    return cudaErrorInvalidValue;
  GroupedArgs g;
  g.src = p.src.data;
  g.dy = p.dy.data;
  g.out = p.dw;
  g.lists = p.index.lists;
  g.counts = p.index.counts;
  g.A = static_cast<int>(p.A);
  g.D = static_cast<int>(p.D);
  g.F = static_cast<int>(p.F);
  g.E = static_cast<int>(p.E);
  g.row_div = static_cast<int>(p.row_div);
  g.src_stride = p.src.rows * p.D;
  g.dy_stride = p.A * p.F;
  g.src_div = Div(p.batch, p.src.batch);
  g.dy_div = Div(p.batch, p.dy.batch);
  g.idx_div = Div(p.batch, p.index.batch);
  g.group = static_cast<int>(p.batch / p.dw_batch);
  switch (p.dtype) {
    case DType::kF32: return PickWgrad<SimtLarge, SimtSmall, float>(g, p, stream);
    case DType::kBF16: return PickWgrad<MmaLarge, MmaSmall, __nv_bfloat16>(g, p, stream);
    case DType::kF16: return PickWgrad<MmaLarge, MmaSmall, __half>(g, p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace pit
