// pit_mask_blocks on the GPU: decode and validate (shared with the CPU handler), then launch
// on XLA's stream (no host sync, no allocation: command-buffer compatible).
#include <vector>

#include <cuda_runtime.h>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/gpu/gpu_common.h"
#include "cuda/ffi/gpu/handlers.h"
#include "cuda/ffi/mask_blocks_args.h"
#include "cuda/kernels/mask_blocks.h"

namespace pit {
namespace {

ffi::Error MaskBlocksCuda(cudaStream_t stream, ffi::AnyBuffer live, ffi::RemainingArgs mats, ffi::RemainingRets rets,
                          int64_t tile_h, int64_t tile_w) {
  ++HandlerCalls();
  MaskBlocksParams p;
  std::vector<const void*> src;
  std::vector<void*> dst;
  ffi::Error err = DecodeMaskBlocks(live, mats, rets, tile_h, tile_w, p, src, dst);
  if (err.failure()) return err;
  cudaError_t status = cudaSuccess;
  const size_t bytes = static_cast<size_t>(p.rows * p.cols * DTypeBytes(p.out_dtype));
  for (void* d : dst)
    if (status == cudaSuccess) status = gpu::Poison(d, bytes, stream);
  if (status == cudaSuccess) status = LaunchMaskBlocks(p, src.data(), dst.data(), stream);
  return gpu::LaunchStatus("pit_mask_blocks", status);
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitMaskBlocksCuda, pit::MaskBlocksCuda, pit::bind::MaskBlocks(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
