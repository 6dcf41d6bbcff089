// pit_block_topk's decoded call (docs/kernels.md): plain data shared by the FFI handlers
// (cuda/ffi/block_topk_args.h) and the kernels.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common/block_grid.h"
#include "cuda/common/host_device.h"
#include "cuda/common/matmul_params.h"

namespace pit {

// Matrices handed to one launch of the scores kernel (its parameter block holds their
// addresses); a call with more launches again.
constexpr int kTopkMaxMatrices = 64;
// Groups of matrices (each of one shape, dtype and block) one call takes: their selects
// run as one launch.
constexpr int kTopkMaxGroups = 16;

struct BlockTopkParams : BlockGrid {
  DType dtype = DType::kF32;       // the matrices' element type
  const float* density = nullptr;  // [] on the device: the live fraction of each matrix's blocks
  bool* live = nullptr;            // [M, tile_rows, tile_cols]
  float* scores = nullptr;         // [M, tile_rows, tile_cols]: each block's L1 norm
  float* thresholds = nullptr;     // [M]: each matrix's cut, its keep-th largest score
};

// keep = round-half-even(density * blocks) clipped to [1, blocks] (NaN: 1), in float32
// as jnp computes it (pruning's top_blocks); the cut is the keep-th largest score.
PIT_HOST_DEVICE inline int64_t TopkKeep(float density, int64_t blocks) {
  const float d = density * static_cast<float>(blocks);
  if (!(d >= 1.f)) return 1;
  if (d >= static_cast<float>(blocks)) return blocks;
  const int64_t k = static_cast<int64_t>(rintf(d));
  return k < 1 ? 1 : (k > blocks ? blocks : k);
}

}  // namespace pit
