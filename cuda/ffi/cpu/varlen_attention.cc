// pit_varlen_attention(_bwd) on the CPU: the same semantics as the kernels, in float32 per
// (sequence, head); the kernels also round the probabilities and dS to the inputs' dtype
// before their tensor-core products (docs/kernels.md).
#include <algorithm>
#include <cmath>
#include <vector>

#include "cuda/ffi/bindings.h"
#include "cuda/ffi/cpu/cpu_common.h"
#include "cuda/ffi/cpu/handlers.h"
#include "cuda/ffi/varlen_attention_args.h"

namespace pit {
namespace {

struct Heads {
  const VarlenAttentionParams& p;
  // Sequence j of the call: its row, its first valid token in the row and its valid tokens,
  // as the kernels read them (cuda/common/varlen_attention_params.h).
  VarlenSpan Sequence(int64_t j) const {
    const int i = static_cast<int>(j);
    return p.cu_seqlens != nullptr ? PackedSpan(p, i) : PaddedSpan(p, i);
  }
  // Element offset of valid token s (counted from the first valid one) of head h, in a
  // layout of `heads` heads (q's, or k's and v's).
  int64_t Offset(const VarlenSpan& q, int64_t s, int64_t h, int64_t heads) const {
    return ((q.row * p.tokens + q.origin + s) * heads + h) * p.head_dim;
  }
  int64_t LseOffset(const VarlenSpan& q, int64_t h, int64_t s) const {
    return (q.row * p.heads + h) * p.tokens + q.origin + s;
  }
  // Keys a valid query attends to: [KeyBegin, KeyEnd) (causal: up to itself; a local
  // window: within window_left before and window_right after it).
  int KeyBegin(int query) const {
    return p.window_left < 0 ? 0 : static_cast<int>(std::max<int64_t>(0, query - p.window_left));
  }
  int KeyEnd(int query, int len) const {
    int64_t end = p.causal ? query + 1 : len;
    if (p.window_right >= 0) end = std::min<int64_t>(end, query + p.window_right + 1);
    return static_cast<int>(end);
  }
  // The kv head that query head h reads (grouped-query attention).
  int64_t KvHead(int64_t h) const { return h / (p.heads / p.kv_heads); }
  // The valid rows of head h as floats [len, head_dim], and back: h a head of q's layout,
  // or with kv of k's and v's.
  std::vector<float> Load(const void* src, const VarlenSpan& q, int64_t h, bool kv = false) const {
    std::vector<float> out(static_cast<size_t>(q.len) * p.head_dim);
    for (int s = 0; s < q.len; ++s)
      cpu::LoadRow(p.dtype, src, Offset(q, s, h, kv ? p.kv_heads : p.heads), p.head_dim, &out[s * p.head_dim]);
    return out;
  }
  void Store(const std::vector<float>& rows, void* dst, const VarlenSpan& q, int64_t h, bool kv = false) const {
    for (int s = 0; s < q.len; ++s)
      cpu::StoreRow(p.dtype, &rows[s * p.head_dim], p.head_dim, dst, Offset(q, s, h, kv ? p.kv_heads : p.heads));
  }
};

float Dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void VarlenAttentionFwd(const VarlenAttentionParams& p) {
  const Heads hd{p};
  const int64_t d = p.head_dim;
  cpu::Zero(p.out, p.batch * p.tokens * p.heads * d * DTypeBytes(p.dtype));  // padding rows
  for (int64_t i = 0; i < p.batch * p.heads * p.tokens; ++i) p.lse[i] = 0.f;
  for (int64_t j = 0; j < VarlenSequences(p); ++j) {
    const VarlenSpan sq = hd.Sequence(j);
    const int len = sq.len;
    for (int64_t h = 0; h < p.heads && len > 0; ++h) {
      const auto q = hd.Load(p.q, sq, h), k = hd.Load(p.k, sq, hd.KvHead(h), true),
                 v = hd.Load(p.v, sq, hd.KvHead(h), true);
      std::vector<float> o(static_cast<size_t>(len) * d, 0.f), s(len);
      for (int i = 0; i < len; ++i) {
        const int first = hd.KeyBegin(i), keys = hd.KeyEnd(i, len);
        float m = -INFINITY;
        for (int j = first; j < keys; ++j) m = std::fmax(m, s[j] = p.scale * Dot(&q[i * d], &k[j * d], d));
        float l = 0.f;
        for (int j = first; j < keys; ++j) l += s[j] = std::exp(s[j] - m);
        for (int j = first; j < keys; ++j) cpu::Axpy(s[j] / l, &v[j * d], &o[i * d], d);
        p.lse[hd.LseOffset(sq, h, i)] = m + std::log(l);
      }
      hd.Store(o, p.out, sq, h);
    }
  }
}

void VarlenAttentionBwd(const VarlenAttentionParams& p) {
  const Heads hd{p};
  const int64_t d = p.head_dim, row_bytes = p.batch * p.tokens * d * DTypeBytes(p.dtype);
  const int64_t group = p.kv_heads > 0 ? p.heads / p.kv_heads : 1;  // kv_heads 0: no heads at all
  cpu::Zero(p.dq, row_bytes * p.heads);  // padding rows
  for (void* r : {p.dk, p.dv}) cpu::Zero(r, row_bytes * p.kv_heads);
  for (int64_t j = 0; j < VarlenSequences(p); ++j) {
    const VarlenSpan sq = hd.Sequence(j);
    const int len = sq.len;
    std::vector<float> dk, dv;  // a kv head's, summed over its group's query heads in order
    for (int64_t h = 0; h < p.heads && len > 0; ++h) {
      const auto q = hd.Load(p.q, sq, h), k = hd.Load(p.k, sq, hd.KvHead(h), true),
                 v = hd.Load(p.v, sq, hd.KvHead(h), true);
      const auto o = hd.Load(p.o, sq, h), dout = hd.Load(p.dout, sq, h);
      std::vector<float> dq(static_cast<size_t>(len) * d, 0.f);
      if (h % group == 0) dk = dv = dq;
      for (int i = 0; i < len; ++i) {
        const float lse = p.lse_in[hd.LseOffset(sq, h, i)];
        const float delta = Dot(&dout[i * d], &o[i * d], d);
        for (int j = hd.KeyBegin(i); j < hd.KeyEnd(i, len); ++j) {
          const float pr = std::exp(p.scale * Dot(&q[i * d], &k[j * d], d) - lse);
          const float ds = pr * (Dot(&dout[i * d], &v[j * d], d) - delta);
          cpu::Axpy(pr, &dout[i * d], &dv[j * d], d);
          cpu::Axpy(p.scale * ds, &k[j * d], &dq[i * d], d);
          cpu::Axpy(p.scale * ds, &q[i * d], &dk[j * d], d);
        }
      }
      hd.Store(dq, p.dq, sq, h);
      if (h % group == group - 1) {
        hd.Store(dk, p.dk, sq, hd.KvHead(h), true);
        hd.Store(dv, p.dv, sq, hd.KvHead(h), true);
      }
    }
  }
}

// `order` (the GPU kernels' launch order) is checked and unused: the CPU walks the sequences in turn.
ffi::Error VarlenAttentionCpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, S32Buffer lengths,
                              S32Buffer order,
                              ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse, float scale, bool causal,
                              bool left_padded, int64_t window_left, int64_t window_right, int64_t max_seqlen) {
  auto p = DecodeVarlenAttention(q, k, v, lengths, order, out, lse, scale, causal, left_padded, window_left,
                                 window_right, max_seqlen);
  if (p.has_error()) return p.error();
  cpu::Poison(out->untyped_data(), out->size_bytes());
  cpu::Poison(lse->untyped_data(), lse->size_bytes());
  VarlenAttentionFwd(*p);
  return ffi::Error::Success();
}

ffi::Error VarlenAttentionBwdCpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer o,
                                 ffi::AnyBuffer lse, ffi::AnyBuffer dout, S32Buffer lengths, S32Buffer order,
                                 ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                                 ffi::Result<ffi::AnyBuffer> dv, float scale, bool causal, bool left_padded,
                                 int64_t window_left, int64_t window_right, int64_t max_seqlen) {
  auto p = DecodeVarlenAttentionBwd(q, k, v, o, lse, dout, lengths, order, dq, dk, dv, scale, causal,
                                    left_padded, window_left, window_right, max_seqlen);
  if (p.has_error()) return p.error();
  for (auto* r : {&dq, &dk, &dv}) cpu::Poison((*r)->untyped_data(), (*r)->size_bytes());
  VarlenAttentionBwd(*p);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace pit

XLA_FFI_DEFINE_HANDLER_SYMBOL(PitVarlenAttentionCpu, pit::VarlenAttentionCpu,
                              pit::bind::VarlenAttention(xla::ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(PitVarlenAttentionBwdCpu, pit::VarlenAttentionBwdCpu,
                              pit::bind::VarlenAttentionBwd(xla::ffi::Ffi::Bind()));
