// Decoding and validation of the sparse-product custom calls (pit_row_gather_matmul,
// pit_stile_matmul, pit_sdd_matmul), shared by their CPU and CUDA handlers.
// docs/kernels.md specifies each target. Every inconsistency is an InvalidArgument
// error naming the target: a bad call never reaches a kernel.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "cuda/common/matmul_params.h"
#include "cuda/ffi/ffi_common.h"

namespace pit {

using S32Buffer = ffi::Buffer<ffi::S32>;

inline ffi::ErrorOr<DType> DecodeDType(ffi::DataType t, const std::string& what) {
  switch (t) {
    case ffi::DataType::F32: return DType::kF32;
    case ffi::DataType::BF16: return DType::kBF16;
    case ffi::DataType::F16: return DType::kF16;
    default: return InvalidArg(what + " must be float32, bfloat16 or float16");
  }
}

// Shapes, dtypes and batch counts of C = op_a(A) @ op_b(B) (see matmul_params.h).
inline ffi::ErrorOr<MatmulParams> DecodeMatmul(const std::string& target, ffi::AnyBuffer a, ffi::AnyBuffer b,
                                               ffi::AnyBuffer::Dimensions c_dims, ffi::DataType c_type, void* c_data,
                                               bool trans_a, bool trans_b, bool trans_c, bool allow_tf32) {
  MatmulParams p;
  auto dtype = DecodeDType(a.element_type(), target + ": a");
  if (dtype.has_error()) return ffi::Unexpected<ffi::Error>(dtype.error());
  if (b.element_type() != a.element_type() || c_type != a.element_type())
    return InvalidArg(target + ": a, b and the result must have the same dtype");
  p.dtype = *dtype;
  p.allow_tf32 = allow_tf32 && p.dtype == DType::kF32;
  auto am = AsBatchedMatrix(a.dimensions(), (target + ": a").c_str());
  auto bm = AsBatchedMatrix(b.dimensions(), (target + ": b").c_str());
  auto cm = AsBatchedMatrix(c_dims, (target + ": result").c_str());
  if (am.has_error()) return ffi::Unexpected<ffi::Error>(am.error());
  if (bm.has_error()) return ffi::Unexpected<ffi::Error>(bm.error());
  if (cm.has_error()) return ffi::Unexpected<ffi::Error>(cm.error());
  p.trans_a = trans_a;
  p.trans_b = trans_b;
  p.trans_c = trans_c;
  p.M = trans_a ? am->cols : am->rows;
  p.K = trans_a ? am->rows : am->cols;
  const int64_t kb = trans_b ? bm->cols : bm->rows;
  p.N = trans_b ? bm->rows : bm->cols;
  if (kb != p.K)
    return InvalidArg(target + ": inner dimensions differ (" + std::to_string(p.K) + " vs " + std::to_string(kb) + ")");
  const int64_t cr = trans_c ? cm->cols : cm->rows, cc = trans_c ? cm->rows : cm->cols;
  if (cr != p.M || cc != p.N) return InvalidArg(target + ": result must be [..., M, N] (or [..., N, M] with trans_c)");
  p.a = {a.untyped_data(), am->batch, am->rows, am->cols};
  p.b = {b.untyped_data(), bm->batch, bm->rows, bm->cols};
  p.c = c_data;
  p.c_batch = cm->batch;
  p.batch = std::max({am->batch, bm->batch, cm->batch});
  for (int64_t n : {am->batch, bm->batch, cm->batch})
    if (n == 0 ? p.batch != 0 : p.batch % n != 0)
      return InvalidArg(target + ": batch counts of a, b and the result must divide each other");
  return p;
}

// A list operand [..., groups, capacity] with counts [..., groups].
inline ffi::ErrorOr<TileList> DecodeLists(const std::string& target, S32Buffer lists, S32Buffer counts,
                                          int64_t tile_h, int64_t tile_w) {
  const auto ld = lists.dimensions();
  const auto cd = counts.dimensions();
  if (ld.size() < 2 || cd.size() != ld.size() - 1 || !std::equal(cd.begin(), cd.end(), ld.begin()))
    return InvalidArg(target + ": lists must be [..., groups, capacity] and counts [..., groups]");
  if (tile_h < 1 || tile_w < 1) return InvalidArg(target + ": micro-tile must be positive");
  TileList t;
  t.lists = lists.typed_data();
  t.counts = counts.typed_data();
  t.capacity = ld.back();
  t.groups = ld[ld.size() - 2];
  t.batch = LeadingProduct(ld, ld.size() - 2);
  t.tile_h = tile_h;
  t.tile_w = tile_w;
  return t;
}

// A flat tile list [..., capacity] with its count [...], seen as one group.
inline ffi::ErrorOr<TileList> DecodeFlatList(const std::string& target, S32Buffer tiles, S32Buffer count,
                                             int64_t tile_h, int64_t tile_w) {
  const auto td = tiles.dimensions();
  if (td.size() < 1 || static_cast<int64_t>(count.element_count()) != LeadingProduct(td, td.size() - 1))
    return InvalidArg(target + ": tiles must be [..., capacity] and count [...]");
  if (tile_h < 1 || tile_w < 1) return InvalidArg(target + ": micro-tile must be positive");
  TileList t;
  t.lists = tiles.typed_data();
  t.counts = count.typed_data();
  t.capacity = td.back();
  t.groups = 1;
  t.batch = LeadingProduct(td, td.size() - 1);
  t.tile_h = tile_h;
  t.tile_w = tile_w;
  return t;
}

inline ffi::Error CheckIndexBatch(const std::string& target, const TileList& t, int64_t owner_batch,
                                  const char* owner) {
  if (t.batch != owner_batch)
    return ffi::Error::InvalidArgument(target + ": the index must have the leading dims of " + owner);
  return ffi::Error::Success();
}

// pit_stile_matmul: which way the sparse operand's lists run.
struct StileGeometry {
  bool sparse_b = false;     // the masked operand is B (else A)
  bool reduce_cols = false;  // the reduction runs along the sparse operand's stored columns:
                             // groups are its tile rows and list entries tile columns
                             // (else groups are tile columns and entries tile rows)
  int64_t rows = 0, cols = 0;  // the sparse operand's stored matrix
};

inline ffi::ErrorOr<StileGeometry> DecodeStileGeometry(const std::string& target, const MatmulParams& p,
                                                       const TileList& t, bool sparse_b) {
  StileGeometry g;
  g.sparse_b = sparse_b;
  const MatrixRef& s = sparse_b ? p.b : p.a;
  g.rows = s.rows;
  g.cols = s.cols;
  // A's reduction dim is its stored cols unless transposed; B's is its stored rows.
  g.reduce_cols = sparse_b ? p.trans_b : !p.trans_a;
  const int64_t groups = g.reduce_cols ? CeilDiv(s.rows, t.tile_h) : CeilDiv(s.cols, t.tile_w);
  if (t.groups != groups)
    return InvalidArg(target + ": expected " + std::to_string(groups) + " list groups for this micro-tile, got " +
                      std::to_string(t.groups));
  if (t.tile_h > s.rows || t.tile_w > s.cols) return InvalidArg(target + ": micro-tile larger than the sparse operand");
  auto err = CheckIndexBatch(target, t, s.batch, sparse_b ? "b" : "a");
  if (err.failure()) return ffi::Unexpected<ffi::Error>(err);
  return g;
}

// -- one decoder per product target, shared by its CPU and CUDA handlers ----------------

struct ProductArgs {
  MatmulParams mm;
  TileList index;
  StileGeometry geometry;  // pit_stile_matmul only
};

// The fused epilogue: bias [N] in c's dtype or float32, dead_row [N] in c's dtype, either
// empty (none; zeros); activation a code of matmul_params.h's Activation.
inline ffi::ErrorOr<Epilogue> DecodeEpilogue(const std::string& target, ffi::AnyBuffer bias, ffi::AnyBuffer dead_row,
                                             int64_t activation, const MatmulParams& p) {
  Epilogue e;
  if (activation < 0 || activation >= kNumActivations)
    return InvalidArg(target + ": activation must be a code in [0, " + std::to_string(kNumActivations) + "), got " +
                      std::to_string(activation));
  e.act = static_cast<Activation>(activation);
  auto vector = [&](ffi::AnyBuffer v, const char* what, bool f32_ok) -> ffi::ErrorOr<const void*> {
    if (v.element_count() == 0) return static_cast<const void*>(nullptr);
    auto dtype = DecodeDType(v.element_type(), target + ": " + what);
    if (dtype.has_error() || (*dtype != p.dtype && !(f32_ok && *dtype == DType::kF32)))
      return InvalidArg(target + ": " + what + " must have the dtype of a" + (f32_ok ? " or float32" : ""));
    if (v.dimensions().size() != 1 || v.dimensions()[0] != p.N)
      return InvalidArg(target + ": " + what + " must be [N] = [" + std::to_string(p.N) + "] or empty");
    return static_cast<const void*>(v.untyped_data());
  };
  auto b = vector(bias, "bias", true);
  if (b.has_error()) return ffi::Unexpected<ffi::Error>(b.error());
  auto d = vector(dead_row, "dead_row", false);
  if (d.has_error()) return ffi::Unexpected<ffi::Error>(d.error());
  e.bias = *b;
  e.dead = *d;
  e.bias_f32 = *b != nullptr && p.dtype != DType::kF32 && bias.element_type() == ffi::DataType::F32;
  return e;
}

// What the row-gather targets check after the product's shapes: c has a's leading dims
// (no batch reduction, a is never the shared operand), the flat list, the epilogue
// (skip_dead: the unlisted rows left unwritten).
inline ffi::ErrorOr<ProductArgs> DecodeRowGatherRest(const std::string& target, MatmulParams p, S32Buffer tiles,
                                                     S32Buffer count, ffi::AnyBuffer bias, ffi::AnyBuffer dead_row,
                                                     int64_t tile_h, int64_t activation, bool skip_dead) {
  if (p.a.batch != p.batch || p.c_batch != p.batch)
    return InvalidArg(target + ": the result must have a's leading dims, and b's batch count must divide a's");
  auto t = DecodeFlatList(target, tiles, count, tile_h, 1);
  if (t.has_error()) return ffi::Unexpected<ffi::Error>(t.error());
  auto err = CheckIndexBatch(target, *t, p.a.batch, "a");
  if (err.failure()) return ffi::Unexpected<ffi::Error>(err);
  auto epi = DecodeEpilogue(target, bias, dead_row, activation, p);
  if (epi.has_error()) return ffi::Unexpected<ffi::Error>(epi.error());
  p.epi = *epi;
  p.epi.skip_dead = skip_dead;
  return ProductArgs{p, *t, {}};
}

inline ffi::ErrorOr<ProductArgs> DecodeRowGatherArgs(ffi::AnyBuffer a, ffi::AnyBuffer b, S32Buffer tiles,
                                                     S32Buffer count, ffi::AnyBuffer bias, ffi::AnyBuffer dead_row,
                                                     ffi::Result<ffi::AnyBuffer>& c, int64_t tile_h, bool trans_b,
                                                     bool allow_tf32, int64_t activation, bool skip_dead,
                                                     const std::string& target = "pit_row_gather_matmul") {
  auto p = DecodeMatmul(target, a, b, c->dimensions(), c->element_type(), c->untyped_data(), false, trans_b, false,
                        allow_tf32);
  if (p.has_error()) return ffi::Unexpected<ffi::Error>(p.error());
  return DecodeRowGatherRest(target, *p, tiles, count, bias, dead_row, tile_h, activation, skip_dead);
}

// pit_row_gather_matmul_packed: as pit_row_gather_matmul, plus a_packed, a's listed rows
// packed in list order ([..., capacity * tile_h, K] with a's leading dims and dtype: what
// pit_sread_live makes of a), which a kernel may read instead of gathering a's rows.
inline ffi::ErrorOr<ProductArgs> DecodeRowGatherPackedArgs(ffi::AnyBuffer a, ffi::AnyBuffer a_packed, ffi::AnyBuffer b,
                                                           S32Buffer tiles, S32Buffer count, ffi::AnyBuffer bias,
                                                           ffi::AnyBuffer dead_row, ffi::Result<ffi::AnyBuffer>& c,
                                                           int64_t tile_h, bool trans_b, bool allow_tf32,
                                                           int64_t activation, bool skip_dead) {
  const std::string target = "pit_row_gather_matmul_packed";
  auto args = DecodeRowGatherArgs(a, b, tiles, count, bias, dead_row, c, tile_h, trans_b, allow_tf32, activation,
                                  skip_dead, target);
  if (args.has_error()) return args;
  auto ad = a.dimensions(), pdims = a_packed.dimensions();
  std::vector<int64_t> want(ad.begin(), ad.end()), pd(pdims.begin(), pdims.end());
  want[want.size() - 2] = args->index.capacity * args->index.tile_h;
  if (a_packed.element_type() != a.element_type() || !SameDims(pd, want))
    return InvalidArg(target + ": a_packed must have a's dtype and shape [..., capacity * tile_h, K] = " +
                      DimsString(want) + ", got " + DimsString(pd));
  args->mm.a_packed = a_packed.untyped_data();
  return args;
}

// pit_row_gather_matmul_pre: as pit_row_gather_matmul (with an activation), plus z, the
// activation's input on the listed rows, a second result of c's shape and dtype.
inline ffi::ErrorOr<ProductArgs> DecodeRowGatherPreArgs(ffi::AnyBuffer a, ffi::AnyBuffer b, S32Buffer tiles,
                                                        S32Buffer count, ffi::AnyBuffer bias, ffi::AnyBuffer dead_row,
                                                        ffi::Result<ffi::AnyBuffer>& c, ffi::Result<ffi::AnyBuffer>& z,
                                                        int64_t tile_h, bool trans_b, bool allow_tf32,
                                                        int64_t activation, bool skip_dead) {
  const std::string target = "pit_row_gather_matmul_pre";
  auto args = DecodeRowGatherArgs(a, b, tiles, count, bias, dead_row, c, tile_h, trans_b, allow_tf32, activation,
                                  skip_dead, target);
  if (args.has_error()) return args;
  if (args->mm.epi.act == Activation::kNone)
    return InvalidArg(target + ": needs an activation (without one z is c: use pit_row_gather_matmul)");
  auto cd = c->dimensions(), zd = z->dimensions();
  if (z->element_type() != c->element_type() || zd.size() != cd.size() || !std::equal(zd.begin(), zd.end(), cd.begin()))
    return InvalidArg(target + ": z must have c's shape and dtype");
  args->mm.epi.pre = z->untyped_data();
  return args;
}

// pit_row_gather_matmul3: as pit_row_gather_matmul with C given as `parts` results of
// equal shape [..., M, N / parts] (the decoder sees the [..., M, N] they make together).
inline ffi::ErrorOr<ProductArgs> DecodeRowGatherPartsArgs(ffi::AnyBuffer a, ffi::AnyBuffer b, S32Buffer tiles,
                                                          S32Buffer count, ffi::AnyBuffer bias, ffi::AnyBuffer dead_row,
                                                          ffi::Result<ffi::AnyBuffer>* parts, int n_parts,
                                                          int64_t tile_h, bool trans_b, bool allow_tf32,
                                                          int64_t activation, bool skip_dead) {
  const std::string target = "pit_row_gather_matmul3";
  auto dims0 = parts[0]->dimensions();
  if (dims0.size() < 2) return InvalidArg(target + ": every result must be at least 2-D");
  for (int i = 1; i < n_parts; ++i) {
    auto d = parts[i]->dimensions();
    if (parts[i]->element_type() != parts[0]->element_type() || d.size() != dims0.size() ||
        !std::equal(d.begin(), d.end(), dims0.begin()))
      return InvalidArg(target + ": the results must share one shape and dtype");
  }
  std::vector<int64_t> full(dims0.begin(), dims0.end());
  full.back() *= n_parts;
  auto p = DecodeMatmul(target, a, b, ffi::Span<const int64_t>(full.data(), full.size()), parts[0]->element_type(),
                        parts[0]->untyped_data(), false, trans_b, false, allow_tf32);
  if (p.has_error()) return ffi::Unexpected<ffi::Error>(p.error());
  auto args = DecodeRowGatherRest(target, *p, tiles, count, bias, dead_row, tile_h, activation, skip_dead);
  if (args.has_error()) return args;
  args->mm.c = nullptr;
  args->mm.c_parts = n_parts;
  for (int i = 0; i < n_parts; ++i) args->mm.c_part[i] = parts[i]->untyped_data();
  return args;
}

inline ffi::ErrorOr<ProductArgs> DecodeStileArgs(ffi::AnyBuffer a, ffi::AnyBuffer b, S32Buffer lists,
                                                 S32Buffer counts, ffi::Result<ffi::AnyBuffer>& c, bool sparse_b,
                                                 int64_t tile_h, int64_t tile_w, bool trans_a, bool trans_b,
                                                 bool trans_c, bool allow_tf32) {
  const std::string target = "pit_stile_matmul";
  auto p = DecodeMatmul(target, a, b, c->dimensions(), c->element_type(), c->untyped_data(), trans_a, trans_b,
                        trans_c, allow_tf32);
  if (p.has_error()) return ffi::Unexpected<ffi::Error>(p.error());
  auto t = DecodeLists(target, lists, counts, tile_h, tile_w);
  if (t.has_error()) return ffi::Unexpected<ffi::Error>(t.error());
  auto g = DecodeStileGeometry(target, *p, *t, sparse_b);
  if (g.has_error()) return ffi::Unexpected<ffi::Error>(g.error());
  return ProductArgs{*p, *t, *g};
}

inline ffi::ErrorOr<ProductArgs> DecodeSddArgs(ffi::AnyBuffer a, ffi::AnyBuffer b, S32Buffer tiles, S32Buffer count,
                                               ffi::Result<ffi::AnyBuffer>& c, int64_t tile_h, int64_t tile_w,
                                               bool trans_a, bool trans_b, bool allow_tf32) {
  const std::string target = "pit_sdd_matmul";
  auto p = DecodeMatmul(target, a, b, c->dimensions(), c->element_type(), c->untyped_data(), trans_a, trans_b, false,
                        allow_tf32);
  if (p.has_error()) return ffi::Unexpected<ffi::Error>(p.error());
  auto t = DecodeFlatList(target, tiles, count, tile_h, tile_w);
  if (t.has_error()) return ffi::Unexpected<ffi::Error>(t.error());
  auto err = CheckIndexBatch(target, *t, p->c_batch, "the result");
  if (err.failure()) return ffi::Unexpected<ffi::Error>(err);
  return ProductArgs{*p, *t, {}};
}

}  // namespace pit
