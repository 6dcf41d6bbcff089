// MoE grouped weight gradient for Hopper (sm_90a): the device side (launcher in
// grouped_gemm.cu; measurements in docs/notes/sm90_grouped.md).
//
//   dw[c, e] = sum over the batch entries b of c, over the assignments a of group e:
//              src[b', a / row_div, :]^T (x) dy[b'', a, :]        (float32 accumulation)
//
// One CTA per 128 x 256 tile of dw[c, e] (D rows x F columns), no split over the tokens, so
// the sum order is fixed (deterministic) and an empty expert writes zeros. The reduction
// runs over the expert's tokens 64 at a time: all 256 threads cp.async the gathered rows
// (A: 64 tokens x 128 src columns; B: 64 tokens x 256 dy columns), stored as they come, i.e.
// MN-major with the 128B swizzle, 4 stages (classic multistage: wait_group + barrier);
// warpgroup w computes rows 64w.. with m64n256k16 wgmma, both operands transposed; the
// gather of k-block i + 2 is issued while the wgmma of k-block i runs.
// That is v2 (GroupedWgradKernel, bench only now). The launcher's kernel is v3
// (GroupedWgradWsKernel below: warp-specialized, 4 stages of 64 tokens (8 of 32 until run
// 11), optional deterministic split of the reduction over a cluster, packed rows by TMA).
// v4 (consumers gathering src) measured slower and was removed in run 11.
// Measurements: docs/notes/sm90_grouped.md, runs 7-8 and 11.
#pragma once

#include <cstdint>

#include "cuda/kernels/sm90/row_gather_gemm.cuh"

namespace pit {
namespace sm90_grouped {

constexpr int kWgThreads = 256;
constexpr int kWgStages = 4;
constexpr int kWgLookahead = kWgStages - 2;  // k-blocks loaded ahead of the MMA
constexpr int kWgTokens = 64;                          // tokens (K) per stage
constexpr int kWgStageA = kWgTokens * 128 * 2;         // 128 src columns: 16 KB
constexpr int kWgStageB = kWgTokens * 256 * 2;         // 256 dy columns: 32 KB
constexpr int kWgStageBytes = kWgStageA + kWgStageB;  // 48 KB
constexpr int kWgSmemBytes = kWgStages * kWgStageBytes + 1024;

struct WgradArgs {
  const char* src = nullptr;
  const char* dy = nullptr;
  char* dw = nullptr;
  const int32_t* lists = nullptr;   // [idx_batch, E+1, A]
  const int32_t* counts = nullptr;  // [idx_batch, E+1]
  int64_t src_batch_bytes = 0, dy_batch_bytes = 0, dw_batch_bytes = 0;  // per batch entry
  int64_t src_row_bytes = 0, dy_row_bytes = 0;                          // D * es, F * es
  int A = 0, D = 0, F = 0, E = 1, row_div = 1;
  int per_c = 1;  // batch entries per dw entry
  int src_div = 1, dy_div = 1, idx_div = 1;
  int m_tiles = 0, n_tiles = 0;
  int packed = 0;  // v3: rows packed and zero-padded (GroupedWgradParams::packed): every stage by TMA
};

// The reduction's position: batch entry b (of this dw entry), first token j0 of the group.
struct WgradCursor {
  int b, b_end, j0, count;
  const int32_t* list;
  const char* src_b;
  const char* dy_b;
  __device__ __forceinline__ void Load(const WgradArgs& g, int e) {
    for (; b < b_end; ++b) {
      const int64_t ib = b / g.idx_div;
      int c = __ldg(g.counts + ib * (g.E + 1) + e);
      count = c < 0 ? 0 : (c > g.A ? g.A : c);
      if (count > 0) {
        list = g.lists + (ib * (g.E + 1) + e) * g.A;
        src_b = g.src + static_cast<int64_t>(b / g.src_div) * g.src_batch_bytes;
        dy_b = g.dy + static_cast<int64_t>(b / g.dy_div) * g.dy_batch_bytes;
        return;
      }
    }
  }
  __device__ __forceinline__ bool Done() const { return b >= b_end; }
  __device__ __forceinline__ void Next(const WgradArgs& g, int e) {
    j0 += kWgTokens;
    if (j0 >= count) {
      j0 = 0;
      ++b;
      Load(g, e);
    }
  }
};

// The list entries (assignments) of one stage that this thread copies: tokens
// (tid + 256 r) / 16 of A (r < 4) and (tid + 256 r) / 32 of B (r < 8); -1 past the count.
// Fetched one k-block ahead so their load latency hides behind the MMA.
struct StageIds {
  int a[4], b[8];
  __device__ __forceinline__ void Fetch(const WgradCursor& cur, int tid, bool done) {
    const int slots = done ? 0 : min(kWgTokens, cur.count - cur.j0);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int k = (tid + kWgThreads * r) >> 4;
      a[r] = k < slots ? __ldg(cur.list + cur.j0 + k) : -1;
    }
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      const int k = (tid + kWgThreads * r) >> 5;
      b[r] = k < slots ? __ldg(cur.list + cur.j0 + k) : -1;
    }
  }
};

// Gathers one stage: thread tid copies chunks tid + 256 r of A (16 per token row: 8 per
// 64-column block) and of B (32 per token row). Chunk q of token k's 128-byte row lands at
// (q ^ (k % 8)): the 128B swizzle of an MN-major tile whose 64-element blocks are 64 K rows
// x 128 B (8 KB) apart.
__device__ __forceinline__ void WgradLoadStage(const WgradArgs& g, const WgradCursor& cur, const StageIds& ids,
                                               int d0, int f0, uint32_t stage_s, int tid) {
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int c = tid + kWgThreads * r, k = c >> 4, ch = c & 15;
    const int col = d0 + ch * 8, a = ids.a[r];
    const bool ok = a >= 0 && a < g.A && col < g.D;
    const char* p = ok ? cur.src_b + static_cast<int64_t>(a / g.row_div) * g.src_row_bytes + col * 2 : g.src;
    sm90_rg::CpAsync16(stage_s + (ch >> 3) * 8192 + k * 128 + (((ch & 7) ^ (k & 7)) << 4), p, ok ? 16u : 0u);
  }
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    const int c = tid + kWgThreads * r, k = c >> 5, ch = c & 31;
    const int col = f0 + ch * 8, a = ids.b[r];
    const bool ok = a >= 0 && a < g.A && col < g.F;
    const char* p = ok ? cur.dy_b + static_cast<int64_t>(a) * g.dy_row_bytes + col * 2 : g.dy;
    sm90_rg::CpAsync16(stage_s + kWgStageA + (ch >> 3) * 8192 + k * 128 + (((ch & 7) ^ (k & 7)) << 4), p,
                       ok ? 16u : 0u);
  }
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void CpAsyncWaitGroup() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

template <int kKind>
__global__ void __launch_bounds__(kWgThreads, 1) GroupedWgradKernel(const WgradArgs g) {
  static_assert(kKind == sm90_rg::kBf16 || kKind == sm90_rg::kF16, "bf16 / f16 only");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) char smem_raw[];
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t base = sm90_rg::SmemAddr(smem);
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  // Tile: t = ((c * E + e) * m_tiles + mt) * n_tiles + nt.
  int t = blockIdx.x;
  const int nt = t % g.n_tiles;
  t /= g.n_tiles;
  const int mt = t % g.m_tiles;
  t /= g.m_tiles;
  const int e = t % g.E, c = t / g.E;
  const int d0 = mt * 128, f0 = nt * 256;

  // Pipeline: k-block i sits in stage i % 4; loads run 2 k-blocks ahead and one wgmma
  // group stays in flight, so at iteration i the stages of i - 1 (wgmma finishing), i,
  // i + 1 (landing) and i + 2 (being loaded) are all distinct.
  WgradCursor ld{c * g.per_c, (c + 1) * g.per_c, 0, 0, nullptr, nullptr, nullptr};
  ld.Load(g, e);
  StageIds ids;
#pragma unroll
  for (int s = 0; s < kWgLookahead; ++s) {  // a commit group per k-block, empty past the end
    ids.Fetch(ld, tid, ld.Done());
    if (!ld.Done()) {
      WgradLoadStage(g, ld, ids, d0, f0, base + s * kWgStageBytes, tid);
      ld.Next(g, e);
    }
    CpAsyncCommit();
  }
  ids.Fetch(ld, tid, ld.Done());
  WgradCursor mm = {c * g.per_c, (c + 1) * g.per_c, 0, 0, nullptr, nullptr, nullptr};
  mm.Load(g, e);
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  int stage = 0, load_stage = kWgLookahead;
  while (!mm.Done()) {
    CpAsyncWaitGroup<kWgLookahead - 1>();  // this thread's copies of `stage` have landed
    sm90_rg::FenceProxyAsync();            // ... and are visible to the async proxy (wgmma)
    __syncthreads();                       // everyone's copies; everyone's wgmma of 2 k-blocks ago done
    const uint32_t sa = base + stage * kWgStageBytes + wg * 8192;
    const uint32_t sb = base + stage * kWgStageBytes + kWgStageA;
    const uint64_t da = sm90_rg::MakeDesc(sa, 8192, 1024);
    const uint64_t db = sm90_rg::MakeDesc(sb, 8192, 1024);
    sm90_rg::WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint64_t step = static_cast<uint64_t>(kk * 2048) >> 4;  // 16 K rows of 128 B
      if constexpr (kKind == sm90_rg::kBf16) {
        sm90::WgmmaBf16N256<1, 1>(acc, da + step, db + step);
      } else {
        sm90::WgmmaF16N256<1, 1>(acc, da + step, db + step);
      }
    }
    sm90_rg::WgmmaCommit();
    // While it runs: gather the k-block 2 ahead into the stage freed 2 k-blocks ago.
    if (!ld.Done()) {
      WgradLoadStage(g, ld, ids, d0, f0, base + load_stage * kWgStageBytes, tid);
      ld.Next(g, e);
      ids.Fetch(ld, tid, ld.Done());
    }
    CpAsyncCommit();
    if (++load_stage == kWgStages) load_stage = 0;
    sm90_rg::WgmmaWait<1>();
    if (++stage == kWgStages) stage = 0;
    mm.Next(g, e);
  }
  sm90_rg::WgmmaWait<0>();
  sm90_rg::FenceOperands(acc);
  sm90_rg::CpAsyncWaitAll();

  // Epilogue: fragment rows lane/4 (acc[4j], acc[4j+1]) and lane/4 + 8 (acc[4j+2..3]) of the
  // warp's 16, columns 8j + 2(lane%4) + {0, 1}; 4-byte stores straight from registers.
  char* dw_t = g.dw + static_cast<int64_t>(c) * g.dw_batch_bytes +
               static_cast<int64_t>(e) * g.D * g.F * 2;
  const int r0 = d0 + wg * 64 + warp * 16 + (lane >> 2);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = r0 + 8 * h;
    if (row >= g.D) continue;
    char* prow = dw_t + static_cast<int64_t>(row) * g.F * 2;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int col = f0 + 8 * j + 2 * (lane & 3);
      if (col < g.F)
        *reinterpret_cast<uint32_t*>(prow + col * 2) = sm90_rg::Pack2<kKind>(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
    }
  }
#endif
}


// ---------------------------------------------------------------------------------
// v3: warp-specialized (docs/notes/sm90_grouped.md, run 7). 384 threads: warpgroup 0
// gathers (4 producer warps, cp.async into 4 stages of 64 tokens, each stage's full barrier
// completed by cp.async.mbarrier.arrive.noinc; or TMA for packed rows, 3 stages of 96
// tokens), warpgroups 1 and 2 compute D rows 0-63 / 64-127 of the 128 x 256 tile with
// m64n256k16 wgmma (one per 16 tokens of a stage: 64-token stages measured 7-11 % faster
// than 32, run 11, 96 faster still where packed, run 21; one wgmma group kept in flight
// behind the current one) and release each stage once its wgmma has completed.
// Optional split of the token reduction over the S CTAs of a cluster (S from the launcher):
// CTA rank r takes k-blocks r, r + S, ... of the tile's sequence; the partial sums meet in
// shared memory and CTA r adds up its share of the elements over ranks 0, 1, ..., S-1 in
// that order (DSMEM reads), so the result is deterministic for a given S; no workspace.
// One CTA (cluster) per tile, D-row tiles fastest in the launch order (the grid's working
// set: all of src's columns and a few dy column slabs of one expert).
// ---------------------------------------------------------------------------------
constexpr int kW3Threads = 384;
constexpr int kW3Tok = 64;                          // tokens (K) per stage (gathered rows)
constexpr int kW3Stages = 4;
// Packed rows (TMA): 3 stages of 96 tokens, 72 KB each. A stage costs a fixed ~0.4-0.6 us
// (barrier round trip, TMA completion) beside its math, and 3 stages kept the tensor cores
// as busy as 4 did: 96-token stages ran 8-18 % faster than 64 (H200, 4096 x 4096 at
// 1638-8192 rows and BERT's 768 x 3072; docs/notes/sm90_grouped.md, run 21). The gathered
// form keeps 64: MoE experts often hold fewer tokens than a stage.
constexpr int kW3PackedTok = 96;
constexpr int kW3PackedStages = 3;
constexpr int W3StageBytes(int tok) { return tok * 128 * 6; }  // 128 src + 256 dy columns of tok rows
constexpr int W3MaxOf(int a, int b) { return a > b ? a : b; }
// Either form's stages and barriers (full, then empty; 8 bytes each), + alignment slack.
constexpr int kW3SmemBytes = W3MaxOf(kW3Stages * W3StageBytes(kW3Tok), kW3PackedStages * W3StageBytes(kW3PackedTok)) +
                             16 * W3MaxOf(kW3Stages, kW3PackedStages) + 1024;
constexpr int kW3EpiPitch = 528;                    // staged output row: 256 x 2 B + 16 B pad
// setmaxnreg moves registers within the CTA's launch allocation (168 per thread, what
// ptxas gives 384 threads at one CTA per SM: 64512), so 128 x producer + 256 x consumer
// must not exceed it: 96 / 208 deadlocked the consumers' setmaxnreg.inc (run 16). The
// kernel checks its split against kW3RegPool. The producers' gather address math is the
// stage's limit: 88 producer registers run BERT's weight gradients 7-18 % and 16384-token
// ones 23 % faster than 56 / 224 (H100, run 17); the consumers need no more than 208.
constexpr int kW3RegPool = 168 * kW3Threads;
constexpr int kW3ProducerRegs = 88;
constexpr int kW3ConsumerRegs = 208;
static_assert(kW3SmemBytes <= 232448, "over the 227 KB opt-in limit");

__device__ __forceinline__ uint32_t W3ClusterSize() {
  uint32_t n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return n;
}

// Tokens of group e in batch entry b (the tile's reduction, before it is cut into stages).
__device__ __forceinline__ int W3CountOf(const WgradArgs& g, int b, int e) {
  const int c = __ldg(g.counts + static_cast<int64_t>(b / g.idx_div) * (g.E + 1) + e);
  return c < 0 ? 0 : (c > g.A ? g.A : c);
}

// Producer position in the k-block sequence (batch entry b, first token j0 of the group).
struct W3Cursor {
  int b, b_end, j0, count;
  const int32_t* list;
  const char* src_b;
  const char* dy_b;
  __device__ __forceinline__ void Load(const WgradArgs& g, int e) {  // first non-empty entry >= b
    for (; b < b_end; ++b) {
      count = W3CountOf(g, b, e);
      if (count > 0) {
        list = g.lists + (static_cast<int64_t>(b / g.idx_div) * (g.E + 1) + e) * g.A;
        src_b = g.src + static_cast<int64_t>(b / g.src_div) * g.src_batch_bytes;
        dy_b = g.dy + static_cast<int64_t>(b / g.dy_div) * g.dy_batch_bytes;
        return;
      }
    }
  }
  __device__ __forceinline__ bool Done() const { return b >= b_end; }
  template <int kTok>
  __device__ __forceinline__ void Advance(const WgradArgs& g, int e, int n) {  // n k-blocks of kTok on
    while (n > 0 && !Done()) {
      const int left = (count - j0 + kTok - 1) / kTok;
      if (n < left) {
        j0 += n * kTok;
        return;
      }
      n -= left;
      j0 = 0;
      ++b;
      Load(g, e);
    }
  }
};

// With g.packed, every stage is 6 TMA boxes of 64 columns x kTok rows (2 of src, 4 of
// dy; the 128B swizzle is the layout the gathers write), issued by thread 0 with the
// stage's byte count while the other producer threads arrive plainly. The last stage of a
// batch entry reads the rows up to the next multiple of kTok, which the packing pass
// zeroed (kPackedRowPad is a multiple of it; or TMA fills with zeros past the end).
// kDiag: sm90_rg::kDiagStamp records phase timestamps (bench builds only; see Stamp);
// timing diagnostics (wrong results): kWgDiagNoGather (the producers copy nothing),
// kWgDiagNoMath (the consumers issue no wgmma).
constexpr int kWgDiagNoGather = 1, kWgDiagNoMath = 2;
// kProdRegs / kConsRegs: the register split (bench variants try others).
// kTok / kStages: tokens per stage and stages (kW3Tok / kW3Stages for gathered rows,
// kW3PackedTok / kW3PackedStages for packed ones; the launcher's tensor maps match kTok).
template <int kKind, int kDiag = 0, int kProdRegs = kW3ProducerRegs, int kConsRegs = kW3ConsumerRegs, int kTok = kW3Tok,
          int kStages = kW3Stages>
__global__ void __launch_bounds__(kW3Threads, 1)
    GroupedWgradWsKernel(const WgradArgs g, const __grid_constant__ CUtensorMap map_src,
                         const __grid_constant__ CUtensorMap map_dy) {
  using sm90_rg::Stamp;
  static_assert(kKind == sm90_rg::kBf16 || kKind == sm90_rg::kF16, "bf16 / f16 only");
  static_assert(128 * kProdRegs + 256 * kConsRegs <= kW3RegPool, "within the launch allocation");
  constexpr int kBlock = kTok * 128;  // one 64-column block: kTok K rows x 128 B
  constexpr int kStageA = 2 * kBlock, kStageBytes = W3StageBytes(kTok);  // 128 src + 256 dy columns
  constexpr int kFull = kStages * kStageBytes, kEmpty = kFull + 8 * kStages;  // full, then empty barriers
  static_assert(kEmpty + 8 * kStages + 1024 <= kW3SmemBytes, "within the launch's shared memory");
  static_assert(8 * 16 * kW3EpiPitch <= kFull && 256 * 128 * 4 <= kFull, "epilogue staging / partials fit");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) char smem_raw[];
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t base = sm90_rg::SmemAddr(smem);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int S = static_cast<int>(W3ClusterSize());
  const int rank = S > 1 ? static_cast<int>(sm90_rg::ClusterRank()) : 0;
  // Tile: t = ((c * E + e) * n_tiles + nt) * m_tiles + mt (D-row tiles fastest).
  int t = blockIdx.x / S;
  const int mt = t % g.m_tiles;
  t /= g.m_tiles;
  const int nt = t % g.n_tiles;
  t /= g.n_tiles;
  const int e = t % g.E, c = t / g.E;
  const int d0 = mt * 128, f0 = nt * 256;
  // This CTA's k-blocks: r, r + S, ... of the sequence over the entries of c.
  int total = 0;
  for (int b = c * g.per_c; b < (c + 1) * g.per_c; ++b) total += (W3CountOf(g, b, e) + kTok - 1) / kTok;
  const int mine = total > rank ? (total - rank + S - 1) / S : 0;

  if (tid == 0) {
    Stamp<kDiag>(0);
    for (int s = 0; s < kStages; ++s) {
      sm90_rg::MbarInit(base + kFull + s * 8, 128);  // every gathering thread (cp.async noinc)
      sm90_rg::MbarInit(base + kEmpty + s * 8, 8);   // lane 0 of every consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (tid == 0) Stamp<kDiag>(1), Stamp<kDiag>(10, mine);

  float acc[128];
  if (warp < 4) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProdRegs));
    // Producer warp w: tokens 8w .. 8w+7 of each 32-token pass of a stage. Lane l holds
    // the source row pointers (null: no row) of one of them, fetched one stage early.
    W3Cursor cur{c * g.per_c, (c + 1) * g.per_c, 0, 0, nullptr, nullptr, nullptr};
    cur.Load(g, e);
    cur.template Advance<kTok>(g, e, rank);
    // Lanes 8p .. 8p + 7 hold the tokens of pass p (32 tokens per pass over the 4 warps).
    static_assert(kTok % 32 == 0 && kTok <= 128, "passes of 32 tokens, lanes 8p..8p+7");
    constexpr int kPasses = kTok / 32;
    const int tk = 8 * warp + (lane & 7) + 32 * ((lane >> 3) % kPasses);
    auto fetch = [&](int& a, const char*& sb, const char*& db) {
      a = -1;
      if (!cur.Done() && cur.j0 + tk < cur.count) a = __ldg(cur.list + cur.j0 + tk);
      sb = cur.src_b, db = cur.dy_b;
    };
    int a_id;
    const char *a_sb, *a_db;
    fetch(a_id, a_sb, a_db);
    int stage = 0;
    uint32_t phase = 0;
    for (int i = 0; i < mine; ++i) {
      // This stage: batch entry cur.b, tokens cur.j0 .. cur.j0 + kTok - 1 (before Advance).
      const bool bulk = g.packed;
      const int bulk_row = cur.j0, bulk_b = cur.b;
      const bool ok_row = a_id >= 0 && a_id < g.A;
      const char* srow = ok_row ? a_sb + static_cast<int64_t>(a_id / g.row_div) * g.src_row_bytes : nullptr;
      const char* drow = ok_row ? a_db + static_cast<int64_t>(a_id) * g.dy_row_bytes : nullptr;
      cur.template Advance<kTok>(g, e, S);
      fetch(a_id, a_sb, a_db);  // the next stage's list entries, in flight during this one
      sm90_rg::MbarWait(base + kEmpty + stage * 8, phase ^ 1);
      const uint32_t ss = base + stage * kStageBytes;
      if (bulk) {
        const uint32_t full = base + kFull + stage * 8;
        if constexpr ((kDiag & kWgDiagNoGather) != 0) {
          sm90_rg::MbarArrive(full);  // (the diagnostic: no TMA either)
        } else if (tid == 0) {
          sm90_rg::MbarArriveExpectTx(full, kStageBytes);
          const int sb = bulk_b / g.src_div, db = bulk_b / g.dy_div;
#pragma unroll
          for (int h = 0; h < 2; ++h) sm90_rg::TmaLoad3d(ss + h * kBlock, &map_src, d0 + 64 * h, bulk_row, sb, full);
#pragma unroll
          for (int h = 0; h < 4; ++h)
            sm90_rg::TmaLoad3d(ss + kStageA + h * kBlock, &map_dy, f0 + 64 * h, bulk_row, db, full);
        } else {
          sm90_rg::MbarArrive(full);
        }
        if (++stage == kStages) stage = 0, phase ^= 1;
        continue;
      }
      if constexpr ((kDiag & kWgDiagNoGather) != 0) {
        sm90_rg::CpAsyncArriveNoinc(base + kFull + stage * 8);
        if (++stage == kStages) stage = 0, phase ^= 1;
        continue;
      }
#pragma unroll
      for (int r = 0; r < 4 * kPasses; ++r) {  // A: 2 tokens x 16 chunks per instruction
        const int pass = r / 4, tt = (lane >> 4) + 2 * (r % 4), ch = lane & 15, k = 8 * warp + 32 * pass + tt;
        const char* p =
            reinterpret_cast<const char*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(srow), tt + 8 * pass));
        const int col = d0 + ch * 8;
        const bool ok = p != nullptr && col < g.D;
        sm90_rg::CpAsync16(ss + (ch >> 3) * kBlock + k * 128 + (((ch & 7) ^ (k & 7)) << 4),
                           ok ? p + col * 2 : g.src, ok ? 16u : 0u);
      }
#pragma unroll
      for (int r = 0; r < 8 * kPasses; ++r) {  // B: one token x 32 chunks per instruction
        const int pass = r / 8, k = 8 * warp + 32 * pass + r % 8;
        const char* p =
            reinterpret_cast<const char*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(drow), r % 8 + 8 * pass));
        const int col = f0 + lane * 8;
        const bool ok = p != nullptr && col < g.F;
        sm90_rg::CpAsync16(ss + kStageA + (lane >> 3) * kBlock + k * 128 + (((lane & 7) ^ (k & 7)) << 4),
                           ok ? p + col * 2 : g.dy, ok ? 16u : 0u);
      }
      sm90_rg::CpAsyncArriveNoinc(base + kFull + stage * 8);
      if (i == 0 && tid == 0) Stamp<kDiag>(2);
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    sm90_rg::CpAsyncWaitAll();
    if (tid == 0) Stamp<kDiag>(3);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsRegs));
    const int wg = (warp >> 2) - 1;
    if (tid == 128) Stamp<kDiag>(4);
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    int stage = 0, prev = -1;
    uint32_t phase = 0;
    for (int i = 0; i < mine; ++i) {
      sm90_rg::MbarWait(base + kFull + stage * 8, phase);
      sm90_rg::FenceProxyAsync();  // cp.async (generic proxy) writes -> wgmma (async proxy) reads
      const uint32_t ss = base + stage * kStageBytes;
      const uint64_t da = sm90_rg::MakeDesc(ss + wg * kBlock, kBlock, 1024);
      const uint64_t db = sm90_rg::MakeDesc(ss + kStageA, kBlock, 1024);
      sm90_rg::WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < kTok / 16; ++kk) {
        const uint64_t step = static_cast<uint64_t>(kk * 2048) >> 4;  // 16 K rows of 128 B
        if constexpr ((kDiag & kWgDiagNoMath) != 0) {
        } else if constexpr (kKind == sm90_rg::kBf16) {
          sm90::WgmmaBf16N256<1, 1>(acc, da + step, db + step);
        } else {
          sm90::WgmmaF16N256<1, 1>(acc, da + step, db + step);
        }
      }
      sm90_rg::WgmmaCommit();
      sm90_rg::WgmmaWait<1>();  // the previous stage's wgmma is done: release it
      if (prev >= 0 && lane == 0) sm90_rg::MbarArrive(base + kEmpty + prev * 8);
      prev = stage;
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    sm90_rg::WgmmaWait<0>();
    sm90_rg::FenceOperands(acc);
    if (tid == 128) Stamp<kDiag>(7);
    // Every consumer's wgmma is done (the producers' copies all landed before): the stages
    // are free for the epilogue.
    asm volatile("bar.sync 1, 256;" ::: "memory");
    const int ct = tid - 128, cw = ct >> 5;  // consumer thread / warp 0..7
    if (S == 1) {
      // Through shared memory: the warp's 16 rows x 256 columns (pitch 528 B), then one
      // row (512 contiguous bytes) per 16-byte store instruction.
      const uint32_t st = base + cw * 16 * kW3EpiPitch;
      const int fr = lane >> 2, fq = lane & 3;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const uint32_t o = (8 * j + 2 * fq) * 2;
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(st + fr * kW3EpiPitch + o),
                     "r"(sm90_rg::Pack2<kKind>(acc[4 * j], acc[4 * j + 1]))
                     : "memory");
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(st + (fr + 8) * kW3EpiPitch + o),
                     "r"(sm90_rg::Pack2<kKind>(acc[4 * j + 2], acc[4 * j + 3]))
                     : "memory");
      }
      __syncwarp();
      char* dw_t = g.dw + static_cast<int64_t>(c) * g.dw_batch_bytes + static_cast<int64_t>(e) * g.D * g.F * 2;
      const int col = f0 + lane * 8;
      const int row0 = d0 + cw * 16;
#pragma unroll 4
      for (int rr = 0; rr < 16; ++rr) {
        uint4 v;
        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(st + rr * kW3EpiPitch + lane * 16)
                     : "memory");
        const int row = row0 + rr;
        if (row < g.D && col < g.F)
          *reinterpret_cast<uint4*>(dw_t + (static_cast<int64_t>(row) * g.F + col) * 2) = v;
      }
    } else {
      sm90_rg::StorePartials(base, ct, acc);  // the partial sums
    }
    if (tid == 128) Stamp<kDiag>(8);
  }
  if (S > 1) {
    // Everyone's partials are written (and no producer copy is pending) ...
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
    if (tid == 128) Stamp<kDiag>(19);
    if (warp >= 4) {
      const int ct = tid - 128;
      const int cwg = ct >> 7, cwarp = (ct >> 5) & 3, cl = ct & 31;
      char* dw_t = g.dw + static_cast<int64_t>(c) * g.dw_batch_bytes + static_cast<int64_t>(e) * g.D * g.F * 2;
      sm90_rg::SumPairs(base, ct, rank, S, 0, [&](int p, float2 sum) {  // ranks 0..S-1 in order
        // acc[2p], acc[2p+1] = acc[4j + 2h + {0,1}]: row lane/4 + 8h, columns 8j + 2(lane%4) + {0,1}.
        const int j = p >> 1, h = p & 1;
        const int row = d0 + cwg * 64 + cwarp * 16 + (cl >> 2) + 8 * h;
        const int col = f0 + 8 * j + 2 * (cl & 3);
        if (row < g.D && col < g.F)
          *reinterpret_cast<uint32_t*>(dw_t + (static_cast<int64_t>(row) * g.F + col) * 2) =
              sm90_rg::Pack2<kKind>(sum.x, sum.y);
      });
      if (tid == 128) Stamp<kDiag>(18);
    }
    // ... and no CTA leaves while a peer may still read its shared memory.
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
  }
  if constexpr ((kDiag & sm90_rg::kDiagStamp) != 0) {
    __syncthreads();
    if (tid == 0) Stamp<kDiag>(16);
  }
#endif
}

}  // namespace sm90_grouped
}  // namespace pit
