// pit_moe_index on the GPU: decode and validate as the CPU handler does, then launch on
// XLA's stream (no host sync, no allocation: command-buffer compatible).
#include <cuda_runtime.h>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/gpu/gpu_common.h"
#include "cuda/ffi/gpu/handlers.h"
#include "cuda/ffi/moe_args.h"
#include "cuda/kernels/moe_index.h"

namespace pit {
namespace {

constexpr char kTarget[] = "pit_moe_index";

ffi::Error MoeIndexCuda(cudaStream_t stream, ffi::AnyBuffer expert_ids, ffi::Result<ffi::AnyBuffer> lists,
                        ffi::Result<ffi::AnyBuffer> counts, int64_t num_experts) {
  ++HandlerCalls();
  auto p = DecodeMoeIndexArgs(expert_ids, lists, counts, num_experts);
  if (p.has_error()) return p.error();
  cudaError_t status = gpu::Poison(lists->untyped_data(), lists->size_bytes(), stream);
  if (status == cudaSuccess) status = gpu::Poison(counts->untyped_data(), counts->size_bytes(), stream);
  if (status == cudaSuccess) status = LaunchMoeIndex(*p, stream);
  return gpu::LaunchStatus(kTarget, status);
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitMoeIndexCuda, pit::MoeIndexCuda,
                              pit::bind::MoeIndex(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
