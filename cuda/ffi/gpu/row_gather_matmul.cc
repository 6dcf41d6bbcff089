// pit_row_gather_matmul on the GPU: decode and validate as the CPU handler does, then
// launch on XLA's stream (no host sync, no allocation: command-buffer compatible).
#include <string>

#include <cuda_runtime.h>

#include "cuda/ffi/gpu/gpu_common.h"
#include "cuda/ffi/gpu/handlers.h"
#include "cuda/ffi/matmul_args.h"
#include "cuda/kernels/sparse_gemm.h"

namespace pit {
namespace {

constexpr char kTarget[] = "pit_row_gather_matmul";

ffi::Error RowGatherMatmulCuda(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b, S32Buffer tiles,
                               S32Buffer count, ffi::Result<ffi::AnyBuffer> c, int64_t tile_h, bool trans_b,
                               bool allow_tf32) {
  ++HandlerCalls();
  auto p = DecodeMatmul(kTarget, a, b, c->dimensions(), c->element_type(), c->untyped_data(), false, trans_b, false,
                        allow_tf32);
  if (p.has_error()) return p.error();
  // c has a's leading dims: no batch reduction, and a is never the shared operand.
  if (p->a.batch != p->batch || p->c_batch != p->batch)
    return ffi::Error::InvalidArgument(std::string(kTarget) + ": the result must have a's leading dims, and b's "
                                       "batch count must divide a's");
  auto t = DecodeFlatList(kTarget, tiles, count, tile_h, 1);
  if (t.has_error()) return t.error();
  auto err = CheckIndexBatch(kTarget, *t, p->a.batch, "a");
  if (err.failure()) return err;
  cudaError_t status = gpu::Poison(c->untyped_data(), c->size_bytes(), stream);
  if (status == cudaSuccess) status = LaunchRowGatherMatmul(*p, *t, stream);
  return gpu::LaunchStatus(kTarget, status);
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowGatherMatmulCuda, pit::RowGatherMatmulCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()              // a
                                  .Arg<xla::ffi::AnyBuffer>()              // b
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()  // tiles
                                  .Arg<xla::ffi::Buffer<xla::ffi::S32>>()  // count
                                  .Ret<xla::ffi::AnyBuffer>()              // c
                                  .Attr<int64_t>("tile_h")
                                  .Attr<bool>("trans_b")
                                  .Attr<bool>("allow_tf32"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
