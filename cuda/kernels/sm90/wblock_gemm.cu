// Host launcher of the sm_90a (32, 64) weight-block product (device code: wblock_gemm.cuh;
// notes: docs/notes/sm90_wblock.md). One launch per call; no host sync, no allocation, no
// host read of device data (the CTAs read the counts).
//
// Covered (anything else returns cudaErrorNotSupported before launching, and the other
// stile kernels run):
//   - bf16 / f16 on a device of compute capability 9.0;
//   - sparse_b with micro-tile (32, 64) on w's stored [K, N] layout, trans_a and trans_c
//     false, c_batch == batch (no batch reduction), one C part; a, w and the lists batched
//     or shared as in matmul_params.h;
//   - trans_b false: the forward x [M, K] @ (w o mask) [K, N] (per-column lists);
//     trans_b true: dx = dy [M, N] @ (w o mask)^T with w stored [K_out, N] (per-row lists);
//   - the stored rows of a, w and C whole 16-byte vectors (K and N multiples of 8), the
//     pointers 16-byte aligned, at most 1024 reduction blocks, a grid within limits;
//   - lists as pit_jax builds them: no entry twice (an entry is summed once per listing);
//     an entry outside the reduction adds nothing.
#include "cuda/kernels/sm90/wblock_gemm.h"

#include <algorithm>
#include <cstdint>

#include "cuda/kernels/device_utils.cuh"
#include "cuda/kernels/sm90/launch_util.h"
#include "cuda/kernels/sm90/wblock_gemm.cuh"

namespace pit {
namespace {

using sm90::GetDeviceInfo;
using sm90::kMaxDevices;
using namespace sm90_wblock;

template <int kKind, bool kDx>
cudaError_t Launch(const CUtensorMap& map_a, const CUtensorMap& map_w, const CUtensorMap& map_c,
                           const Args& g, dim3 grid, cudaStream_t stream) {
  auto kernel = WeightBlockGemmKernel<kKind, kDx>;
  static bool attr_set[kMaxDevices] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return cudaErrorNotSupported;
  if (!attr_set[dev]) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Layout<kDx>::kBytes);
    if (e != cudaSuccess) return e;
    attr_set[dev] = true;
  }
  kernel<<<grid, kThreads, Layout<kDx>::kBytes, stream>>>(map_a, map_w, map_c, g);
  return cudaGetLastError();
}

// PIT_JAX_WBLOCK=0 turns this kernel off (the other stile kernels run): for A/B timing.
bool Off() {
  static const bool off = !EnvFlag("PIT_JAX_WBLOCK", true);
  return off;
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// A 3-D tiled map of a [batch, rows, cols] row-major 16-bit matrix, zero fill out of bounds.
bool MakeMap(CUtensorMap* map, CUtensorMapDataType dt, const void* data, int64_t cols, int64_t rows, int64_t batch,
             uint32_t box_cols, uint32_t box_rows, CUtensorMapSwizzle swizzle) {
  auto encode = sm90::GetEncodeTiled();
  if (encode == nullptr) return false;
  cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows), static_cast<cuuint64_t>(batch)};
  cuuint64_t strides[2] = {static_cast<cuuint64_t>(cols * 2), static_cast<cuuint64_t>(cols * rows * 2)};
  cuuint32_t box[3] = {box_cols, box_rows, 1u};
  cuuint32_t estrides[3] = {1, 1, 1};
  return encode(map, dt, 3, const_cast<void*>(data), dims, strides, box, estrides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

cudaError_t LaunchWeightBlockGemmSm90(const MatmulParams& p, const TileList& lists, bool sparse_b,
                                      cudaStream_t stream) {
  const sm90::DeviceInfo* info = GetDeviceInfo();
  if (info == nullptr || !info->sm90 || Off()) return cudaErrorNotSupported;
  if (p.dtype != DType::kBF16 && p.dtype != DType::kF16) return cudaErrorNotSupported;
  if (!sparse_b || p.trans_a || p.trans_c || p.c_batch != p.batch || p.c_parts != 1) return cudaErrorNotSupported;
  if (lists.tile_h != 32 || lists.tile_w != 64) return cudaErrorNotSupported;
  if (p.K % 8 != 0 || p.N % 8 != 0) return cudaErrorNotSupported;
  const bool dx = p.trans_b;
  // Reduction blocks (entries) and column groups of C.
  const int64_t entries = dx ? (p.K + 63) / 64 : (p.K + 31) / 32;
  const int64_t groups = dx ? (p.N + 31) / 32 : (p.N + 63) / 64;
  // At most 1024 entries: what the lowering expects this kernel to cover
  // (stile_matmul._weight_block_kernel_covers); the kernel itself has no such limit.
  if (lists.groups != groups || entries > 1024) return cudaErrorNotSupported;
  if (p.batch <= 0 || p.M == 0 || p.N == 0) return p.batch >= 0 ? cudaSuccess : cudaErrorNotSupported;
  if (p.a.batch <= 0 || p.b.batch <= 0 || lists.batch <= 0 || p.batch % p.a.batch || p.batch % p.b.batch ||
      p.batch % lists.batch)
    return cudaErrorNotSupported;
  const int64_t m_tiles = (p.M + kBM - 1) / kBM;
  if (m_tiles > 65535 || p.batch > 65535 || groups > 0x7FFFFFFF || p.M > 0x7FFFFFFF ||
      lists.capacity > 0x7FFFFFFF || lists.batch * groups * lists.capacity > (int64_t{1} << 40))
    return cudaErrorNotSupported;
  if (!Aligned16(p.a.data) || !Aligned16(p.b.data) || !Aligned16(p.c)) return cudaErrorNotSupported;

  const bool bf16 = p.dtype == DType::kBF16;
  const CUtensorMapDataType dt = bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  CUtensorMap map_a, map_w, map_c;
  // a [M, K]: slabs of 256 rows x one entry's reduction depth. w: (32, 64) blocks of its
  // stored [rows, cols] ([K, N] forward, [N, K] = [K_out, N_w] for dx). C [M, N]: one
  // group's 256 x 64 (forward) or 256 x 32 (dx) tile.
  const bool ok =
      MakeMap(&map_a, dt, p.a.data, p.K, p.M, p.a.batch, dx ? 64 : 32, kBM,
              dx ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B) &&
      MakeMap(&map_w, dt, p.b.data, dx ? p.K : p.N, dx ? p.N : p.K, p.b.batch, 64, 32, CU_TENSOR_MAP_SWIZZLE_128B) &&
      MakeMap(&map_c, dt, p.c, p.N, p.M, p.batch, dx ? 32 : 64, kBM,
              dx ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B);
  if (!ok) return cudaErrorNotSupported;

  Args g;
  g.lists = lists.lists;
  g.counts = lists.counts;
  g.groups = static_cast<int>(groups);
  g.capacity = static_cast<int>(lists.capacity);
  g.entries = static_cast<int>(entries);
  g.a_div = static_cast<int>(p.batch / p.a.batch);
  g.b_div = static_cast<int>(p.batch / p.b.batch);
  g.idx_div = static_cast<int>(p.batch / lists.batch);
  const dim3 grid(static_cast<unsigned>(groups), static_cast<unsigned>(m_tiles), static_cast<unsigned>(p.batch));
  if (dx)
    return bf16 ? Launch<kBf16, true>(map_a, map_w, map_c, g, grid, stream)
                : Launch<kF16, true>(map_a, map_w, map_c, g, grid, stream);
  return bf16 ? Launch<kBf16, false>(map_a, map_w, map_c, g, grid, stream)
              : Launch<kF16, false>(map_a, map_w, map_c, g, grid, stream);
}

}  // namespace pit
