// Pieces shared by the varlen attention kernels (varlen_attention.cu: a whole short
// sequence a CTA; varlen_attention_long.cu: longer ones in 128-token blocks): the CTA's
// sequence, mma.sync m16n8k16 fragment loads from row-major shared tiles, and the stores.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16/.f16): lane = 4 g + t;
//   A (16 x 16, row): {a0,a1} row g, cols 2t..2t+1; {a2,a3} row g+8; {a4,a5} row g,
//     cols 2t+8..; {a6,a7} row g+8, cols 2t+8.. (registers a[0..3] hold the pairs);
//   B (16 x 8, col): {b0,b1} rows 2t..2t+1 of col g; {b2,b3} rows 2t+8..;
//   C (16 x 8, f32): c0,c1 row g, cols 2t..2t+1; c2,c3 row g+8.
// So a C fragment pair of two adjacent 8-column tiles is an A fragment of the next
// product (the probabilities feed P V straight from registers). Every tile is staged
// row-major ([token][d], dS [query][key]); ldmatrix.x4 reads four 8 x 8 blocks of it as
// an A fragment or two B fragments, transposed (.trans) where the product reduces over
// tokens (P V, P^T dO, dS^T Q, dS K), so no transposed copy is kept.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/common/varlen_attention_params.h"
#include "cuda/kernels/elem_types.cuh"
#include "cuda/kernels/mma_sync.cuh"

namespace pit {
namespace attn {

constexpr int kWarps = 8;       // 16 rows each: 128 tokens
constexpr int kThreads = 32 * kWarps;
// Row-major tiles of head_dim kD (a multiple of 16): rows of kD + 8 elements (144-272
// bytes, an odd number of 16-byte units), so the 8 rows an ldmatrix phase reads start in
// 8 distinct 16-byte bank groups: conflict-free.
template <int kD>
constexpr int RowPitch() {
  static_assert(kD % 16 == 0 && kD >= 64 && kD <= 128, "head_dim: a multiple of 16 in [64, 128]");
  return kD + 8;
}
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ void St32(uint16_t* p, uint32_t v) { *reinterpret_cast<uint32_t*>(p) = v; }

// Sequence j's span as the kernels' instantiation reads it: packed rows (cu_seqlens) or
// padded rows (lengths).
template <bool kPacked>
__device__ __forceinline__ VarlenSpan SpanOf(const VarlenAttentionParams& p, int j) {
  return kPacked ? PackedSpan(p, j) : PaddedSpan(p, j);
}

// The CTA's problem: sequence b, query head h, its valid tokens and row pointers. Rows
// are counted from the first valid token (token `start` of the sequence's tokens). Padded
// rows: sequence b is row b. Packed rows (p.cu_seqlens): sequence b is sequence b %
// segments of row b / segments, its tokens [cu[i], cu[i + 1]) of the row (clamped to it;
// at most p.seq valid, the rest padding), the row's tokens before cu[0] the padding of its
// first sequence and those after cu[segments] of its last.
template <int kD>
struct Seq {
  int len;           // valid tokens, clamped to [0, seq]
  int rows;          // len rounded up to 16: the rows staged (zeros past len)
  int start;         // padding tokens before the first valid one (left padding, or a packed row's lead)
  int pad;           // padding tokens of the sequence: `start` before its valid ones, the rest after
  // Query i attends to the keys j with i - left <= j <= i + right (right 0: causal; seq:
  // no bound): the causal flag and the local window in one.
  int left, right;
  int64_t stride;    // elements between consecutive tokens of q's layout (heads * kD)
  int64_t base;      // element offset of the first valid token of head h in q's layout
  int64_t kv_stride;  // the same in k's and v's layout (kv_heads * kD), at h's kv head
  int64_t kv_base;
  int64_t lse_base;  // offset of lse[row, h, first valid token]

  // kPacked: p.cu_seqlens' rows (the kernels' packed instantiation, so the padded ones
  // keep their registers: a runtime branch here cost the head-64 long forward 28-36
  // bytes of spill and ~10 % of its time on the H200).
  template <bool kPacked>
  __device__ Seq(const VarlenAttentionParams& p, int b, int h, std::bool_constant<kPacked> packed)
      : Seq(p, SpanOf<kPacked>(p, b), h, packed) {}
  // The same from sequence b's span (PackedSpan or PaddedSpan), read before.
  template <bool kPacked>
  __device__ Seq(const VarlenAttentionParams& p, const VarlenSpan& sp, int h, std::bool_constant<kPacked>) {
    const int n_seq = static_cast<int>(p.seq);
    int64_t token0;  // the first valid token among all rows' tokens
    if constexpr (kPacked) {
      const int tokens = static_cast<int>(p.tokens);
      len = sp.len;
      start = sp.index == 0 ? sp.origin : 0;
      pad = start + (sp.end - sp.origin - len) + (sp.index == static_cast<int>(p.segments) - 1 ? tokens - sp.end : 0);
      token0 = static_cast<int64_t>(sp.row) * tokens + sp.origin;
      lse_base = (static_cast<int64_t>(sp.row) * p.heads + h) * tokens + sp.origin;
    } else {
      len = sp.len;
      start = sp.origin;
      pad = n_seq - len;
      token0 = static_cast<int64_t>(sp.row) * p.seq + start;
      lse_base = (static_cast<int64_t>(sp.row) * p.heads + h) * p.seq + start;
    }
    rows = (len + 15) & ~15;
    left = p.window_left < 0 || p.window_left > n_seq ? n_seq : static_cast<int>(p.window_left);
    right = p.causal ? 0 : n_seq;
    if (p.window_right >= 0 && p.window_right < right) right = static_cast<int>(p.window_right);
    stride = p.heads * kD;
    base = token0 * stride + static_cast<int64_t>(h) * kD;
    kv_stride = p.kv_heads * kD;
    kv_base = token0 * kv_stride + h / (p.heads / p.kv_heads) * kD;
  }
  // Element offsets of (row, col): in q's layout (q, o, dO and every result) and in k's
  // and v's.
  __device__ int64_t At(int row, int col) const { return base + row * stride + col; }
  __device__ int64_t AtKv(int row, int col) const { return kv_base + row * kv_stride + col; }
  template <bool kKv>
  __device__ int64_t AtLayout(int row, int col) const { return kKv ? AtKv(row, col) : At(row, col); }
  // The same sequence at query head h + dh, of the same kv head (a grouped-query walk);
  // `tokens`: a row's (lse's elements between heads).
  __device__ Seq Head(int dh, int64_t tokens) const {
    Seq o = *this;
    o.base += static_cast<int64_t>(dh) * kD;
    o.lse_base += dh * tokens;
    return o;
  }
  // Padding token i of the sequence's `pad`, as a row (negative before the valid ones).
  __device__ int PadRow(int i) const { return i < start ? i - start : i - start + len; }
  // The end of the keys (rows) that queries [r0, r0 + 16) attend to, and of the tiles
  // staged for them (a multiple of 16); the start of the first 16-key tile they attend to.
  // Without a window (kWindow false) right is 0 (causal) or seq and left seq.
  template <bool kWindow>
  __device__ int KeyEnd(int r0) const {
    return kWindow ? min(len, r0 + 16 + right) : (right == 0 ? min(len, r0 + 16) : len);
  }
  template <bool kWindow>
  __device__ int KeyRows(int r0) const {
    return kWindow ? min(rows, (r0 + 16 + right + 15) & ~15) : (right == 0 ? min(rows, r0 + 16) : rows);
  }
  template <bool kWindow>
  __device__ int KeyBegin(int r0) const { return kWindow ? max(0, r0 - left) & ~15 : 0; }
  // The same for the queries that attend to keys [k0, k0 + 16).
  template <bool kWindow>
  __device__ int QueryBegin(int k0) const { return kWindow ? max(0, k0 - right) & ~15 : (right == 0 ? k0 : 0); }
  template <bool kWindow>
  __device__ int QueryEnd(int k0) const { return kWindow ? min(len, k0 + 16 + left) : len; }
  // Whether every query of [q0, q0 + nq) attends to every key of [k0, k0 + nk), all of
  // them valid: a tile between them needs no mask. Never with a window (its instantiation
  // keeps the masks).
  template <bool kWindow>
  __device__ bool AttendsAll(int q0, int nq, int k0, int nk) const {
    return !kWindow && q0 + nq <= len && k0 + nk <= len && (right != 0 || k0 + nk <= q0 + 1);
  }
  // Whether query i attends to key j (both valid). kWindow: the kernels' windowed
  // instantiation; without a window right is 0 (causal) or seq, and one compare does.
  template <bool kWindow>
  __device__ bool Attends(int i, int j) const {
    if constexpr (kWindow) {
      return j - i <= right && i - j <= left;
    } else {
      return right != 0 || j <= i;
    }
  }
};

// Zeros on the padding tokens [first, last) (of the sequence's pad) of `dst` (in q's
// layout, or in k's and v's with kKv), by the CTA's kN threads.
template <int kD, bool kKv = false, int kN = kThreads>
__device__ __forceinline__ void ZeroPadding(void* dst_v, const Seq<kD>& s, int first, int last) {
  uint16_t* __restrict__ dst = static_cast<uint16_t*>(dst_v);
  for (int i = first * (kD / 8) + threadIdx.x; i < last * (kD / 8); i += kN) {
    const int r = s.PadRow(i / (kD / 8)), c = (i % (kD / 8)) * 8;
    *reinterpret_cast<uint4*>(dst + s.template AtLayout<kKv>(r, c)) = make_uint4(0, 0, 0, 0);
  }
}

// The A fragment of rows [r0, r0 + 16) x cols [k0, k0 + 16) of a row-major tile: lanes
// 0-15 address the rows at k0, lanes 16-31 at k0 + 8 (blocks a0..a3 in order).
__device__ __forceinline__ void LoadA(uint32_t (&a)[4], const uint16_t* tile, int pitch, int r0, int k0, int lane) {
  gemm::LdMatrixX4(a, gemm::SmemAddr(tile + (r0 + (lane & 15)) * pitch + k0 + (lane >> 4) * 8));
}

// B fragments of two 8-column tiles (n0.., n0 + 8..) over k [k0, k0 + 16) of a tile
// stored [n][k] (K for q k^T): {b[0], b[1]} the first, {b[2], b[3]} the second.
template <int kD>
__device__ __forceinline__ void LoadBNK(uint32_t (&b)[4], const uint16_t* tile, int n0, int k0, int lane) {
  const uint16_t* p = tile + (n0 + (lane & 7) + (lane >> 4) * 8) * RowPitch<kD>() + k0 + ((lane >> 3) & 1) * 8;
  gemm::LdMatrixX4(b, gemm::SmemAddr(p));
}

// The same for a tile stored [k][n] (V for P V: k the token), transposed by ldmatrix.
template <int kD>
__device__ __forceinline__ void LoadBKN(uint32_t (&b)[4], const uint16_t* tile, int k0, int n0, int lane) {
  gemm::LdMatrixX4Trans(b, gemm::SmemAddr(tile + (k0 + (lane & 15)) * RowPitch<kD>() + n0 + (lane >> 4) * 8));
}

// acc[0..kD/8) += A (16 x 16 tokens [k0, k0 + 16)) times those tokens' rows of a
// row-major [token][kD] tile, for the kD / 8 column tiles (P V, P^T dO, dS^T Q, dS K).
template <typename T, int kD>
__device__ __forceinline__ void MmaTokensB(float (&acc)[kD / 8][4], const uint32_t (&a)[4], const uint16_t* tile,
                                           int k0, int lane) {
#pragma unroll
  for (int jd = 0; jd < kD / 8; jd += 2) {
    uint32_t b[4];
    LoadBKN<kD>(b, tile, k0, 8 * jd, lane);
    gemm::Mma16816<T>(acc[jd], a, b[0], b[1]);
    gemm::Mma16816<T>(acc[jd + 1], a, b[2], b[3]);
  }
}

// c[0], c[1] += A (16 rows x kD; a[kk] the kD / 16 k-steps) times the 16 tokens [n0,
// n0 + 16) of a row-major tile as B (the product reduces over kD: q k^T, k q^T, v dO^T).
template <typename T, int kD>
__device__ __forceinline__ void MmaDimB(float (&c0)[4], float (&c1)[4], const uint32_t (&a)[kD / 16][4],
                                        const uint16_t* tile, int n0, int lane) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    uint32_t b[4];
    LoadBNK<kD>(b, tile, n0, 16 * kk, lane);
    gemm::Mma16816<T>(c0, a[kk], b[0], b[1]);
    gemm::Mma16816<T>(c1, a[kk], b[2], b[3]);
  }
}

// The A fragment of a 16 x 16 block from the C fragments of its two 8-column halves.
template <typename T>
__device__ __forceinline__ void PackA(const float (&lo)[4], const float (&hi)[4], uint32_t (&a)[4]) {
  a[0] = gemm::Elem<T>::Pack2(lo[0], lo[1]);
  a[1] = gemm::Elem<T>::Pack2(lo[2], lo[3]);
  a[2] = gemm::Elem<T>::Pack2(hi[0], hi[1]);
  a[3] = gemm::Elem<T>::Pack2(hi[2], hi[3]);
}

// Stores a warp's 16 x kD result rows (C fragments, times `mul`) for the rows < len (in
// q's layout, or in k's and v's with kKv).
template <typename T, int kD, bool kKv = false>
__device__ __forceinline__ void StoreRows(const float (&acc)[kD / 8][4], float mul, void* dst_v, const Seq<kD>& s,
                                          int r0, int g, int t) {
  uint16_t* __restrict__ dst = static_cast<uint16_t*>(dst_v);
  const int ra = r0 + g, rb = ra + 8;
#pragma unroll
  for (int jd = 0; jd < kD / 8; ++jd) {
    const int c = 8 * jd + 2 * t;
    if (ra < s.len) St32(dst + s.template AtLayout<kKv>(ra, c), gemm::Elem<T>::Pack2(acc[jd][0] * mul, acc[jd][1] * mul));
    if (rb < s.len) St32(dst + s.template AtLayout<kKv>(rb, c), gemm::Elem<T>::Pack2(acc[jd][2] * mul, acc[jd][3] * mul));
  }
}


// acc + the dot product of 8 elements of a and b (16 bytes each, 16-byte aligned, shared
// memory): a piece of delta = rowsum(dO o).
template <typename T>
__device__ __forceinline__ float Dot8(const uint16_t* a, const uint16_t* b, float acc) {
  const uint4 av = *reinterpret_cast<const uint4*>(a), bv = *reinterpret_cast<const uint4*>(b);
  const uint32_t* aw = reinterpret_cast<const uint32_t*>(&av);
  const uint32_t* bw = reinterpret_cast<const uint32_t*>(&bv);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 x = gemm::Elem<T>::Unpack2(aw[j]), y = gemm::Elem<T>::Unpack2(bw[j]);
    acc = fmaf(x.x, y.x, acc);
    acc = fmaf(x.y, y.y, acc);
  }
  return acc;
}

// The probabilities of a C fragment of scores (log2 units; rows g and g + 8 with maxima
// m0, m1), unnormalized, in place, and their sums added to this lane's l0, l1. kWindow: a
// row with no key yet (max -inf: a local window's later keys) gets 0s, not NaNs.
template <bool kWindow>
__device__ __forceinline__ void ExpAndSum(float (&c)[4], float m0, float m1, float& l0, float& l1) {
  if constexpr (kWindow) {
    m0 = m0 == -INFINITY ? 0.f : m0;
    m1 = m1 == -INFINITY ? 0.f : m1;
  }
  c[0] = exp2f(c[0] - m0);
  c[1] = exp2f(c[1] - m0);
  c[2] = exp2f(c[2] - m1);
  c[3] = exp2f(c[3] - m1);
  l0 += c[0] + c[1];
  l1 += c[2] + c[3];
}

// A row's max / sum over the 4 lanes that hold its columns (C fragments: lanes 4g..4g+3).
__device__ __forceinline__ float RowMax4(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float RowSum4(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Scores c0, c1 (C fragments) of a warp's 16 queries (this lane's rows r0 + g, + 8)
// against 16 keys, key positions key0 + n0 + ...: scaled by sl (log2 units), -inf where
// a key is padding or outside the query's window (causal: after it); m0, m1 take the
// rows' maxima over this lane's columns. kMasked false: the caller knows every query
// attends to every key of the tile (an interior one), and no mask is applied.
template <int kD, bool kWindow, bool kMasked = true>
__device__ __forceinline__ void ScaleAndMask(float (&c0)[4], float (&c1)[4], int n0, int key0, int r0, float sl,
                                             const Seq<kD>& s, int lane, float& m0, float& m1) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float(&c)[4] = h == 0 ? c0 : c1;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = key0 + n0 + 8 * h + 2 * t + (e & 1), query = r0 + g + (e < 2 ? 0 : 8);
      const bool live = !kMasked || (key < s.len && s.template Attends<kWindow>(query, key));
      c[e] = live ? c[e] * sl : -INFINITY;
    }
    m0 = fmaxf(m0, fmaxf(c[0], c[1]));
    m1 = fmaxf(m1, fmaxf(c[2], c[3]));
  }
}

// The same (masked) scores of the 16 keys [n0, n0 + 16) of the key tile ks, computed first.
template <typename T, int kD, bool kWindow>
__device__ __forceinline__ void MaskedScores(float (&c0)[4], float (&c1)[4], const uint32_t (&qa)[kD / 16][4],
                                             const uint16_t* ks, int n0, int key0, int r0, float sl,
                                             const Seq<kD>& s, int lane, float& m0, float& m1) {
  MmaDimB<T, kD>(c0, c1, qa, ks, n0, lane);
  ScaleAndMask<kD, kWindow>(c0, c1, n0, key0, r0, sl, s, lane, m0, m1);
}

// The forward's end for a warp's rows [r0, r0 + 16): o / l stored for the rows < len, and
// their lse from the max m and the sum l (log2 units, reduced over the row's lanes); the
// lane holds rows g (m0, l0; c0, c1) and g + 8 (m1, l1; c2, c3).
template <typename T, int kD>
__device__ __forceinline__ void StoreNormalized(float (&o)[kD / 8][4], float m0, float m1, float l0, float l1,
                                                const VarlenAttentionParams& p, const Seq<kD>& s, int r0, int g,
                                                int t) {
  const float i0 = 1.f / l0, i1 = 1.f / l1;
#pragma unroll
  for (int jd = 0; jd < kD / 8; ++jd) {
    o[jd][0] *= i0;
    o[jd][1] *= i0;
    o[jd][2] *= i1;
    o[jd][3] *= i1;
  }
  StoreRows<T, kD>(o, 1.f, p.out, s, r0, g, t);
  if (t == 0) {
    if (r0 + g < s.len) p.lse[s.lse_base + r0 + g] = (m0 + log2f(l0)) * kLn2;
    if (r0 + g + 8 < s.len) p.lse[s.lse_base + r0 + g + 8] = (m1 + log2f(l1)) * kLn2;
  }
}

// Whether a dK / dV walk (both backwards) takes its unmasked query steps two at a time
// (DkvPairStep: the chains of two steps overlap), and whether it reads its keys' and values'
// fragments from their shared-memory tiles for that (head_dim 64, where the registers, 128
// a thread at two CTAs an SM, cannot hold them and a second step; the long backward keeps
// its k, v block for it: 36 KB more a CTA, 93 KB, two still fit an SM). The windowed
// instantiations keep the masked single steps (no tile skips its masks).
template <int kD, bool kWindow>
constexpr bool DkvPairs() {
  return !kWindow;
}
template <int kD, bool kWindow>
constexpr bool DkvKvInSmem() {
  return kD == 64 && DkvPairs<kD, kWindow>();
}

// The A fragments of a warp's 16 keys and values, tile rows [r0, r0 + 16) of the row-major
// k and v tiles ks, vs, for the dK / dV walks: all of them into ka, va (for the single
// steps, DkvStep).
template <int kD>
__device__ __forceinline__ void LoadKv(uint32_t (&ka)[kD / 16][4], uint32_t (&va)[kD / 16][4], const uint16_t* ks,
                                       const uint16_t* vs, int r0, int lane) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    LoadA(ka[kk], ks, RowPitch<kD>(), r0, 16 * kk, lane);
    LoadA(va[kk], vs, RowPitch<kD>(), r0, 16 * kk, lane);
  }
}

// The same for a pair step (DkvPairStep): kv(kk, a, b) gives those of dims [16 kk, 16 kk
// + 16), from ka, va (loaded once), or with kFromTiles from the tiles (head_dim 64 at two
// CTAs an SM: no registers to keep them beside a second step's scores, so the kernels
// LoadKv before each single step instead). The lambda refers to the caller's variables
// through the reference parameters (pass named variables that outlive it, no
// temporaries), as a lambda written in the kernel would: a struct holding copies
// scheduled the short backward differently, 3 % slower at 128 tokens (H200).
template <int kD, bool kFromTiles>
__device__ __forceinline__ auto KvFragments(const uint32_t (&ka)[kD / 16][4], const uint32_t (&va)[kD / 16][4],
                                            const uint16_t* const& ks, const uint16_t* const& vs, const int& r0,
                                            const int& lane) {
  return [&](int kk, uint32_t (&a)[4], uint32_t (&b)[4]) {
    if constexpr (kFromTiles) {
      LoadA(a, ks, RowPitch<kD>(), r0, 16 * kk, lane);
      LoadA(b, vs, RowPitch<kD>(), r0, 16 * kk, lane);
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        a[e] = ka[kk][e];
        b[e] = va[kk][e];
      }
    }
  };
}

// One 16-query step of a warp's dK / dV walk over its 16 keys (this lane's key_a and
// key_a + 8): P^T and dS^T = P^T (dP^T - delta) from k q^T and v dO^T over the rows
// [r0, r0 + 16) of the tiles qs, dos (tile row r is query position q_base + r; lse2 and
// delta are indexed by tile row), then dV += P^T dO and dK += dS^T Q. dS^T is left in
// dst (C fragments) for a caller that keeps it. kMasked false: every query of the step
// sees every key (no masks).
template <typename T, int kD, bool kWindow, bool kMasked = true>
__device__ __forceinline__ void DkvStep(float (&dv)[kD / 8][4], float (&dk)[kD / 8][4], float (&dst)[2][4],
                                        const uint32_t (&ka)[kD / 16][4], const uint32_t (&va)[kD / 16][4],
                                        const uint16_t* qs, const uint16_t* dos, const float* lse2,
                                        const float* delta, int r0, int q_base, int key_a, float sl,
                                        const Seq<kD>& s, int lane) {
  const int t = lane % 4;
  float st[2][4] = {};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dst[h][e] = 0.f;
  }
  MmaDimB<T, kD>(st[0], st[1], ka, qs, r0, lane);
  MmaDimB<T, kD>(dst[0], dst[1], va, dos, r0, lane);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = r0 + 8 * h + 2 * t + (e & 1), q = q_base + r, key = key_a + (e < 2 ? 0 : 8);
      const bool live = !kMasked || (q < s.len && key < s.len && s.template Attends<kWindow>(q, key));
      const float pr = live ? exp2f(st[h][e] * sl - lse2[r]) : 0.f;
      st[h][e] = pr;                          // P^T
      dst[h][e] = pr * (dst[h][e] - delta[r]);  // dS^T
    }
  }
  uint32_t pa[4], dsa[4];
  PackA<T>(st[0], st[1], pa);
  PackA<T>(dst[0], dst[1], dsa);
  MmaTokensB<T, kD>(dv, pa, dos, r0, lane);
  MmaTokensB<T, kD>(dk, dsa, qs, r0, lane);
}

// DkvPairStep's default for each step's dS^T: dropped (the short backward passes a store
// that keeps it for its phase 2).
struct DropDs {
  __device__ void operator()(int, const float (&)[2][4]) const {}
};

// Two unmasked 16-query steps of a warp's dK / dV walk at once (tile rows [r0, r0 + 32)):
// the two steps' k q^T and v dO^T chains are independent, so their latencies overlap.
// kv(kk, ka, va) gives the A fragments of the warp's 16 keys and values at dims [16 kk,
// 16 kk + 16) (KvFragments); ds(rows, dst) gets each step's dS^T (C fragments, as DkvStep
// leaves it) with its first tile row.
template <typename T, int kD, typename Kv, typename KeepDs = DropDs>
__device__ __forceinline__ void DkvPairStep(float (&dv)[kD / 8][4], float (&dk)[kD / 8][4], Kv&& kv,
                                            const uint16_t* qs, const uint16_t* dos, const float* lse2,
                                            const float* delta, int r0, float sl, int lane, KeepDs&& ds = {}) {
  const int t = lane % 4;
  float st[2][2][4] = {}, dst[2][2][4] = {};  // [step][8-query half][C fragment]
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    uint32_t ka[4], va[4];
    kv(kk, ka, va);
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      uint32_t b[4];
      LoadBNK<kD>(b, qs, r0 + 16 * q, 16 * kk, lane);
      gemm::Mma16816<T>(st[q][0], ka, b[0], b[1]);
      gemm::Mma16816<T>(st[q][1], ka, b[2], b[3]);
      LoadBNK<kD>(b, dos, r0 + 16 * q, 16 * kk, lane);
      gemm::Mma16816<T>(dst[q][0], va, b[0], b[1]);
      gemm::Mma16816<T>(dst[q][1], va, b[2], b[3]);
    }
  }
#pragma unroll
  for (int q = 0; q < 2; ++q) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = r0 + 16 * q + 8 * h + 2 * t + (e & 1);
        const float pr = exp2f(st[q][h][e] * sl - lse2[r]);
        st[q][h][e] = pr;                             // P^T
        dst[q][h][e] = pr * (dst[q][h][e] - delta[r]);  // dS^T
      }
    }
  }
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    ds(r0 + 16 * q, dst[q]);
    uint32_t pa[4], dsa[4];
    PackA<T>(st[q][0], st[q][1], pa);
    PackA<T>(dst[q][0], dst[q][1], dsa);
    MmaTokensB<T, kD>(dv, pa, dos, r0 + 16 * q, lane);
    MmaTokensB<T, kD>(dk, dsa, qs, r0 + 16 * q, lane);
  }
}

// What a launch checks before any kernel runs, as errors for the handler to report, not
// faults in a kernel: rows are read 16 bytes at a time (a misaligned buffer: XLA's never
// are), and the kv heads divide the query heads (the handlers decoded them so).
inline cudaError_t VarlenLaunchable(const VarlenAttentionParams& p) {
  const void* const buffers[] = {p.q, p.k, p.v, p.o, p.dout, p.out, p.dq, p.dk, p.dv};
  for (const void* ptr : buffers) {
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return cudaErrorMisalignedAddress;
  }
  return p.kv_heads > 0 && p.heads % p.kv_heads == 0 ? cudaSuccess : cudaErrorInvalidValue;
}

// launch(T*, std::integral_constant<int, kD>, std::bool_constant<kWindow>,
// std::bool_constant<kPacked>) for the call's dtype T, head dim kD, whether it has a local
// window and whether its rows are packed (cu_seqlens).
template <typename F>
cudaError_t ForDtypeAndHeadDim(const VarlenAttentionParams& p, F&& launch) {
  // A window bounds more than causal does: the windowed instantiation (its masks and
  // guards cost the unwindowed kernels 2-19 % when they were runtime checks).
  const bool windowed = p.window_left >= 0 || (p.window_right >= 0 && !p.causal);
  auto by_packed = [&](auto type, auto dim, auto window) -> cudaError_t {
    return p.cu_seqlens != nullptr ? launch(type, dim, window, std::true_type{})
                                   : launch(type, dim, window, std::false_type{});
  };
  auto by_window = [&](auto type, auto dim) -> cudaError_t {
    return windowed ? by_packed(type, dim, std::true_type{}) : by_packed(type, dim, std::false_type{});
  };
  auto by_dim = [&](auto type) -> cudaError_t {
    switch (p.head_dim) {
      case 80: return by_window(type, std::integral_constant<int, 80>{});
      case 96: return by_window(type, std::integral_constant<int, 96>{});
      case 128: return by_window(type, std::integral_constant<int, 128>{});
      default: return by_window(type, std::integral_constant<int, 64>{});
    }
  };
  return p.dtype == DType::kBF16 ? by_dim(static_cast<__nv_bfloat16*>(nullptr)) : by_dim(static_cast<__half*>(nullptr));
}

}  // namespace attn
}  // namespace pit
