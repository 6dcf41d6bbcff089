// pit_index on the GPU: decode, validate, launch on XLA's stream. No host sync and no
// allocation, so the handler is safe to capture in a command buffer (CUDA graph).
#include <cuda_runtime.h>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/gpu/gpu_common.h"
#include "cuda/ffi/gpu/handlers.h"
#include "cuda/ffi/index_args.h"
#include "cuda/kernels/index.h"

namespace pit {
namespace {

// The decoded call's launch (both targets share the kernels and IndexParams).
ffi::Error Launch(const char* target, const ffi::ErrorOr<IndexParams>& p, cudaStream_t stream) {
  ++HandlerCalls();
  if (p.has_error()) return p.error();
  return gpu::LaunchStatus(target, LaunchIndex(*p, stream));
}

ffi::Error IndexCuda(cudaStream_t stream, ffi::AnyBuffer x, S32Result tiles, S32Result count, S32Result row_tiles,
                     S32Result row_count, S32Result col_tiles, S32Result col_count, S32Result scratch, int64_t tile_h, int64_t tile_w,
                     bool group_rows, bool group_cols) {
  return Launch("pit_index",
                DecodeIndexArgs(x, {tiles, count, row_tiles, row_count, col_tiles, col_count, scratch}, tile_h, tile_w,
                                group_rows, group_cols),
                stream);
}

ffi::Error IndexSplitCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::RemainingRets rets, int64_t tile_h, int64_t tile_w,
                          bool group_rows, bool group_cols) {
  return Launch("pit_index_split", DecodeIndexSplitArgs(x, rets, tile_h, tile_w, group_rows, group_cols), stream);
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitIndexCuda, pit::IndexCuda,
                              pit::bind::Index(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(PitIndexSplitCuda, pit::IndexSplitCuda,
                              pit::bind::IndexSplit(pit::gpu::Binding()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
