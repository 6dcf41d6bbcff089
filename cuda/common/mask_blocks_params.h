// pit_mask_blocks's decoded call (docs/kernels.md): plain data shared by the FFI handlers
// (cuda/ffi/mask_blocks_args.h) and the kernel.
#pragma once

#include <cstdint>

#include "cuda/common/matmul_params.h"

namespace pit {

// Matrices one launch takes (its parameter block holds their addresses); a call with
// more launches again.
constexpr int kMaskMaxMatrices = 64;

struct MaskBlocksParams {
  DType in_dtype = DType::kF32;   // the matrices' element type
  DType out_dtype = DType::kF32;  // the results' element type
  int64_t matrices = 0;           // M: the matrices of all operands, in operand order
  int64_t rows = 0;               // K
  int64_t cols = 0;               // N
  int64_t tile_h = 1;             // block rows
  int64_t tile_w = 1;             // block columns
  int64_t tile_rows = 0;          // ceil(K / tile_h)
  int64_t tile_cols = 0;          // ceil(N / tile_w)
  const bool* live = nullptr;     // [M, tile_rows, tile_cols]
};

}  // namespace pit
