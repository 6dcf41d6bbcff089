// Attention over padded short sequences (seq <= 128, head_dim 64, 80, 96 or 128; right or
// left padding, bidirectional or causal), valid tokens only, on tensor cores with mma.sync
// m16n8k16 (sm_80 and up; the same code runs on Hopper, where these problems are
// latency-bound, not tensor-bound).
//
// One CTA of 8 warps per (head, sequence) stages the sequence's valid rows in shared
// memory (zeros up to the next multiple of 16), so the whole key range is in one tile:
// the softmax needs no running rescale and the backward needs no atomics (its dQ is a
// second product over dS staged in shared memory), and every sum has a fixed order.
// Padding tokens cost nothing but the zeros written to their rows of the results. Left
// padding moves the rows' base to the first valid token; causal attention skips the key
// tiles past a warp's last query (forward, dQ) and the query tiles before a warp's first
// key (dK, dV), so it does about half the work.
// Fragment layouts and the shared pieces: varlen_attention_tiles.cuh. Longer sequences:
// varlen_attention_long.cu.
#include "cuda/kernels/varlen_attention.h"

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/kernels/device_utils.cuh"
#include "cuda/kernels/varlen_attention_long.h"
#include "cuda/kernels/varlen_attention_tiles.cuh"

namespace pit {
namespace {

using namespace attn;  // NOLINT: the shared tiles and fragments

constexpr int kMaxRows = static_cast<int>(kVarlenAttentionShortSeq);

// Copies rows [0, s.rows) x kD of each `src` into its row-major tile `dst` (pitch
// kRowPitch), zeros past s.len; the sources from kKvFrom on are in k's and v's layout.
// Every thread issues all its loads before its first store, so the CTA waits on one round
// trip to memory, not one per chunk. Chunk i is column chunk i / kMaxRows of row i %
// kMaxRows: a warp's 16-byte stores go to 32 consecutive rows, 8 distinct bank quads per
// phase.
template <int kD, int kN, int kKvFrom>
__device__ __forceinline__ void Stage(const void* const (&src)[kN], uint16_t* const (&dst)[kN], const Seq<kD>& s) {
  constexpr int kStageIters = kMaxRows * (kD / 8) / kThreads;  // 16-byte chunks per thread and tensor
  constexpr int kRowPitch = RowPitch<kD>();
  uint4 v[kN][kStageIters];
#pragma unroll
  for (int it = 0; it < kStageIters; ++it) {
    const int i = threadIdx.x + it * kThreads, r = i % kMaxRows, c = (i / kMaxRows) * 8;
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      v[n][it] = make_uint4(0, 0, 0, 0);
      if (r < s.len) {
        const uint16_t* row = static_cast<const uint16_t*>(src[n]) + (n < kKvFrom ? s.At(r, c) : s.AtKv(r, c));
        v[n][it] = __ldg(reinterpret_cast<const uint4*>(row));
      }
    }
  }
#pragma unroll
  for (int it = 0; it < kStageIters; ++it) {
    const int i = threadIdx.x + it * kThreads, r = i % kMaxRows, c = (i / kMaxRows) * 8;
    if (r >= s.rows) continue;
#pragma unroll
    for (int n = 0; n < kN; ++n) *reinterpret_cast<uint4*>(dst[n] + r * kRowPitch + c) = v[n][it];
  }
}

// Launch order: the longest sequences first (p.longest_first). A CTA holds a whole sequence,
// so its time grows with the length; in batch order a long sequence late in the batch
// starts in the grid's last wave and ends long after the rest (BERT's GLUE-like batch 32 x
// 12 heads: 1.45 waves). The CTA of grid row y takes the y-th longest sequence (ties in
// index order), ranked by the CTA itself: warp 0 loads every length (the round trip the
// sequence's own took), ranks them with ballots and leaves the chosen span in shared
// memory. No order operand (an XLA sort a call, and its load before the length's), one
// warp's issue slots (eight warps ranking alike cost the forward ~0.9 us), and the span
// passed on, not loaded again. The launcher sets the flag for 2 to kRankedSequences
// sequences filling more than one and at most four CTAs an SM (more waves hide the tail,
// and the ranking's ~0.3 us a CTA is then not paid back). Not in the forwards of
// head_dim 80 and 96: they fit 128 registers (two CTAs an SM) only while the sequence is
// blockIdx.y; one computed at run time takes some to 131-149, and capped at 128 they spill.
constexpr int kRankWords = 4;
constexpr int kRankedSequences = 32 * kRankWords;
static_assert(kMaxRows < 256, "lengths ranked as 8-bit values");
template <int kD, bool kBwd>
constexpr bool RanksLengths() {
  return kBwd || kD % 64 == 0;
}

// Warp 0's part: sequence j = lane + 32 w of the call is word w of the lane. The launcher
// sets p.longest_first for at most kRankedSequences (gridDim.y) sequences.
template <bool kPacked>
__device__ __forceinline__ VarlenSpan RankedSpan(const VarlenAttentionParams& p, int y) {
  const int n = static_cast<int>(gridDim.y), lane = threadIdx.x % 32;
  int len[kRankWords], origin[kRankWords], end[kRankWords];
#pragma unroll
  for (int w = 0; w < kRankWords; ++w) {
    const int j = lane + 32 * w;
    len[w] = -1;  // no sequence
    origin[w] = end[w] = 0;
    if (j < n) {
      const VarlenSpan sp = SpanOf<kPacked>(p, j);
      len[w] = sp.len;
      origin[w] = sp.origin;
      end[w] = sp.end;
    }
  }
  int word = 0, owner = 0, value = 0;
  if (n <= 32) {
    // Every lane's rank at once: its length's bits, from the top, against the ballots of
    // every lane's bits (eight independent ballots, not the select's chain of them).
    unsigned bits[8];
#pragma unroll
    for (int b = 0; b < 8; ++b) bits[b] = __ballot_sync(kFullMask, (len[0] >> b) & 1);
    unsigned greater = 0, equal = __ballot_sync(kFullMask, len[0] >= 0);
#pragma unroll
    for (int b = 7; b >= 0; --b) {
      const bool one = (len[0] >> b) & 1;
      if (!one) greater |= equal & bits[b];
      equal &= one ? bits[b] : ~bits[b];
    }
    const int rank = __popc(greater) + __popc(equal & ((1u << lane) - 1));
    owner = __ffs(__ballot_sync(kFullMask, len[0] >= 0 && rank == y)) - 1;
    value = __shfl_sync(kFullMask, len[0], owner);
  } else {  // a radix select of the y-th longest over the words, then its tie
    int need = y;
#pragma unroll
    for (int bit = 7; bit >= 0; --bit) {
      const int probe = (value >> bit) | 1;
      int count = 0;
#pragma unroll
      for (int w = 0; w < kRankWords; ++w) {
        if (32 * w < n) count += __popc(__ballot_sync(kFullMask, len[w] >= 0 && (len[w] >> bit) == probe));
      }
      if (need < count) {
        value |= 1 << bit;
      } else {
        need -= count;
      }
    }
#pragma unroll
    for (int w = 0; w < kRankWords; ++w) {
      if (32 * w >= n || need < 0) break;
      unsigned equal = __ballot_sync(kFullMask, len[w] == value);
      const int count = __popc(equal);
      if (need < count) {
        for (int k = need; k > 0; --k) equal &= equal - 1;  // past the lower-indexed ties
        word = w;
        owner = __ffs(equal) - 1;
      }
      need -= count;
    }
  }
  int o = origin[0], e = end[0];
#pragma unroll
  for (int w = 1; w < kRankWords; ++w) {
    if (w == word) {
      o = origin[w];
      e = end[w];
    }
  }
  o = __shfl_sync(kFullMask, o, owner);
  e = __shfl_sync(kFullMask, e, owner);
  const int j = 32 * word + owner;
  if constexpr (kPacked) {
    const int segments = static_cast<int>(p.segments);
    return {j / segments, j % segments, o, e, value};
  }
  return {j, 0, o, o + value, value};
}

// The span of the CTA's sequence: grid row y's in launch order.
template <int kD, bool kBwd, bool kPacked>
__device__ __forceinline__ VarlenSpan SequenceSpan(const VarlenAttentionParams& p, int y) {
  if (!RanksLengths<kD, kBwd>() || !p.longest_first) return SpanOf<kPacked>(p, y);
  __shared__ VarlenSpan chosen;
  if (threadIdx.x < 32) {
    const VarlenSpan sp = RankedSpan<kPacked>(p, y);
    if (threadIdx.x == 0) chosen = sp;
  }
  __syncthreads();
  return chosen;
}

// Forward: warp w computes query rows [16 w, 16 w + 16) against all keys at once.
template <typename T, int kD, bool kWindow, bool kPacked>
__global__ void __launch_bounds__(kThreads) VarlenAttentionKernel(VarlenAttentionParams p) {
  constexpr int kRowPitch = RowPitch<kD>();
  extern __shared__ __align__(16) uint16_t smem[];
  const int seq = static_cast<int>(p.seq), s16 = (seq + 15) & ~15;
  uint16_t* qs = smem;                  // [s16][kRowPitch] each
  uint16_t* ks = qs + s16 * kRowPitch;
  uint16_t* vs = ks + s16 * kRowPitch;
  const Seq<kD> s(p, SequenceSpan<kD, false, kPacked>(p, blockIdx.y), blockIdx.x, std::bool_constant<kPacked>{});
  Stage<kD, 3, 1>({p.q, p.k, p.v}, {qs, ks, vs}, s);
  ZeroPadding(p.out, s, 0, s.pad);
  for (int i = threadIdx.x; i < s.pad; i += kThreads) p.lse[s.lse_base + s.PadRow(i)] = 0.f;
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
  const int r0 = 16 * warp;
  if (r0 >= s.len) return;
  uint32_t qa[kD / 16][4];
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) LoadA(qa[kk], qs, kRowPitch, r0, 16 * kk, lane);
  // Scores in log2 units, 16 tiles of 8 keys; only the staged keys' tiles in the rows'
  // window are computed (outside [key_begin, key_rows) the probabilities are 0 without
  // an exp).
  const int key_begin = s.template KeyBegin<kWindow>(r0), key_rows = s.template KeyRows<kWindow>(r0);
  const int key_end = s.template KeyEnd<kWindow>(r0), g = lane / 4;
  float sc[16][4] = {};
  const float sl = p.scale * kLog2e;
  float m0 = -INFINITY, m1 = -INFINITY;
#pragma unroll
  for (int j = 0; j < 16; j += 2) {
    if (8 * j >= key_rows) break;
    if (kWindow && 8 * j < key_begin) continue;
    MaskedScores<T, kD, kWindow>(sc[j], sc[j + 1], qa, ks, 8 * j, 0, r0, sl, s, lane, m0, m1);
  }
  m0 = RowMax4(m0);
  m1 = RowMax4(m1);
  float l0 = 0.f, l1 = 0.f;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    if (8 * j >= key_rows) break;
    if (kWindow && 8 * j < key_begin) continue;
    ExpAndSum<kWindow>(sc[j], m0, m1, l0, l1);
  }
  l0 = RowSum4(l0);
  l1 = RowSum4(l1);

  float o[kD / 8][4] = {};
#pragma unroll
  for (int kb = 0; kb < 8; ++kb) {
    if (16 * kb >= key_end) break;
    if (kWindow && 16 * kb < key_begin) continue;
    uint32_t pa[4];
    PackA<T>(sc[2 * kb], sc[2 * kb + 1], pa);
    MmaTokensB<T, kD>(o, pa, vs, 16 * kb, lane);
  }
  StoreNormalized<T, kD>(o, m0, m1, l0, l1, p, s, r0, g, t);
}

// Backward. Phase 1: warp w owns keys [16 w, 16 w + 16) and walks the query blocks (two
// unmasked ones at a time): P^T and dP^T (from k q^T and v dO^T), dS^T = P^T (dP^T -
// delta), dV += P^T dO, dK += dS^T Q, and dS into shared memory. Phase 2: warp w owns
// queries [16 w, 16 w + 16): dQ = dS K. delta = rowsum(dO o) per query, from the
// forward's rounded o. Causal and local windows: phase 1 walks only the query blocks that
// see the warp's keys (causal: from its own on), phase 2 only the key blocks its queries
// see; every dS entry phase 2 reads was written in phase 1 (the two ranges are the same
// 16 x 16 tiles seen from either side).
// Two CTAs an SM at head_dim 64 (128 registers, 107 KB); one above (123-171 KB).
template <typename T, int kD, bool kWindow, bool kPacked>
__global__ void __launch_bounds__(kThreads, kD <= 64 ? 2 : 1) VarlenAttentionBwdKernel(VarlenAttentionParams p) {
  constexpr int kRowPitch = RowPitch<kD>();
  extern __shared__ __align__(16) uint16_t smem[];
  const int seq = static_cast<int>(p.seq), s16 = (seq + 15) & ~15, pitch_ds = s16 + 8;
  uint16_t* qs = smem;                   // [s16][kRowPitch] each
  uint16_t* ks = qs + s16 * kRowPitch;
  uint16_t* vs = ks + s16 * kRowPitch;
  uint16_t* dos = vs + s16 * kRowPitch;
  uint16_t* dss = dos + s16 * kRowPitch;  // [s16][pitch_ds]: dS[query][key]; first o, [s16][kRowPitch]
  float* lse2 = reinterpret_cast<float*>(dss + s16 * max(pitch_ds, kRowPitch));  // [s16]: lse in log2 units
  float* delta = lse2 + s16;                                                     // [s16]
  const Seq<kD> s(p, SequenceSpan<kD, true, kPacked>(p, blockIdx.y), blockIdx.x, std::bool_constant<kPacked>{});
  uint16_t* os = dss;  // read before phase 1 writes dS
  Stage<kD, 5, 3>({p.q, p.dout, p.o, p.k, p.v}, {qs, dos, os, ks, vs}, s);
  ZeroPadding(p.dq, s, 0, s.pad);
  ZeroPadding(p.dk, s, 0, s.pad);
  ZeroPadding(p.dv, s, 0, s.pad);
  __syncthreads();
  for (int r = threadIdx.x; r < s.rows; r += kThreads) {
    float dl = 0.f;
#pragma unroll
    for (int c = 0; c < kD; c += 8) dl = Dot8<T>(os + r * kRowPitch + c, dos + r * kRowPitch + c, dl);
    lse2[r] = r < s.len ? p.lse_in[s.lse_base + r] * kLog2e : 0.f;
    delta[r] = dl;
  }
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const float sl = p.scale * kLog2e;
  const int k0 = 16 * warp;
  if (k0 < s.len) {
    // Unmasked query steps two at a time, the fragments from the tiles at head_dim 64, as
    // the long backward's dK / dV walk (DkvPairs, DkvKvInSmem).
    constexpr bool kPairs = DkvPairs<kD, kWindow>(), kKvFromSmem = DkvKvInSmem<kD, kWindow>();
    uint32_t ka[kD / 16][4], va[kD / 16][4];
    const auto kv = KvFragments<kD, kKvFromSmem>(ka, va, ks, vs, k0, lane);
    if constexpr (!kKvFromSmem) LoadKv<kD>(ka, va, ks, vs, k0, lane);
    float dv[kD / 8][4] = {}, dk[kD / 8][4] = {};
    const int key_a = k0 + g, key_b = key_a + 8;
    const int query_end = s.template QueryEnd<kWindow>(k0);
    // dS[query][key] of a step whose tile rows start at r (DkvStep's dS^T, rounded as in
    // its product), for phase 2.
    auto keep_ds = [&](int r, const float (&dpt)[2][4]) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int q = r + 8 * h + 2 * t + (e & 1), key = e < 2 ? key_a : key_b;
          dss[q * pitch_ds + key] = gemm::Elem<T>::FromFloat(dpt[h][e]);
        }
      }
    };
#pragma unroll 1
    for (int qb = s.template QueryBegin<kWindow>(k0) / 16; 16 * qb < query_end; ++qb) {
      if constexpr (kPairs) {
        if (s.template AttendsAll<kWindow>(16 * qb, 32, k0, 16)) {  // two steps, no masks
          DkvPairStep<T, kD>(dv, dk, kv, qs, dos, lse2, delta, 16 * qb, sl, lane, keep_ds);
          ++qb;
          continue;
        }
        if constexpr (kKvFromSmem) LoadKv<kD>(ka, va, ks, vs, k0, lane);
      }
      float dpt[2][4];
      DkvStep<T, kD, kWindow>(dv, dk, dpt, ka, va, qs, dos, lse2, delta, 16 * qb, 0, key_a, sl, s, lane);
      keep_ds(16 * qb, dpt);
    }
    StoreRows<T, kD>(dv, 1.f, p.dv, s, k0, g, t);
    StoreRows<T, kD>(dk, p.scale, p.dk, s, k0, g, t);
  }
  __syncthreads();

  const int q0 = 16 * warp;
  if (q0 < s.len) {
    float dq[kD / 8][4] = {};
    const int key_end = s.template KeyEnd<kWindow>(q0);
#pragma unroll 1
    for (int kb = s.template KeyBegin<kWindow>(q0) / 16; 16 * kb < key_end; ++kb) {
      uint32_t a[4];
      LoadA(a, dss, pitch_ds, q0, 16 * kb, lane);
      MmaTokensB<T, kD>(dq, a, ks, 16 * kb, lane);
    }
    StoreRows<T, kD>(dq, p.scale, p.dq, s, q0, g, t);
  }
}

template <int kD>
size_t FwdSmem(int64_t seq) {
  const int64_t s16 = (seq + 15) & ~int64_t{15};
  return static_cast<size_t>(3 * s16 * RowPitch<kD>()) * 2;
}

template <int kD>
size_t BwdSmem(int64_t seq) {
  constexpr int64_t kRowPitch = RowPitch<kD>();
  const int64_t s16 = (seq + 15) & ~int64_t{15}, pitch_ds = s16 + 8;
  const int64_t ds = s16 * (pitch_ds > kRowPitch ? pitch_ds : kRowPitch);  // dS, first o
  return static_cast<size_t>(4 * s16 * kRowPitch + ds) * 2 + 2 * s16 * sizeof(float);
}

template <typename T, int kD, bool kBwd, bool kWindow, bool kPacked>
cudaError_t Launch(const VarlenAttentionParams& p, cudaStream_t stream) {
  if (p.batch == 0 || p.heads == 0 || p.seq == 0) return cudaSuccess;
  if (cudaError_t e = VarlenLaunchable(p); e != cudaSuccess) return e;
  constexpr auto kernel = kBwd ? VarlenAttentionBwdKernel<T, kD, kWindow, kPacked> : VarlenAttentionKernel<T, kD, kWindow, kPacked>;
  const size_t smem = kBwd ? BwdSmem<kD>(p.seq) : FwdSmem<kD>(p.seq);
  if (cudaError_t e = AllowDynamicSmem<kernel>(smem); e != cudaSuccess) return e;
  static const bool on = EnvFlag("PIT_JAX_ATTN_LONGEST_FIRST", true);  // A/B switch
  const int64_t seqs = VarlenSequences(p), ctas = seqs * p.heads, sms = DeviceSmCount();
  VarlenAttentionParams ranked = p;
  ranked.longest_first = on && RanksLengths<kD, kBwd>() && seqs > 1 && seqs <= kRankedSequences && ctas > sms &&
                         ctas <= 4 * sms;
  kernel<<<dim3(static_cast<unsigned>(p.heads), static_cast<unsigned>(seqs)), kThreads, smem, stream>>>(ranked);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchVarlenAttention(const VarlenAttentionParams& p, cudaStream_t stream) {
  if (p.seq > kVarlenAttentionShortSeq) return LaunchVarlenAttentionLong(p, stream);
  return ForDtypeAndHeadDim(p, [&](auto type, auto dim, auto window, auto packed) {
    return Launch<std::remove_pointer_t<decltype(type)>, decltype(dim)::value, false, decltype(window)::value,
                  decltype(packed)::value>(p, stream);
  });
}

cudaError_t LaunchVarlenAttentionBwd(const VarlenAttentionParams& p, cudaStream_t stream) {
  // The short backward sums dK / dV over one query head's queries in a CTA; grouped kv
  // heads take the long one, whose dK / dV blocks walk the group's heads.
  if (p.seq > kVarlenAttentionShortSeq || p.kv_heads != p.heads) return LaunchVarlenAttentionLongBwd(p, stream);
  return ForDtypeAndHeadDim(p, [&](auto type, auto dim, auto window, auto packed) {
    return Launch<std::remove_pointer_t<decltype(type)>, decltype(dim)::value, true, decltype(window)::value,
                  decltype(packed)::value>(p, stream);
  });
}

}  // namespace pit
