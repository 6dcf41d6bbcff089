// pit_grouped_matmul on the GPU: decode and validate as the CPU handler does, then launch
// on XLA's stream (no host sync, no allocation: command-buffer compatible).
#include <cuda_runtime.h>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/gpu/gpu_common.h"
#include "cuda/ffi/gpu/handlers.h"
#include "cuda/ffi/moe_args.h"
#include "cuda/kernels/grouped_gemm.h"

namespace pit {
namespace {

constexpr char kTarget[] = "pit_grouped_matmul";

ffi::Error GroupedMatmulCuda(cudaStream_t stream, ffi::AnyBuffer src, ffi::AnyBuffer w, ffi::AnyBuffer lists,
                             ffi::AnyBuffer counts, ffi::Result<ffi::AnyBuffer> y, int64_t row_div, bool trans_w,
                             bool allow_tf32, int64_t activation) {
  ++HandlerCalls();
  auto p = DecodeGroupedMatmulArgs(src, w, lists, counts, y, row_div, trans_w, allow_tf32, activation);
  if (p.has_error()) return p.error();
  cudaError_t status = gpu::Poison(y->untyped_data(), y->size_bytes(), stream);
  if (status == cudaSuccess) status = LaunchGroupedMatmul(*p, stream);
  return gpu::LaunchStatus(kTarget, status);
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitGroupedMatmulCuda, pit::GroupedMatmulCuda,
                              pit::bind::GroupedMatmul(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
