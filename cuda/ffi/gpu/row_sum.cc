// pit_row_sum on the GPU: decode and validate (shared with the CPU handler), then launch
// on XLA's stream (no host sync, no allocation: command-buffer compatible).
#include <cuda_runtime.h>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/gpu/gpu_common.h"
#include "cuda/ffi/gpu/handlers.h"
#include "cuda/ffi/row_sum_args.h"
#include "cuda/kernels/row_sum.h"

namespace pit {
namespace {

ffi::Error RowSumCuda(cudaStream_t stream, ffi::AnyBuffer x, S32Buffer tiles, S32Buffer count,
                      ffi::Result<ffi::AnyBuffer> sums, ffi::Result<ffi::AnyBuffer> work, int64_t tile_h) {
  ++HandlerCalls();
  auto p = DecodeRowSum(x, tiles, count, sums, work, tile_h);
  if (p.has_error()) return p.error();
  cudaError_t status = gpu::Poison(sums->untyped_data(), sums->size_bytes(), stream);
  if (status == cudaSuccess) status = gpu::Poison(work->untyped_data(), work->size_bytes(), stream);
  if (status == cudaSuccess) status = LaunchRowSum(*p, stream);
  return gpu::LaunchStatus("pit_row_sum", status);
}

ffi::Error RowConcatSumCuda(cudaStream_t stream, ffi::AnyBuffer x0, ffi::AnyBuffer x1, ffi::AnyBuffer x2,
                            S32Buffer tiles, S32Buffer count, ffi::Result<ffi::AnyBuffer> cat,
                            ffi::Result<ffi::AnyBuffer> sums, ffi::Result<ffi::AnyBuffer> work, int64_t tile_h) {
  ++HandlerCalls();
  auto p = DecodeRowConcatSum(x0, x1, x2, tiles, count, cat, sums, work, tile_h);
  if (p.has_error()) return p.error();
  cudaError_t status = gpu::Poison(cat->untyped_data(), cat->size_bytes(), stream);
  if (status == cudaSuccess) status = gpu::Poison(sums->untyped_data(), sums->size_bytes(), stream);
  if (status == cudaSuccess) status = gpu::Poison(work->untyped_data(), work->size_bytes(), stream);
  if (status == cudaSuccess) status = LaunchRowSum(*p, stream);
  return gpu::LaunchStatus("pit_row_concat_sum", status);
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowSumCuda, pit::RowSumCuda, pit::bind::RowSum(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowConcatSumCuda, pit::RowConcatSumCuda,
                              pit::bind::RowConcatSum(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
