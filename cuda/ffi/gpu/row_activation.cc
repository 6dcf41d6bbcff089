// pit_row_activation(_bwd) on the GPU: decode and validate (shared with the CPU handlers),
// then launch on XLA's stream (no host sync, no allocation: command-buffer compatible).
#include <cuda_runtime.h>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/gpu/gpu_common.h"
#include "cuda/ffi/gpu/handlers.h"
#include "cuda/ffi/row_activation_args.h"
#include "cuda/kernels/row_activation.h"

namespace pit {
namespace {

ffi::Error RowActivationCuda(cudaStream_t stream, ffi::AnyBuffer z, ffi::AnyBuffer fill, S32Buffer tiles,
                             S32Buffer count, ffi::Result<ffi::AnyBuffer> y, int64_t tile_h, int64_t activation) {
  ++HandlerCalls();
  auto p = DecodeRowActivation(z, fill, tiles, count, y, tile_h, activation);
  if (p.has_error()) return p.error();
  cudaError_t status = gpu::Poison(y->untyped_data(), y->size_bytes(), stream);
  if (status == cudaSuccess) status = LaunchRowActivation(*p, stream);
  return gpu::LaunchStatus("pit_row_activation", status);
}

ffi::Error RowActivationBwdCuda(cudaStream_t stream, ffi::AnyBuffer z, S32Buffer tiles, S32Buffer count,
                                ffi::AnyBuffer dy, ffi::Result<ffi::AnyBuffer> dz, int64_t tile_h,
                                int64_t activation, bool dead_zeros) {
  ++HandlerCalls();
  auto p = DecodeRowActivationBwd(z, tiles, count, dy, dz, tile_h, activation, dead_zeros);
  if (p.has_error()) return p.error();
  cudaError_t status = gpu::Poison(dz->untyped_data(), dz->size_bytes(), stream);
  if (status == cudaSuccess) status = LaunchRowActivationBwd(*p, stream);
  return gpu::LaunchStatus("pit_row_activation_bwd", status);
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowActivationCuda, pit::RowActivationCuda,
                              pit::bind::RowActivation(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowActivationBwdCuda, pit::RowActivationBwdCuda,
                              pit::bind::RowActivationBwd(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
