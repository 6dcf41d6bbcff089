// pit_stile_matmul on the CPU. Both cases run as one loop nest with the sparse operand
// on the left: L [P, K] (op_a(A), or op_b(B)^T when B is masked) times R [K, Q]
// (op_b(B), or op_a(A)^T), so acc [P, Q] is C or C^T. A group is a block of L's rows
// (P), its list entries are K ranges; only those K ranges are multiplied.
#include <algorithm>
#include <vector>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/cpu/cpu_common.h"
#include "cuda/ffi/cpu/handlers.h"
#include "cuda/ffi/matmul_args.h"

namespace pit {
namespace {


void Stile(const MatmulParams& p, const TileList& t, const StileGeometry& g) {
  const bool sb = g.sparse_b;
  const int64_t P = sb ? p.N : p.M, Q = sb ? p.M : p.N;
  // Stored layouts: A [M, K] or [K, M] (trans_a); B [K, N] or [N, K] (trans_b).
  cpu::CachedMatrix lmat = sb ? cpu::CachedMatrix(p.b, p.dtype, !p.trans_b) : cpu::CachedMatrix(p.a, p.dtype, p.trans_a);
  cpu::CachedMatrix rmat = sb ? cpu::CachedMatrix(p.a, p.dtype, !p.trans_a) : cpu::CachedMatrix(p.b, p.dtype, p.trans_b);
  // Micro-tile on S's stored layout -> extent along P (a group) and along K (an entry).
  const int64_t gsz = g.reduce_cols ? t.tile_h : t.tile_w;
  const int64_t ksz = g.reduce_cols ? t.tile_w : t.tile_h;
  const int64_t k_tiles = CeilDiv(p.K, ksz);
  const int64_t per_c = p.batch / p.c_batch, per_a = p.batch / p.a.batch, per_b = p.batch / p.b.batch;
  std::vector<float> acc(static_cast<size_t>(P * Q));
  for (int64_t c = 0; c < p.c_batch; ++c) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    // C[c] sums its consecutive batch entries, in order.
    for (int64_t b = c * per_c; b < (c + 1) * per_c; ++b) {
      const int64_t ab = b / per_a, bb = b / per_b, ib = sb ? bb : ab;  // the index follows S
      const cpu::FloatMatrix* lm = nullptr;
      const cpu::FloatMatrix* rm = nullptr;
      for (int64_t gi = 0; gi < t.groups; ++gi) {
        const int64_t list = ib * t.groups + gi;
        const int64_t live = cpu::LiveCount(t.counts[list], t.capacity);
        if (live == 0) continue;
        if (lm == nullptr) {  // convert only when some group has work
          lm = &lmat.Get(sb ? bb : ab);
          rm = &rmat.Get(sb ? ab : bb);
        }
        const int64_t p0 = gi * gsz, p1 = std::min(P, p0 + gsz);
        const int32_t* entries = t.lists + list * t.capacity;
        // Every row of the group reduces over the same K ranges: kR rows at a time.
        for (int64_t row = p0; row < p1; row += cpu::kRowBlock) {
          const int rows = static_cast<int>(std::min<int64_t>(cpu::kRowBlock, p1 - row));
          const float* l[cpu::kRowBlock];
          float* out[cpu::kRowBlock];
          for (int i = 0; i < rows; ++i) {
            l[i] = lm->row(row + i);
            out[i] = acc.data() + (row + i) * Q;
          }
          for (int64_t s = 0; s < live; ++s) {
            const int64_t e = entries[s];
            if (e < 0 || e >= k_tiles) continue;  // not a K tile: skip
            cpu::UpdateRows(rows, l, out, *rm, 0, e * ksz, std::min(p.K, (e + 1) * ksz), Q);
          }
        }
      }
    }
    // acc is C when A is sparse, C^T when B is; C itself may be stored transposed.
    cpu::StoreMatrix(p.dtype, acc.data(), P, Q, sb != p.trans_c, p.c, c);
  }
}

ffi::Error StileMatmulCpu(ffi::AnyBuffer a, ffi::AnyBuffer b, S32Buffer lists, S32Buffer counts,
                          ffi::Result<ffi::AnyBuffer> c, bool sparse_b, int64_t tile_h, int64_t tile_w, bool trans_a,
                          bool trans_b, bool trans_c, bool allow_tf32) {
  auto args = DecodeStileArgs(a, b, lists, counts, c, sparse_b, tile_h, tile_w, trans_a, trans_b, trans_c, allow_tf32);
  if (args.has_error()) return args.error();
  cpu::Poison(c->untyped_data(), c->size_bytes());
  if (args->mm.batch > 0) Stile(args->mm, args->index, args->geometry);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitStileMatmulCpu, pit::StileMatmulCpu,
                              pit::bind::StileMatmul(xla::ffi::Ffi::Bind()));
