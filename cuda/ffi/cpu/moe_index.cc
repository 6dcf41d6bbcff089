// pit_moe_index on the CPU: assignments are listed in ascending order per group (callers
// must not rely on any order; the GPU's is arbitrary). Out-of-range expert ids (negative
// too) go to group E, the dropped ones.
#include <algorithm>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/cpu/handlers.h"
#include "cuda/ffi/moe_args.h"

namespace pit {
namespace {

void BuildRouting(const MoeIndexParams& p) {
  const int64_t A = p.T * p.k, G = p.E + 1;
  std::fill(p.lists, p.lists + p.batch * G * A, -1);
  std::fill(p.counts, p.counts + p.batch * G, 0);
  for (int64_t b = 0; b < p.batch; ++b) {
    const int32_t* ids = p.expert_ids + b * A;
    int32_t* counts = p.counts + b * G;
    int32_t* lists = p.lists + b * G * A;
    for (int64_t a = 0; a < A; ++a) {
      const int64_t id = ids[a];
      const int64_t g = (id >= 0 && id < p.E) ? id : p.E;
      lists[g * A + counts[g]++] = static_cast<int32_t>(a);
    }
  }
}

ffi::Error MoeIndexCpu(ffi::AnyBuffer expert_ids, ffi::Result<ffi::AnyBuffer> lists,
                       ffi::Result<ffi::AnyBuffer> counts, int64_t num_experts) {
  auto p = DecodeMoeIndexArgs(expert_ids, lists, counts, num_experts);
  if (p.has_error()) return p.error();
  BuildRouting(*p);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitMoeIndexCpu, pit::MoeIndexCpu,
                              pit::bind::MoeIndex(xla::ffi::Ffi::Bind()));
