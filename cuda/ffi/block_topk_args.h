// Decoding and validation of pit_block_topk, shared by its CPU and CUDA handlers
// (docs/kernels.md specifies it).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cuda/common/block_topk_params.h"
#include "cuda/ffi/matmul_args.h"

namespace pit {

// One group of pit_block_topk: operands [..., K, N] of one shape and dtype (leading dims
// are more matrices) -> live pred [M, tk, tn], scores float32 [M, tk, tn], thresholds
// float32 [M] (M = the group's matrices). `bases` gets each matrix's address, in order.
inline ffi::ErrorOr<BlockTopkParams> DecodeBlockTopkGroup(const std::string& target, ffi::AnyBuffer density,
                                                          const ffi::RemainingArgs& mats, size_t first, size_t count,
                                                          ffi::Result<ffi::AnyBuffer>& live,
                                                          ffi::Result<ffi::AnyBuffer>& scores,
                                                          ffi::Result<ffi::AnyBuffer>& thresholds, int64_t tile_h,
                                                          int64_t tile_w, std::vector<const void*>& bases) {
  if (tile_h < 1 || tile_w < 1) return InvalidArg(target + ": tile_h and tile_w must be >= 1");
  if (count < 1) return InvalidArg(target + ": expected at least one matrix");
  BlockTopkParams p;
  p.tile_h = tile_h;
  p.tile_w = tile_w;
  const size_t first_base = bases.size();
  for (size_t i = first; i < first + count; ++i) {
    auto buf = mats.get<ffi::AnyBuffer>(i);
    if (buf.has_error()) return ffi::Unexpected<ffi::Error>(buf.error());
    const std::string what = target + ": matrix operand " + std::to_string(i);
    auto m = AsBatchedMatrix(buf->dimensions(), what.c_str());
    if (m.has_error()) return ffi::Unexpected<ffi::Error>(m.error());
    auto dt = DecodeDType(buf->element_type(), what);
    if (dt.has_error()) return ffi::Unexpected<ffi::Error>(dt.error());
    if (i == first) {
      p.dtype = *dt;
      p.rows = m->rows;
      p.cols = m->cols;
    } else if (*dt != p.dtype || m->rows != p.rows || m->cols != p.cols) {
      return InvalidArg(what + " must have operand " + std::to_string(first) + "'s dtype and trailing shape [" +
                        std::to_string(p.rows) + ", " + std::to_string(p.cols) + "]");
    }
    for (int64_t b = 0; b < m->batch; ++b)
      bases.push_back(static_cast<const char*>(buf->untyped_data()) + b * m->rows * m->cols * DTypeBytes(p.dtype));
  }
  if (p.rows < 1 || p.cols < 1) return InvalidArg(target + ": the matrices must not be empty");
  p.matrices = static_cast<int64_t>(bases.size() - first_base);
  p.CountTiles();
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

// density float32 [], then the groups' matrices, group after group (group_sizes[g]
// operands each, tile (tile_h[g], tile_w[g])) -> three results per group (above).
// `groups` gets each group's parameters, `bases` every matrix's address, in order;
// `outputs` the results' buffers (for poisoning).
inline ffi::Error DecodeBlockTopk(ffi::AnyBuffer density, const ffi::RemainingArgs& mats,
                                  const ffi::RemainingRets& rets, ffi::Span<const int64_t> tile_h,
                                  ffi::Span<const int64_t> tile_w, ffi::Span<const int64_t> group_sizes,
                                  std::vector<BlockTopkParams>& groups, std::vector<const void*>& bases,
                                  std::vector<std::pair<void*, size_t>>& outputs) {
  const std::string target = "pit_block_topk";
  if (density.element_type() != ffi::DataType::F32 || density.element_count() != 1)
    return ffi::Error::InvalidArgument(target + ": density must be a float32 scalar");
  const size_t n = group_sizes.size();
  if (n < 1 || n > static_cast<size_t>(kTopkMaxGroups) || tile_h.size() != n || tile_w.size() != n)
    return ffi::Error::InvalidArgument(target + ": expected 1 to " + std::to_string(kTopkMaxGroups) +
                                       " groups, with tile_h, tile_w and group_sizes of one length each");
  if (rets.size() != 3 * n) return ffi::Error::InvalidArgument(target + ": expected three results per group");
  groups.clear();
  bases.clear();
  outputs.clear();
  size_t first = 0;
  for (size_t g = 0; g < n; ++g) {
    if (group_sizes[g] < 1 || first + static_cast<size_t>(group_sizes[g]) > mats.size())
      return ffi::Error::InvalidArgument(target + ": group_sizes do not match the matrix operands");
    std::vector<ffi::Result<ffi::AnyBuffer>> held;  // live, scores, thresholds
    for (int j = 0; j < 3; ++j) {
      auto r = rets.get<ffi::AnyBuffer>(3 * g + j);
      if (r.has_error()) return r.error();
      held.push_back(*r);
    }
    auto p = DecodeBlockTopkGroup(target, density, mats, first, static_cast<size_t>(group_sizes[g]), held[0], held[1],
                                  held[2], tile_h[g], tile_w[g], bases);
    if (p.has_error()) return p.error();
    groups.push_back(*p);
    for (auto& r : held) outputs.emplace_back(r->untyped_data(), r->size_bytes());
    first += static_cast<size_t>(group_sizes[g]);
  }
  if (first != mats.size())
    return ffi::Error::InvalidArgument(target + ": group_sizes do not match the matrix operands");
  return ffi::Error::Success();
}

}  // namespace pit
