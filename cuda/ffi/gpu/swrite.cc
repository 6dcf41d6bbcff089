// pit_swrite on the GPU: decode and validate (shared with the CPU handler), then launch
// on XLA's stream (no host sync, no allocation: command-buffer compatible).
#include <cuda_runtime.h>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/gpu/gpu_common.h"
#include "cuda/ffi/gpu/handlers.h"
#include "cuda/ffi/sread_swrite_args.h"
#include "cuda/kernels/sread_swrite.h"

namespace pit {
namespace {

ffi::Error SwriteCuda(cudaStream_t stream, ffi::AnyBuffer packed, S32Buffer tiles, S32Buffer count,
                      ffi::AnyBuffer base, ffi::Result<ffi::AnyBuffer> out, bool accumulate) {
  ++HandlerCalls();
  auto p = DecodeSwrite(packed, tiles, count, base, out, accumulate);
  if (p.has_error()) return p.error();
  // XLA honours the alias (operand 3 -> result 0); should it ever hand over a separate
  // buffer, start from base so the untouched elements keep it. Not poisoned.
  cudaError_t status = cudaSuccess;
  if (out->untyped_data() != base.untyped_data() && base.size_bytes() > 0)
    status = cudaMemcpyAsync(out->untyped_data(), base.untyped_data(), base.size_bytes(), cudaMemcpyDeviceToDevice,
                             stream);
  if (status == cudaSuccess) status = LaunchSwrite(gpu::ToLaunch(*p), stream);
  return gpu::LaunchStatus("pit_swrite", status);
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitSwriteCuda, pit::SwriteCuda,
                              pit::bind::Swrite(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
