// pit_sread on the GPU: decode and validate (shared with the CPU handler), then launch
// on XLA's stream (no host sync, no allocation: command-buffer compatible).
#include <cuda_runtime.h>

#include "cuda/ffi/gpu/gpu_common.h"
#include "cuda/ffi/gpu/handlers.h"
#include "cuda/ffi/sread_swrite_args.h"
#include "cuda/kernels/sread_swrite.h"

namespace pit {
namespace {

ffi::Error SreadCuda(cudaStream_t stream, ffi::AnyBuffer x, S32Buffer tiles, S32Buffer count,
                     ffi::Result<ffi::AnyBuffer> packed, int64_t tile_h, int64_t tile_w) {
  ++HandlerCalls();
  auto p = DecodeSread(x, tiles, count, packed, tile_h, tile_w);
  if (p.has_error()) return p.error();
  cudaError_t status = gpu::Poison(packed->untyped_data(), packed->size_bytes(), stream);
  if (status == cudaSuccess) status = LaunchSread(gpu::ToLaunch(*p), stream);
  return gpu::LaunchStatus("pit_sread", status);
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitSreadCuda, pit::SreadCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()              // x
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()  // tiles
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()  // count
                                  .Ret<xla::ffi::AnyBuffer>()              // packed
                                  .Attr<int64_t>("tile_h")
                                  .Attr<int64_t>("tile_w"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
