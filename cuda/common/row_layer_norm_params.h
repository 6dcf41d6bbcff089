// pit_row_layer_norm's decoded call (docs/kernels.md): plain data shared by the FFI
// handlers (cuda/ffi/row_layer_norm_args.h) and the kernel (cuda/kernels/row_layer_norm.h).
#pragma once

#include <cstdint>

#include "cuda/common/matmul_params.h"

namespace pit {

struct RowLayerNormParams {
  DType dtype = DType::kF32;               // x, residual and y
  int64_t batch = 1, rows = 0, cols = 0;   // x [batch, rows, cols]
  int64_t tile_h = 1, tile_rows = 0;       // row blocks of tile_h rows
  int64_t capacity = 0;                    // tiles [batch, capacity]
  const int32_t* tiles = nullptr;          // live row-block ids, then (at full capacity) -1 - dead id
  const int32_t* count = nullptr;          // [batch]
  const void* x = nullptr;
  const void* residual = nullptr;          // [batch, rows, cols] or null
  const float* bias = nullptr;             // [cols] or null
  const float* scale = nullptr;            // [cols]
  const float* offset = nullptr;           // [cols]
  float epsilon = 1e-6f;
  void* y = nullptr;                       // [batch, rows, cols]
};

}  // namespace pit
