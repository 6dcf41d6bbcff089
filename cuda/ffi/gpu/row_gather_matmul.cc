// pit_row_gather_matmul on the GPU: decode and validate as the CPU handler does, then
// launch on XLA's stream (no host sync, no allocation: command-buffer compatible).
#include <string>

#include <cuda_runtime.h>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/gpu/gpu_common.h"
#include "cuda/ffi/gpu/handlers.h"
#include "cuda/ffi/matmul_args.h"
#include "cuda/kernels/sparse_gemm.h"

namespace pit {
namespace {

constexpr char kTarget[] = "pit_row_gather_matmul";

ffi::Error RowGatherMatmulCuda(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b, S32Buffer tiles,
                               S32Buffer count, ffi::AnyBuffer bias, ffi::AnyBuffer dead_row, ffi::Result<ffi::AnyBuffer> c, int64_t tile_h,
                               bool trans_b, bool allow_tf32, int64_t activation, bool skip_dead) {
  ++HandlerCalls();
  auto args =
      DecodeRowGatherArgs(a, b, tiles, count, bias, dead_row, c, tile_h, trans_b, allow_tf32, activation, skip_dead);
  if (args.has_error()) return args.error();
  cudaError_t status = gpu::Poison(c->untyped_data(), c->size_bytes(), stream);
  if (status == cudaSuccess) status = LaunchRowGatherMatmul(args->mm, args->index, stream);
  return gpu::LaunchStatus(kTarget, status);
}

ffi::Error RowGatherMatmulPackedCuda(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer a_packed, ffi::AnyBuffer b,
                                     S32Buffer tiles, S32Buffer count, ffi::AnyBuffer bias, ffi::AnyBuffer dead_row,
                                     ffi::Result<ffi::AnyBuffer> c, int64_t tile_h, bool trans_b, bool allow_tf32,
                                     int64_t activation, bool skip_dead) {
  ++HandlerCalls();
  auto args = DecodeRowGatherPackedArgs(a, a_packed, b, tiles, count, bias, dead_row, c, tile_h, trans_b, allow_tf32,
                                        activation, skip_dead);
  if (args.has_error()) return args.error();
  cudaError_t status = gpu::Poison(c->untyped_data(), c->size_bytes(), stream);
  if (status == cudaSuccess) status = LaunchRowGatherMatmul(args->mm, args->index, stream);
  return gpu::LaunchStatus("pit_row_gather_matmul_packed", status);
}

ffi::Error RowGatherMatmulPreCuda(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b, S32Buffer tiles,
                                  S32Buffer count, ffi::AnyBuffer bias, ffi::AnyBuffer dead_row,
                                  ffi::Result<ffi::AnyBuffer> c, ffi::Result<ffi::AnyBuffer> z, int64_t tile_h,
                                  bool trans_b, bool allow_tf32, int64_t activation, bool skip_dead) {
  ++HandlerCalls();
  auto args =
      DecodeRowGatherPreArgs(a, b, tiles, count, bias, dead_row, c, z, tile_h, trans_b, allow_tf32, activation,
                             skip_dead);
  if (args.has_error()) return args.error();
  cudaError_t status = gpu::Poison(c->untyped_data(), c->size_bytes(), stream);
  if (status == cudaSuccess) status = gpu::Poison(z->untyped_data(), z->size_bytes(), stream);
  if (status == cudaSuccess) status = LaunchRowGatherMatmul(args->mm, args->index, stream);
  return gpu::LaunchStatus("pit_row_gather_matmul_pre", status);
}

ffi::Error RowGatherMatmul3Cuda(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b, S32Buffer tiles,
                                S32Buffer count, ffi::AnyBuffer bias, ffi::AnyBuffer dead_row,
                                ffi::Result<ffi::AnyBuffer> c0, ffi::Result<ffi::AnyBuffer> c1,
                                ffi::Result<ffi::AnyBuffer> c2, int64_t tile_h, bool trans_b, bool allow_tf32,
                                int64_t activation, bool skip_dead) {
  ++HandlerCalls();
  ffi::Result<ffi::AnyBuffer> parts[3] = {c0, c1, c2};
  auto args =
      DecodeRowGatherPartsArgs(a, b, tiles, count, bias, dead_row, parts, 3, tile_h, trans_b, allow_tf32, activation,
                               skip_dead);
  if (args.has_error()) return args.error();
  cudaError_t status = cudaSuccess;
  for (auto& c : parts)
    if (status == cudaSuccess) status = gpu::Poison(c->untyped_data(), c->size_bytes(), stream);
  if (status == cudaSuccess) status = LaunchRowGatherMatmul(args->mm, args->index, stream);
  if (status == cudaErrorNotSupported)
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "pit_row_gather_matmul3: needs an sm_90a GPU, 16-bit types and N / 3 a multiple of 256 "
                      "(the lowering checks this; called directly?)");
  return gpu::LaunchStatus("pit_row_gather_matmul3", status);
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowGatherMatmulCuda, pit::RowGatherMatmulCuda,
                              pit::bind::RowGatherMatmul(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowGatherMatmulPackedCuda, pit::RowGatherMatmulPackedCuda,
                              pit::bind::RowGatherMatmulPacked(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowGatherMatmulPreCuda, pit::RowGatherMatmulPreCuda,
                              pit::bind::RowGatherMatmulPre(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowGatherMatmul3Cuda, pit::RowGatherMatmul3Cuda,
                              pit::bind::RowGatherMatmul3(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
