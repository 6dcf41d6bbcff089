// Decoding and validation of pit_mask_blocks, shared by its CPU and CUDA handlers
// (docs/kernels.md specifies it).
#pragma once

#include <string>
#include <vector>

#include "cuda/common/mask_blocks_params.h"
#include "cuda/ffi/matmul_args.h"

namespace pit {

// live pred [M, tk, tn], then matrices [..., K, N] of one trailing shape and dtype (leading
// dims are more matrices; M counts them all, in operand order) -> one result per matrix
// operand, of its shape, all of one float dtype. `src` / `dst` get every matrix's and
// result's address, in order.
inline ffi::Error DecodeMaskBlocks(ffi::AnyBuffer live, const ffi::RemainingArgs& mats,
                                   const ffi::RemainingRets& rets, int64_t tile_h, int64_t tile_w,
                                   MaskBlocksParams& p, std::vector<const void*>& src, std::vector<void*>& dst) {
  const std::string target = "pit_mask_blocks";
  if (tile_h < 1 || tile_w < 1) return ffi::Error::InvalidArgument(target + ": tile_h and tile_w must be >= 1");
  if (mats.size() < 1 || rets.size() != mats.size())
    return ffi::Error::InvalidArgument(target + ": expected at least one matrix and one result per matrix");
  p = MaskBlocksParams{};
  p.tile_h = tile_h;
  p.tile_w = tile_w;
  src.clear();
  dst.clear();
  for (size_t i = 0; i < mats.size(); ++i) {
    auto buf = mats.get<ffi::AnyBuffer>(i);
    if (buf.has_error()) return buf.error();
    auto out = rets.get<ffi::AnyBuffer>(i);
    if (out.has_error()) return out.error();
    const std::string what = target + ": matrix operand " + std::to_string(i);
    auto m = AsBatchedMatrix(buf->dimensions(), what.c_str());
    if (m.has_error()) return m.error();
    auto in_dt = DecodeDType(buf->element_type(), what);
    if (in_dt.has_error()) return in_dt.error();
    auto out_dt = DecodeDType((*out)->element_type(), target + ": result " + std::to_string(i));
    if (out_dt.has_error()) return out_dt.error();
    if (i == 0) {
      p.in_dtype = *in_dt;
      p.out_dtype = *out_dt;
      p.rows = m->rows;
      p.cols = m->cols;
    } else if (*in_dt != p.in_dtype || *out_dt != p.out_dtype || m->rows != p.rows || m->cols != p.cols) {
      return ffi::Error::InvalidArgument(what + " and its result must have operand 0's dtypes and trailing shape [" +
                                         std::to_string(p.rows) + ", " + std::to_string(p.cols) + "]");
    }
    auto od = (*out)->dimensions();
    auto id = buf->dimensions();
    if (od.size() != id.size() || !std::equal(od.begin(), od.end(), id.begin()))
      return ffi::Error::InvalidArgument(target + ": result " + std::to_string(i) + " must have its matrix's shape");
    const int64_t bytes_in = p.rows * p.cols * DTypeBytes(p.in_dtype);
    const int64_t bytes_out = p.rows * p.cols * DTypeBytes(p.out_dtype);
    for (int64_t b = 0; b < m->batch; ++b) {
      src.push_back(static_cast<const char*>(buf->untyped_data()) + b * bytes_in);
      dst.push_back(static_cast<char*>((*out)->untyped_data()) + b * bytes_out);
    }
  }
  p.matrices = static_cast<int64_t>(src.size());
  p.CountTiles();
  if (live.element_type() != ffi::DataType::PRED ||
      static_cast<int64_t>(live.element_count()) != p.matrices * p.tile_rows * p.tile_cols)
    return ffi::Error::InvalidArgument(target + ": live must be bool [" + std::to_string(p.matrices) + ", " +
                                       std::to_string(p.tile_rows) + ", " + std::to_string(p.tile_cols) + "]");
  p.live = static_cast<const bool*>(live.untyped_data());
  return ffi::Error::Success();
}

}  // namespace pit
