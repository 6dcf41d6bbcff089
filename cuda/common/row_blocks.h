// What the row-wise targets (pit_row_layer_norm(_bwd), pit_row_activation(_bwd)) share:
// a batch of [rows, cols] matrices and a flat list of its row blocks (an M-axis index).
#pragma once

#include <cstdint>

#include "cuda/common/matmul_params.h"

namespace pit {

struct RowBlocks {
  DType dtype = DType::kF32;              // the matrices' (and results') element type
  int64_t batch = 1, rows = 0, cols = 0;  // [batch, rows, cols]
  int64_t tile_h = 1, tile_rows = 0;      // row blocks of tile_h rows
  int64_t capacity = 0;                   // tiles [batch, capacity]
  const int32_t* tiles = nullptr;         // live row-block ids, then (at full capacity) -1 - dead id
  const int32_t* count = nullptr;         // [batch]
};

}  // namespace pit
