// pit_row_gather_matmul on the GPU: decode and validate as the CPU handler does, then
// launch on XLA's stream (no host sync, no allocation: command-buffer compatible).
#include <string>

#include <cuda_runtime.h>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/gpu/gpu_common.h"
#include "cuda/ffi/gpu/handlers.h"
#include "cuda/ffi/matmul_args.h"
#include "cuda/kernels/sparse_gemm.h"

namespace pit {
namespace {

constexpr char kTarget[] = "pit_row_gather_matmul";

ffi::Error RowGatherMatmulCuda(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b, S32Buffer tiles,
                               S32Buffer count, ffi::AnyBuffer bias, ffi::AnyBuffer dead_row, ffi::Result<ffi::AnyBuffer> c, int64_t tile_h,
                               bool trans_b, bool allow_tf32, int64_t activation) {
  ++HandlerCalls();
  auto args = DecodeRowGatherArgs(a, b, tiles, count, bias, dead_row, c, tile_h, trans_b, allow_tf32, activation);
  if (args.has_error()) return args.error();
  cudaError_t status = gpu::Poison(c->untyped_data(), c->size_bytes(), stream);
  if (status == cudaSuccess) status = LaunchRowGatherMatmul(args->mm, args->index, stream);
  return gpu::LaunchStatus(kTarget, status);
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowGatherMatmulCuda, pit::RowGatherMatmulCuda,
                              pit::bind::RowGatherMatmul(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
