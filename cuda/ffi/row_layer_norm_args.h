// Decoding and validation of pit_row_layer_norm, shared by its CPU and CUDA handlers
// (docs/kernels.md specifies both).
#pragma once

#include <cmath>
#include <string>

#include "cuda/common/matmul_params.h"
#include "cuda/ffi/ffi_common.h"
#include "cuda/ffi/row_blocks_args.h"
#include "cuda/common/row_layer_norm_params.h"

namespace pit {

// A float32 vector operand [cols] (or [0] where `optional`): its data, or null when empty.
inline ffi::ErrorOr<const float*> DecodeRowVector(const std::string& target, ffi::AnyBuffer v, int64_t cols,
                                                  bool optional, const char* name) {
  const std::string what = target + ": " + name;
  if (v.element_type() != ffi::DataType::F32) return InvalidArg(what + " must be float32");
  const auto d = v.dimensions();
  if (optional && v.element_count() == 0) return static_cast<const float*>(nullptr);
  if (d.size() != 1 || d[0] != cols)
    return InvalidArg(what + " must be [" + std::to_string(cols) + "] (x's last dim)" +
                      (optional ? " or [0]" : ""));
  return static_cast<const float*>(v.untyped_data());
}

// The operands both targets share: x [..., M, H], residual (x's shape, or [0]), bias /
// scale float32 [H] (bias may be [0]), tiles [..., capacity], count [...] (a flat list of
// row blocks of tile_h rows), tile_h and epsilon. Leaves offset and y unset.
inline ffi::ErrorOr<RowLayerNormParams> DecodeRowLayerNormOperands(const std::string& target, ffi::AnyBuffer x,
                                                                   ffi::AnyBuffer residual, ffi::AnyBuffer bias,
                                                                   ffi::AnyBuffer scale, S32Buffer tiles,
                                                                   S32Buffer count, int64_t tile_h, float epsilon) {
  auto rb = DecodeRowBlocks(target, "x", x, tiles, count, tile_h);
  if (rb.has_error()) return ffi::Unexpected<ffi::Error>(rb.error());
  if (residual.element_count() != 0) {
    if (residual.element_type() != x.element_type()) return InvalidArg(target + ": residual must have x's dtype");
    if (!SameDims(residual.dimensions(), x.dimensions()))
      return InvalidArg(target + ": residual must have x's shape (or be [0] for none)");
  }
  if (!(epsilon >= 0.f) || !std::isfinite(epsilon))
    return InvalidArg(target + ": epsilon must be finite and >= 0");
  auto b = DecodeRowVector(target, bias, rb->cols, true, "bias");
  if (b.has_error()) return ffi::Unexpected<ffi::Error>(b.error());
  auto s = DecodeRowVector(target, scale, rb->cols, false, "scale");
  if (s.has_error()) return ffi::Unexpected<ffi::Error>(s.error());
  RowLayerNormParams p;
  static_cast<RowBlocks&>(p) = *rb;
  p.x = x.untyped_data();
  p.residual = residual.element_count() != 0 ? residual.untyped_data() : nullptr;
  p.bias = *b;
  p.scale = *s;
  p.epsilon = epsilon;
  return p;
}

// pit_row_layer_norm: the shared operands, offset float32 [H], y (x's shape and dtype).
inline ffi::ErrorOr<RowLayerNormParams> DecodeRowLayerNorm(ffi::AnyBuffer x, ffi::AnyBuffer residual,
                                                           ffi::AnyBuffer bias, ffi::AnyBuffer scale,
                                                           ffi::AnyBuffer offset, S32Buffer tiles, S32Buffer count,
                                                           ffi::Result<ffi::AnyBuffer>& y, int64_t tile_h,
                                                           float epsilon, bool skip_dead) {
  const std::string target = "pit_row_layer_norm";
  auto p = DecodeRowLayerNormOperands(target, x, residual, bias, scale, tiles, count, tile_h, epsilon);
  if (p.has_error()) return p;
  if (y->element_type() != x.element_type() || y->element_count() != x.element_count())
    return InvalidArg(target + ": y must have x's shape and dtype");
  auto o = DecodeRowVector(target, offset, p->cols, false, "offset");
  if (o.has_error()) return ffi::Unexpected<ffi::Error>(o.error());
  p->offset = *o;
  p->y = y->untyped_data();
  p->skip_dead = skip_dead;
  return p;
}

// pit_row_layer_norm_bwd: the shared operands, dy and dy2 (x's shape and dtype; dy2 may be
// [0]); results dh (x's shape and dtype), dvec float32 [..., 3, H], work float32
// [..., warps, 3, H].
inline ffi::ErrorOr<RowLayerNormBwdParams> DecodeRowLayerNormBwd(
    ffi::AnyBuffer x, ffi::AnyBuffer residual, ffi::AnyBuffer bias, ffi::AnyBuffer scale, S32Buffer tiles,
    S32Buffer count, ffi::AnyBuffer dy, ffi::AnyBuffer dy2, ffi::Result<ffi::AnyBuffer>& dh,
    ffi::Result<ffi::AnyBuffer>& dvec, ffi::Result<ffi::AnyBuffer>& work, int64_t tile_h, float epsilon) {
  const std::string target = "pit_row_layer_norm_bwd";
  auto p = DecodeRowLayerNormOperands(target, x, residual, bias, scale, tiles, count, tile_h, epsilon);
  if (p.has_error()) return ffi::Unexpected<ffi::Error>(p.error());
  if (dy.element_type() != x.element_type() || !SameDims(dy.dimensions(), x.dimensions()))
    return InvalidArg(target + ": dy must have x's shape and dtype");
  if (dy2.element_count() != 0 &&
      (dy2.element_type() != x.element_type() || !SameDims(dy2.dimensions(), x.dimensions())))
    return InvalidArg(target + ": dy2 must have x's shape and dtype (or be [0] for none)");
  if (dh->element_type() != x.element_type() || dh->element_count() != x.element_count())
    return InvalidArg(target + ": dh must have x's shape and dtype");
  const int64_t vec = 3 * p->cols;
  if (dvec->element_type() != ffi::DataType::F32 || static_cast<int64_t>(dvec->element_count()) != p->batch * vec)
    return InvalidArg(target + ": dvec must be float32 [..., 3, H] (x's batch dims)");
  const auto wd = work->dimensions();
  if (work->element_type() != ffi::DataType::F32 || wd.size() < 3 || wd[wd.size() - 3] < 1 ||
      static_cast<int64_t>(work->element_count()) != p->batch * wd[wd.size() - 3] * vec)
    return InvalidArg(target + ": work must be float32 [..., warps, 3, H] with warps >= 1 (x's batch dims)");
  RowLayerNormBwdParams q;
  q.fwd = *p;
  q.dy = dy.untyped_data();
  q.dy2 = dy2.element_count() != 0 ? dy2.untyped_data() : nullptr;
  q.dh = dh->untyped_data();
  q.dvec = static_cast<float*>(dvec->untyped_data());
  q.work = static_cast<float*>(work->untyped_data());
  q.warps = wd[wd.size() - 3];
  return q;
}

}  // namespace pit
