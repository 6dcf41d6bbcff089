// pit_sread on the CPU: copy each listed micro-tile of x into its packed slot. Same
// dtype in and out, so elements move as raw bytes (no conversion).
#include <cstring>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/cpu/cpu_common.h"
#include "cuda/ffi/cpu/handlers.h"
#include "cuda/ffi/sread_swrite_args.h"

namespace pit {
namespace {

void Sread(const PackParams& p) {
  const int64_t es = DTypeBytes(p.dtype);
  const int64_t tile_elems = p.tile_h * p.tile_w;
  const int64_t num_tiles = p.tile_rows * p.tile_cols;
  const char* x = static_cast<const char*>(p.src);
  char* packed = static_cast<char*>(p.dst);
  // Partial edge tiles and unused slots read as zeros.
  cpu::Zero(packed, p.batch * p.capacity * tile_elems * es);
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t live = cpu::LiveCount(p.count[b], p.capacity);
    const int32_t* tiles = p.tiles + b * p.capacity;
    const char* xb = x + b * p.rows * p.cols * es;
    for (int64_t s = 0; s < live; ++s) {
      const int64_t id = tiles[s];
      if (id < 0 || id >= num_tiles) continue;  // not a tile of this grid: leave the slot zero
      const int64_t r0 = (id / p.tile_cols) * p.tile_h, c0 = (id % p.tile_cols) * p.tile_w;
      const int64_t h = std::min(p.tile_h, p.rows - r0), w = std::min(p.tile_w, p.cols - c0);
      char* slot = packed + (b * p.capacity + s) * tile_elems * es;
      for (int64_t i = 0; i < h; ++i)
        std::memcpy(slot + i * p.tile_w * es, xb + ((r0 + i) * p.cols + c0) * es, static_cast<size_t>(w * es));
    }
  }
}

ffi::Error SreadImpl(const char* target, ffi::AnyBuffer x, S32Buffer tiles, S32Buffer count,
                     ffi::Result<ffi::AnyBuffer> packed, int64_t tile_h, int64_t tile_w) {
  auto p = DecodeSread(x, tiles, count, packed, tile_h, tile_w, target);
  if (p.has_error()) return p.error();
  cpu::Poison(packed->untyped_data(), packed->size_bytes());
  Sread(*p);
  return ffi::Error::Success();
}

ffi::Error SreadCpu(ffi::AnyBuffer x, S32Buffer tiles, S32Buffer count, ffi::Result<ffi::AnyBuffer> packed,
                    int64_t tile_h, int64_t tile_w) {
  return SreadImpl("pit_sread", x, tiles, count, packed, tile_h, tile_w);
}

// pit_sread_live leaves the slots past the count undefined; zeroing them here is one
// way of doing that (the CPU pass is not what the live-only contract is for).
ffi::Error SreadLiveCpu(ffi::AnyBuffer x, S32Buffer tiles, S32Buffer count, ffi::Result<ffi::AnyBuffer> packed,
                        int64_t tile_h, int64_t tile_w) {
  return SreadImpl("pit_sread_live", x, tiles, count, packed, tile_h, tile_w);
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitSreadCpu, pit::SreadCpu,
                              pit::bind::Sread(xla::ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitSreadLiveCpu, pit::SreadLiveCpu,
                              pit::bind::Sread(xla::ffi::Ffi::Bind()));
