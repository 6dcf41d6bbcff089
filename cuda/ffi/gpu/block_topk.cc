// pit_block_topk on the GPU: decode and validate (shared with the CPU handler), then launch
// on XLA's stream (no host sync, no allocation: command-buffer compatible).
#include <utility>
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
                         ffi::RemainingRets rets, ffi::Span<const int64_t> tile_h, ffi::Span<const int64_t> tile_w,
                         ffi::Span<const int64_t> group_sizes) {
  ++HandlerCalls();
  std::vector<BlockTopkParams> groups;
  std::vector<const void*> bases;
  std::vector<std::pair<void*, size_t>> outputs;
  ffi::Error err = DecodeBlockTopk(density, mats, rets, tile_h, tile_w, group_sizes, groups, bases, outputs);
  if (err.failure()) return err;
  cudaError_t status = cudaSuccess;
  for (const auto& o : outputs)
    if (status == cudaSuccess) status = gpu::Poison(o.first, o.second, stream);
  if (status == cudaSuccess)
    status = LaunchBlockTopk(groups.data(), static_cast<int>(groups.size()), bases.data(), stream);
  return gpu::LaunchStatus("pit_block_topk", status);
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitBlockTopkCuda, pit::BlockTopkCuda, pit::bind::BlockTopk(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
