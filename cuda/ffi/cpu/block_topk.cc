// pit_block_topk on the CPU: the same semantics as the kernels (float32 block sums of
// |w|, the exact keep-th largest score per matrix, live = score >= it).
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/block_topk_args.h"
#include "cuda/ffi/cpu/cpu_common.h"
#include "cuda/ffi/cpu/handlers.h"

namespace pit {
namespace {

void BlockTopk(const BlockTopkParams& p, const void* const* bases) {
  const int64_t n = p.cols, nb = p.tile_rows * p.tile_cols;
  std::vector<float> row(static_cast<size_t>(n));
  std::vector<uint32_t> bits(static_cast<size_t>(nb));
  for (int64_t m = 0; m < p.matrices; ++m) {
    float* s = p.scores + m * nb;
    std::fill(s, s + nb, 0.f);
    for (int64_t r = 0; r < p.rows; ++r) {
      cpu::LoadRow(p.dtype, bases[m], r * n, n, row.data());
      float* band = s + (r / p.tile_h) * p.tile_cols;
      for (int64_t c = 0; c < n; ++c) band[c / p.tile_w] += std::fabs(row[c]);
    }
    // Non-negative floats order as their bits (NaN above +inf), as the GPU's radix select.
    for (int64_t i = 0; i < nb; ++i) bits[i] = cpu::FloatBits(s[i]);
    const int64_t rank = nb - TopkKeep(*p.density, nb);
    std::nth_element(bits.begin(), bits.begin() + rank, bits.end());
    const float cut = cpu::BitsFloat(bits[rank]);
    p.thresholds[m] = cut;
    for (int64_t i = 0; i < nb; ++i) p.live[m * nb + i] = s[i] >= cut;
  }
}

ffi::Error BlockTopkCpu(ffi::AnyBuffer density, ffi::RemainingArgs mats, ffi::RemainingRets rets,
                        ffi::Span<const int64_t> tile_h, ffi::Span<const int64_t> tile_w,
                        ffi::Span<const int64_t> group_sizes) {
  std::vector<BlockTopkParams> groups;
  std::vector<const void*> bases;
  std::vector<std::pair<void*, size_t>> outputs;
  ffi::Error err = DecodeBlockTopk(density, mats, rets, tile_h, tile_w, group_sizes, groups, bases, outputs);
  if (err.failure()) return err;
  for (const auto& o : outputs) cpu::Poison(o.first, o.second);
  const void* const* group_bases = bases.data();
  for (const BlockTopkParams& p : groups) {
    BlockTopk(p, group_bases);
    group_bases += p.matrices;
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitBlockTopkCpu, pit::BlockTopkCpu, pit::bind::BlockTopk(xla::ffi::Ffi::Bind()));
