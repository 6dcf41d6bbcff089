// pit_row_activation / pit_row_activation_bwd's decoded call (docs/kernels.md): plain data
// shared by the FFI handlers (cuda/ffi/row_activation_args.h) and the kernels.
#pragma once

#include <cstdint>

#include "cuda/common/matmul_params.h"

namespace pit {

struct RowActivationParams {
  DType dtype = DType::kF32;              // z, fill, dy and the result
  int64_t batch = 1, rows = 0, cols = 0;  // z [batch, rows, cols]
  int64_t tile_h = 1, tile_rows = 0;      // row blocks of tile_h rows
  int64_t capacity = 0;                   // tiles [batch, capacity]
  const int32_t* tiles = nullptr;         // live row-block ids, then (at full capacity) -1 - dead id
  const int32_t* count = nullptr;         // [batch]
  Activation act = Activation::kNone;
  const void* z = nullptr;                // [batch, rows, cols]
  const void* fill = nullptr;             // forward: [cols], the other rows' value, or null (zeros)
  const void* dy = nullptr;               // backward: [batch, rows, cols]
  void* out = nullptr;                    // forward: y; backward: dz
};

}  // namespace pit
