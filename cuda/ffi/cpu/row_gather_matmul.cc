// pit_row_gather_matmul on the CPU: rows of the listed row blocks of a are multiplied
// by op_b(B); every other row of c is zero.
#include <algorithm>
#include <cstring>
#include <vector>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/cpu/cpu_common.h"
#include "cuda/ffi/cpu/handlers.h"
#include "cuda/ffi/matmul_args.h"

namespace pit {
namespace {

void RowGather(const MatmulParams& p, const TileList& t) {
  const int64_t es = DTypeBytes(p.dtype);
  const int64_t blocks = CeilDiv(p.M, t.tile_h);
  cpu::CachedMatrix bmat(p.b, p.dtype, p.trans_b);  // op_b(B) as float [K, N]
  constexpr int kR = cpu::kRowBlock;
  std::vector<float> arows(static_cast<size_t>(kR * p.K)), acc(static_cast<size_t>(kR * p.N));
  const float* l[kR];
  float* out[kR];
  for (int i = 0; i < kR; ++i) {
    l[i] = arows.data() + i * p.K;
    out[i] = acc.data() + i * p.N;
  }
  // The epilogue: act(acc + bias) on live rows, a copy of the dead row (zeros without one)
  // on the others.
  std::vector<float> bias(static_cast<size_t>(p.N), 0.0f);
  if (p.epi.bias) {
    cpu::LoadRow(p.epi.bias_f32 ? DType::kF32 : p.dtype, p.epi.bias, 0, p.N, bias.data());
    if (p.epi.bias_f32) cpu::RoundTo(p.dtype, bias.data(), p.N);  // as a cast beforehand would
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    char* cb = static_cast<char*>(p.c) + b * p.M * p.N * es;
    if (p.epi.skip_dead) {
      cpu::FillNaN(cb, p.M * p.N * es);  // unspecified: NaN here, so that a reader of them shows
    } else if (p.epi.dead) {
      for (int64_t r = 0; r < p.M; ++r) std::memcpy(cb + r * p.N * es, p.epi.dead, static_cast<size_t>(p.N * es));
    } else {
      cpu::Zero(cb, p.M * p.N * es);  // all-zero bytes are +0 in every dtype
    }
    const int64_t live = cpu::LiveCount(t.counts[b], t.capacity);
    if (live == 0) continue;
    const cpu::FloatMatrix& bm = bmat.Get(b / (p.batch / p.b.batch));
    const int32_t* ids = t.lists + b * t.capacity;
    for (int64_t s = 0; s < live; ++s) {
      const int64_t id = ids[s];
      if (id < 0 || id >= blocks) continue;  // not a row block of a: skip
      const int64_t r1 = std::min(p.M, (id + 1) * t.tile_h);
      // The block's rows are consecutive in a and c: load, multiply and store kR at a time.
      for (int64_t r = id * t.tile_h; r < r1; r += kR) {
        const int rows = static_cast<int>(std::min<int64_t>(kR, r1 - r));
        cpu::LoadRow(p.dtype, p.a.data, (b * p.M + r) * p.K, rows * p.K, arows.data());
        std::fill(acc.begin(), acc.end(), 0.0f);
        cpu::UpdateRows(rows, l, out, bm, 0, 0, p.K, p.N);
        if (p.epi.pre) {  // z = acc + bias, rounded, then act(z) from the unrounded sum
          for (int i = 0; i < rows; ++i)
            for (int64_t n = 0; n < p.N; ++n) out[i][n] += bias[n];
          cpu::StoreRow(p.dtype, acc.data(), rows * p.N, p.epi.pre, (b * p.M + r) * p.N);
          for (int i = 0; i < rows; ++i)
            for (int64_t n = 0; n < p.N; ++n) out[i][n] = cpu::Activate(out[i][n], p.epi.act);
        } else if (!p.epi.Trivial()) {
          for (int i = 0; i < rows; ++i)
            for (int64_t n = 0; n < p.N; ++n) out[i][n] = cpu::Activate(out[i][n] + bias[n], p.epi.act);
        }
        cpu::StoreRow(p.dtype, acc.data(), rows * p.N, p.c, (b * p.M + r) * p.N);
      }
    }
  }
}

ffi::Error RowGatherMatmulCpu(ffi::AnyBuffer a, ffi::AnyBuffer b, S32Buffer tiles, S32Buffer count,
                              ffi::AnyBuffer bias, ffi::AnyBuffer dead_row, ffi::Result<ffi::AnyBuffer> c, int64_t tile_h, bool trans_b,
                              bool allow_tf32, int64_t activation, bool skip_dead) {
  auto args =
      DecodeRowGatherArgs(a, b, tiles, count, bias, dead_row, c, tile_h, trans_b, allow_tf32, activation, skip_dead);
  if (args.has_error()) return args.error();
  cpu::Poison(c->untyped_data(), c->size_bytes());
  if (args->mm.batch > 0) RowGather(args->mm, args->index);
  return ffi::Error::Success();
}

// The product given also a's listed rows packed (checked, then not read: the rows of a are
// the same values, and this loop reads them in place).
ffi::Error RowGatherMatmulPackedCpu(ffi::AnyBuffer a, ffi::AnyBuffer a_packed, ffi::AnyBuffer b, S32Buffer tiles,
                                    S32Buffer count, ffi::AnyBuffer bias, ffi::AnyBuffer dead_row,
                                    ffi::Result<ffi::AnyBuffer> c, int64_t tile_h, bool trans_b, bool allow_tf32,
                                    int64_t activation, bool skip_dead) {
  auto args = DecodeRowGatherPackedArgs(a, a_packed, b, tiles, count, bias, dead_row, c, tile_h, trans_b, allow_tf32,
                                        activation, skip_dead);
  if (args.has_error()) return args.error();
  cpu::Poison(c->untyped_data(), c->size_bytes());
  if (args->mm.batch > 0) RowGather(args->mm, args->index);
  return ffi::Error::Success();
}

// The product with its activation and z, the activation's input, on the listed rows (z's
// other rows keep the poison: nothing may read them).
ffi::Error RowGatherMatmulPreCpu(ffi::AnyBuffer a, ffi::AnyBuffer b, S32Buffer tiles, S32Buffer count,
                                 ffi::AnyBuffer bias, ffi::AnyBuffer dead_row, ffi::Result<ffi::AnyBuffer> c,
                                 ffi::Result<ffi::AnyBuffer> z, int64_t tile_h, bool trans_b, bool allow_tf32,
                                 int64_t activation, bool skip_dead) {
  auto args =
      DecodeRowGatherPreArgs(a, b, tiles, count, bias, dead_row, c, z, tile_h, trans_b, allow_tf32, activation,
                             skip_dead);
  if (args.has_error()) return args.error();
  cpu::Poison(c->untyped_data(), c->size_bytes());
  cpu::Poison(z->untyped_data(), z->size_bytes());
  if (args->mm.batch > 0) RowGather(args->mm, args->index);
  return ffi::Error::Success();
}

// The three column parts: the product into one [batch, M, N] buffer, then each part's
// columns copied out (the CPU has no pass to save; the target exists on both platforms).
ffi::Error RowGatherMatmul3Cpu(ffi::AnyBuffer a, ffi::AnyBuffer b, S32Buffer tiles, S32Buffer count,
                               ffi::AnyBuffer bias, ffi::AnyBuffer dead_row, ffi::Result<ffi::AnyBuffer> c0,
                               ffi::Result<ffi::AnyBuffer> c1, ffi::Result<ffi::AnyBuffer> c2, int64_t tile_h,
                               bool trans_b, bool allow_tf32, int64_t activation, bool skip_dead) {
  ffi::Result<ffi::AnyBuffer> parts[3] = {c0, c1, c2};
  auto args =
      DecodeRowGatherPartsArgs(a, b, tiles, count, bias, dead_row, parts, 3, tile_h, trans_b, allow_tf32, activation,
                               skip_dead);
  if (args.has_error()) return args.error();
  MatmulParams p = args->mm;
  const int64_t es = DTypeBytes(p.dtype), part_bytes = p.N / 3 * es;
  std::vector<char> full(static_cast<size_t>(p.batch * p.M * p.N * es));
  p.c = full.data();
  p.c_parts = 1;
  if (p.batch > 0) RowGather(p, args->index);
  for (int i = 0; i < 3; ++i) {
    char* dst = static_cast<char*>(parts[i]->untyped_data());
    for (int64_t r = 0; r < p.batch * p.M; ++r)
      std::memcpy(dst + r * part_bytes, full.data() + r * p.N * es + i * part_bytes, static_cast<size_t>(part_bytes));
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowGatherMatmulCpu, pit::RowGatherMatmulCpu,
                              pit::bind::RowGatherMatmul(xla::ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowGatherMatmulPackedCpu, pit::RowGatherMatmulPackedCpu,
                              pit::bind::RowGatherMatmulPacked(xla::ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowGatherMatmulPreCpu, pit::RowGatherMatmulPreCpu,
                              pit::bind::RowGatherMatmulPre(xla::ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(PitRowGatherMatmul3Cpu, pit::RowGatherMatmul3Cpu,
                              pit::bind::RowGatherMatmul3(xla::ffi::Ffi::Bind()));
