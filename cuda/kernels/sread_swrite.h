// pit_sread / pit_swrite on the GPU: gather listed micro-tiles into packed slots, and
// scatter packed slots back into a matrix (docs/kernels.md). No host sync, no
// allocation, no host reads of device data; safe to capture in a CUDA graph. The
// parameters were validated by the handlers (cuda/ffi/sread_swrite_args.h), which
// build the PackParams; the launchers only see plain data.
#pragma once

#include <cuda_runtime.h>

#include "cuda/common/matmul_params.h"

namespace pit {

// One gather/scatter between x [batch, rows, cols] and packed [batch, capacity,
// tile_h, tile_w]. (The same fields as the handlers' PackParams, kept free of XLA.)
struct PackLaunch {
  DType dtype = DType::kF32;
  int64_t batch = 1, rows = 0, cols = 0;
  int64_t tile_h = 1, tile_w = 1, tile_rows = 0, tile_cols = 0;
  int64_t capacity = 0;
  const int32_t* tiles = nullptr;  // [batch, capacity]
  const int32_t* count = nullptr;  // [batch]
  const void* src = nullptr;       // x (sread) or packed (swrite)
  void* dst = nullptr;             // packed (sread) or out (swrite, already holding base)
  bool accumulate = false;         // swrite: out[tile] += packed[slot] (float32, one rounding)
  bool live_only = false;          // sread: leave the slots past the count unwritten, except
  int64_t live_pad_rows = 1;       // ... those whose rows lie below the next multiple of this: zeros
};

// packed[b, s] = tile tiles[b, s] of x for s < min(count[b], capacity), zeros in
// partial-tile padding and in every other slot (with live_only: only the slots past the
// count whose rows lie below round_up(count * tile_h, live_pad_rows) are zeroed, the
// rest are not written, so the pass moves only the live bytes).
cudaError_t LaunchSread(const PackLaunch& p, cudaStream_t stream);

// out[tile tiles[b, s]] = packed[b, s] (or += with accumulate) for s < min(count[b],
// capacity); everything else of out is left alone.
cudaError_t LaunchSwrite(const PackLaunch& p, cudaStream_t stream);

}  // namespace pit
