// pit_block_topk on the CPU: the same semantics as the kernels (float32 block sums of
// |w|, the exact keep-th largest score per matrix, live = score >= it).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/block_topk_args.h"
#include "cuda/ffi/cpu/cpu_common.h"
#include "cuda/ffi/cpu/handlers.h"

namespace pit {
namespace {

void BlockTopk(const BlockTopkParams& p, const std::vector<const void*>& bases) {
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

ffi::Error BlockTopkCpu(ffi::AnyBuffer density, ffi::RemainingArgs mats, ffi::Result<ffi::AnyBuffer> live,
                        ffi::Result<ffi::AnyBuffer> scores, ffi::Result<ffi::AnyBuffer> thresholds, int64_t tile_h,
                        int64_t tile_w) {
  std::vector<const void*> bases;
  auto p = DecodeBlockTopk(density, mats, live, scores, thresholds, tile_h, tile_w, bases);
  if (p.has_error()) return p.error();
  cpu::Poison(live->untyped_data(), live->size_bytes());
  cpu::Poison(scores->untyped_data(), scores->size_bytes());
  cpu::Poison(thresholds->untyped_data(), thresholds->size_bytes());
  BlockTopk(*p, bases);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitBlockTopkCpu, pit::BlockTopkCpu, pit::bind::BlockTopk(xla::ffi::Ffi::Bind()));
