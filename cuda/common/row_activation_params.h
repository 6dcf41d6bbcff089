// pit_row_activation / pit_row_activation_bwd's decoded call (docs/kernels.md): plain data
// shared by the FFI handlers (cuda/ffi/row_activation_args.h) and the kernels.
#pragma once

#include <cstdint>

#include "cuda/common/row_blocks.h"

namespace pit {

// The RowBlocks are z's (dtype: z, fill, dy and the result).
struct RowActivationParams : RowBlocks {
  Activation act = Activation::kNone;
  const void* z = nullptr;                // [batch, rows, cols]
  const void* fill = nullptr;             // forward: [cols], the other rows' value, or null (zeros)
  const void* dy = nullptr;               // backward: [batch, rows, cols]
  void* out = nullptr;                    // forward: y; backward: dz
  // Backward: false leaves the rows the list does not name unwritten (for a dz that only
  // listed-row readers take: dead_zeros in docs/kernels.md), true writes zeros there.
  bool dead_zeros = true;
};

}  // namespace pit
