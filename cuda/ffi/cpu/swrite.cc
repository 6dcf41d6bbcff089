// pit_swrite on the CPU: scatter packed micro-tiles into out (aliased to base).
// Overwrite moves raw bytes; accumulate adds in float32 and rounds once.
#include <algorithm>
#include <cstring>
#include <vector>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/cpu/cpu_common.h"
#include "cuda/ffi/cpu/handlers.h"
#include "cuda/ffi/sread_swrite_args.h"

namespace pit {
namespace {

void Swrite(const PackParams& p) {
  const int64_t es = DTypeBytes(p.dtype);
  const int64_t tile_elems = p.tile_h * p.tile_w;
  const int64_t num_tiles = p.tile_rows * p.tile_cols;
  const char* packed = static_cast<const char*>(p.src);
  std::vector<float> sum(static_cast<size_t>(p.tile_w)), add(static_cast<size_t>(p.tile_w));
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t live = cpu::LiveCount(p.count[b], p.capacity);
    const int32_t* tiles = p.tiles + b * p.capacity;
    const int64_t out_b = b * p.rows * p.cols;  // element offset of this matrix
    for (int64_t s = 0; s < live; ++s) {
      const int64_t id = tiles[s];
      if (id < 0 || id >= num_tiles) continue;  // not a tile of this grid: write nothing
      const int64_t r0 = (id / p.tile_cols) * p.tile_h, c0 = (id % p.tile_cols) * p.tile_w;
      const int64_t h = std::min(p.tile_h, p.rows - r0), w = std::min(p.tile_w, p.cols - c0);
      const int64_t slot = (b * p.capacity + s) * tile_elems;  // element offset of the slot
      for (int64_t i = 0; i < h; ++i) {
        const int64_t dst = out_b + (r0 + i) * p.cols + c0, src = slot + i * p.tile_w;
        if (!p.accumulate) {
          std::memcpy(static_cast<char*>(p.dst) + dst * es, packed + src * es, static_cast<size_t>(w * es));
          continue;
        }
        cpu::LoadRow(p.dtype, p.dst, dst, w, sum.data());
        cpu::LoadRow(p.dtype, p.src, src, w, add.data());
        for (int64_t j = 0; j < w; ++j) sum[j] += add[j];
        cpu::StoreRow(p.dtype, sum.data(), w, p.dst, dst);
      }
    }
  }
}

ffi::Error SwriteCpu(ffi::AnyBuffer packed, S32Buffer tiles, S32Buffer count, ffi::AnyBuffer base,
                     ffi::Result<ffi::AnyBuffer> out, bool accumulate) {
  auto p = DecodeSwrite(packed, tiles, count, base, out, accumulate);
  if (p.has_error()) return p.error();
  // XLA honours the alias (operand 3 -> result 0); should it ever hand over a separate
  // buffer, start from base so the untouched elements still keep it. Not poisoned.
  if (out->untyped_data() != base.untyped_data() && base.size_bytes() > 0)
    std::memmove(out->untyped_data(), base.untyped_data(), base.size_bytes());
  Swrite(*p);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitSwriteCpu, pit::SwriteCpu,
                              pit::bind::Swrite(xla::ffi::Ffi::Bind()));
