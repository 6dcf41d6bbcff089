// pit_sdd_matmul on the CPU: only the listed micro-tiles of C = op_a(A) @ op_b(B) are
// computed; the rest of C is zero.
#include <algorithm>
#include <vector>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/cpu/cpu_common.h"
#include "cuda/ffi/cpu/handlers.h"
#include "cuda/ffi/matmul_args.h"

namespace pit {
namespace {


// Narrow tiles (e.g. (32, 1)) would leave the row update with a one-element inner
// loop; those take dot products over contiguous rows of op_a(A) and op_b(B)^T instead.
constexpr int64_t kMinAxpyWidth = 16;

// Fixed-order dot product with 8 independent partial sums (vectorizable, deterministic).
inline float Dot(const float* __restrict x, const float* __restrict y, int64_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += x[i + j] * y[i + j];
  float tail = 0.0f;
  for (; i < n; ++i) tail += x[i] * y[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + tail;
}

void Sdd(const MatmulParams& p, const TileList& t) {
  const bool dot = t.tile_w < kMinAxpyWidth;
  cpu::CachedMatrix amat(p.a, p.dtype, p.trans_a);                   // [M, K]
  cpu::CachedMatrix bmat(p.b, p.dtype, dot ? !p.trans_b : p.trans_b);  // [N, K] for dots, else [K, N]
  const int64_t tile_cols = CeilDiv(p.N, t.tile_w), num_tiles = CeilDiv(p.M, t.tile_h) * tile_cols;
  const int64_t per_c = p.batch / p.c_batch, per_a = p.batch / p.a.batch, per_b = p.batch / p.b.batch;
  std::vector<float> acc(static_cast<size_t>(p.M * p.N));
  for (int64_t c = 0; c < p.c_batch; ++c) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    const int64_t live = cpu::LiveCount(t.counts[c], t.capacity);  // the index has C's leading dims
    const int32_t* ids = t.lists + c * t.capacity;
    for (int64_t b = c * per_c; live > 0 && b < (c + 1) * per_c; ++b) {
      const cpu::FloatMatrix& am = amat.Get(b / per_a);
      const cpu::FloatMatrix& bm = bmat.Get(b / per_b);
      for (int64_t s = 0; s < live; ++s) {
        const int64_t id = ids[s];
        if (id < 0 || id >= num_tiles) continue;  // not a tile of C: skip
        const int64_t r0 = (id / tile_cols) * t.tile_h, c0 = (id % tile_cols) * t.tile_w;
        const int64_t r1 = std::min(p.M, r0 + t.tile_h), c1 = std::min(p.N, c0 + t.tile_w);
        if (dot) {
          for (int64_t m = r0; m < r1; ++m) {
            const float* arow = am.row(m);
            float* out = acc.data() + m * p.N;
            for (int64_t n = c0; n < c1; ++n) out[n] += Dot(arow, bm.row(n), p.K);
          }
          continue;
        }
        for (int64_t m = r0; m < r1; m += cpu::kRowBlock) {  // kR rows share each row of B
          const int rows = static_cast<int>(std::min<int64_t>(cpu::kRowBlock, r1 - m));
          const float* l[cpu::kRowBlock];
          float* out[cpu::kRowBlock];
          for (int i = 0; i < rows; ++i) {
            l[i] = am.row(m + i);
            out[i] = acc.data() + (m + i) * p.N + c0;
          }
          cpu::UpdateRows(rows, l, out, bm, c0, 0, p.K, c1 - c0);
        }
      }
    }
    cpu::StoreMatrix(p.dtype, acc.data(), p.M, p.N, false, p.c, c);
  }
}

ffi::Error SddMatmulCpu(ffi::AnyBuffer a, ffi::AnyBuffer b, S32Buffer tiles, S32Buffer count,
                        ffi::Result<ffi::AnyBuffer> c, int64_t tile_h, int64_t tile_w, bool trans_a, bool trans_b,
                        bool allow_tf32) {
  auto args = DecodeSddArgs(a, b, tiles, count, c, tile_h, tile_w, trans_a, trans_b, allow_tf32);
  if (args.has_error()) return args.error();
  cpu::Poison(c->untyped_data(), c->size_bytes());
  if (args->mm.batch > 0) Sdd(args->mm, args->index);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitSddMatmulCpu, pit::SddMatmulCpu,
                              pit::bind::SddMatmul(xla::ffi::Ffi::Bind()));
