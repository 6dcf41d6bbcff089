// Helpers the CUDA handlers share: output poisoning, launch-status reporting.
#pragma once

#include <cstddef>
#include <string>

#include <cuda_runtime.h>

#include "cuda/ffi/ffi_common.h"
#include "cuda/ffi/sread_swrite_args.h"
#include "cuda/kernels/sread_swrite.h"

namespace pit {
namespace gpu {

// Debug poisoning (docs/kernels.md): NaN bytes over the output, on XLA's stream, before
// the kernels run. A memset is capturable in a command buffer.
inline cudaError_t Poison(void* data, size_t bytes, cudaStream_t stream) {
  if (!PoisonOutputs() || data == nullptr || bytes == 0) return cudaSuccess;
  return cudaMemsetAsync(data, 0xff, bytes, stream);
}

// The CUDA handlers' binding: XLA's stream first, then the target's operands
// (cuda/ffi/bindings.h, shared with the CPU handlers).
inline auto Binding() { return ::xla::ffi::Ffi::Bind().Ctx<::xla::ffi::PlatformStream<cudaStream_t>>(); }

// A launch failure as the handler's result, naming the target.
inline ffi::Error LaunchStatus(const char* target, cudaError_t err) {
  if (err == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string(target) + ": " + cudaGetErrorString(err));
}

// The decoded pit_sread / pit_swrite call as the kernels' plain-data PackLaunch.
inline PackLaunch ToLaunch(const PackParams& p) {
  PackLaunch l;
  l.dtype = p.dtype;
  l.batch = p.batch;
  l.rows = p.rows;
  l.cols = p.cols;
  l.tile_h = p.tile_h;
  l.tile_w = p.tile_w;
  l.tile_rows = p.tile_rows;
  l.tile_cols = p.tile_cols;
  l.capacity = p.capacity;
  l.tiles = p.tiles;
  l.count = p.count;
  l.src = p.src;
  l.dst = p.dst;
  l.accumulate = p.accumulate;
  return l;
}

}  // namespace gpu
}  // namespace pit
