// Attention over padded sequences longer than 128 tokens (up to kVarlenAttentionMaxSeq),
// valid tokens only: the flash-attention scheme on mma.sync m16n8k16 tiles (sm_80 and up),
// with the fragments, rows and padding of the short kernels (varlen_attention_tiles.cuh).
//
// A CTA takes a block of 128 tokens of one (head, sequence); its warps hold their rows'
// fragments in registers and walk the other operand in chunks of 64 tokens,
// double-buffered by cp.async (zeros past the valid tokens).
// - Forward: a block of queries walks the key chunks with a running max and sum, in 8
//   warps of 16 rows, or at head_dim 64 in 4 warps of 32 (two tiles sharing each K and V
//   fragment).
// - Backward, one launch of two independent kinds of blocks, no atomics, every sum in a
//   fixed order: dK, dV (a block of keys walks the query chunks, two unmasked 16-query
//   steps at a time) and dQ (a block of queries walks the key chunks, recomputing P and
//   dS). delta = rowsum(dO o) is computed where it is read: for the block's queries (dQ)
//   and for each staged query chunk (dK, dV).
// The grid covers every block of the padded sequence: a block past the valid tokens only
// writes its share of the padding rows' zeros. With p.order (bidirectional) it runs the
// sequences in that order, longest first (GridPlace). Causal attention skips the chunks past a
// block's last query (forward, dQ) and before its first key (dK, dV), and within them a
// warp's tiles on the far side of its diagonal.
#include "cuda/kernels/varlen_attention_long.h"

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/kernels/device_utils.cuh"
#include "cuda/kernels/varlen_attention_tiles.cuh"

namespace pit {
namespace {

using namespace attn;  // NOLINT: the shared tiles and fragments

constexpr int kBlock = 16 * kWarps;  // a CTA's rows: 128 tokens
constexpr int kChunk = 64;           // the walked operand's tokens per stage

// Issues cp.async copies of rows [r_begin, r_begin + kRows) x kD of `src` (rows counted
// from the sequence's first valid token; zeros past s.len; in k's and v's layout with
// kKv) into the row-major tile `dst`, by the CTA's kN threads. Consecutive threads copy
// consecutive 16 bytes of a row.
template <int kD, int kRows, bool kKv = false, int kN = kThreads>
__device__ __forceinline__ void StageAsync(const void* src, uint16_t* dst, const Seq<kD>& s, int r_begin) {
  constexpr int kUnits = kD / 8;  // 16-byte units a row
#pragma unroll
  for (int i = threadIdx.x; i < kRows * kUnits; i += kN) {
    const int r = i / kUnits, c = (i % kUnits) * 8;
    const bool valid = r_begin + r < s.len;
    const int row_at = valid ? r_begin + r : 0;
    const uint16_t* row = static_cast<const uint16_t*>(src) + s.template AtLayout<kKv>(row_at, c);
    gemm::CpAsync16(gemm::SmemAddr(dst + r * RowPitch<kD>() + c), row, valid ? 16u : 0u);
  }
}

// Double buffering: issues chunk c + 1's copies (stage(c + 1), if there is one) and waits
// for chunk c's, then the CTA barrier.
template <typename F>
__device__ __forceinline__ void NextChunk(int c, int chunks, F&& stage) {
  if (c + 1 < chunks) {
    stage(c + 1);
    gemm::CpAsyncWait<1>();
  } else {
    gemm::CpAsyncWait<0>();
  }
  __syncthreads();
}

// delta = rowsum(dO o) of kRows staged rows, 4 threads a row (kThreads / 4 rows a pass).
template <typename T, int kD, int kRows>
__device__ __forceinline__ void RowDots(const uint16_t* os, const uint16_t* dos, float* delta) {
  constexpr int kPitch = RowPitch<kD>(), kUnits = kD / 8;
#pragma unroll
  for (int r0 = 0; r0 < kRows; r0 += kThreads / 4) {
    const int r = r0 + threadIdx.x / 4;
    float dl = 0.f;
    for (int u = threadIdx.x % 4; u < kUnits; u += 4) {
      dl = Dot8<T>(os + r * kPitch + 8 * u, dos + r * kPitch + 8 * u, dl);
    }
    dl = RowSum4(dl);  // a row's 4 threads are 4 adjacent lanes
    if (threadIdx.x % 4 == 0) delta[r] = dl;
  }
}

// The CTA's block of the sequence, [first, first + kBlock), and its share of the padding
// tokens: [first, first + kBlock) of the sequence's pad, and every `step` tokens further
// (a packed row's tail may be longer than the sequences). Blocks are numbered from the
// grid's last: the blocks far into the sequence exist only for long sequences, the ones
// with the most work, so they start first and the short sequences' blocks fill the tail
// (the causal dK / dV blocks are numbered from the first: the backward's kernel).
template <int kD>
struct Block {
  int first;  // the block's first row (from the first valid token)
  int step;   // the grid's blocks of a sequence, in tokens
  __device__ Block(int index, int count) : first(kBlock * (count - 1 - index)), step(kBlock * count) {}
};

// Zeros on the block's share of the padding rows of `dst` (in q's layout, or in k's and
// v's with kKv), and 0 in `lse` (when given) on them. Padded rows have at most the grid's
// blocks of padding; a packed row's tail may have more (kPacked: every `step` further).
template <int kD, bool kPacked, bool kKv = false, int kN = kThreads>
__device__ __forceinline__ void ZeroBlockPadding(void* dst, const Seq<kD>& s, const Block<kD>& blk,
                                                 float* lse = nullptr) {
  for (int f = blk.first; f < s.pad; f += blk.step) {
    const int last = min(f + kBlock, s.pad);
    ZeroPadding<kD, kKv, kN>(dst, s, f, last);
    if (lse != nullptr) {
      for (int i = f + threadIdx.x; i < last; i += kN) lse[s.lse_base + s.PadRow(i)] = 0.f;
    }
    if constexpr (!kPacked) break;  // padded rows: one range at most
  }
}

// The CTA's sequence and the index of its block among `count`. With p.order the grid is
// (heads, blocks, sequences) and runs the sequences in that order, every block of one
// together (bidirectional: longest first); else (heads, sequences, blocks).
struct Place {
  int seq, index, count;
};
__device__ __forceinline__ Place GridPlace(const VarlenAttentionParams& p) {
  if (p.order != nullptr) {
    const int n = static_cast<int>(gridDim.z);
    return {min(max(p.order[blockIdx.z], 0), n - 1), static_cast<int>(blockIdx.y), static_cast<int>(gridDim.y)};
  }
  return {static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z), static_cast<int>(gridDim.z)};
}

// The key chunks [begin, end) a block of queries walks (causal: to its last query's; a
// local window: from its first query's window on), and the copies of chunk c's k and v
// rows into stage c % 2 ([2][k, v][kChunk][kPitch]).
struct Chunks {
  int begin, end;
};
template <bool kWindow, int kD>
__device__ __forceinline__ Chunks KeyChunks(const Seq<kD>& s, const Block<kD>& blk) {
  const int end = min(s.len, blk.first + kBlock + s.right);
  return {s.template KeyBegin<kWindow>(blk.first) / kChunk, (end + kChunk - 1) / kChunk};
}
template <int kD, int kN = kThreads>
__device__ __forceinline__ void StageKeyChunk(const VarlenAttentionParams& p, uint16_t* smem, const Seq<kD>& s,
                                              int c) {
  constexpr int kTile = kChunk * RowPitch<kD>();
  uint16_t* buf = smem + (c & 1) * 2 * kTile;
  StageAsync<kD, kChunk, true, kN>(p.k, buf, s, c * kChunk);
  StageAsync<kD, kChunk, true, kN>(p.v, buf + kTile, s, c * kChunk);
  gemm::CpAsyncCommit();
}

// Forward: warp w's queries are rows [first + 16 kM w, + 16 kM), kM tiles of 16 rows that
// share each K and V fragment the warp loads. kM = 2 at head_dim 64 (flash-attention 2's
// layout: 4 warps, two CTAs an SM; half the shared-memory reads a FLOP of 16-row warps,
// whose ~16 FLOP a byte is where an SM's mma.sync rate and its shared-memory bandwidth
// meet), else 1 (8 warps; two tiles' accumulators of wider heads spill).
template <int kD>
constexpr int FwdTiles() {
  return kD == 64 ? 2 : 1;
}
template <int kD>
constexpr int FwdThreads() {
  return kThreads / FwdTiles<kD>();
}

template <typename T, int kD, bool kWindow, bool kPacked>
__global__ void __launch_bounds__(FwdThreads<kD>(), kD <= 64 ? 2 : 1) VarlenAttentionLongKernel(VarlenAttentionParams p) {
  constexpr int kM = FwdTiles<kD>(), kN = FwdThreads<kD>();
  constexpr int kPitch = RowPitch<kD>(), kTile = kChunk * kPitch;
  extern __shared__ __align__(16) uint16_t smem[];  // stages [2][k, v][kChunk][kPitch]; first q [kBlock][kPitch]
  const Place at = GridPlace(p);
  const Seq<kD> s(p, at.seq, blockIdx.x, std::bool_constant<kPacked>{});
  const Block<kD> blk(at.index, at.count);
  ZeroBlockPadding<kD, kPacked, false, kN>(p.out, s, blk, p.lse);
  if (blk.first >= s.len) return;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  StageAsync<kD, kBlock, false, kN>(p.q, smem, s, blk.first);
  gemm::CpAsyncCommit();
  gemm::CpAsyncWait<0>();
  __syncthreads();
  uint32_t qa[kM][kD / 16][4];
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) LoadA(qa[m][kk], smem, kPitch, 16 * (kM * warp + m), 16 * kk, lane);
  }
  __syncthreads();  // q's tile is the stages' space

  const Chunks chunks = KeyChunks<kWindow>(s, blk);
  auto stage = [&](int c) { StageKeyChunk<kD, kN>(p, smem, s, c); };
  stage(chunks.begin);
  // The warp's keys: from its first tile's first to its last tile's last (the masks take
  // each tile's own).
  const int r0 = blk.first + 16 * kM * warp;
  const int warp_key_end = r0 < s.len ? s.template KeyEnd<kWindow>(r0 + 16 * (kM - 1)) : 0;
  const int warp_key_begin = s.template KeyBegin<kWindow>(r0);
  const float sl = p.scale * kLog2e;
  float o[kM][kD / 8][4] = {};
  float mx[kM][2], l[kM][2] = {};  // [tile][rows g, g + 8]
#pragma unroll
  for (int m = 0; m < kM; ++m) mx[m][0] = mx[m][1] = -INFINITY;
#pragma unroll 1
  for (int c = chunks.begin; c < chunks.end; ++c) {
    NextChunk(c, chunks.end, stage);
    const int key0 = c * kChunk;
    if (key0 < warp_key_end && (!kWindow || key0 + kChunk > warp_key_begin)) {
      const uint16_t* ks = smem + (c & 1) * 2 * kTile;
      const uint16_t* vs = ks + kTile;
      float sc[kM][kChunk / 8][4] = {};
      float cm[kM][2];  // the chunk's row maxima
#pragma unroll
      for (int m = 0; m < kM; ++m) cm[m][0] = cm[m][1] = -INFINITY;
      auto scores = [&](auto masked) {
        constexpr bool kMasked = decltype(masked)::value;
#pragma unroll
        for (int j = 0; j < kChunk / 8; j += 2) {
          if (kMasked && key0 + 8 * j >= warp_key_end) break;
          if (kMasked && kWindow && key0 + 8 * j < warp_key_begin) continue;
#pragma unroll
          for (int kk = 0; kk < kD / 16; ++kk) {
            uint32_t b[4];
            LoadBNK<kD>(b, ks, 8 * j, 16 * kk, lane);
#pragma unroll
            for (int m = 0; m < kM; ++m) {
              gemm::Mma16816<T>(sc[m][j], qa[m][kk], b[0], b[1]);
              gemm::Mma16816<T>(sc[m][j + 1], qa[m][kk], b[2], b[3]);
            }
          }
#pragma unroll
          for (int m = 0; m < kM; ++m) {
            ScaleAndMask<kD, kWindow, kMasked>(sc[m][j], sc[m][j + 1], 8 * j, key0, r0 + 16 * m, sl, s, lane,
                                               cm[m][0], cm[m][1]);
          }
        }
      };
      if (s.template AttendsAll<kWindow>(r0, 16 * kM, key0, kChunk)) {  // most chunks: no masks
        scores(std::false_type{});
      } else {
        scores(std::true_type{});
      }
#pragma unroll
      for (int m = 0; m < kM; ++m) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          // A row's max stays -inf until its first key (a local window's rows may start
          // later): no rescale while it does (its sums are 0; ExpAndSum gives masked keys 0).
          const float n = fmaxf(mx[m][h], RowMax4(cm[m][h]));
          const float a = kWindow && n == -INFINITY ? 1.f : exp2f(mx[m][h] - n);
          mx[m][h] = n;
          l[m][h] *= a;
#pragma unroll
          for (int jd = 0; jd < kD / 8; ++jd) {
            o[m][jd][2 * h] *= a;
            o[m][jd][2 * h + 1] *= a;
          }
        }
      }
#pragma unroll
      for (int kb = 0; kb < kChunk / 16; ++kb) {
        if (key0 + 16 * kb >= warp_key_end) break;
        if (kWindow && key0 + 16 * kb < warp_key_begin) continue;
        uint32_t pa[kM][4];
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          ExpAndSum<kWindow>(sc[m][2 * kb], mx[m][0], mx[m][1], l[m][0], l[m][1]);
          ExpAndSum<kWindow>(sc[m][2 * kb + 1], mx[m][0], mx[m][1], l[m][0], l[m][1]);
          PackA<T>(sc[m][2 * kb], sc[m][2 * kb + 1], pa[m]);
        }
#pragma unroll
        for (int jd = 0; jd < kD / 8; jd += 2) {
          uint32_t b[4];
          LoadBKN<kD>(b, vs, 16 * kb, 8 * jd, lane);
#pragma unroll
          for (int m = 0; m < kM; ++m) {
            gemm::Mma16816<T>(o[m][jd], pa[m], b[0], b[1]);
            gemm::Mma16816<T>(o[m][jd + 1], pa[m], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // this stage's buffer is refilled for chunk c + 2
  }
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    if (r0 + 16 * m < s.len) {
      StoreNormalized<T, kD>(o[m], mx[m][0], mx[m][1], RowSum4(l[m][0]), RowSum4(l[m][1]), p, s, r0 + 16 * m, g, t);
    }
  }
}

// dQ: warp w's queries are rows [first + 16 w, + 16); per 16 keys P = exp(s - lse),
// dS = P (dP - delta), dQ += dS K.
template <typename T, int kD, bool kWindow, bool kPacked>
__device__ __forceinline__ void LongDq(const VarlenAttentionParams& p, uint16_t* smem, int seq, int index,
                                       int count) {
  constexpr int kPitch = RowPitch<kD>(), kTile = kChunk * kPitch;
  // smem: stages [2][k, v][kChunk][kPitch]; first q, dO, o [kBlock][kPitch]
  float* lse2 = reinterpret_cast<float*>(smem + 3 * kBlock * kPitch);  // [kBlock], log2 units
  float* delta = lse2 + kBlock;                                        // [kBlock]
  const Seq<kD> s(p, seq, blockIdx.x, std::bool_constant<kPacked>{});
  const Block<kD> blk(index, count);
  ZeroBlockPadding<kD, kPacked>(p.dq, s, blk);
  if (blk.first >= s.len) return;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  uint16_t* qs = smem;
  uint16_t* dos = qs + kBlock * kPitch;
  uint16_t* os = dos + kBlock * kPitch;
  StageAsync<kD, kBlock>(p.q, qs, s, blk.first);
  StageAsync<kD, kBlock>(p.dout, dos, s, blk.first);
  StageAsync<kD, kBlock>(p.o, os, s, blk.first);
  gemm::CpAsyncCommit();
  for (int r = threadIdx.x; r < kBlock; r += kThreads)
    lse2[r] = blk.first + r < s.len ? p.lse_in[s.lse_base + blk.first + r] * kLog2e : 0.f;
  gemm::CpAsyncWait<0>();
  __syncthreads();
  RowDots<T, kD, kBlock>(os, dos, delta);
  uint32_t qa[kD / 16][4], da[kD / 16][4];
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    LoadA(qa[kk], qs, kPitch, 16 * warp, 16 * kk, lane);
    LoadA(da[kk], dos, kPitch, 16 * warp, 16 * kk, lane);
  }
  __syncthreads();
  const float lse_a = lse2[16 * warp + g], lse_b = lse2[16 * warp + g + 8];
  const float delta_a = delta[16 * warp + g], delta_b = delta[16 * warp + g + 8];
  __syncthreads();  // q, dO, o's tiles are the stages' space

  const Chunks chunks = KeyChunks<kWindow>(s, blk);
  auto stage = [&](int c) { StageKeyChunk(p, smem, s, c); };
  stage(chunks.begin);
  const int r0 = blk.first + 16 * warp, warp_key_end = r0 < s.len ? s.template KeyEnd<kWindow>(r0) : 0;
  const int warp_key_begin = s.template KeyBegin<kWindow>(r0);
  const float sl = p.scale * kLog2e;
  float dq[kD / 8][4] = {};
#pragma unroll 1
  for (int c = chunks.begin; c < chunks.end; ++c) {
    NextChunk(c, chunks.end, stage);
    const int key0 = c * kChunk;
    const uint16_t* ks = smem + (c & 1) * 2 * kTile;
    const uint16_t* vs = ks + kTile;
    // kMasked false: every query of the warp sees every key of the chunk (no masks).
    auto walk = [&](auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
#pragma unroll
      for (int kb = 0; kb < kChunk / 16; ++kb) {
        if (kMasked && key0 + 16 * kb >= warp_key_end) break;
        if (kMasked && kWindow && key0 + 16 * kb < warp_key_begin) continue;
        float st[2][4] = {}, dp[2][4] = {};
        MmaDimB<T, kD>(st[0], st[1], qa, ks, 16 * kb, lane);
        MmaDimB<T, kD>(dp[0], dp[1], da, vs, 16 * kb, lane);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = key0 + 16 * kb + 8 * h + 2 * t + (e & 1), query = r0 + g + (e < 2 ? 0 : 8);
            const bool live = !kMasked || (query < s.len && key < s.len && s.template Attends<kWindow>(query, key));
            const float pr = live ? exp2f(st[h][e] * sl - (e < 2 ? lse_a : lse_b)) : 0.f;
            dp[h][e] = pr * (dp[h][e] - (e < 2 ? delta_a : delta_b));  // dS
          }
        }
        uint32_t dsa[4];
        PackA<T>(dp[0], dp[1], dsa);
        MmaTokensB<T, kD>(dq, dsa, ks, 16 * kb, lane);
      }
    };
    if (s.template AttendsAll<kWindow>(r0, 16, key0, kChunk)) {
      walk(std::false_type{});
    } else {
      walk(std::true_type{});
    }
    __syncthreads();
  }
  if (warp_key_end > 0) StoreRows<T, kD>(dq, p.scale, p.dq, s, r0, g, t);
}

// dK, dV of kv head `kv_head`: warp w's keys are rows [first + 16 w, + 16); per 16
// queries of each query head of the group in turn, P^T, dS^T, dV += P^T dO, dK += dS^T Q
// (the group's sum in the float32 accumulators).
template <typename T, int kD, bool kWindow, bool kPacked>
__device__ __forceinline__ void LongDkv(const VarlenAttentionParams& p, uint16_t* smem, int seq, int kv_head,
                                        int index, int count) {
  constexpr int kPitch = RowPitch<kD>(), kTile = kChunk * kPitch;
  constexpr bool kPairs = DkvPairs<kD, kWindow>(), kKvInSmem = DkvKvInSmem<kD, kWindow>();
  // smem: stages [2][q, dO, o][kChunk][kPitch]; the k, v block [2][kBlock][kPitch] after
  // them with kKvInSmem, else first in the stages' space
  uint16_t* kblk = kKvInSmem ? smem + 6 * kTile : smem;
  uint16_t* vblk = kblk + kBlock * kPitch;
  float* lse2 = reinterpret_cast<float*>(smem + 6 * kTile + (kKvInSmem ? 2 * kBlock * kPitch : 0));  // [2][kChunk], log2
  float* delta = lse2 + 2 * kChunk;                                                               // [2][kChunk]
  const int group = static_cast<int>(p.heads / p.kv_heads);
  const Seq<kD> s(p, seq, kv_head * group, std::bool_constant<kPacked>{});  // the group's first query head
  const Block<kD> blk(index, count);
  ZeroBlockPadding<kD, kPacked, true>(p.dk, s, blk);
  ZeroBlockPadding<kD, kPacked, true>(p.dv, s, blk);
  if (blk.first >= s.len) return;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  StageAsync<kD, kBlock, true>(p.k, kblk, s, blk.first);
  StageAsync<kD, kBlock, true>(p.v, vblk, s, blk.first);
  gemm::CpAsyncCommit();
  uint32_t ka[kD / 16][4], va[kD / 16][4];
  const int kv_row = 16 * warp;  // the warp's keys' row of the block's tiles
  const auto kv = KvFragments<kD, kKvInSmem>(ka, va, kblk, vblk, kv_row, lane);
  if constexpr (!kKvInSmem) {
    gemm::CpAsyncWait<0>();
    __syncthreads();
    LoadKv<kD>(ka, va, kblk, vblk, kv_row, lane);
    __syncthreads();  // k, v's tiles are the stages' space
  }

  // The query chunks that see the block's keys (causal: none before it; a local window:
  // none past its reach). Step i walks chunk c_begin + i % n of the group's query head i / n.
  const int c_begin = s.template QueryBegin<kWindow>(blk.first) / kChunk;
  const int n = (min(s.len, blk.first + kBlock + s.left) + kChunk - 1) / kChunk - c_begin;
  const int steps = group * n;
  auto stage = [&](int i) {
    const Seq<kD> sh = s.Head(i / n, p.tokens);
    const int r = (c_begin + i % n) * kChunk;
    uint16_t* buf = smem + (i & 1) * 3 * kTile;
    StageAsync<kD, kChunk>(p.q, buf, sh, r);
    StageAsync<kD, kChunk>(p.dout, buf + kTile, sh, r);
    StageAsync<kD, kChunk>(p.o, buf + 2 * kTile, sh, r);
    gemm::CpAsyncCommit();
  };
  stage(0);
  const int k0 = blk.first + 16 * warp, key_a = k0 + g;
  const float sl = p.scale * kLog2e;
  float dv[kD / 8][4] = {}, dk[kD / 8][4] = {};
#pragma unroll 1
  for (int i = 0; i < steps; ++i) {
    NextChunk(i, steps, stage);  // (kKvInSmem: also waits for the k, v block, committed first)
    const int query0 = (c_begin + i % n) * kChunk;
    const int64_t lse_base = s.Head(i / n, p.tokens).lse_base;
    const uint16_t* qs = smem + (i & 1) * 3 * kTile;
    const uint16_t* dos = qs + kTile;
    float* lse2_c = lse2 + (i & 1) * kChunk;
    float* delta_c = delta + (i & 1) * kChunk;
    RowDots<T, kD, kChunk>(qs + 2 * kTile, dos, delta_c);
    for (int r = threadIdx.x; r < kChunk; r += kThreads) {
      const int q = query0 + r;
      lse2_c[r] = q < s.len ? p.lse_in[lse_base + q] * kLog2e : 0.f;
    }
    __syncthreads();
#pragma unroll 1
    for (int qb = 0; qb < kChunk / 16; ++qb) {
      const int qb0 = query0 + 16 * qb;
      if (k0 >= s.len || qb0 >= s.len) break;
      if constexpr (kPairs) {
        if (qb % 2 == 0 && s.template AttendsAll<kWindow>(qb0, 32, k0, 16)) {  // two steps, no masks
          DkvPairStep<T, kD>(dv, dk, kv, qs, dos, lse2_c, delta_c, 16 * qb, sl, lane);
          ++qb;
          continue;
        }
      }
      // no query of the block sees the warp's keys
      if (qb0 + 16 <= s.template QueryBegin<kWindow>(k0) || (kWindow && qb0 >= s.template QueryEnd<kWindow>(k0))) {
        continue;
      }
      if constexpr (kKvInSmem) LoadKv<kD>(ka, va, kblk, vblk, kv_row, lane);
      float dst[2][4];
      if (s.template AttendsAll<kWindow>(qb0, 16, k0, 16)) {  // no masks
        DkvStep<T, kD, kWindow, false>(dv, dk, dst, ka, va, qs, dos, lse2_c, delta_c, 16 * qb, query0, key_a, sl, s,
                                       lane);
      } else {
        DkvStep<T, kD, kWindow>(dv, dk, dst, ka, va, qs, dos, lse2_c, delta_c, 16 * qb, query0, key_a, sl, s, lane);
      }
    }
    __syncthreads();
  }
  if (k0 < s.len) {
    StoreRows<T, kD, true>(dv, 1.f, p.dv, s, k0, g, t);
    StoreRows<T, kD, true>(dk, p.scale, p.dk, s, k0, g, t);
  }
}

// The backward, one launch: the grid's first half of blocks dK / dV, the second dQ (the
// two are independent), so the two fill each other's tails. dK / dV blocks are per kv
// head: with grouped-query attention the first kv_heads of the grid's heads take them,
// the rest return. Two CTAs an SM at head_dim 64.
template <typename T, int kD, bool kWindow, bool kPacked>
__global__ void __launch_bounds__(kThreads, kD <= 64 ? 2 : 1) VarlenAttentionLongBwdKernel(VarlenAttentionParams p) {
  extern __shared__ __align__(16) uint16_t smem[];
  const Place at = GridPlace(p);
  const int count = at.count / 2, z = at.index;
  if (z < count) {
    // Causal: a block's keys are seen by the queries from them on, so the blocks of a
    // sequence's first keys walk the most; numbered from the first (Block numbers from the
    // last), they start first and the short walks fill the tail.
    const int index = p.causal ? count - 1 - z : z;
    if (blockIdx.x < p.kv_heads) LongDkv<T, kD, kWindow, kPacked>(p, smem, at.seq, blockIdx.x, index, count);
  } else {
    LongDq<T, kD, kWindow, kPacked>(p, smem, at.seq, z - count, count);
  }
}

// Shared memory a CTA (mirrored by pit_jax/primitives/varlen_attention.py).
template <int kD>
constexpr size_t FwdSmem() {
  return static_cast<size_t>(4 * kChunk * RowPitch<kD>()) * 2;  // >= q's block
}
template <int kD>
constexpr size_t DqSmem() {
  return static_cast<size_t>(3 * kBlock * RowPitch<kD>()) * 2 + 2 * kBlock * sizeof(float);
}
template <int kD, bool kWindow>
constexpr size_t DkvSmem() {
  return static_cast<size_t>(6 * kChunk + (DkvKvInSmem<kD, kWindow>() ? 2 * kBlock : 0)) * RowPitch<kD>() * 2 +
         4 * kChunk * sizeof(float);
}
static_assert(4 * kChunk >= kBlock && 6 * kChunk >= 2 * kBlock && 3 * kBlock >= 4 * kChunk,
              "the first tiles fit the stages' space");

template <typename T, int kD, bool kBwd, bool kWindow, bool kPacked>
cudaError_t Launch(const VarlenAttentionParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.heads == 0 || p.seq == 0) return cudaSuccess;
  if (cudaError_t e = VarlenLaunchable(p); e != cudaSuccess) return e;
  constexpr auto kernel =
      kBwd ? VarlenAttentionLongBwdKernel<T, kD, kWindow, kPacked> : VarlenAttentionLongKernel<T, kD, kWindow, kPacked>;
  constexpr size_t smem = kBwd ? (DqSmem<kD>() > DkvSmem<kD, kWindow>() ? DqSmem<kD>() : DkvSmem<kD, kWindow>()) : FwdSmem<kD>();
  if (cudaError_t e = AllowDynamicSmem<kernel>(smem); e != cudaSuccess) return e;
  const unsigned blocks = static_cast<unsigned>((p.seq + kBlock - 1) / kBlock) * (kBwd ? 2 : 1);
  const unsigned heads = static_cast<unsigned>(p.heads), seqs = static_cast<unsigned>(VarlenSequences(p));
  const dim3 grid = p.order != nullptr ? dim3(heads, blocks, seqs) : dim3(heads, seqs, blocks);  // GridPlace
  kernel<<<grid, kBwd ? kThreads : FwdThreads<kD>(), smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchVarlenAttentionLong(const VarlenAttentionParams& p, cudaStream_t stream) {
  return ForDtypeAndHeadDim(p, [&](auto type, auto dim, auto window, auto packed) {
    return Launch<std::remove_pointer_t<decltype(type)>, decltype(dim)::value, false, decltype(window)::value,
                  decltype(packed)::value>(p, stream);
  });
}

cudaError_t LaunchVarlenAttentionLongBwd(const VarlenAttentionParams& p, cudaStream_t stream) {
  return ForDtypeAndHeadDim(p, [&](auto type, auto dim, auto window, auto packed) {
    return Launch<std::remove_pointer_t<decltype(type)>, decltype(dim)::value, true, decltype(window)::value,
                  decltype(packed)::value>(p, stream);
  });
}

}  // namespace pit
