// Each target's operands, results and attributes, in docs/kernels.md's order, written
// once for its CPU and CUDA handlers: `b` is xla::ffi::Ffi::Bind() on the CPU and
// Ffi::Bind().Ctx<PlatformStream<cudaStream_t>>() on the GPU (the stream comes first;
// pit::gpu::Binding()). A binding's methods take it as an rvalue.
#pragma once

#include <cstdint>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace pit {
namespace bind {

using ::xla::ffi::AnyBuffer;
using S32 = ::xla::ffi::Buffer<::xla::ffi::S32>;

template <class B>
auto GroupedMatmul(B b) {
  return std::move(b).template Arg<AnyBuffer>()  // src [..., R, D]
      .template Arg<AnyBuffer>()  // w [..., E, D, F] ([..., E, F, D] with trans_w)
      .template Arg<AnyBuffer>()  // lists [..., E+1, A] (s32)
      .template Arg<AnyBuffer>()  // counts [..., E+1] (s32)
      .template Ret<AnyBuffer>()  // y [..., A, F]
      .template Attr<int64_t>("row_div")
      .template Attr<bool>("trans_w")
      .template Attr<bool>("allow_tf32")
      .template Attr<int64_t>("activation");  // 0 none, 1 relu
}

template <class B>
auto GroupedWgrad(B b) {
  return std::move(b).template Arg<AnyBuffer>()  // src [..., R, D]
      .template Arg<AnyBuffer>()  // dy [..., A, F]
      .template Arg<AnyBuffer>()  // lists [..., E+1, A] (s32)
      .template Arg<AnyBuffer>()  // counts [..., E+1] (s32)
      .template Ret<AnyBuffer>()  // dw [..., E, D, F]
      .template Attr<int64_t>("row_div")
      .template Attr<bool>("allow_tf32");
}

template <class B>
auto Index(B b) {
  return std::move(b).template Arg<AnyBuffer>()  // x
      .template Ret<S32>()  // tiles
      .template Ret<S32>()  // count
      .template Ret<S32>()  // row_tiles
      .template Ret<S32>()  // row_count
      .template Ret<S32>()  // col_tiles
      .template Ret<S32>()  // col_count
      .template Ret<S32>()  // scratch
      .template Attr<int64_t>("tile_h")
      .template Attr<int64_t>("tile_w")
      .template Attr<bool>("group_rows")
      .template Attr<bool>("group_cols");
}

template <class B>
auto IndexSplit(B b) {
  return std::move(b).template Arg<AnyBuffer>()  // x [n, rows, cols]
      .RemainingRets()  // per entry: tiles, count, row_tiles, row_count, col_tiles, col_count; then scratch [n]
      .template Attr<int64_t>("tile_h")
      .template Attr<int64_t>("tile_w")
      .template Attr<bool>("group_rows")
      .template Attr<bool>("group_cols");
}

template <class B>
auto MoeIndex(B b) {
  return std::move(b).template Arg<AnyBuffer>()  // expert_ids [..., T, k] (s32)
      .template Ret<AnyBuffer>()  // lists [..., E+1, T*k] (s32)
      .template Ret<AnyBuffer>()  // counts [..., E+1] (s32)
      .template Attr<int64_t>("num_experts");
}

// The row-gather products' operands and attributes; the results sit between them. (By
// reference: a Binding's move constructor is private.)
template <class B>
auto RowGatherOperands(B&& b) {
  return std::forward<B>(b).template Arg<AnyBuffer>()  // a
      .template Arg<AnyBuffer>()  // b
      .template Arg<S32>()  // tiles
      .template Arg<S32>()  // count
      .template Arg<AnyBuffer>()  // bias: [N] or empty
      .template Arg<AnyBuffer>();  // dead_row: [N] or empty
}

template <class B>
auto RowGatherAttrs(B&& b) {
  return std::forward<B>(b).template Attr<int64_t>("tile_h")
      .template Attr<bool>("trans_b")
      .template Attr<bool>("allow_tf32")
      .template Attr<int64_t>("activation")
      .template Attr<bool>("skip_dead");  // unlisted rows left unwritten (else dead_row / zeros)
}

template <class B>
auto RowGatherMatmul(B b) {
  return RowGatherAttrs(RowGatherOperands(std::move(b)).template Ret<AnyBuffer>());  // c
}

// pit_row_gather_matmul_packed: the same product given also a's listed rows packed in list
// order (pit_sread_live's result), which the sm_90a kernel reads by TMA instead of
// gathering them.
template <class B>
auto RowGatherMatmulPacked(B b) {
  auto operands = std::move(b).template Arg<AnyBuffer>()  // a
                      .template Arg<AnyBuffer>()           // a_packed: [..., capacity * tile_h, K]
                      .template Arg<AnyBuffer>()           // b
                      .template Arg<S32>()                 // tiles
                      .template Arg<S32>()                 // count
                      .template Arg<AnyBuffer>()           // bias: [N] or empty
                      .template Arg<AnyBuffer>();          // dead_row: [N] or empty
  return RowGatherAttrs(std::move(operands).template Ret<AnyBuffer>());  // c
}

// pit_row_gather_matmul_pre: the same product with an activation, and z = A @ op(B) + bias
// (the activation's input) as a second result on the listed rows only.
template <class B>
auto RowGatherMatmulPre(B b) {
  return RowGatherAttrs(RowGatherOperands(std::move(b))
                            .template Ret<AnyBuffer>()     // c
                            .template Ret<AnyBuffer>());  // z
}

// pit_row_gather_matmul3: the same product with C as three column parts (q, k and v of a
// fused projection), each [..., M, N / 3]. CUDA: sm_90a only (the lowering checks); CPU:
// the product, then the columns copied out.
template <class B>
auto RowGatherMatmul3(B b) {
  return RowGatherAttrs(RowGatherOperands(std::move(b))
                            .template Ret<AnyBuffer>()     // c part 0
                            .template Ret<AnyBuffer>()     // c part 1
                            .template Ret<AnyBuffer>());  // c part 2
}

template <class B>
auto RowLayerNorm(B b) {
  return std::move(b).template Arg<AnyBuffer>()  // x
      .template Arg<AnyBuffer>()  // residual (or [0])
      .template Arg<AnyBuffer>()  // bias (or [0])
      .template Arg<AnyBuffer>()  // scale
      .template Arg<AnyBuffer>()  // offset
      .template Arg<S32>()  // tiles
      .template Arg<S32>()  // count
      .template Ret<AnyBuffer>()  // y
      .template Attr<int64_t>("tile_h")
      .template Attr<float>("epsilon")
      .template Attr<bool>("skip_dead");  // unlisted rows left unwritten (else zeros)
}

template <class B>
auto RowLayerNormBwd(B b) {
  return std::move(b).template Arg<AnyBuffer>()  // x
      .template Arg<AnyBuffer>()  // residual (or [0])
      .template Arg<AnyBuffer>()  // bias (or [0])
      .template Arg<AnyBuffer>()  // scale
      .template Arg<S32>()  // tiles
      .template Arg<S32>()  // count
      .template Arg<AnyBuffer>()  // dy
      .template Arg<AnyBuffer>()  // dy2 (or [0])
      .template Ret<AnyBuffer>()  // dh
      .template Ret<AnyBuffer>()  // dvec [..., 3, H]: d scale, d offset, d bias
      .template Ret<AnyBuffer>()  // work [..., warps, 3, H]
      .template Attr<int64_t>("tile_h")
      .template Attr<float>("epsilon");
}

template <class B>
auto RowActivation(B b) {
  return std::move(b).template Arg<AnyBuffer>()  // z
      .template Arg<AnyBuffer>()  // fill (or [0])
      .template Arg<S32>()  // tiles
      .template Arg<S32>()  // count
      .template Ret<AnyBuffer>()  // y
      .template Attr<int64_t>("tile_h")
      .template Attr<int64_t>("activation");
}

template <class B>
auto BlockTopk(B b) {
  return std::move(b).template Arg<AnyBuffer>()  // density float32 []
      .RemainingArgs()  // the groups' matrices [..., K_g, N_g], group after group
      .RemainingRets()  // per group: live pred [M_g, tk, tn], scores float32 [M_g, tk, tn], thresholds float32 [M_g]
      .template Attr<::xla::ffi::Span<const int64_t>>("tile_h")  // per group
      .template Attr<::xla::ffi::Span<const int64_t>>("tile_w")
      .template Attr<::xla::ffi::Span<const int64_t>>("group_sizes");  // matrix operands per group
}

template <class B>
auto MaskBlocks(B b) {
  return std::move(b).template Arg<AnyBuffer>()  // live pred [M, tk, tn]
      .RemainingArgs()  // the matrices [..., K, N], one trailing shape and dtype
      .RemainingRets()  // one per matrix: its shape, the results' dtype
      .template Attr<int64_t>("tile_h")
      .template Attr<int64_t>("tile_w");
}

template <class B>
auto RowSum(B b) {
  return std::move(b).template Arg<AnyBuffer>()  // x
      .template Arg<S32>()  // tiles
      .template Arg<S32>()  // count
      .template Ret<AnyBuffer>()  // sums [..., N]
      .template Ret<AnyBuffer>()  // work [..., slices, N] float32 (or [0])
      .template Attr<int64_t>("tile_h");
}

template <class B>
auto RowConcatSum(B b) {
  return std::move(b).template Arg<AnyBuffer>()  // x0 [..., M, Np]
      .template Arg<AnyBuffer>()  // x1
      .template Arg<AnyBuffer>()  // x2
      .template Arg<S32>()  // tiles
      .template Arg<S32>()  // count
      .template Ret<AnyBuffer>()  // cat [..., M, 3 Np]: the listed rows
      .template Ret<AnyBuffer>()  // sums [..., 3 Np]
      .template Ret<AnyBuffer>()  // work [..., slices, 3 Np] float32 (or [0])
      .template Attr<int64_t>("tile_h");
}

template <class B>
auto RowActivationBwd(B b) {
  return std::move(b).template Arg<AnyBuffer>()  // z
      .template Arg<S32>()  // tiles
      .template Arg<S32>()  // count
      .template Arg<AnyBuffer>()  // dy
      .template Ret<AnyBuffer>()  // dz
      .template Attr<int64_t>("tile_h")
      .template Attr<int64_t>("activation")
      .template Attr<bool>("dead_zeros");
}

template <class B>
auto SddMatmul(B b) {
  return std::move(b).template Arg<AnyBuffer>()  // a
      .template Arg<AnyBuffer>()  // b
      .template Arg<S32>()  // tiles
      .template Arg<S32>()  // count
      .template Ret<AnyBuffer>()  // c
      .template Attr<int64_t>("tile_h")
      .template Attr<int64_t>("tile_w")
      .template Attr<bool>("trans_a")
      .template Attr<bool>("trans_b")
      .template Attr<bool>("allow_tf32");
}

template <class B>
auto Sread(B b) {
  return std::move(b).template Arg<AnyBuffer>()  // x
      .template Arg<S32>()  // tiles
      .template Arg<S32>()  // count
      .template Ret<AnyBuffer>()  // packed
      .template Attr<int64_t>("tile_h")
      .template Attr<int64_t>("tile_w");
}

template <class B>
auto StileMatmul(B b) {
  return std::move(b).template Arg<AnyBuffer>()  // a
      .template Arg<AnyBuffer>()  // b
      .template Arg<S32>()  // lists
      .template Arg<S32>()  // counts
      .template Ret<AnyBuffer>()  // c
      .template Attr<bool>("sparse_b")
      .template Attr<int64_t>("tile_h")
      .template Attr<int64_t>("tile_w")
      .template Attr<bool>("trans_a")
      .template Attr<bool>("trans_b")
      .template Attr<bool>("trans_c")
      .template Attr<bool>("allow_tf32");
}

template <class B>
auto Swrite(B b) {
  return std::move(b).template Arg<AnyBuffer>()  // packed
      .template Arg<S32>()  // tiles
      .template Arg<S32>()  // count
      .template Arg<AnyBuffer>()  // base
      .template Ret<AnyBuffer>()  // out (aliases base)
      .template Attr<bool>("accumulate");
}

template <class B>
auto VarlenAttention(B b) {
  return std::move(b).template Arg<AnyBuffer>()  // q [batch, seq, heads, head_dim]
      .template Arg<AnyBuffer>()  // k
      .template Arg<AnyBuffer>()  // v
      .template Arg<S32>()  // lengths [batch], or with max_seqlen > 0 cu_seqlens [batch, segments + 1]
      .template Arg<S32>()  // order: [sequences], the long kernels' launch order (longest first), or [0]
      .template Ret<AnyBuffer>()  // out (q's shape)
      .template Ret<AnyBuffer>()  // lse float32 [batch, heads, seq]
      .template Attr<float>("scale")
      .template Attr<bool>("causal")
      .template Attr<bool>("left_padded")
      .template Attr<int64_t>("window_left")  // -1: no bound
      .template Attr<int64_t>("window_right")
      .template Attr<int64_t>("max_seqlen");  // 0: padded rows; > 0: packed rows, their longest sequence
}

template <class B>
auto VarlenAttentionBwd(B b) {
  return std::move(b).template Arg<AnyBuffer>()  // q
      .template Arg<AnyBuffer>()  // k
      .template Arg<AnyBuffer>()  // v
      .template Arg<AnyBuffer>()  // o (the forward's out)
      .template Arg<AnyBuffer>()  // lse (the forward's)
      .template Arg<AnyBuffer>()  // dout
      .template Arg<S32>()  // lengths
      .template Arg<S32>()  // order
      .template Ret<AnyBuffer>()  // dq
      .template Ret<AnyBuffer>()  // dk
      .template Ret<AnyBuffer>()  // dv
      .template Attr<float>("scale")
      .template Attr<bool>("causal")
      .template Attr<bool>("left_padded")
      .template Attr<int64_t>("window_left")
      .template Attr<int64_t>("window_right")
      .template Attr<int64_t>("max_seqlen");
}

}  // namespace bind
}  // namespace pit
