// pit_grouped_wgrad on the GPU: decode and validate as the CPU handler does, then launch
// on XLA's stream (no host sync, no allocation: command-buffer compatible).
#include <cuda_runtime.h>

#include <string>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/gpu/gpu_common.h"
#include "cuda/ffi/gpu/handlers.h"
#include "cuda/ffi/moe_args.h"
#include "cuda/kernels/grouped_gemm.h"

namespace pit {
namespace {

constexpr char kTarget[] = "pit_grouped_wgrad";

ffi::Error Run(const char* target, bool packed, cudaStream_t stream, ffi::AnyBuffer src, ffi::AnyBuffer dy,
               ffi::AnyBuffer lists, ffi::AnyBuffer counts, ffi::Result<ffi::AnyBuffer> dw, int64_t row_div,
               bool allow_tf32) {
  ++HandlerCalls();
  auto p = DecodeGroupedWgradArgs(src, dy, lists, counts, dw, row_div, allow_tf32);
  if (p.has_error()) return p.error();
  if (packed && row_div != 1) return ffi::Error::InvalidArgument(std::string(target) + ": row_div must be 1");
  p->packed = packed;
  cudaError_t status = gpu::Poison(dw->untyped_data(), dw->size_bytes(), stream);
  if (status == cudaSuccess) status = LaunchGroupedWgrad(*p, stream);
  return gpu::LaunchStatus(target, status);
}

ffi::Error GroupedWgradCuda(cudaStream_t stream, ffi::AnyBuffer src, ffi::AnyBuffer dy, ffi::AnyBuffer lists,
                            ffi::AnyBuffer counts, ffi::Result<ffi::AnyBuffer> dw, int64_t row_div, bool allow_tf32) {
  return Run(kTarget, false, stream, src, dy, lists, counts, dw, row_div, allow_tf32);
}

// pit_grouped_wgrad_packed: the same contract, with src and dy rows packed by
// pit_sread_live and lists that are the identity on their first count entries
// (GroupedWgradParams::packed).
ffi::Error GroupedWgradPackedCuda(cudaStream_t stream, ffi::AnyBuffer src, ffi::AnyBuffer dy, ffi::AnyBuffer lists,
                                  ffi::AnyBuffer counts, ffi::Result<ffi::AnyBuffer> dw, int64_t row_div,
                                  bool allow_tf32) {
  return Run("pit_grouped_wgrad_packed", true, stream, src, dy, lists, counts, dw, row_div, allow_tf32);
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitGroupedWgradCuda, pit::GroupedWgradCuda,
                              pit::bind::GroupedWgrad(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitGroupedWgradPackedCuda, pit::GroupedWgradPackedCuda,
                              pit::bind::GroupedWgrad(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
