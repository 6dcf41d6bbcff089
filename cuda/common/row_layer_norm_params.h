// pit_row_layer_norm's decoded call (docs/kernels.md): plain data shared by the FFI
// handlers (cuda/ffi/row_layer_norm_args.h) and the kernel (cuda/kernels/row_layer_norm.h).
#pragma once

#include <cstdint>

#include "cuda/common/row_blocks.h"

namespace pit {

// The RowBlocks are x's (dtype: x, residual and y).
struct RowLayerNormParams : RowBlocks {
  const void* x = nullptr;
  const void* residual = nullptr;          // [batch, rows, cols] or null
  const float* bias = nullptr;             // [cols] or null
  const float* scale = nullptr;            // [cols]
  const float* offset = nullptr;           // [cols]
  float epsilon = 1e-6f;
  // Leave y's unlisted rows unwritten (else zeros). Here, in epsilon's padding: a larger
  // struct (it is the kernels' by-value parameter) changed their code and cost BERT b32's
  // 25 norms ~4.5 us a call (H100, H200).
  bool skip_dead = false;
  void* y = nullptr;                       // [batch, rows, cols]
};

// pit_row_layer_norm_bwd: the cotangents of the forward on the same rows. `fwd` carries
// x, residual, bias, scale and the index (its offset and y are unused).
struct RowLayerNormBwdParams {
  RowLayerNormParams fwd;
  const void* dy = nullptr;  // [batch, rows, cols], x's dtype: the forward's cotangent
  // [batch, rows, cols] or null: a second cotangent of y (a second consumer's), added to dy
  // in float32 on the listed rows (XLA would add the two over every row first).
  const void* dy2 = nullptr;
  void* dh = nullptr;        // [batch, rows, cols], x's dtype: d(x + residual + bias), 0 on dead rows
  float* dvec = nullptr;     // [batch, 3, cols]: sums over the entry's live rows of d scale, d offset, d bias
  float* work = nullptr;     // [batch, warps, 3, cols]: each warp's partial sums (summed in a fixed order)
  int64_t warps = 1;         // warps per batch entry
};

}  // namespace pit
