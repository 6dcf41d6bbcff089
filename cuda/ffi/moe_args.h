// Decoding and validation of the MoE custom calls (pit_moe_index, pit_grouped_matmul,
// pit_grouped_wgrad), shared by their CPU and CUDA handlers. docs/kernels.md ("MoE")
// specifies each target. Every inconsistency is an InvalidArgument naming the target
// and the argument, so a hand-written call never reaches a kernel with bad sizes.
//
// Index operands are taken as AnyBuffer and their dtype checked here, so a wrong dtype
// is this error too (not the FFI decoder's, which names no argument).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/common/moe_params.h"
#include "cuda/ffi/ffi_common.h"
#include "cuda/ffi/matmul_args.h"

namespace pit {

namespace moe {

// Every size a kernel indexes with 32-bit ints (assignment ids, rows, features, groups)
// stays below this; element offsets are 64-bit.
constexpr int64_t kMaxExtent = (int64_t{1} << 31) - 1;

using Dims = std::vector<int64_t>;

inline Dims ToDims(ffi::AnyBuffer::Dimensions d) { return Dims(d.begin(), d.end()); }

inline Dims Lead(const Dims& d, size_t trailing) {
  return d.size() >= trailing ? Dims(d.begin(), d.end() - trailing) : Dims();
}

inline int64_t Product(const Dims& d) {
  int64_t p = 1;
  for (int64_t v : d) p *= v;
  return p;
}

inline std::string Str(const Dims& d) { return DimsString(d); }

inline bool IsPrefix(const Dims& p, const Dims& full) {
  if (p.size() > full.size()) return false;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] != full[i]) return false;
  return true;
}

inline ffi::Error Fail(const std::string& msg) { return ffi::Error::InvalidArgument(msg); }

inline ffi::Error CheckS32(const std::string& target, ffi::DataType t, const char* what) {
  if (t != ffi::DataType::S32) return Fail(target + ": " + what + " must be int32");
  return ffi::Error::Success();
}

inline ffi::Error CheckExtent(const std::string& target, int64_t v, const char* what) {
  if (v > kMaxExtent) return Fail(target + ": " + what + " (" + std::to_string(v) + ") must be below 2^31");
  return ffi::Error::Success();
}

// The routing index lists [..., E+1, A], counts [..., E+1]: fills `index` and returns
// (via out-params) E, A and the index's leading dims.
inline ffi::Error DecodeRouting(const std::string& target, ffi::AnyBuffer lists, ffi::AnyBuffer counts,
                                RoutingIndex* index, int64_t* E, int64_t* A, Dims* lead) {
  if (auto e = CheckS32(target, lists.element_type(), "lists"); e.failure()) return e;
  if (auto e = CheckS32(target, counts.element_type(), "counts"); e.failure()) return e;
  const Dims ld = ToDims(lists.dimensions()), cd = ToDims(counts.dimensions());
  if (ld.size() < 2) return Fail(target + ": lists must be [..., E+1, A], got " + Str(ld));
  if (cd != Lead(ld, 1)) return Fail(target + ": counts must be lists' [..., E+1] " + Str(Lead(ld, 1)) + ", got " + Str(cd));
  const int64_t groups = ld[ld.size() - 2];
  if (groups < 2) return Fail(target + ": lists must have E+1 >= 2 groups (E >= 1 experts), got " + std::to_string(groups));
  *E = groups - 1;
  *A = ld.back();
  *lead = Lead(ld, 2);
  if (auto e = CheckExtent(target, groups, "the number of groups E+1"); e.failure()) return e;
  if (auto e = CheckExtent(target, *A, "the number of assignments A"); e.failure()) return e;
  index->lists = static_cast<const int32_t*>(lists.untyped_data());
  index->counts = static_cast<const int32_t*>(counts.untyped_data());
  index->batch = Product(*lead);
  return ffi::Error::Success();
}

// The full batch: the longest of the operands' leading dims, each a prefix of it.
inline ffi::ErrorOr<Dims> FullBatch(const std::string& target, const std::vector<std::pair<const char*, Dims>>& leads) {
  Dims full;
  for (const auto& [name, d] : leads)
    if (d.size() > full.size()) full = d;
  for (const auto& [name, d] : leads)
    if (!IsPrefix(d, full))
      return InvalidArg(target + ": the leading dims of " + name + " " + Str(d) + " must be a prefix of the full batch " +
                        Str(full) + " (operands are shared over trailing batch entries only)");
  if (auto e = CheckExtent(target, Product(full), "the batch count"); e.failure()) return ffi::Unexpected<ffi::Error>(e);
  return full;
}

}  // namespace moe

inline ffi::ErrorOr<MoeIndexParams> DecodeMoeIndexArgs(ffi::AnyBuffer expert_ids, ffi::Result<ffi::AnyBuffer>& lists,
                                                       ffi::Result<ffi::AnyBuffer>& counts, int64_t num_experts) {
  const std::string target = "pit_moe_index";
  using moe::Dims;
  if (auto e = moe::CheckS32(target, expert_ids.element_type(), "expert_ids"); e.failure())
    return ffi::Unexpected<ffi::Error>(e);
  if (auto e = moe::CheckS32(target, lists->element_type(), "lists"); e.failure()) return ffi::Unexpected<ffi::Error>(e);
  if (auto e = moe::CheckS32(target, counts->element_type(), "counts"); e.failure())
    return ffi::Unexpected<ffi::Error>(e);
  const Dims xd = moe::ToDims(expert_ids.dimensions());
  if (xd.size() < 2) return InvalidArg(target + ": expert_ids must be [..., T, k], got " + moe::Str(xd));
  if (num_experts < 1 || num_experts >= moe::kMaxExtent)
    return InvalidArg(target + ": num_experts must be in [1, 2^31 - 1), got " + std::to_string(num_experts));
  MoeIndexParams p;
  p.T = xd[xd.size() - 2];
  p.k = xd.back();
  p.E = num_experts;
  const Dims lead = moe::Lead(xd, 2);
  p.batch = moe::Product(lead);
  const int64_t A = p.T * p.k;
  if (auto e = moe::CheckExtent(target, A, "the number of assignments T*k"); e.failure())
    return ffi::Unexpected<ffi::Error>(e);
  if (auto e = moe::CheckExtent(target, p.batch, "the batch count"); e.failure()) return ffi::Unexpected<ffi::Error>(e);
  Dims want_lists = lead, want_counts = lead;
  want_lists.insert(want_lists.end(), {p.E + 1, A});
  want_counts.push_back(p.E + 1);
  if (moe::ToDims(lists->dimensions()) != want_lists)
    return InvalidArg(target + ": lists must be [..., E+1, T*k] = " + moe::Str(want_lists) + ", got " +
                      moe::Str(moe::ToDims(lists->dimensions())));
  if (moe::ToDims(counts->dimensions()) != want_counts)
    return InvalidArg(target + ": counts must be [..., E+1] = " + moe::Str(want_counts) + ", got " +
                      moe::Str(moe::ToDims(counts->dimensions())));
  p.expert_ids = static_cast<const int32_t*>(expert_ids.untyped_data());
  p.lists = static_cast<int32_t*>(lists->untyped_data());
  p.counts = static_cast<int32_t*>(counts->untyped_data());
  return p;
}

inline ffi::ErrorOr<GroupedMatmulParams> DecodeGroupedMatmulArgs(ffi::AnyBuffer src, ffi::AnyBuffer w,
                                                                 ffi::AnyBuffer lists, ffi::AnyBuffer counts,
                                                                 ffi::Result<ffi::AnyBuffer>& y, int64_t row_div,
                                                                 bool trans_w, bool allow_tf32, int64_t activation) {
  const std::string target = "pit_grouped_matmul";
  using moe::Dims;
  GroupedMatmulParams p;
  // Only ReLU: its derivative is read from the output, so autodiff keeps the fusion.
  if (activation != static_cast<int64_t>(Activation::kNone) && activation != static_cast<int64_t>(Activation::kRelu))
    return InvalidArg(target + ": activation must be 0 (none) or 1 (relu), got " + std::to_string(activation));
  p.relu = activation == static_cast<int64_t>(Activation::kRelu);
  auto dtype = DecodeDType(src.element_type(), target + ": src");
  if (dtype.has_error()) return ffi::Unexpected<ffi::Error>(dtype.error());
  if (w.element_type() != src.element_type()) return InvalidArg(target + ": w must have src's dtype");
  if (y->element_type() != src.element_type()) return InvalidArg(target + ": the result y must have src's dtype");
  p.dtype = *dtype;
  p.allow_tf32 = allow_tf32 && p.dtype == DType::kF32;
  p.trans_w = trans_w;

  Dims idx_lead;
  if (auto e = moe::DecodeRouting(target, lists, counts, &p.index, &p.E, &p.A, &idx_lead); e.failure())
    return ffi::Unexpected<ffi::Error>(e);
  const Dims sd = moe::ToDims(src.dimensions()), wd = moe::ToDims(w.dimensions()), yd = moe::ToDims(y->dimensions());
  if (sd.size() < 2) return InvalidArg(target + ": src must be [..., R, D], got " + moe::Str(sd));
  if (wd.size() < 3)
    return InvalidArg(target + ": w must be [..., E, D, F] (or [..., E, F, D] with trans_w), got " + moe::Str(wd));
  if (yd.size() < 2) return InvalidArg(target + ": the result y must be [..., A, F], got " + moe::Str(yd));
  const int64_t R = sd[sd.size() - 2];
  p.D = sd.back();
  const int64_t we = wd[wd.size() - 3];
  const int64_t wdim = trans_w ? wd.back() : wd[wd.size() - 2];
  p.F = trans_w ? wd[wd.size() - 2] : wd.back();
  if (we != p.E)
    return InvalidArg(target + ": w has " + std::to_string(we) + " experts but the routing index has E = " +
                      std::to_string(p.E) + " (lists [..., E+1, A])");
  if (wdim != p.D)
    return InvalidArg(target + ": w's D dim (" + std::to_string(wdim) + ") must equal src's feature dim D = " +
                      std::to_string(p.D) + (trans_w ? " (w is [..., E, F, D] with trans_w)" : " (w is [..., E, D, F])"));
  if (row_div < 1 || row_div > moe::kMaxExtent)
    return InvalidArg(target + ": row_div must be >= 1 and below 2^31, got " + std::to_string(row_div));
  if (R > moe::kMaxExtent || R * row_div != p.A)
    return InvalidArg(target + ": src has R = " + std::to_string(R) + " rows; R * row_div (" + std::to_string(row_div) +
                      ") must equal the index's A = " + std::to_string(p.A));
  if (yd[yd.size() - 2] != p.A || yd.back() != p.F)
    return InvalidArg(target + ": the result y must be [..., A, F] = [..., " + std::to_string(p.A) + ", " +
                      std::to_string(p.F) + "], got " + moe::Str(yd));
  for (auto [v, what] : {std::pair<int64_t, const char*>{p.D, "D"}, {p.F, "F"}})
    if (auto e = moe::CheckExtent(target, v, what); e.failure()) return ffi::Unexpected<ffi::Error>(e);

  const Dims src_lead = moe::Lead(sd, 2), w_lead = moe::Lead(wd, 3), y_lead = moe::Lead(yd, 2);
  auto full = moe::FullBatch(target, {{"src", src_lead}, {"w", w_lead}, {"lists", idx_lead}});
  if (full.has_error()) return ffi::Unexpected<ffi::Error>(full.error());
  if (y_lead != *full)
    return InvalidArg(target + ": the result y must have the full batch dims " + moe::Str(*full) + ", got " +
                      moe::Str(y_lead));
  p.batch = moe::Product(*full);
  p.row_div = row_div;
  p.src = {src.untyped_data(), moe::Product(src_lead), R, p.D};
  p.w = w.untyped_data();
  p.w_batch = moe::Product(w_lead);
  p.y = y->untyped_data();
  return p;
}

inline ffi::ErrorOr<GroupedWgradParams> DecodeGroupedWgradArgs(ffi::AnyBuffer src, ffi::AnyBuffer dy,
                                                               ffi::AnyBuffer lists, ffi::AnyBuffer counts,
                                                               ffi::Result<ffi::AnyBuffer>& dw, int64_t row_div,
                                                               bool allow_tf32) {
  const std::string target = "pit_grouped_wgrad";
  using moe::Dims;
  GroupedWgradParams p;
  auto dtype = DecodeDType(src.element_type(), target + ": src");
  if (dtype.has_error()) return ffi::Unexpected<ffi::Error>(dtype.error());
  if (dy.element_type() != src.element_type()) return InvalidArg(target + ": dy must have src's dtype");
  if (dw->element_type() != src.element_type()) return InvalidArg(target + ": the result dw must have src's dtype");
  p.dtype = *dtype;
  p.allow_tf32 = allow_tf32 && p.dtype == DType::kF32;

  Dims idx_lead;
  if (auto e = moe::DecodeRouting(target, lists, counts, &p.index, &p.E, &p.A, &idx_lead); e.failure())
    return ffi::Unexpected<ffi::Error>(e);
  const Dims sd = moe::ToDims(src.dimensions()), gd = moe::ToDims(dy.dimensions()), od = moe::ToDims(dw->dimensions());
  if (sd.size() < 2) return InvalidArg(target + ": src must be [..., R, D], got " + moe::Str(sd));
  if (gd.size() < 2) return InvalidArg(target + ": dy must be [..., A, F], got " + moe::Str(gd));
  if (od.size() < 3) return InvalidArg(target + ": the result dw must be [..., E, D, F], got " + moe::Str(od));
  const int64_t R = sd[sd.size() - 2];
  p.D = sd.back();
  p.F = gd.back();
  if (gd[gd.size() - 2] != p.A)
    return InvalidArg(target + ": dy has " + std::to_string(gd[gd.size() - 2]) + " rows but the index has A = " +
                      std::to_string(p.A) + " assignments");
  if (row_div < 1 || row_div > moe::kMaxExtent)
    return InvalidArg(target + ": row_div must be >= 1 and below 2^31, got " + std::to_string(row_div));
  if (R > moe::kMaxExtent || R * row_div != p.A)
    return InvalidArg(target + ": src has R = " + std::to_string(R) + " rows; R * row_div (" + std::to_string(row_div) +
                      ") must equal the index's A = " + std::to_string(p.A));
  const Dims want = {p.E, p.D, p.F};
  if (Dims(od.end() - 3, od.end()) != want)
    return InvalidArg(target + ": the result dw must be [..., E, D, F] = [..., " + std::to_string(p.E) + ", " +
                      std::to_string(p.D) + ", " + std::to_string(p.F) + "], got " + moe::Str(od));
  for (auto [v, what] : {std::pair<int64_t, const char*>{p.D, "D"}, {p.F, "F"}})
    if (auto e = moe::CheckExtent(target, v, what); e.failure()) return ffi::Unexpected<ffi::Error>(e);

  const Dims src_lead = moe::Lead(sd, 2), dy_lead = moe::Lead(gd, 2), dw_lead = moe::Lead(od, 3);
  auto full = moe::FullBatch(target, {{"src", src_lead}, {"dy", dy_lead}, {"lists", idx_lead}});
  if (full.has_error()) return ffi::Unexpected<ffi::Error>(full.error());
  if (!moe::IsPrefix(dw_lead, *full))
    return InvalidArg(target + ": the leading dims of the result dw " + moe::Str(dw_lead) +
                      " must be a prefix of the full batch " + moe::Str(*full));
  p.batch = moe::Product(*full);
  p.row_div = row_div;
  p.src = {src.untyped_data(), moe::Product(src_lead), R, p.D};
  p.dy = {dy.untyped_data(), moe::Product(dy_lead), p.A, p.F};
  p.dw = dw->untyped_data();
  p.dw_batch = moe::Product(dw_lead);
  return p;
}

// Entry b of the full batch reads entry b / Div(batch, n) of an operand with n entries
// (1 for an empty batch, whose entries are never read).
inline int64_t BatchDiv(int64_t batch, int64_t n) { return (batch > 0 && n > 0) ? batch / n : 1; }

}  // namespace pit
