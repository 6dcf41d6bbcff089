// Host launcher of the sm_90a pit_stile_matmul kernel (device code: stile_gemm.cuh; notes:
// docs/notes/sm90_stile.md). One launch per call; no host sync, no allocation, no host read
// of device data (the kernel reads the counts).
//
// Covered (anything else returns cudaErrorNotSupported before launching, and the generic
// kernel of sparse_gemm.cu runs):
//   - bf16 / f16 on a device of compute capability 9.0;
//   - trans_b false, trans_c false, c_batch == batch (no batch reduction); a, b and the
//     lists batched or shared as in matmul_params.h;
//   - the two forward uses, micro-tile (tile_h, tile_w) on the masked operand's stored layout:
//       sparse_b (weight blocks on w [K, N], tile (bk, bn)), groups = ceil(N / bn) column
//         blocks of C; x stored [K, M] (trans_a: any bk), or [M, K] (bk % 8 == 0 and
//         K % 8 == 0: whole 16-byte runs of k);
//       !sparse_b with trans_a (K axis on x^T [K, M], tile (tw, th)), groups = ceil(M / th)
//         row blocks of C; any tw;
//     the group extent tile_w (bn or th) a multiple of 8, at most 64;
//   - M % 8 == 0, N % 8 == 0, 16-byte aligned a, b, c; sizes within int32 (M, N, K,
//     capacity * tile_h, the tile count).
// Not covered: the K axis with x untransposed (its gather would be of single columns), f32,
// the backward products (batch reduction, trans_b / trans_c).
#include "cuda/kernels/sm90/stile_gemm.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "cuda/kernels/sm90/launch_util.h"
#include "cuda/kernels/sm90/stile_gemm.cuh"

namespace pit {
namespace {

using sm90::GetDeviceInfo;
using sm90::kMaxDevices;

template <int kKind, int kMode, bool kNoMma = false>
cudaError_t Launch(const sm90_stile::Args& args, int sms, cudaStream_t stream) {
  auto kernel = sm90_stile::StileGemmKernel<kKind, kMode, kNoMma>;
  static bool attr_set[kMaxDevices] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return cudaErrorNotSupported;
  if (!attr_set[dev]) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, sm90_stile::kSmemBytes);
    if (e != cudaSuccess) return e;
    attr_set[dev] = true;
  }
  const int grid = std::min(args.tiles, sms);
  kernel<<<grid, sm90_stile::kThreads, sm90_stile::kSmemBytes, stream>>>(args);
  return cudaGetLastError();
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// PIT_JAX_STILE_ORDER=0 walks the tiles without the order table (A/B timing).
bool OrderTableOn() {
  static const bool on = EnvFlag("PIT_JAX_STILE_ORDER", true);
  return on;
}

}  // namespace

#ifdef PIT_STILE_EXPERIMENTS
// Harness knobs (stile_bench.cu): the K axis on m64n64 even for groups <= 32 rows; gather
// only (no wgmma; wrong results); the other tile order (groups fastest <-> wide fastest).
int g_stile_force_ka64 = 0, g_stile_no_mma = 0, g_stile_groups_fastest = 0;
#endif

cudaError_t LaunchStileGemmSm90(const MatmulParams& p, const TileList& lists, bool sparse_b, cudaStream_t stream) {
  const sm90::DeviceInfo* info = GetDeviceInfo();
  if (info == nullptr || !info->sm90) return cudaErrorNotSupported;
  if (p.dtype != DType::kBF16 && p.dtype != DType::kF16) return cudaErrorNotSupported;
  if (p.trans_b || p.trans_c || p.c_batch != p.batch) return cudaErrorNotSupported;
  if (p.M % 8 != 0 || p.N % 8 != 0) return cudaErrorNotSupported;
  const int64_t gs = lists.tile_w, kt = lists.tile_h;
  if (gs < 8 || gs > 64 || gs % 8 != 0 || kt < 1) return cudaErrorNotSupported;
  // x untransposed: only the weight blocks, as 16-byte runs of k.
  const bool x_k_major = !p.trans_a;
  if (x_k_major && (!sparse_b || kt % 8 != 0 || p.K % 8 != 0)) return cudaErrorNotSupported;
  const int64_t narrow_cols = sparse_b ? p.N : p.M, wide_cols = sparse_b ? p.M : p.N;
  const int64_t groups = (narrow_cols + gs - 1) / gs;
  if (lists.groups != groups) return cudaErrorNotSupported;
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  if (p.batch <= 0 || p.M == 0 || p.N == 0) return p.batch >= 0 ? cudaSuccess : cudaErrorNotSupported;
  if (p.a.batch <= 0 || p.b.batch <= 0 || lists.batch <= 0 || p.batch % p.a.batch || p.batch % p.b.batch ||
      p.batch % lists.batch)
    return cudaErrorNotSupported;
  // (- 64: the kernel's stage positions run up to 31 past a group's listed rows)
  if (p.M > kIntMax || p.N > kIntMax || p.K > kIntMax || lists.capacity > (kIntMax - 64) / kt ||
      groups * lists.capacity > kIntMax / 4)
    return cudaErrorNotSupported;
  if (!Aligned16(p.a.data) || !Aligned16(p.b.data) || !Aligned16(p.c)) return cudaErrorNotSupported;
  const int64_t wide_tiles = (wide_cols + sm90_stile::kWideCols - 1) / sm90_stile::kWideCols;
  const int64_t tiles = p.batch * groups * wide_tiles;
  if (tiles > kIntMax) return cudaErrorNotSupported;

  sm90_stile::Args g;
  const MatrixRef& nar = sparse_b ? p.b : p.a;  // stored [K, cols]
  const MatrixRef& wid = sparse_b ? p.a : p.b;  // stored [K, cols], or x [M, K]
  g.narrow = static_cast<const char*>(nar.data);
  g.wide = static_cast<const char*>(wid.data);
  g.c = static_cast<char*>(p.c);
  g.lists = lists.lists;
  g.counts = lists.counts;
  g.narrow_row_bytes = narrow_cols * 2;
  g.wide_row_bytes = (x_k_major ? p.K : wide_cols) * 2;
  g.narrow_batch_bytes = p.K * narrow_cols * 2;
  g.wide_batch_bytes = p.K * wide_cols * 2;
  g.c_batch_bytes = p.M * p.N * 2;
  g.narrow_cols = static_cast<int>(narrow_cols);
  g.wide_cols = static_cast<int>(wide_cols);
  g.M = static_cast<int>(p.M);
  g.N = static_cast<int>(p.N);
  g.K = static_cast<int>(p.K);
  g.kt = static_cast<int>(kt);
  g.tiles_k = static_cast<int>((p.K + kt - 1) / kt);
  g.gs = static_cast<int>(gs);
  g.groups = static_cast<int>(groups);
  g.capacity = static_cast<int>(lists.capacity);
  g.narrow_div = static_cast<int>(p.batch / nar.batch);
  g.wide_div = static_cast<int>(p.batch / wid.batch);
  g.idx_div = static_cast<int>(p.batch / lists.batch);
  g.wide_tiles = static_cast<int>(wide_tiles);
  g.tiles = static_cast<int>(tiles);
  // The K axis walks groups fastest (the CTAs at work share one 512-column slab of w, which
  // stays in L2); the weight blocks walk the wide tiles fastest (docs/notes/sm90_stile.md,
  // run 2).
  g.groups_fastest = sparse_b ? 0 : 1;
  // Listed groups' tiles first (sm90_stile::TileOrder) where the table fits; with groups
  // fastest only when w is one matrix, since the table walks (wt, b, g) instead of (b, wt, g).
  g.order = OrderTableOn() && p.batch * groups <= sm90_stile::kMaxOrder && (sparse_b || wid.batch == 1) ? 1 : 0;
  const int sms = info->sms;
  const bool bf16 = p.dtype == DType::kBF16;
#ifdef PIT_STILE_EXPERIMENTS
  if (g_stile_groups_fastest) g.groups_fastest = !g.groups_fastest;
  if (g_stile_no_mma) {
    if (sparse_b)
      return x_k_major ? Launch<sm90_stile::kBf16, sm90_stile::kWeightBlocksXK, true>(g, sms, stream)
                       : Launch<sm90_stile::kBf16, sm90_stile::kWeightBlocks, true>(g, sms, stream);
    return gs <= 32 ? Launch<sm90_stile::kBf16, sm90_stile::kKAxis32, true>(g, sms, stream)
                    : Launch<sm90_stile::kBf16, sm90_stile::kKAxis, true>(g, sms, stream);
  }
  const bool force_ka64 = g_stile_force_ka64 != 0;
#else
  constexpr bool force_ka64 = false;
#endif
  if (sparse_b && x_k_major)
    return bf16 ? Launch<sm90_stile::kBf16, sm90_stile::kWeightBlocksXK>(g, sms, stream)
                : Launch<sm90_stile::kF16, sm90_stile::kWeightBlocksXK>(g, sms, stream);
  if (sparse_b)
    return bf16 ? Launch<sm90_stile::kBf16, sm90_stile::kWeightBlocks>(g, sms, stream)
                : Launch<sm90_stile::kF16, sm90_stile::kWeightBlocks>(g, sms, stream);
  if (gs <= 32 && !force_ka64)
    return bf16 ? Launch<sm90_stile::kBf16, sm90_stile::kKAxis32>(g, sms, stream)
                : Launch<sm90_stile::kF16, sm90_stile::kKAxis32>(g, sms, stream);
  return bf16 ? Launch<sm90_stile::kBf16, sm90_stile::kKAxis>(g, sms, stream)
              : Launch<sm90_stile::kF16, sm90_stile::kKAxis>(g, sms, stream);
}

}  // namespace pit
