// pit_grouped_wgrad on the CPU: dw[c, e] = sum over the batch entries of c and the
// assignments a of group e of src[a / row_div]^T (x) dy[a], in float32, in a fixed order
// (entries, then list order), rounded once. Empty experts give zeros.
#include <algorithm>
#include <vector>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/cpu/cpu_common.h"
#include "cuda/ffi/cpu/handlers.h"
#include "cuda/ffi/moe_args.h"

namespace pit {
namespace {

void GroupedWgrad(const GroupedWgradParams& p) {
  const int64_t G = p.E + 1, A = p.A, D = p.D, F = p.F;
  const int64_t group = p.dw_batch > 0 ? p.batch / p.dw_batch : 0;  // entries summed into one dw entry
  const int64_t src_div = BatchDiv(p.batch, p.src.batch), dy_div = BatchDiv(p.batch, p.dy.batch),
                idx_div = BatchDiv(p.batch, p.index.batch);
  std::vector<float> acc(static_cast<size_t>(D * F)), srow(D), grow(F);
  for (int64_t c = 0; c < p.dw_batch; ++c) {
    for (int64_t e = 0; e < p.E; ++e) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t b = c * group; b < (c + 1) * group; ++b) {
        const int64_t ie = b / idx_div, se = b / src_div, ge = b / dy_div;
        const int64_t n = cpu::LiveCount(p.index.counts[ie * G + e], A);
        const int32_t* ids = p.index.lists + (ie * G + e) * A;
        for (int64_t s = 0; s < n; ++s) {
          const int64_t a = ids[s];
          if (a < 0 || a >= A) continue;  // not an assignment: skip
          cpu::LoadRow(p.dtype, p.src.data, (se * p.src.rows + a / p.row_div) * D, D, srow.data());
          cpu::LoadRow(p.dtype, p.dy.data, (ge * A + a) * F, F, grow.data());
          for (int64_t d = 0; d < D; ++d) cpu::Axpy(srow[d], grow.data(), acc.data() + d * F, F);
        }
      }
      cpu::StoreRow(p.dtype, acc.data(), D * F, p.dw, (c * p.E + e) * D * F);
    }
  }
}

ffi::Error GroupedWgradCpu(ffi::AnyBuffer src, ffi::AnyBuffer dy, ffi::AnyBuffer lists, ffi::AnyBuffer counts,
                           ffi::Result<ffi::AnyBuffer> dw, int64_t row_div, bool allow_tf32) {
  auto p = DecodeGroupedWgradArgs(src, dy, lists, counts, dw, row_div, allow_tf32);
  if (p.has_error()) return p.error();
  cpu::Poison(dw->untyped_data(), dw->size_bytes());
  GroupedWgrad(*p);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitGroupedWgradCpu, pit::GroupedWgradCpu,
                              pit::bind::GroupedWgrad(xla::ffi::Ffi::Bind()));
