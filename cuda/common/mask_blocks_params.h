// pit_mask_blocks's decoded call (docs/kernels.md): plain data shared by the FFI handlers
// (cuda/ffi/mask_blocks_args.h) and the kernel.
#pragma once

#include <cstdint>

#include "cuda/common/block_grid.h"
#include "cuda/common/matmul_params.h"

namespace pit {

// Matrices one launch takes (its parameter block holds their addresses); a call with
// more launches again.
constexpr int kMaskMaxMatrices = 64;

struct MaskBlocksParams : BlockGrid {
  DType in_dtype = DType::kF32;   // the matrices' element type
  DType out_dtype = DType::kF32;  // the results' element type
  const bool* live = nullptr;     // [M, tile_rows, tile_cols]
};

}  // namespace pit
