// pit_sread on the GPU: decode and validate (shared with the CPU handler), then launch
// on XLA's stream (no host sync, no allocation: command-buffer compatible).
#include <cuda_runtime.h>

#include "cuda/common/moe_params.h"
#include "cuda/ffi/bindings.h"
#include "cuda/ffi/gpu/gpu_common.h"
#include "cuda/ffi/gpu/handlers.h"
#include "cuda/ffi/sread_swrite_args.h"
#include "cuda/kernels/sread_swrite.h"

namespace pit {
namespace {

ffi::Error SreadImpl(const char* target, bool live_only, cudaStream_t stream, ffi::AnyBuffer x, S32Buffer tiles,
                     S32Buffer count, ffi::Result<ffi::AnyBuffer> packed, int64_t tile_h, int64_t tile_w) {
  ++HandlerCalls();
  auto p = DecodeSread(x, tiles, count, packed, tile_h, tile_w, target);
  if (p.has_error()) return p.error();
  cudaError_t status = gpu::Poison(packed->untyped_data(), packed->size_bytes(), stream);
  PackLaunch launch = gpu::ToLaunch(*p);
  launch.live_only = live_only;
  launch.live_pad_rows = kPackedRowPad;
  if (status == cudaSuccess) status = LaunchSread(launch, stream);
  return gpu::LaunchStatus(target, status);
}

ffi::Error SreadCuda(cudaStream_t stream, ffi::AnyBuffer x, S32Buffer tiles, S32Buffer count,
                     ffi::Result<ffi::AnyBuffer> packed, int64_t tile_h, int64_t tile_w) {
  return SreadImpl("pit_sread", false, stream, x, tiles, count, packed, tile_h, tile_w);
}

// pit_sread_live: the slots past the count are left unwritten (their contents are
// undefined), so compacting a few live rows moves only those rows; the slots up to the
// next multiple of kPackedRowPad rows are zeros (whole TMA stages for
// pit_grouped_wgrad_packed).
ffi::Error SreadLiveCuda(cudaStream_t stream, ffi::AnyBuffer x, S32Buffer tiles, S32Buffer count,
                         ffi::Result<ffi::AnyBuffer> packed, int64_t tile_h, int64_t tile_w) {
  return SreadImpl("pit_sread_live", true, stream, x, tiles, count, packed, tile_h, tile_w);
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitSreadCuda, pit::SreadCuda,
                              pit::bind::Sread(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitSreadLiveCuda, pit::SreadLiveCuda,
                              pit::bind::Sread(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
