// The generic sparse GEMM behind pit_row_gather_matmul, pit_stile_matmul and
// pit_sdd_matmul (docs/kernels.md). One block computes one BM x BN tile of C:
//
//   rows    contiguous [m_lo, m_hi), or (row gather) BM consecutive POSITIONS of the
//           concatenated listed row blocks, mapped to rows through a shared table;
//   columns contiguous [n_lo, n_hi);
//   K       all of [0, K), or (stile) the concatenation of the K ranges of the listed
//           tiles of the block's group: position p -> tile list[p / kt], offset p % kt,
//           mapped per BK-chunk through a small shared table;
//   batch   the block loops over the `group` batch entries that sum into its C entry,
//           so the reduction is deterministic and needs no atomics.
//
// The main loop is a classic two-stage pipeline: global loads of chunk q+1 go to
// registers while chunk q is multiplied from shared memory, then they are stored to
// the other stage. Global reads are 16-byte vectors along the stored contiguous dim
// wherever alignment allows (element by element otherwise, and at ragged edges).
//   MMA  (bf16/f16): operands keep their stored contiguity in shared memory (16-byte
//        copies); mma.sync m16n8k16 with fragments through ldmatrix (.trans for
//        operands stored M/N-contiguous), float32 accumulation;
//   SIMT (float32, exact FFMA; also bf16/f16 when PIT_SPARSE_GEMM_SIMT=1): shared
//        tiles converted to float, [BK][rows] layout, 8x8 or 4x4 outputs per thread.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "cuda/kernels/elem_types.cuh"
#include "cuda/kernels/epilogue.cuh"
#include "cuda/kernels/mma_sync.cuh"

namespace pit {
namespace gemm {

enum Mode : int { kRowGather = 0, kStileA = 1, kStileB = 2, kSdd = 3 };

// Everything a block needs; built by the host launchers (sparse_gemm.cu).
struct GemmArgs {
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  int M = 0, N = 0, K = 0;
  int64_t lda = 0, ldb = 0;                          // stored leading dims (= stored cols)
  int64_t a_stride = 0, b_stride = 0, c_stride = 0;  // elements per batch entry
  int group = 1;                                     // batch entries summed into one C entry
  int a_div = 1, b_div = 1, idx_div = 1;             // entry b reads A[b / a_div], ...
  int mode = kRowGather;
  bool trans_c = false;
  bool a_vec = false, b_vec = false;  // 16-byte loads are aligned (see the launchers)
  bool c_vec = false;                 // kCV-wide stores of C are aligned
  const int32_t* lists = nullptr;     // [idx_batch, groups, capacity]
  const int32_t* counts = nullptr;    // [idx_batch, groups]
  int groups = 1, capacity = 0;
  int tile = 1;      // row gather: rows per row block; stile: group extent; sdd: tile_h
  int tile2 = 1;     // stile: K extent of a listed tile; sdd: tile_w
  int tiles_a = 0;   // row gather: row blocks; stile: K tiles; sdd: tile rows
  int tiles_b = 0;   // sdd: tile columns
  int units = 1;     // per C entry: 1 (row gather), groups (stile), capacity (sdd)
  int blocks_m = 1, blocks_n = 1;  // blocks per unit along M and N
  EpilogueDev epi;                 // row gather only: bias + activation on the written rows
};

// ---------------------------------------------------------------------------------
// Tile configurations.

// kMinBlocks: blocks per SM the register budget must allow (__launch_bounds__).
template <int BM_, int BN_, int BK_, int TM_, int TN_, int kMinBlocks_>
struct SimtCfg {
  static constexpr bool kMma = false;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int BM = BM_, BN = BN_, BK = BK_, TM = TM_, TN = TN_;
  static constexpr int kThreads = (BM / TM) * (BN / TN);
  static constexpr int kCV = 4;  // C columns per vector store
  static_assert(TM % 4 == 0 && TN % 4 == 0 && BM % TM == 0 && BN % TN == 0, "4-wide strips");
  static_assert(kThreads % 32 == 0 && kThreads <= 1024 && kThreads >= BK, "block shape");
};

template <int BM_, int BN_, int BK_, int WARPS_M_, int WARPS_N_, int kMinBlocks_>
struct MmaCfg {
  static constexpr bool kMma = true;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int BM = BM_, BN = BN_, BK = BK_;
  static constexpr int WARPS_M = WARPS_M_, WARPS_N = WARPS_N_;
  static constexpr int kThreads = WARPS_M * WARPS_N * 32;
  static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;
  static constexpr int MT = WM / 16, NT = WN / 8;  // mma tiles per warp
  static constexpr int kCV = 2;
  static_assert(WM % 16 == 0 && WN % 16 == 0 && BK % 16 == 0, "m16n8k16 tiles, B fragments in pairs");
  static_assert(kThreads >= BK, "one thread per position of a K-chunk table");
};

// Shared-memory tile of one operand and stage. SIMT: float [BK][rows + 4]. MMA: 16-bit
// words in the operand's stored contiguity, rows padded by 16 bytes so that the eight
// 16-byte rows one ldmatrix phase reads fall in distinct bank groups.
template <class Cfg, bool kKContig, int ROWS>
struct SmemTile {
  static constexpr bool kKMajor = Cfg::kMma && kKContig;  // [ROWS][BK] (else [BK][ROWS])
  static constexpr int kPitch = Cfg::kMma ? (kKContig ? Cfg::BK + 8 : ROWS + 8) : ROWS + 4;
  static constexpr int kSize = (kKMajor ? ROWS : Cfg::BK) * kPitch;
  static_assert((kPitch * (Cfg::kMma ? 2 : 4)) % 16 == 0, "16-byte aligned rows");
};

// ---------------------------------------------------------------------------------
// Global -> registers -> shared loader of one operand's BK-chunk: a ROWS x BK tile
// (rows = m for A, n for B) of a matrix stored [rows][K] (kKContig) or [K][rows].
// Each thread owns kSlots 16-byte vectors along the stored contiguous dim.

template <class Cfg, typename T, bool kKContig, int ROWS>
struct TileLoader {
  using Word = typename Elem<T>::Word;
  static constexpr int BK = Cfg::BK, kThreads = Cfg::kThreads;
  static constexpr int V = 16 / static_cast<int>(sizeof(T));
  static constexpr int kPerLine = kKContig ? BK / V : ROWS / V;
  static constexpr int kLines = kKContig ? ROWS : BK;
  static constexpr int kTotal = kLines * kPerLine;
  static constexpr int kSlots = (kTotal + kThreads - 1) / kThreads;
  static_assert((kKContig ? BK : ROWS) % V == 0 && kPerLine > 0, "whole vectors");
  using Tile = SmemTile<Cfg, kKContig, ROWS>;

  int64_t row_off[kSlots];  // kKContig: element offset of the slot's row in an entry, or -1
  uint4 stage[kSlots];

  static __device__ __forceinline__ int Slot(int i) { return static_cast<int>(threadIdx.x) + i * kThreads; }
  static __device__ __forceinline__ bool Has(int i) { return kTotal % kThreads == 0 || Slot(i) < kTotal; }

  // kKContig: global row of each slot (row_of(line) -> row or -1), fixed for the block.
  template <typename RowOf>
  __device__ __forceinline__ void InitRows(RowOf row_of, int64_t ld) {
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      row_off[i] = -1;
      if (kKContig && Has(i)) {
        const int row = row_of(Slot(i) / kPerLine);
        if (row >= 0) row_off[i] = static_cast<int64_t>(row) * ld;
      }
    }
  }

  // Chunk kc of one batch entry at `base`. Dense K: positions are k itself (k < K).
  // Gathered K: ktab[position in chunk] is k or -1. Rows (not kKContig) are [lo, hi).
  template <bool kGather>
  __device__ __forceinline__ void Load(const Word* __restrict__ base, int64_t ld, int K, int kc,
                                       const int* ktab, bool vec, int lo, int hi) {
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      Word w[V];
#pragma unroll
      for (int e = 0; e < V; ++e) w[e] = 0;
      stage[i] = make_uint4(0, 0, 0, 0);
      if (!Has(i)) continue;
      const int line = Slot(i) / kPerLine, vi = Slot(i) % kPerLine;
      if (kKContig) {
        if (row_off[i] < 0) continue;
        const Word* row = base + row_off[i];
        const int kp = vi * V;  // first position of this vector in the chunk
        if (kGather) {
          if (vec) {  // kt % V == 0: the V positions are V consecutive k of one tile
            const int k0 = ktab[kp];
            if (k0 >= 0) stage[i] = __ldg(reinterpret_cast<const uint4*>(row + k0));
            continue;
          }
#pragma unroll
          for (int e = 0; e < V; ++e) {
            const int k = ktab[kp + e];
            if (k >= 0) w[e] = __ldg(row + k);
          }
        } else {
          const int k0 = kc * BK + kp;
          if (vec && k0 + V <= K) {
            stage[i] = __ldg(reinterpret_cast<const uint4*>(row + k0));
            continue;
          }
#pragma unroll
          for (int e = 0; e < V; ++e)
            if (k0 + e < K) w[e] = __ldg(row + k0 + e);
        }
      } else {
        int k;
        if (kGather) {
          k = ktab[line];
        } else {
          k = kc * BK + line;
          if (k >= K) k = -1;
        }
        if (k < 0) continue;
        const Word* krow = base + static_cast<int64_t>(k) * ld;
        const int r0 = lo + vi * V;
        if (vec && r0 + V <= hi) {
          stage[i] = __ldg(reinterpret_cast<const uint4*>(krow + r0));
          continue;
        }
#pragma unroll
        for (int e = 0; e < V; ++e)
          if (r0 + e < hi) w[e] = __ldg(krow + r0 + e);
      }
      stage[i] = Pack(w);
    }
  }

  // Registers -> one shared stage (uint16_t* for MMA, float* for SIMT).
  template <typename S>
  __device__ __forceinline__ void Store(S* __restrict__ smem) const {
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      if (!Has(i)) continue;
      const int line = Slot(i) / kPerLine, vi = Slot(i) % kPerLine;
      if constexpr (Cfg::kMma) {
        static_assert(sizeof(S) == 2 && V == 8, "16-bit operands");
        // Same contiguity as global: one 16-byte store (pitch and offsets are multiples of 8 words).
        *reinterpret_cast<uint4*>(smem + line * Tile::kPitch + vi * V) = stage[i];
      } else {
        Word w[V];
        Unpack(stage[i], w);
        if (kKContig) {  // transpose into [BK][rows]
#pragma unroll
          for (int e = 0; e < V; ++e) smem[(vi * V + e) * Tile::kPitch + line] = Elem<T>::ToFloat(w[e]);
        } else {
          float* dst = smem + line * Tile::kPitch + vi * V;
#pragma unroll
          for (int e = 0; e < V; e += 4)
            *reinterpret_cast<float4*>(dst + e) =
                make_float4(Elem<T>::ToFloat(w[e]), Elem<T>::ToFloat(w[e + 1]), Elem<T>::ToFloat(w[e + 2]),
                            Elem<T>::ToFloat(w[e + 3]));
        }
      }
    }
  }
};

// ---------------------------------------------------------------------------------
// Math engines.

template <class Cfg>
struct SimtMath {
  static constexpr int BM = Cfg::BM, BN = Cfg::BN, TM = Cfg::TM, TN = Cfg::TN;
  static constexpr int kTx = BN / TN;                      // threads along N
  static constexpr int kStrideM = BM / (TM / 4), kStrideN = BN / (TN / 4);  // between 4-wide strips
  static constexpr int kPitchA = BM + 4, kPitchB = BN + 4;
  float acc[TM][TN];

  __device__ __forceinline__ void Zero() {
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;
  }
  static __device__ __forceinline__ int Row(int i) {
    return (i / 4) * kStrideM + (static_cast<int>(threadIdx.x) / kTx) * 4 + i % 4;
  }
  static __device__ __forceinline__ int Col(int j) {
    return (j / 4) * kStrideN + (static_cast<int>(threadIdx.x) % kTx) * 4 + j % 4;
  }
  // The epilogue's walk: fn(row, n, v0, v1, v2, v3) for each quad of this thread's
  // accumulators (columns n .. n + 3 from n_lo) in the tile rows r whose row = row_of(r)
  // is not negative.
  template <class RowOf, class Fn>
  __device__ __forceinline__ void ForEachQuad(RowOf row_of, int n_lo, Fn fn) const {
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const int row = row_of(Row(i));
      if (row < 0) continue;
#pragma unroll
      for (int js = 0; js < TN; js += 4)
        fn(row, n_lo + Col(js), acc[i][js], acc[i][js + 1], acc[i][js + 2], acc[i][js + 3]);
    }
  }

  __device__ __forceinline__ void Step(const float* __restrict__ As, const float* __restrict__ Bs) {
    const float* a_ptr = As + Row(0);
    const float* b_ptr = Bs + Col(0);
#pragma unroll
    for (int k = 0; k < Cfg::BK; ++k) {
      float a[TM], b[TN];
#pragma unroll
      for (int s = 0; s < TM / 4; ++s) {
        const float4 v = *reinterpret_cast<const float4*>(a_ptr + k * kPitchA + s * kStrideM);
        a[4 * s] = v.x;
        a[4 * s + 1] = v.y;
        a[4 * s + 2] = v.z;
        a[4 * s + 3] = v.w;
      }
#pragma unroll
      for (int s = 0; s < TN / 4; ++s) {
        const float4 v = *reinterpret_cast<const float4*>(b_ptr + k * kPitchB + s * kStrideN);
        b[4 * s] = v.x;
        b[4 * s + 1] = v.y;
        b[4 * s + 2] = v.z;
        b[4 * s + 3] = v.w;
      }
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
  }
};

// Warp tile WM x WN = MT x NT mma tiles of 16 x 8. Fragment ownership (PTX ISA,
// m16n8k16): g = lane / 4, t = lane % 4; A regs {a0a1, a2a3, a4a5, a6a7} hold
// (row g, k 2t..2t+1), (g+8, 2t), (g, 2t+8), (g+8, 2t+8); B regs {b0b1, b2b3} hold
// (k 2t..2t+1, col g), (k 2t+8.., g); C {c0c1, c2c3} hold (g, 2t..2t+1), (g+8, 2t..).
// The fragments come by ldmatrix.x4 (mma_sync.cuh has its layout).
template <class Cfg, typename T, bool kAK, bool kBK>
struct MmaMath {
  static constexpr int MT = Cfg::MT, NT = Cfg::NT, WM = Cfg::WM, WN = Cfg::WN;
  using TileA = SmemTile<Cfg, kAK, Cfg::BM>;
  using TileB = SmemTile<Cfg, kBK, Cfg::BN>;
  float acc[MT][NT][4];

  __device__ __forceinline__ void Zero() {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
  }
  static __device__ __forceinline__ int Lane() { return static_cast<int>(threadIdx.x) & 31; }
  static __device__ __forceinline__ int WarpM() { return (static_cast<int>(threadIdx.x) >> 5) / Cfg::WARPS_N; }
  static __device__ __forceinline__ int WarpN() { return (static_cast<int>(threadIdx.x) >> 5) % Cfg::WARPS_N; }
  // The epilogue's walk: fn(row, n, v0, v1) for each pair of this thread's accumulators
  // (columns n, n + 1 from n_lo) in the tile rows r whose row = row_of(r) is not negative.
  template <class RowOf, class Fn>
  __device__ __forceinline__ void ForEachPair(RowOf row_of, int n_lo, Fn fn) const {
    const int lane = Lane(), gq = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row_of(WarpM() * WM + mt * 16 + h * 8 + gq);
        if (row < 0) continue;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          fn(row, n_lo + WarpN() * WN + nt * 8 + 2 * tq, acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
      }
    }
  }

  __device__ __forceinline__ void Step(const uint16_t* __restrict__ As, const uint16_t* __restrict__ Bs) {
    const int lane = Lane();
    const int r8 = lane & 7, hi8 = (lane >> 3) & 1, q = lane >> 4;  // row in matrix, matrix bit 0, bit 1
    const int m_base = WarpM() * WM, n_base = WarpN() * WN;
#pragma unroll
    for (int ks = 0; ks < Cfg::BK / 16; ++ks) {
      const int k0 = ks * 16;
      uint32_t af[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int m0 = m_base + mt * 16;
        if (kAK) {  // [BM][BK]: matrices (m+0,k+0), (m+8,k+0), (m+0,k+8), (m+8,k+8)
          LdMatrixX4(af[mt], SmemAddr(As + (m0 + r8 + hi8 * 8) * TileA::kPitch + k0 + q * 8));
        } else {  // [BK][BM]: the same four blocks, rows of the stored block are k
          LdMatrixX4Trans(af[mt], SmemAddr(As + (k0 + r8 + q * 8) * TileA::kPitch + m0 + hi8 * 8));
        }
      }
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {  // B fragments of two n8 tiles, used at once
        const int n0 = n_base + np * 16;
        uint32_t r[4];
        if (kBK) {  // [BN][BK]: matrices (n+0,k+0), (n+0,k+8), (n+8,k+0), (n+8,k+8)
          LdMatrixX4(r, SmemAddr(Bs + (n0 + r8 + q * 8) * TileB::kPitch + k0 + hi8 * 8));
        } else {  // [BK][BN]: the same four blocks, rows of the stored block are k
          LdMatrixX4Trans(r, SmemAddr(Bs + (k0 + r8 + hi8 * 8) * TileB::kPitch + n0 + q * 8));
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          Mma16816<T>(acc[mt][2 * np], af[mt], r[0], r[1]);
          Mma16816<T>(acc[mt][2 * np + 1], af[mt], r[2], r[3]);
        }
      }
    }
  }
};

// ---------------------------------------------------------------------------------
// The kernel.

// Position in the flat sequence of (batch entry j of the group, K-chunk kc) a block
// reduces over; entries with nothing to reduce are skipped.
struct ChunkIter {
  int j = -1, kc = 0, nk = 0;
  bool valid = true;
};

__device__ __forceinline__ int LiveCount(const int32_t* counts, int64_t at, int capacity) {
  const int n = __ldg(counts + at);
  return n <= 0 ? 0 : (n < capacity ? n : capacity);
}

template <class Cfg, typename T, bool kAK, bool kBK, bool kGather>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) SparseGemmKernel(const GemmArgs g) {
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, kThreads = Cfg::kThreads;
  using Word = typename Elem<T>::Word;
  using S = std::conditional_t<Cfg::kMma, uint16_t, float>;
  using LoaderA = TileLoader<Cfg, T, kAK, BM>;
  using LoaderB = TileLoader<Cfg, T, kBK, BN>;
  using Math = std::conditional_t<Cfg::kMma, MmaMath<Cfg, T, kAK, kBK>, SimtMath<Cfg>>;
  static_assert(!Cfg::kMma || sizeof(T) == 2, "tensor cores for 16-bit operands only");

  __shared__ __align__(16) S s_a[2][LoaderA::Tile::kSize];
  __shared__ __align__(16) S s_b[2][LoaderB::Tile::kSize];
  __shared__ int s_mrow[BM];               // global row of each tile row, or -1
  // The block's ranges, re-read from shared memory in the main loop rather than held
  // in registers across it (the 128x128 MMA tile is right at the 128-register budget).
  __shared__ int s_range[4];
  __shared__ int s_ktab[2][kGather ? BK : 1];  // per stage: k of each chunk position, or -1
  const int tid = static_cast<int>(threadIdx.x);

  // 1. This block's tile of C (all block-uniform, so the early exits are safe).
  const int per_unit = g.blocks_m * g.blocks_n;
  const int per_c = g.units * per_unit;
  const int bid = static_cast<int>(blockIdx.x);
  const int c = bid / per_c;
  const int unit = (bid - c * per_c) / per_unit;
  const int mi = (bid - c * per_c - unit * per_unit) / g.blocks_n;
  const int ni = bid - c * per_c - unit * per_unit - mi * g.blocks_n;
  int m_lo = mi * BM, m_hi = min(g.M, m_lo + BM);
  int n_lo = ni * BN, n_hi = min(g.N, n_lo + BN);
  const int32_t* rlist = nullptr;
  if (g.mode == kRowGather) {
    // m_lo/m_hi are positions in the concatenated listed row blocks.
    const int ie = (c * g.group) / g.idx_div;
    const int npos = LiveCount(g.counts, ie, g.capacity) * g.tile;
    m_hi = min(npos, m_lo + BM);
    rlist = g.lists + static_cast<int64_t>(ie) * g.capacity;
  } else if (g.mode == kStileA) {
    const int base = unit * g.tile;
    m_lo = base + mi * BM;
    m_hi = min(min(m_lo + BM, base + g.tile), g.M);
  } else if (g.mode == kStileB) {
    const int base = unit * g.tile;
    n_lo = base + ni * BN;
    n_hi = min(min(n_lo + BN, base + g.tile), g.N);
  } else {  // kSdd: slot `unit` of the flat list over C's tiles
    const int ie = (c * g.group) / g.idx_div;
    if (unit >= LiveCount(g.counts, ie, g.capacity)) return;
    const int t = __ldg(g.lists + static_cast<int64_t>(ie) * g.capacity + unit);
    if (t < 0 || t >= g.tiles_a * g.tiles_b) return;  // not a tile of C: nothing to write
    const int tr = t / g.tiles_b, tc = t - tr * g.tiles_b;
    m_lo = tr * g.tile + mi * BM;
    m_hi = min(min(m_lo + BM, tr * g.tile + g.tile), g.M);
    n_lo = tc * g.tile2 + ni * BN;
    n_hi = min(min(n_lo + BN, tc * g.tile2 + g.tile2), g.N);
  }
  if (m_lo >= m_hi || n_lo >= n_hi) return;

  for (int r = tid; r < BM; r += kThreads) {
    int row = -1;
    const int pos = m_lo + r;
    if (pos < m_hi) {
      if (g.mode == kRowGather) {
        const int idx = pos / g.tile, off = pos - idx * g.tile;
        const int v = __ldg(rlist + idx);
        if (v >= 0 && v < g.tiles_a) {  // negative (dead / padding) or foreign ids: no row
          row = v * g.tile + off;
          if (row >= g.M) row = -1;  // past the end of a partial last row block
        }
      } else {
        row = pos;
      }
    }
    s_mrow[r] = row;
  }
  if (tid == 0) {
    s_range[0] = m_lo;
    s_range[1] = m_hi;
    s_range[2] = n_lo;
    s_range[3] = n_hi;
  }

  // 2. The reduction sequence over (entry, chunk).
  auto chunks_of = [&](int j) -> int {
    if (!kGather) return (g.K + BK - 1) / BK;
    const int ie = (c * g.group + j) / g.idx_div;
    const int npos = LiveCount(g.counts, static_cast<int64_t>(ie) * g.groups + unit, g.capacity) * g.tile2;
    return (npos + BK - 1) / BK;
  };
  auto next_entry = [&](ChunkIter& it) {
    do {
      if (++it.j >= g.group) {
        it.valid = false;
        return;
      }
      it.nk = chunks_of(it.j);
    } while (it.nk == 0);
    it.kc = 0;
  };
  auto advance = [&](ChunkIter& it) {
    if (!it.valid) return;
    if (++it.kc < it.nk) return;
    next_entry(it);
  };
  // Stile: k of each position of chunk `it` (positions of the listed tiles' K ranges).
  auto fill_ktab = [&](int* tab, const ChunkIter& it) {
    if (!kGather || tid >= BK) return;
    const int ie = (c * g.group + it.j) / g.idx_div;
    const int64_t list = static_cast<int64_t>(ie) * g.groups + unit;
    const int kt = g.tile2;
    const int p = it.kc * BK + tid;
    int k = -1;
    if (p < LiveCount(g.counts, list, g.capacity) * kt) {
      const int idx = p / kt, off = p - idx * kt;
      const int v = __ldg(g.lists + list * g.capacity + idx);
      if (v >= 0 && v < g.tiles_a) {
        k = v * kt + off;
        if (k >= g.K) k = -1;  // past the end of a partial last K tile
      }
    }
    tab[tid] = k;
  };

  ChunkIter cur;
  next_entry(cur);
  ChunkIter nxt = cur;
  advance(nxt);
  if (kGather && cur.valid) {
    fill_ktab(s_ktab[0], cur);
    if (nxt.valid) fill_ktab(s_ktab[1], nxt);
  }
  __syncthreads();  // s_mrow, s_ktab

  LoaderA la;
  LoaderB lb;
  la.InitRows([&](int line) { return s_mrow[line]; }, g.lda);
  lb.InitRows([&](int line) { return n_lo + line < n_hi ? n_lo + line : -1; }, g.ldb);
  auto load = [&](const ChunkIter& it, const int* tab) {
    const int b = c * g.group + it.j;
    const Word* A = static_cast<const Word*>(g.a) + static_cast<int64_t>(b / g.a_div) * g.a_stride;
    const Word* B = static_cast<const Word*>(g.b) + static_cast<int64_t>(b / g.b_div) * g.b_stride;
    la.template Load<kGather>(A, g.lda, g.K, it.kc, tab, g.a_vec, s_range[0], s_range[1]);
    lb.template Load<kGather>(B, g.ldb, g.K, it.kc, tab, g.b_vec, s_range[2], s_range[3]);
  };

  Math math;
  math.Zero();
  if (cur.valid) {
    load(cur, s_ktab[0]);
    la.Store(s_a[0]);
    lb.Store(s_b[0]);
    __syncthreads();
    int s = 0;  // stage (and table) of the chunk being multiplied
    for (;;) {
      const bool has_next = nxt.valid;
      if (has_next) load(nxt, s_ktab[s ^ 1]);
      math.Step(s_a[s], s_b[s]);
      if (has_next) {
        la.Store(s_a[s ^ 1]);
        lb.Store(s_b[s ^ 1]);
      }
      ChunkIter after = nxt;
      advance(after);
      // The chunk after next reuses this stage's table: its last reader (the load of
      // the current chunk) finished before the previous barrier.
      if (kGather && after.valid) fill_ktab(s_ktab[s], after);
      __syncthreads();
      if (!has_next) break;
      s ^= 1;
      nxt = after;
    }
  }

  // 3. Epilogue: round once to T; rows through s_mrow, columns [n_lo, n_hi).
  n_lo = s_range[2];
  n_hi = s_range[3];
  Word* C = static_cast<Word*>(g.c) + static_cast<int64_t>(c) * g.c_stride;
  auto out = [&](int row, int n) -> Word& {
    return C[g.trans_c ? static_cast<int64_t>(n) * g.M + row : static_cast<int64_t>(row) * g.N + n];
  };
  // The epilogue on v (column n); with Epilogue::pre (row gather: C row-major) v + bias
  // goes there first, rounded once.
  auto epilogue = [&](float v, int row, int n) {
    if (!g.epi.pre) return g.epi.Apply(v, n);
    v += g.epi.Bias(n);
    if (n < n_hi) (reinterpret_cast<Word*>(g.epi.pre) + static_cast<int64_t>(c) * g.c_stride)[
        static_cast<int64_t>(row) * g.N + n] = Elem<T>::FromFloat(v);
    return Activate(v, g.epi.act);
  };
  auto row_of = [&](int r) { return s_mrow[r]; };
  const int64_t step = g.trans_c ? g.M : 1;  // between C's consecutive columns
  if constexpr (Cfg::kMma) {
    math.ForEachPair(row_of, n_lo, [&](int row, int n, float v0, float v1) {
      if (g.epi.on) v0 = epilogue(v0, row, n), v1 = epilogue(v1, row, n + 1);
      StorePair<T>(&out(row, n), step, g.c_vec, n, n_hi, v0, v1);  // c_vec: row-major C, N even
    });
  } else {
    math.ForEachQuad(row_of, n_lo, [&](int row, int n, float v0, float v1, float v2, float v3) {
      if (g.epi.on) {
        v0 = epilogue(v0, row, n), v1 = epilogue(v1, row, n + 1);
        v2 = epilogue(v2, row, n + 2), v3 = epilogue(v3, row, n + 3);
      }
      StoreQuad<T>(&out(row, n), step, g.c_vec, n, n_hi, v0, v1, v2, v3);  // c_vec: row-major C, N % 4 == 0
    });
  }
}

}  // namespace gemm
}  // namespace pit
