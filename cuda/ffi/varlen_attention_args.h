// Decoding and validation of pit_varlen_attention and pit_varlen_attention_bwd, shared by
// their CPU and CUDA handlers (docs/kernels.md specifies both). Every inconsistency is an
// InvalidArgument error naming the target and the operand: a bad call never reaches a kernel.
#pragma once

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>

#include "cuda/common/varlen_attention_params.h"
#include "cuda/ffi/matmul_args.h"

namespace pit {

// q [batch, seq, heads, head_dim] (bf16 or f16, head_dim 64, 80, 96 or 128, seq <= 65536); k and v: q's
// dtype and shape, or [batch, seq, kv_heads, head_dim] with kv_heads dividing heads; lengths [batch] int32.
// Packed rows (max_seqlen > 0): lengths is cu_seqlens [batch, segments + 1], segments >= 1, the longest
// sequence max_seqlen <= 65536 tokens, a row at most kVarlenAttentionMaxPackedRow tokens, no left padding.
inline ffi::ErrorOr<VarlenAttentionParams> DecodeVarlenAttentionCommon(const std::string& target, ffi::AnyBuffer q,
                                                                      ffi::AnyBuffer k, ffi::AnyBuffer v,
                                                                      S32Buffer lengths, S32Buffer order,
                                                                      float scale, bool causal,
                                                                      bool left_padded, int64_t window_left,
                                                                      int64_t window_right, int64_t max_seqlen) {
  const auto d = q.dimensions();
  if (d.size() != 4) return InvalidArg(target + ": q must be [batch, seq, heads, head_dim], got " + DimsString(d));
  if (q.element_type() != ffi::DataType::BF16 && q.element_type() != ffi::DataType::F16)
    return InvalidArg(target + ": q must be bfloat16 or float16");
  if (!VarlenAttentionHeadDimOk(d[3]))
    return InvalidArg(target + ": head_dim (q's last dim) must be 64, 80, 96 or 128, got " + std::to_string(d[3]));
  const bool packed = max_seqlen != 0;
  if (max_seqlen < 0 || max_seqlen > kVarlenAttentionMaxSeq)
    return InvalidArg(target + ": max_seqlen must be in [0, " + std::to_string(kVarlenAttentionMaxSeq) +
                      "] (0: padded rows), got " + std::to_string(max_seqlen));
  if (packed ? d[1] > kVarlenAttentionMaxPackedRow : d[1] > kVarlenAttentionMaxSeq)
    return InvalidArg(target + ": seq (q's dim 1) must be at most " +
                      std::to_string(packed ? kVarlenAttentionMaxPackedRow : kVarlenAttentionMaxSeq) + ", got " +
                      std::to_string(d[1]));
  if (d[0] > 65535 || d[2] > 65535)
    return InvalidArg(target + ": batch and heads must be at most 65535, got " + DimsString(d));
  // k, v: q's shape, or q's batch, seq and head_dim with kv_heads dividing its heads.
  const auto kd = k.dimensions();
  const bool grouped = kd.size() == 4 && kd[0] == d[0] && kd[1] == d[1] && kd[3] == d[3] && kd[2] > 0 &&
                       d[2] % kd[2] == 0;
  for (auto [name, buf] : {std::pair<const char*, ffi::AnyBuffer*>{"k", &k}, {"v", &v}}) {
    if (buf->element_type() != q.element_type() || !(SameDims(buf->dimensions(), d) || grouped) ||
        !SameDims(buf->dimensions(), kd))
      return InvalidArg(target + ": " + name + " must have q's shape " + DimsString(d) +
                        " (or its batch, seq and head_dim with kv_heads dividing its heads; v k's shape) and "
                        "dtype, got " + DimsString(buf->dimensions()));
  }
  if (window_left < -1 || window_right < -1)
    return InvalidArg(target + ": window_left and window_right must be >= 0 (or -1: no bound), got " +
                      std::to_string(window_left) + ", " + std::to_string(window_right));
  const auto ld = lengths.dimensions();
  if (!packed && (ld.size() != 1 || ld[0] != d[0]))
    return InvalidArg(target + ": lengths must be int32 [batch] = [" + std::to_string(d[0]) + "]");
  if (packed && (ld.size() != 2 || ld[0] != d[0] || ld[1] < 2 || d[0] * (ld[1] - 1) > 65535 || left_padded))
    return InvalidArg(target + ": packed rows take cu_seqlens int32 [batch = " + std::to_string(d[0]) +
                      ", segments + 1] with 1 <= segments and batch * segments <= 65535, no left padding; got " +
                      DimsString(ld) + (left_padded ? " and left_padded" : ""));
  VarlenAttentionParams p;
  p.dtype = q.element_type() == ffi::DataType::BF16 ? DType::kBF16 : DType::kF16;
  p.batch = d[0];
  p.tokens = d[1];
  p.seq = packed ? std::min<int64_t>(max_seqlen, d[1]) : d[1];
  p.heads = d[2];
  p.kv_heads = kd[2];
  p.head_dim = d[3];
  p.scale = scale;
  p.causal = causal;
  p.left_padded = left_padded;
  p.window_left = window_left;
  p.window_right = window_right;
  if (packed) {
    p.cu_seqlens = lengths.typed_data();
    p.segments = ld[1] - 1;
  } else {
    p.lengths = lengths.typed_data();
  }
  // order: the sequences' launch order, a permutation (its values are clamped on the device,
  // so a wrong one cannot fault), or empty.
  const auto od = order.dimensions();
  if (od.size() != 1 || (od[0] != 0 && od[0] != VarlenSequences(p)))
    return InvalidArg(target + ": order must be int32 [" + std::to_string(VarlenSequences(p)) +
                      "] (the sequences) or [0], got " + DimsString(od));
  if (od[0] != 0) p.order = order.typed_data();
  p.q = q.untyped_data();
  p.k = k.untyped_data();
  p.v = v.untyped_data();
  return p;
}

// `name` has the shape `want` of operand `like` (q or k) and q's dtype.
inline ffi::Error CheckLike(const std::string& target, const char* name, ffi::AnyBuffer::Dimensions d,
                            ffi::DataType t, const VarlenAttentionParams& p, const char* like,
                            ffi::AnyBuffer::Dimensions want) {
  const ffi::DataType dtype = p.dtype == DType::kBF16 ? ffi::DataType::BF16 : ffi::DataType::F16;
  if (t != dtype || !SameDims(d, want))
    return ffi::Error::InvalidArgument(target + ": " + name + " must have " + like + "'s shape " +
                                       DimsString(want) + " and q's dtype, got " + DimsString(d));
  return ffi::Error::Success();
}

inline ffi::Error CheckLse(const std::string& target, const char* name, ffi::AnyBuffer::Dimensions d,
                           ffi::DataType t, const VarlenAttentionParams& p) {
  if (t != ffi::DataType::F32 || d.size() != 3 || d[0] != p.batch || d[1] != p.heads || d[2] != p.tokens)
    return ffi::Error::InvalidArgument(target + ": " + name + " must be float32 [batch, heads, seq] = [" +
                                       std::to_string(p.batch) + ", " + std::to_string(p.heads) + ", " +
                                       std::to_string(p.tokens) + "], got " + DimsString(d));
  return ffi::Error::Success();
}

// pit_varlen_attention: q, k, v, lengths, order -> out, lse.
inline ffi::ErrorOr<VarlenAttentionParams> DecodeVarlenAttention(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                                                                S32Buffer lengths, S32Buffer order,
                                                                ffi::Result<ffi::AnyBuffer>& out,
                                                                ffi::Result<ffi::AnyBuffer>& lse, float scale,
                                                                bool causal, bool left_padded,
                                                                int64_t window_left, int64_t window_right,
                                                                int64_t max_seqlen) {
  const std::string target = "pit_varlen_attention";
  auto p = DecodeVarlenAttentionCommon(target, q, k, v, lengths, order, scale, causal, left_padded, window_left,
                                       window_right, max_seqlen);
  if (p.has_error()) return p;
  if (auto e = CheckLike(target, "the result", out->dimensions(), out->element_type(), *p, "q", q.dimensions());
      e.failure())
    return ffi::Unexpected<ffi::Error>(e);
  if (auto e = CheckLse(target, "lse (the second result)", lse->dimensions(), lse->element_type(), *p); e.failure())
    return ffi::Unexpected<ffi::Error>(e);
  p->out = out->untyped_data();
  p->lse = static_cast<float*>(lse->untyped_data());
  return p;
}

// pit_varlen_attention_bwd: q, k, v, o, lse, dout, lengths, order -> dq, dk, dv (q's, k's, v's shapes).
inline ffi::ErrorOr<VarlenAttentionParams> DecodeVarlenAttentionBwd(
    ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer o, ffi::AnyBuffer lse, ffi::AnyBuffer dout,
    S32Buffer lengths, S32Buffer order, ffi::Result<ffi::AnyBuffer>& dq, ffi::Result<ffi::AnyBuffer>& dk,
    ffi::Result<ffi::AnyBuffer>& dv, float scale, bool causal, bool left_padded, int64_t window_left,
    int64_t window_right, int64_t max_seqlen) {
  const std::string target = "pit_varlen_attention_bwd";
  auto p = DecodeVarlenAttentionCommon(target, q, k, v, lengths, order, scale, causal, left_padded, window_left,
                                       window_right, max_seqlen);
  if (p.has_error()) return p;
  const auto qd = q.dimensions(), kd = k.dimensions();
  for (auto [name, dims, type, like] :
       {std::tuple<const char*, ffi::AnyBuffer::Dimensions, ffi::DataType, const char*>{
            "o", o.dimensions(), o.element_type(), "q"},
        {"dout", dout.dimensions(), dout.element_type(), "q"},
        {"dq", dq->dimensions(), dq->element_type(), "q"},
        {"dk", dk->dimensions(), dk->element_type(), "k"},
        {"dv", dv->dimensions(), dv->element_type(), "k"}}) {
    if (auto e = CheckLike(target, name, dims, type, *p, like, like[0] == 'q' ? qd : kd); e.failure())
      return ffi::Unexpected<ffi::Error>(e);
  }
  if (auto e = CheckLse(target, "lse", lse.dimensions(), lse.element_type(), *p); e.failure())
    return ffi::Unexpected<ffi::Error>(e);
  p->o = o.untyped_data();
  p->lse_in = static_cast<const float*>(lse.untyped_data());
  p->dout = dout.untyped_data();
  p->dq = dq->untyped_data();
  p->dk = dk->untyped_data();
  p->dv = dv->untyped_data();
  return p;
}

}  // namespace pit
