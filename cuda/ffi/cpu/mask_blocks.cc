// pit_mask_blocks on the CPU: each element of a live block converted to the results'
// dtype (rounded to nearest even), every element of a dead block 0.
#include <cstdint>
#include <vector>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/cpu/cpu_common.h"
#include "cuda/ffi/cpu/handlers.h"
#include "cuda/ffi/mask_blocks_args.h"

namespace pit {
namespace {

ffi::Error MaskBlocksCpu(ffi::AnyBuffer live, ffi::RemainingArgs mats, ffi::RemainingRets rets, int64_t tile_h,
                         int64_t tile_w) {
  MaskBlocksParams p;
  std::vector<const void*> src;
  std::vector<void*> dst;
  ffi::Error err = DecodeMaskBlocks(live, mats, rets, tile_h, tile_w, p, src, dst);
  if (err.failure()) return err;
  const int64_t n = p.cols;
  std::vector<float> row(static_cast<size_t>(n));
  for (int64_t m = 0; m < p.matrices; ++m) {
    cpu::Poison(dst[m], static_cast<size_t>(p.rows * n * DTypeBytes(p.out_dtype)));
    const bool* band0 = p.live + m * p.tile_rows * p.tile_cols;
    for (int64_t r = 0; r < p.rows; ++r) {
      cpu::LoadRow(p.in_dtype, src[m], r * n, n, row.data());
      const bool* band = band0 + (r / p.tile_h) * p.tile_cols;
      for (int64_t c = 0; c < n; ++c)
        if (!band[c / p.tile_w]) row[c] = 0.f;
      cpu::StoreRow(p.out_dtype, row.data(), n, dst[m], r * n);
    }
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitMaskBlocksCpu, pit::MaskBlocksCpu, pit::bind::MaskBlocks(xla::ffi::Ffi::Bind()));
