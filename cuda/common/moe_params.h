// What the MoE targets work on (docs/kernels.md, "MoE"): plain data shared by the CPU and
// CUDA paths.
//
// Routing: T tokens, each sent to k experts (`expert_ids [T, k]`). Assignment a = t*k + j
// is token t's j-th choice. The routing index lists, per expert e < E, the assignments
// routed to e (any order), and in group E the dropped ones (expert id out of range):
//   lists [E+1, A] (A = T*k, every expert can hold every assignment: dropless),
//   counts [E+1]; every a in [0, A) is in exactly one group; entries past a count are -1.
//
// Grouped products gather their rows by assignment: row a reads source row a / row_div
// (row_div = k when the source holds tokens, 1 when it holds assignments).
//   grouped matmul: y[a, :] = src[a / row_div, :] @ op(W[e]) for a in group e < E,
//                   y[a, :] = 0 for a in group E (dropped); with `relu`, max(., 0) of that
//                   before the one rounding (relu(0) = 0: dropped rows stay 0).
//   grouped wgrad:  dW[e] = sum over a in group e of src[a / row_div, :]^T (x) dy[a, :]
//                   (zeros for an empty expert; float32 accumulation, deterministic).
//
// Batching (the prefix convention of matmul_params.h): src, W, dy and the index have
// batch counts dividing `batch`; entry b reads src[b / (batch / src.batch)], etc. The
// grouped matmul's y has the full batch; the wgrad's dW has `dw_batch` entries and
// dW[c] SUMS the batch / dw_batch consecutive entries mapping to c.
#pragma once

#include <cstdint>

#include "cuda/common/matmul_params.h"

namespace pit {

struct RoutingIndex {
  const int32_t* lists = nullptr;   // [batch, E+1, A]
  const int32_t* counts = nullptr;  // [batch, E+1]
  int64_t batch = 1;
};

struct MoeIndexParams {
  const int32_t* expert_ids = nullptr;  // [batch, T, k]
  int32_t* lists = nullptr;             // [batch, E+1, T*k]
  int32_t* counts = nullptr;            // [batch, E+1]
  int64_t batch = 1, T = 0, k = 1, E = 1;
};

struct GroupedMatmulParams {
  DType dtype = DType::kF32;  // of src, W and y
  bool allow_tf32 = false;
  int64_t batch = 1;
  int64_t E = 1, A = 0, D = 0, F = 0;  // y[a] (F) = src row (D) @ op(W[e]) (D x F)
  int64_t row_div = 1;                 // src has A / row_div rows
  MatrixRef src;                       // [src.batch, A / row_div, D]
  const void* w = nullptr;             // [w_batch, E, D, F], or [w_batch, E, F, D] with trans_w
  int64_t w_batch = 1;
  bool trans_w = false;
  bool relu = false;  // the FFN's ReLU in the epilogue (activation code 1)
  RoutingIndex index;
  void* y = nullptr;  // [batch, A, F]
};

// Row padding of packed weight-gradient operands (pit_sread_live zeroes up to it): a
// multiple of the sm_90a kernel's stages (96 tokens packed, 64 gathered).
constexpr int64_t kPackedRowPad = 192;

struct GroupedWgradParams {
  DType dtype = DType::kF32;  // of src, dy and dW
  bool allow_tf32 = false;
  int64_t batch = 1;
  int64_t E = 1, A = 0, D = 0, F = 0;
  int64_t row_div = 1;
  MatrixRef src;  // [src.batch, A / row_div, D]
  MatrixRef dy;   // [dy.batch, A, F]
  RoutingIndex index;
  void* dw = nullptr;  // [dw_batch, E, D, F]
  int64_t dw_batch = 1;
  // Rows packed by pit_sread_live: the lists are the identity on their first count entries
  // (row j of src and dy is list entry j) and rows count .. (the next multiple of
  // kPackedRowPad, or the end) are zeros, so a kernel may read whole blocks of rows
  // without the lists (the sm_90a kernel: by TMA). Needs row_div 1.
  bool packed = false;
};

}  // namespace pit
