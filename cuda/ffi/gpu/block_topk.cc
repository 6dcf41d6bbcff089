// pit_block_topk on the GPU: decode and validate (shared with the CPU handler), then launch
// on XLA's stream (no host sync, no allocation: command-buffer compatible).
#include <vector>

#include <cuda_runtime.h>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/block_topk_args.h"
#include "cuda/ffi/gpu/gpu_common.h"
#include "cuda/ffi/gpu/handlers.h"
#include "cuda/kernels/block_topk.h"

namespace pit {
namespace {

ffi::Error BlockTopkCuda(cudaStream_t stream, ffi::AnyBuffer density, ffi::RemainingArgs mats,
                         ffi::Result<ffi::AnyBuffer> live, ffi::Result<ffi::AnyBuffer> scores,
                         ffi::Result<ffi::AnyBuffer> thresholds, int64_t tile_h, int64_t tile_w) {
  ++HandlerCalls();
  std::vector<const void*> bases;
  auto p = DecodeBlockTopk(density, mats, live, scores, thresholds, tile_h, tile_w, bases);
  if (p.has_error()) return p.error();
  cudaError_t status = gpu::Poison(live->untyped_data(), live->size_bytes(), stream);
  if (status == cudaSuccess) status = gpu::Poison(scores->untyped_data(), scores->size_bytes(), stream);
  if (status == cudaSuccess) status = gpu::Poison(thresholds->untyped_data(), thresholds->size_bytes(), stream);
  if (status == cudaSuccess) status = LaunchBlockTopk(*p, bases.data(), stream);
  return gpu::LaunchStatus("pit_block_topk", status);
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitBlockTopkCuda, pit::BlockTopkCuda, pit::bind::BlockTopk(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
