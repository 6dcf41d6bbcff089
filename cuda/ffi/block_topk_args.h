// Decoding and validation of pit_block_topk, shared by its CPU and CUDA handlers
// (docs/kernels.md specifies it).
#pragma once

#include <string>
#include <vector>

#include "cuda/common/block_topk_params.h"
#include "cuda/ffi/matmul_args.h"

namespace pit {

// density float32 [], then the matrices: operands [..., K, N] of one shape and dtype
// (leading dims are more matrices) -> live pred [M, tk, tn], scores float32 [M, tk, tn],
// thresholds float32 [M] (M = all the operands' matrices). `bases` gets each matrix's
// address, in order.
inline ffi::ErrorOr<BlockTopkParams> DecodeBlockTopk(ffi::AnyBuffer density, ffi::RemainingArgs mats,
                                                     ffi::Result<ffi::AnyBuffer>& live,
                                                     ffi::Result<ffi::AnyBuffer>& scores,
                                                     ffi::Result<ffi::AnyBuffer>& thresholds, int64_t tile_h,
                                                     int64_t tile_w, std::vector<const void*>& bases) {
  const std::string target = "pit_block_topk";
  if (density.element_type() != ffi::DataType::F32 || density.element_count() != 1)
    return InvalidArg(target + ": density must be a float32 scalar");
  if (tile_h < 1 || tile_w < 1) return InvalidArg(target + ": tile_h and tile_w must be >= 1");
  if (mats.size() < 1) return InvalidArg(target + ": expected at least one matrix");
  BlockTopkParams p;
  p.tile_h = tile_h;
  p.tile_w = tile_w;
  bases.clear();
  for (size_t i = 0; i < mats.size(); ++i) {
    auto buf = mats.get<ffi::AnyBuffer>(i);
    if (buf.has_error()) return ffi::Unexpected<ffi::Error>(buf.error());
    const std::string what = target + ": matrix operand " + std::to_string(i);
    auto m = AsBatchedMatrix(buf->dimensions(), what.c_str());
    if (m.has_error()) return ffi::Unexpected<ffi::Error>(m.error());
    auto dt = DecodeDType(buf->element_type(), what);
    if (dt.has_error()) return ffi::Unexpected<ffi::Error>(dt.error());
    if (i == 0) {
      p.dtype = *dt;
      p.rows = m->rows;
      p.cols = m->cols;
    } else if (*dt != p.dtype || m->rows != p.rows || m->cols != p.cols) {
      return InvalidArg(what + " must have operand 0's dtype and trailing shape [" + std::to_string(p.rows) +
                        ", " + std::to_string(p.cols) + "]");
    }
    for (int64_t b = 0; b < m->batch; ++b)
      bases.push_back(static_cast<const char*>(buf->untyped_data()) + b * m->rows * m->cols * DTypeBytes(p.dtype));
  }
  if (p.rows < 1 || p.cols < 1) return InvalidArg(target + ": the matrices must not be empty");
  p.matrices = static_cast<int64_t>(bases.size());
  p.tile_rows = CeilDiv(p.rows, tile_h);
  p.tile_cols = CeilDiv(p.cols, tile_w);
  const int64_t blocks = p.matrices * p.tile_rows * p.tile_cols;
  if (p.tile_rows * p.tile_cols > (int64_t{1} << 30))
    return InvalidArg(target + ": at most 2^30 blocks per matrix");
  if (live->element_type() != ffi::DataType::PRED || static_cast<int64_t>(live->element_count()) != blocks)
    return InvalidArg(target + ": live must be bool [" + std::to_string(p.matrices) + ", " +
                      std::to_string(p.tile_rows) + ", " + std::to_string(p.tile_cols) + "]");
  if (scores->element_type() != ffi::DataType::F32 || static_cast<int64_t>(scores->element_count()) != blocks)
    return InvalidArg(target + ": scores must be float32 with live's shape");
  if (thresholds->element_type() != ffi::DataType::F32 ||
      static_cast<int64_t>(thresholds->element_count()) != p.matrices)
    return InvalidArg(target + ": thresholds must be float32 [" + std::to_string(p.matrices) + "]");
  p.density = static_cast<const float*>(density.untyped_data());
  p.live = static_cast<bool*>(live->untyped_data());
  p.scores = static_cast<float*>(scores->untyped_data());
  p.thresholds = static_cast<float*>(thresholds->untyped_data());
  return p;
}

}  // namespace pit
