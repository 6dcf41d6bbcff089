// pit_varlen_attention(_bwd) on the GPU: decode and validate (shared with the CPU handlers),
// then launch on XLA's stream (no host sync, no allocation: command-buffer compatible).
#include <cuda_runtime.h>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/gpu/gpu_common.h"
#include "cuda/ffi/gpu/handlers.h"
#include "cuda/ffi/varlen_attention_args.h"
#include "cuda/kernels/varlen_attention.h"

namespace pit {
namespace {

ffi::Error VarlenAttentionCuda(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                               S32Buffer lengths, S32Buffer order, ffi::Result<ffi::AnyBuffer> out,
                               ffi::Result<ffi::AnyBuffer> lse, float scale, bool causal, bool left_padded,
                               int64_t window_left, int64_t window_right, int64_t max_seqlen) {
  ++HandlerCalls();
  auto p = DecodeVarlenAttention(q, k, v, lengths, order, out, lse, scale, causal, left_padded, window_left,
                                 window_right, max_seqlen);
  if (p.has_error()) return p.error();
  cudaError_t status = gpu::Poison(out->untyped_data(), out->size_bytes(), stream);
  if (status == cudaSuccess) status = gpu::Poison(lse->untyped_data(), lse->size_bytes(), stream);
  if (status == cudaSuccess) status = LaunchVarlenAttention(*p, stream);
  return gpu::LaunchStatus("pit_varlen_attention", status);
}

ffi::Error VarlenAttentionBwdCuda(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                                  ffi::AnyBuffer o, ffi::AnyBuffer lse, ffi::AnyBuffer dout, S32Buffer lengths,
                                  S32Buffer order,
                                  ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                                  ffi::Result<ffi::AnyBuffer> dv, float scale, bool causal, bool left_padded,
                                  int64_t window_left, int64_t window_right, int64_t max_seqlen) {
  ++HandlerCalls();
  auto p = DecodeVarlenAttentionBwd(q, k, v, o, lse, dout, lengths, order, dq, dk, dv, scale, causal,
                                    left_padded, window_left, window_right, max_seqlen);
  if (p.has_error()) return p.error();
  cudaError_t status = cudaSuccess;
  for (auto* r : {&dq, &dk, &dv})
    if (status == cudaSuccess) status = gpu::Poison((*r)->untyped_data(), (*r)->size_bytes(), stream);
  if (status == cudaSuccess) status = LaunchVarlenAttentionBwd(*p, stream);
  return gpu::LaunchStatus("pit_varlen_attention_bwd", status);
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitVarlenAttentionCuda, pit::VarlenAttentionCuda,
                              pit::bind::VarlenAttention(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(PitVarlenAttentionBwdCuda, pit::VarlenAttentionBwdCuda,
                              pit::bind::VarlenAttentionBwd(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
