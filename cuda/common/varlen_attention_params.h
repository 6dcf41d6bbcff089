// pit_varlen_attention / pit_varlen_attention_bwd's decoded call (docs/kernels.md): plain
// data shared by the FFI handlers (cuda/ffi/varlen_attention_args.h) and the kernels.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda/common/host_device.h"
#include "cuda/common/matmul_params.h"

namespace pit {

// Padded sequences: q, o and every result are [batch, seq, heads, head_dim] in `dtype`;
// k and v [batch, seq, kv_heads, head_dim], kv_heads dividing heads (grouped-query
// attention: query head h reads kv head h / (heads / kv_heads); kv_heads = heads is
// multi-head attention); dk and dv have k's shape, each kv head's gradient summed over its
// group's query heads. Sequence b's first lengths[b] tokens (clamped to [0, seq]) are valid,
// or its last lengths[b] with `left_padded`; the rest are padding that no valid token
// attends to and whose rows of every result are 0. With `causal` a valid query attends to
// the valid keys at or before its own position. A local window (window_left /
// window_right >= 0; -1: no bound) limits query i to the keys j with i - window_left <= j
// <= i + window_right (positions among the valid tokens), as jax.nn.dot_product_attention's
// local_window_size does.
//
// Packed rows (cu_seqlens set): each of the batch rows of `tokens` tokens holds `segments`
// sequences one after another, sequence i of row b its tokens [cu_seqlens[b, i],
// cu_seqlens[b, i + 1]) (clamped to the row; cu_seqlens [batch, segments + 1],
// nondecreasing), of which at most `seq` are valid; every other token of the row
// (before the first sequence, after the last, and past `seq` of a longer one) is padding.
// Padded rows: sequence b is row b, seq = tokens.
struct VarlenAttentionParams {
  DType dtype = DType::kBF16;
  int64_t batch = 0, seq = 0, heads = 0, head_dim = 0;
  int64_t tokens = 0;               // a row's tokens (q's dim 1)
  const int32_t* cu_seqlens = nullptr;  // packed rows: [batch, segments + 1]
  int64_t segments = 0;
  int64_t kv_heads = 0;
  float scale = 1.f;                // on q k^T, before the softmax
  bool causal = false;
  bool left_padded = false;
  int64_t window_left = -1, window_right = -1;
  const int32_t* lengths = nullptr;  // [batch]; padded rows
  // The long kernels' launch order (or null): the sequences, longest first. Bidirectional,
  // every block of a sequence walks all its keys (or queries), so the blocks of the
  // longest sequences are the longest; launched first, the short ones fill the tail.
  const int32_t* order = nullptr;   // [VarlenSequences(p)], a permutation
  // The short kernels' launch order, set by their launcher: each CTA ranks the sequences
  // by length itself and takes the grid row's (varlen_attention.cu, SequenceSpan).
  bool longest_first = false;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  // Forward results: out, and lse [batch, heads, tokens] float32, each valid query's
  // log-sum-exp of its scaled scores (natural log; 0 on padding rows).
  void* out = nullptr;
  float* lse = nullptr;
  // Backward operands (the forward's out and lse, and out's cotangent) and results.
  const void* o = nullptr;
  const float* lse_in = nullptr;
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
};

// The sequences of the call: one a row, or `segments` a packed row.
inline int64_t VarlenSequences(const VarlenAttentionParams& p) {
  return p.cu_seqlens != nullptr ? p.batch * p.segments : p.batch;
}

// Sequence j of the call, as the kernels and the CPU handler read it (one definition of the
// clamps above): `row` holds it; its tokens are [origin, end) of the row, the first `len`
// of them valid (a padded row: its valid tokens, after the padding with `left_padded`).
// `index` is its place in a packed row (0 for padded rows). int: a packed row holds at
// most kVarlenAttentionMaxPackedRow tokens, and the kernels' grids count sequences in int.
struct VarlenSpan {
  int row, index, origin, end, len;
};
// Packed rows (cu_seqlens): sequence j is segment j % segments of row j / segments.
PIT_HOST_DEVICE inline VarlenSpan PackedSpan(const VarlenAttentionParams& p, int j) {
  const int tokens = static_cast<int>(p.tokens), segments = static_cast<int>(p.segments), n_seq = static_cast<int>(p.seq);
  const int i = j % segments, row = j / segments;
  const int32_t* cu = p.cu_seqlens + static_cast<int64_t>(row) * (segments + 1);
  const int origin = std::min(std::max(cu[i], 0), tokens);
  const int end = std::min(std::max(cu[i + 1], origin), tokens);
  const int len = std::min(end - origin, n_seq);
  return {row, i, origin, end, len};
}
// Padded rows: sequence j is row j, lengths[j] valid tokens clamped to [0, seq].
PIT_HOST_DEVICE inline VarlenSpan PaddedSpan(const VarlenAttentionParams& p, int j) {
  const int n = p.lengths[j], n_seq = static_cast<int>(p.seq);
  const int len = n < 0 ? 0 : (n > p.seq ? n_seq : n);
  const int origin = p.left_padded ? n_seq - len : 0;
  return {j, 0, origin, origin + len, len};
}

// What the kernels take: 16-bit dtypes, head_dim 64, 80, 96 or 128, sequences of at most
// kVarlenAttentionMaxSeq tokens. Up to kVarlenAttentionShortSeq one CTA holds a whole
// sequence's keys (varlen_attention.cu); longer ones run in blocks of 128 tokens with an
// online softmax (varlen_attention_long.cu).
constexpr bool VarlenAttentionHeadDimOk(int64_t head_dim) {
  return head_dim == 64 || head_dim == 80 || head_dim == 96 || head_dim == 128;
}
constexpr int64_t kVarlenAttentionShortSeq = 128;
constexpr int64_t kVarlenAttentionMaxSeq = 65536;
constexpr int64_t kVarlenAttentionMaxPackedRow = int64_t{1} << 24;  // a packed row's tokens (int indexing)

}  // namespace pit
