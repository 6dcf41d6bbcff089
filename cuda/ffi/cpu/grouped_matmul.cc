// pit_grouped_matmul on the CPU: y[a] = src[a / row_div] @ op(W[e]) for the assignments
// listed in group e < E, zeros for those in group E. Rows of one expert are gathered
// kRowBlock at a time so each row of W[e] is loaded once per block. `relu` clamps before
// the rounding.
#include <algorithm>
#include <vector>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/cpu/cpu_common.h"
#include "cuda/ffi/cpu/handlers.h"
#include "cuda/ffi/moe_args.h"

namespace pit {
namespace {

void GroupedMatmul(const GroupedMatmulParams& p) {
  const int64_t G = p.E + 1, A = p.A, D = p.D, F = p.F;
  const int64_t src_div = BatchDiv(p.batch, p.src.batch), w_div = BatchDiv(p.batch, p.w_batch),
                idx_div = BatchDiv(p.batch, p.index.batch);
  const MatrixRef w_ref{p.w, p.w_batch * p.E, p.trans_w ? F : D, p.trans_w ? D : F};  // one entry per (w entry, e)
  cpu::CachedMatrix wmat(w_ref, p.dtype, p.trans_w);                                // op(W[e]) as float [D, F]
  constexpr int kR = cpu::kRowBlock;
  std::vector<float> rows_in(static_cast<size_t>(kR * D)), acc(static_cast<size_t>(kR * F)), zeros(F, 0.0f);
  const float* l[kR];
  float* out[kR];
  for (int i = 0; i < kR; ++i) {
    l[i] = rows_in.data() + i * D;
    out[i] = acc.data() + i * F;
  }
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t ie = b / idx_div, se = b / src_div, we = b / w_div;
    for (int64_t e = 0; e < G; ++e) {
      const int64_t n = cpu::LiveCount(p.index.counts[ie * G + e], A);
      const int32_t* ids = p.index.lists + (ie * G + e) * A;
      // The listed assignments that are rows of y (a hand-written index may hold others).
      std::vector<int64_t> as;
      for (int64_t s = 0; s < n; ++s)
        if (ids[s] >= 0 && ids[s] < A) as.push_back(ids[s]);
      if (e == p.E) {  // dropped: zero rows
        for (int64_t a : as) cpu::StoreRow(p.dtype, zeros.data(), F, p.y, (b * A + a) * F);
        continue;
      }
      if (as.empty()) continue;
      const cpu::FloatMatrix& wm = wmat.Get(we * p.E + e);
      for (size_t s = 0; s < as.size(); s += kR) {
        const int rows = static_cast<int>(std::min<size_t>(kR, as.size() - s));
        for (int i = 0; i < rows; ++i)
          cpu::LoadRow(p.dtype, p.src.data, (se * p.src.rows + as[s + i] / p.row_div) * D, D, rows_in.data() + i * D);
        std::fill(acc.begin(), acc.end(), 0.0f);
        cpu::UpdateRows(rows, l, out, wm, 0, 0, D, F);
        if (p.relu)
          for (float& v : acc) v = cpu::Activate(v, Activation::kRelu);
        for (int i = 0; i < rows; ++i) cpu::StoreRow(p.dtype, out[i], F, p.y, (b * A + as[s + i]) * F);
      }
    }
  }
}

ffi::Error GroupedMatmulCpu(ffi::AnyBuffer src, ffi::AnyBuffer w, ffi::AnyBuffer lists, ffi::AnyBuffer counts,
                            ffi::Result<ffi::AnyBuffer> y, int64_t row_div, bool trans_w, bool allow_tf32,
                            int64_t activation) {
  auto p = DecodeGroupedMatmulArgs(src, w, lists, counts, y, row_div, trans_w, allow_tf32, activation);
  if (p.has_error()) return p.error();
  cpu::Poison(y->untyped_data(), y->size_bytes());
  GroupedMatmul(*p);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitGroupedMatmulCpu, pit::GroupedMatmulCpu,
                              pit::bind::GroupedMatmul(xla::ffi::Ffi::Bind()));
