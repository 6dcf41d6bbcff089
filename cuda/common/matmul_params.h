// What one sparse product works on: plain data shared by the CPU and CUDA paths.
// docs/kernels.md is the full contract of each FFI target; in short:
//
//   per batch entry, C[M, N] = op_a(A)[M, K] @ op_b(B)[K, N]   (float32 accumulation)
//
// op_x is the identity or a transpose of the stored row-major matrix (trans_x). With
// trans_c, C is stored transposed ([N, M]). Which products are skipped depends on the
// target:
//   row gather (M axis):  only rows of C in the row-block list are computed; the
//                         other rows are written as zeros. With an epilogue,
//                         C = act(A @ op_b(B) + bias) on the listed rows and a copy of
//                         `dead` (the caller's act(bias)) on the others.
//   stile (K axis):       the sparse operand (A or B) is masked by its micro-tiles;
//                         for each group (block of C rows, or of C columns), the
//                         reduction runs only over the listed live tiles.
//   sdd (output sparse):  only the listed micro-tiles of C are computed; the others
//                         are written as zeros.
//
// Batching: every operand has leading dims that flatten to a count dividing `batch`.
// Entry b of the full batch reads A[b / (batch / a_batch)], B[b / (batch / b_batch)]
// and the index at b / (batch / idx_batch); C holds c_batch entries, and C[c] is the
// SUM over the batch / c_batch consecutive entries b with b / (batch / c_batch) == c
// (that is how a shared weight's gradient sums over the batch).
#pragma once

#include <cstdint>

namespace pit {

enum class DType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

inline int DTypeBytes(DType t) { return t == DType::kF32 ? 4 : 2; }

// A batched row-major matrix as stored: [batch, rows, cols].
struct MatrixRef {
  const void* data = nullptr;
  int64_t batch = 1, rows = 0, cols = 0;
};

// The fused epilogue of the row-gather product (ignored by the other targets, whose
// decoders never set it). Codes are the FFI attribute `activation`.
enum class Activation : int { kNone = 0, kRelu = 1, kGeluTanh = 2, kGeluErf = 3, kSilu = 4 };
constexpr int kNumActivations = 5;

struct Epilogue {
  const void* bias = nullptr;  // [N] in C's dtype or float32 (bias_f32), or null (no bias)
  const void* dead = nullptr;  // [N] in C's dtype: every unlisted row's value, or null (zeros)
  Activation act = Activation::kNone;
  // A float32 bias for a 16-bit C (mixed-precision parameters): each value is rounded to
  // C's dtype before the add, so the result is the one of a bias cast beforehand, without
  // a cast kernel per call.
  bool bias_f32 = false;
  // The activation's input (the product plus the bias, rounded to C's dtype) as a second
  // result [c_batch, M, N], written on the listed rows only (the others are left as they
  // are), or null: a differentiated step keeps it for the activation's derivative, so the
  // forward needs no pass of its own for the activation.
  void* pre = nullptr;
  // Leave the unlisted rows unwritten (no dead-row value, no zeros): the caller promised
  // that nothing reads them (sparse_dense(dead_rows="unspecified"), inference).
  bool skip_dead = false;
  bool Trivial() const { return bias == nullptr && act == Activation::kNone; }
};

struct MatmulParams {
  DType dtype = DType::kF32;  // of A, B and C alike
  bool allow_tf32 = false;    // float32 only: TF32 tensor cores allowed (else exact f32)

  int64_t M = 0, N = 0, K = 0;  // logical sizes of one product
  int64_t batch = 1;            // full batch count

  MatrixRef a;  // stored [a.batch, M, K], or [a.batch, K, M] with trans_a
  MatrixRef b;  // stored [b.batch, K, N], or [b.batch, N, K] with trans_b
  void* c = nullptr;  // stored [c_batch, M, N], or [c_batch, N, M] with trans_c
  int64_t c_batch = 1;
  // Row gather on sm_90a only: C as c_parts results of N / c_parts columns each (part i
  // holds columns [i N / c_parts, (i + 1) N / c_parts), stored [c_batch, M, N / c_parts]);
  // 1 = C alone. A fused q/k/v projection writes q, k and v apart this way.
  static constexpr int kMaxCParts = 4;
  int c_parts = 1;
  void* c_part[kMaxCParts] = {};
  bool trans_a = false, trans_b = false, trans_c = false;
  Epilogue epi;  // row gather only
  // Row gather only, optional: A's listed rows already packed in list order
  // ([a.batch, capacity * tile_h, K]: row j = the j-th listed row, zeros past the count),
  // which a kernel may read instead of gathering them from A (the sm_90a kernel by TMA);
  // kernels that do not, gather from A as usual (same result).
  const void* a_packed = nullptr;
};

// The live micro-tiles that drive a product (see docs/kernels.md per target).
struct TileList {
  const int32_t* lists = nullptr;   // [batch, groups, capacity]; -1 past the count
  const int32_t* counts = nullptr;  // [batch, groups]; may exceed capacity (clamp)
  int64_t batch = 1, groups = 1, capacity = 0;
  int64_t tile_h = 1, tile_w = 1;   // micro-tile on the indexed matrix's stored layout
};

}  // namespace pit
