// Decoding and validation of pit_row_activation and pit_row_activation_bwd, shared by
// their CPU and CUDA handlers (docs/kernels.md specifies both).
#pragma once

#include <string>

#include "cuda/common/row_activation_params.h"
#include "cuda/ffi/row_blocks_args.h"

namespace pit {

// z [..., M, N], tiles [..., capacity], count [...] (a flat list of row blocks of tile_h
// rows), out (z's shape and dtype), activation (1-4: relu, gelu tanh, gelu erf, silu).
inline ffi::ErrorOr<RowActivationParams> DecodeRowActivationCommon(const std::string& target, ffi::AnyBuffer z,
                                                                   S32Buffer tiles, S32Buffer count,
                                                                   ffi::Result<ffi::AnyBuffer>& out, int64_t tile_h,
                                                                   int64_t activation) {
  auto rb = DecodeRowBlocks(target, "z", z, tiles, count, tile_h);
  if (rb.has_error()) return ffi::Unexpected<ffi::Error>(rb.error());
  if (out->element_type() != z.element_type() || out->element_count() != z.element_count())
    return InvalidArg(target + ": the result must have z's shape and dtype");
  if (activation < 1 || activation >= kNumActivations)
    return InvalidArg(target + ": activation must be 1-" + std::to_string(kNumActivations - 1) +
                      " (relu, gelu, gelu_exact, silu), got " + std::to_string(activation));
  RowActivationParams p;
  static_cast<RowBlocks&>(p) = *rb;
  p.act = static_cast<Activation>(activation);
  p.z = z.untyped_data();
  p.out = out->untyped_data();
  return p;
}

// pit_row_activation: z, fill ([N] in z's dtype, or [0]: zeros), tiles, count -> y.
inline ffi::ErrorOr<RowActivationParams> DecodeRowActivation(ffi::AnyBuffer z, ffi::AnyBuffer fill, S32Buffer tiles,
                                                             S32Buffer count, ffi::Result<ffi::AnyBuffer>& y,
                                                             int64_t tile_h, int64_t activation) {
  const std::string target = "pit_row_activation";
  auto p = DecodeRowActivationCommon(target, z, tiles, count, y, tile_h, activation);
  if (p.has_error()) return p;
  if (fill.element_count() != 0) {
    const auto d = fill.dimensions();
    if (fill.element_type() != z.element_type() || d.size() != 1 || d[0] != p->cols)
      return InvalidArg(target + ": fill must be [" + std::to_string(p->cols) + "] (z's last dim) in z's dtype, or [0]");
    p->fill = fill.untyped_data();
  }
  return p;
}

// pit_row_activation_bwd: z, tiles, count, dy (z's shape and dtype) -> dz; dead_zeros false
// leaves dz's unlisted rows unwritten.
inline ffi::ErrorOr<RowActivationParams> DecodeRowActivationBwd(ffi::AnyBuffer z, S32Buffer tiles, S32Buffer count,
                                                                ffi::AnyBuffer dy, ffi::Result<ffi::AnyBuffer>& dz,
                                                                int64_t tile_h, int64_t activation, bool dead_zeros) {
  const std::string target = "pit_row_activation_bwd";
  auto p = DecodeRowActivationCommon(target, z, tiles, count, dz, tile_h, activation);
  if (p.has_error()) return p;
  if (dy.element_type() != z.element_type() || !SameDims(dy.dimensions(), z.dimensions()))
    return InvalidArg(target + ": dy must have z's shape and dtype");
  p->dy = dy.untyped_data();
  p->dead_zeros = dead_zeros;
  return p;
}

}  // namespace pit
