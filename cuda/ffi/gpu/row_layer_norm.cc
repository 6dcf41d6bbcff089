// pit_row_layer_norm on the GPU: decode and validate (shared with the CPU handler), then
// launch on XLA's stream (no host sync, no allocation: command-buffer compatible).
#include <cuda_runtime.h>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/gpu/gpu_common.h"
#include "cuda/ffi/gpu/handlers.h"
#include "cuda/ffi/row_layer_norm_args.h"
#include "cuda/kernels/row_layer_norm.h"

namespace pit {
namespace {

ffi::Error RowLayerNormCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer residual, ffi::AnyBuffer bias,
                            ffi::AnyBuffer scale, ffi::AnyBuffer offset, S32Buffer tiles, S32Buffer count,
                            ffi::Result<ffi::AnyBuffer> y, int64_t tile_h, float epsilon, bool skip_dead) {
  ++HandlerCalls();
  auto p = DecodeRowLayerNorm(x, residual, bias, scale, offset, tiles, count, y, tile_h, epsilon, skip_dead);
  if (p.has_error()) return p.error();
  cudaError_t status = gpu::Poison(y->untyped_data(), y->size_bytes(), stream);
  if (status == cudaSuccess) status = LaunchRowLayerNorm(*p, stream);
  return gpu::LaunchStatus("pit_row_layer_norm", status);
}

ffi::Error RowLayerNormBwdCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer residual, ffi::AnyBuffer bias,
                               ffi::AnyBuffer scale, S32Buffer tiles, S32Buffer count, ffi::AnyBuffer dy,
                               ffi::AnyBuffer dy2, ffi::Result<ffi::AnyBuffer> dh, ffi::Result<ffi::AnyBuffer> dvec,
                               ffi::Result<ffi::AnyBuffer> work, int64_t tile_h, float epsilon) {
  ++HandlerCalls();
  auto q = DecodeRowLayerNormBwd(x, residual, bias, scale, tiles, count, dy, dy2, dh, dvec, work, tile_h, epsilon);
  if (q.has_error()) return q.error();
  cudaError_t status = gpu::Poison(dh->untyped_data(), dh->size_bytes(), stream);
  if (status == cudaSuccess) status = gpu::Poison(dvec->untyped_data(), dvec->size_bytes(), stream);
  if (status == cudaSuccess) status = LaunchRowLayerNormBwd(*q, stream);
  return gpu::LaunchStatus("pit_row_layer_norm_bwd", status);
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowLayerNormCuda, pit::RowLayerNormCuda,
                              pit::bind::RowLayerNorm(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowLayerNormBwdCuda, pit::RowLayerNormBwdCuda,
                              pit::bind::RowLayerNormBwd(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
