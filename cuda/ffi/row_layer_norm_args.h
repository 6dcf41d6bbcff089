// Decoding and validation of pit_row_layer_norm, shared by its CPU and CUDA handlers
// (docs/kernels.md specifies both).
#pragma once

#include <cmath>
#include <string>

#include "cuda/common/matmul_params.h"
#include "cuda/ffi/ffi_common.h"
#include "cuda/ffi/matmul_args.h"
#include "cuda/ffi/sread_swrite_args.h"
#include "cuda/common/row_layer_norm_params.h"

namespace pit {

// A float32 vector operand [cols] (or [0] where `optional`): its data, or null when empty.
inline ffi::ErrorOr<const float*> DecodeRowVector(ffi::AnyBuffer v, int64_t cols, bool optional, const char* name) {
  const std::string what = std::string("pit_row_layer_norm: ") + name;
  if (v.element_type() != ffi::DataType::F32) return InvalidArg(what + " must be float32");
  const auto d = v.dimensions();
  if (optional && v.element_count() == 0) return static_cast<const float*>(nullptr);
  if (d.size() != 1 || d[0] != cols)
    return InvalidArg(what + " must be [" + std::to_string(cols) + "] (x's last dim)" +
                      (optional ? " or [0]" : ""));
  return static_cast<const float*>(v.untyped_data());
}

// x [..., M, H], residual (x's shape, or [0]), bias / scale / offset float32 [H] (bias
// may be [0]), tiles [..., capacity], count [...]: a flat list of row blocks of tile_h rows.
inline ffi::ErrorOr<RowLayerNormParams> DecodeRowLayerNorm(ffi::AnyBuffer x, ffi::AnyBuffer residual,
                                                           ffi::AnyBuffer bias, ffi::AnyBuffer scale,
                                                           ffi::AnyBuffer offset, S32Buffer tiles, S32Buffer count,
                                                           ffi::Result<ffi::AnyBuffer>& y, int64_t tile_h,
                                                           float epsilon) {
  const std::string target = "pit_row_layer_norm";
  auto dtype = DecodeDType(x.element_type(), target + ": x");
  if (dtype.has_error()) return ffi::Unexpected<ffi::Error>(dtype.error());
  auto m = AsBatchedMatrix(x.dimensions(), "pit_row_layer_norm: x");
  if (m.has_error()) return ffi::Unexpected<ffi::Error>(m.error());
  if (y->element_type() != x.element_type() || y->element_count() != x.element_count())
    return InvalidArg(target + ": y must have x's shape and dtype");
  if (residual.element_count() != 0) {
    if (residual.element_type() != x.element_type()) return InvalidArg(target + ": residual must have x's dtype");
    const auto rd = residual.dimensions(), xd = x.dimensions();
    bool same = rd.size() == xd.size();
    for (size_t i = 0; same && i < rd.size(); ++i) same = rd[i] == xd[i];
    if (!same) return InvalidArg(target + ": residual must have x's shape (or be [0] for none)");
  }
  if (m->rows > 0 && (tile_h < 1 || tile_h > m->rows))
    return InvalidArg(target + ": tile_h must be in [1, M] = [1, " + std::to_string(m->rows) + "], got " +
                      std::to_string(tile_h));
  if (!(epsilon >= 0.f) || !std::isfinite(epsilon))
    return InvalidArg(target + ": epsilon must be finite and >= 0");
  auto b = DecodeRowVector(bias, m->cols, true, "bias");
  if (b.has_error()) return ffi::Unexpected<ffi::Error>(b.error());
  auto s = DecodeRowVector(scale, m->cols, false, "scale");
  if (s.has_error()) return ffi::Unexpected<ffi::Error>(s.error());
  auto o = DecodeRowVector(offset, m->cols, false, "offset");
  if (o.has_error()) return ffi::Unexpected<ffi::Error>(o.error());
  const auto td = tiles.dimensions();
  if (td.size() < 1) return InvalidArg(target + ": tiles must be [..., capacity]");
  RowLayerNormParams p;
  p.dtype = *dtype;
  p.batch = m->batch;
  p.rows = m->rows;
  p.cols = m->cols;
  p.tile_h = tile_h < 1 ? 1 : tile_h;
  p.tile_rows = CeilDiv(p.rows, p.tile_h);
  p.capacity = td.back();
  auto err = CheckTileOperands(target, tiles, count, p.batch, p.capacity);
  if (err.failure()) return ffi::Unexpected<ffi::Error>(err);
  p.tiles = tiles.typed_data();
  p.count = count.typed_data();
  p.x = x.untyped_data();
  p.residual = residual.element_count() != 0 ? residual.untyped_data() : nullptr;
  p.bias = *b;
  p.scale = *s;
  p.offset = *o;
  p.epsilon = epsilon;
  p.y = y->untyped_data();
  return p;
}

}  // namespace pit
