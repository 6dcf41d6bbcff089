// Decoding and validation of pit_sread / pit_swrite, shared by their CPU and CUDA
// handlers (docs/kernels.md specifies both).
#pragma once

#include <string>

#include "cuda/common/matmul_params.h"
#include "cuda/ffi/ffi_common.h"
#include "cuda/ffi/matmul_args.h"

namespace pit {

// One gather/scatter between a batched matrix and its packed micro-tiles.
struct PackParams {
  DType dtype = DType::kF32;
  int64_t batch = 1, rows = 0, cols = 0;  // the matrix [batch, rows, cols]
  int64_t tile_h = 1, tile_w = 1, tile_rows = 0, tile_cols = 0;
  int64_t capacity = 0;                   // packed [batch, capacity, tile_h, tile_w]
  const int32_t* tiles = nullptr;         // [batch, capacity]
  const int32_t* count = nullptr;         // [batch]
  const void* src = nullptr;              // x (sread) or packed (swrite)
  void* dst = nullptr;                    // packed (sread) or out, aliased to base (swrite)
  bool accumulate = false;                // swrite: add to base instead of overwriting
};

inline ffi::Error CheckTileOperands(const std::string& target, S32Buffer tiles, S32Buffer count, int64_t batch,
                                    int64_t capacity) {
  const auto td = tiles.dimensions();
  if (td.size() < 1 || td.back() != capacity || LeadingProduct(td, td.size() - 1) != batch ||
      static_cast<int64_t>(count.element_count()) != batch)
    return ffi::Error::InvalidArgument(target + ": tiles must be [..., capacity] and count [...] with the matrix's "
                                       "leading dims");
  return ffi::Error::Success();
}

// pit_sread: x [..., R, C] -> packed [..., capacity, tile_h, tile_w].
inline ffi::ErrorOr<PackParams> DecodeSread(ffi::AnyBuffer x, S32Buffer tiles, S32Buffer count,
                                            ffi::Result<ffi::AnyBuffer>& packed, int64_t tile_h, int64_t tile_w,
                                            const std::string& target = "pit_sread") {
  auto dtype = DecodeDType(x.element_type(), target + ": x");
  if (dtype.has_error()) return ffi::Unexpected<ffi::Error>(dtype.error());
  if (packed->element_type() != x.element_type()) return InvalidArg(target + ": packed must have x's dtype");
  auto m = AsBatchedMatrix(x.dimensions(), (target + ": x").c_str());
  if (m.has_error()) return ffi::Unexpected<ffi::Error>(m.error());
  if (tile_h < 1 || tile_w < 1 || tile_h > m->rows || tile_w > m->cols)
    return InvalidArg(target + ": micro-tile must be positive and fit in x");
  const auto pd = packed->dimensions();
  if (pd.size() < 3 || pd[pd.size() - 2] != tile_h || pd.back() != tile_w ||
      LeadingProduct(pd, pd.size() - 3) != m->batch)
    return InvalidArg(target + ": packed must be [..., capacity, tile_h, tile_w]");
  PackParams p;
  p.dtype = *dtype;
  p.batch = m->batch;
  p.rows = m->rows;
  p.cols = m->cols;
  p.tile_h = tile_h;
  p.tile_w = tile_w;
  p.tile_rows = CeilDiv(p.rows, tile_h);
  p.tile_cols = CeilDiv(p.cols, tile_w);
  p.capacity = pd[pd.size() - 3];
  auto err = CheckTileOperands(target, tiles, count, p.batch, p.capacity);
  if (err.failure()) return ffi::Unexpected<ffi::Error>(err);
  p.tiles = tiles.typed_data();
  p.count = count.typed_data();
  p.src = x.untyped_data();
  p.dst = packed->untyped_data();
  return p;
}

// pit_swrite: packed [..., capacity, tile_h, tile_w] scattered into out (aliased to base).
inline ffi::ErrorOr<PackParams> DecodeSwrite(ffi::AnyBuffer packed, S32Buffer tiles, S32Buffer count,
                                             ffi::AnyBuffer base, ffi::Result<ffi::AnyBuffer>& out, bool accumulate) {
  const std::string target = "pit_swrite";
  auto dtype = DecodeDType(packed.element_type(), target + ": packed");
  if (dtype.has_error()) return ffi::Unexpected<ffi::Error>(dtype.error());
  if (base.element_type() != packed.element_type() || out->element_type() != packed.element_type())
    return InvalidArg(target + ": packed, base and out must have the same dtype");
  auto m = AsBatchedMatrix(base.dimensions(), "pit_swrite: base");
  if (m.has_error()) return ffi::Unexpected<ffi::Error>(m.error());
  if (out->element_count() != base.element_count()) return InvalidArg(target + ": out must have base's shape");
  const auto pd = packed.dimensions();
  if (pd.size() < 3 || LeadingProduct(pd, pd.size() - 3) != m->batch)
    return InvalidArg(target + ": packed must be [..., capacity, tile_h, tile_w] with base's leading dims");
  PackParams p;
  p.dtype = *dtype;
  p.batch = m->batch;
  p.rows = m->rows;
  p.cols = m->cols;
  p.tile_h = pd[pd.size() - 2];
  p.tile_w = pd.back();
  if (p.tile_h < 1 || p.tile_w < 1 || p.tile_h > p.rows || p.tile_w > p.cols)
    return InvalidArg(target + ": micro-tile must be positive and fit in base");
  p.tile_rows = CeilDiv(p.rows, p.tile_h);
  p.tile_cols = CeilDiv(p.cols, p.tile_w);
  p.capacity = pd[pd.size() - 3];
  auto err = CheckTileOperands(target, tiles, count, p.batch, p.capacity);
  if (err.failure()) return ffi::Unexpected<ffi::Error>(err);
  p.tiles = tiles.typed_data();
  p.count = count.typed_data();
  p.src = packed.untyped_data();
  p.dst = out->untyped_data();
  p.accumulate = accumulate;
  return p;
}

}  // namespace pit
