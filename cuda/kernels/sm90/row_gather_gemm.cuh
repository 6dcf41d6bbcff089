// Row-gather GEMM for Hopper (sm_90a): the device side. See row_gather_gemm.cu for
// the launcher and docs/notes/sm90_row_gather.md for the measurements behind each choice.
//
//   C[b, r, :] = A[b, r, :] @ op(B[b'])   for the rows r of the listed row blocks,
//   C[b, r, :] = 0                        for the rows of the dead blocks (list tail).
//
// The configuration LaunchRowGatherGemmSm90 uses (Config<3, 5, 0, true>, 2-CTA clusters;
// single CTAs when the static tile space is small, where the cluster launch costs more
// than the multicast saves):
// persistent, one CTA per SM, 384 threads = 3 warpgroups; a tile is 128 gathered rows x
// 256 columns, K in steps of 128 bytes (64 bf16/f16 or 32 f32).
//   WG0 (producer, 40 registers after setmaxnreg):
//     warp 2, one lane: B by TMA (128B swizzle, zero fill past N and K), 5 stages; the two
//       CTAs of a cluster work on two row tiles of the same column tile, each loads half of
//       B and multicasts it to both (halves B's L2 traffic);
//     warps 0, 1, 3: write zeros over the dead rows of C (list tail `-1 - id`, spread over
//       all CTAs) while the math runs.
//   WG1, WG2 (consumers, 232 registers): each owns 64 of the tile's 128 rows and issues
//     m64n256k16 (bf16/f16) or m64n256k8 (tf32) wgmma from shared memory into 128 fp32
//     accumulators per thread. They also gather A themselves: each warp cp.asyncs (16 B,
//     zero-fill for missing rows and the K tail) the 16 rows it computes, 128B-swizzled, into
//     the A stage (3 stages) that its previous wgmma has just freed, so the gather is
//     spread over all 4 SM sub-partitions. Epilogue: through the warpgroup's half of the
//     A stage freed last (XOR-swizzled), then 16-byte stores to the gathered row addresses.
// The tile scheduler walks a static tile space (batch x capacity-bound row tiles x column
// tiles) round-robin; row tiles past the device-side count are skipped by every role
// alike, so no host read of the count is needed.
// Small problems with long reductions use the split-K form (kSplitK, clusters of 4 without
// multicast): see SplitOf and ReduceSplit.
// Other configurations (producer-warp gather, no cluster, ...) are the experiments of the
// notes, compiled only with -DPIT_RG_EXPERIMENTS.
#pragma once

#include <cstdint>

#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/kernels/epilogue.cuh"
#include "cuda/kernels/sm90/wgmma.cuh"

namespace pit {
namespace sm90_rg {

// Element kinds of one instantiation.
enum Kind : int { kBf16 = 0, kF16 = 1, kTf32 = 2 };

constexpr int kBM = 128;       // gathered rows per tile (2 consumer warpgroups x 64)
constexpr int kBN = 256;       // columns per tile (one m64n256 per consumer warpgroup)
constexpr int kBKBytes = 128;  // bytes of K per stage (one 128B swizzle row)
constexpr int kStageABytes = kBM * kBKBytes;  // 16 KB
constexpr int kStageBBytes = kBN * kBKBytes;  // 32 KB
constexpr int kEpiPitch = 144;                // staging row: 64 columns x 2 B + 16 B pad
constexpr int kEpiWarpBytes = 16 * kEpiPitch; // one consumer warp's 16 rows
constexpr int kConsumerWarps = 8;

// Shared-memory layout and thread roles of one configuration (384 threads: a producer
// warpgroup and 2 consumer warpgroups; 512 threads would cap registers at 128, too few
// for a 128-accumulator wgmma):
//   kStagesA / kStagesB: separate pipelines for the gathered A (16 KB/stage, cp.async)
//   and B (32 KB/stage, TMA), so A, whose rows come from DRAM, can run further ahead;
//   kGatherWarps 2: warps 0-1 gather A (64 rows each), warp 2 loads B, warp 3 zero-fills;
//   kGatherWarps 3: warps 0, 1, 3 gather A (48, 48, 32 rows), warp 2 loads B and zero-fills
//   one dead row per B stage in between (the rest after its last stage);
//   kGatherWarps 0: the consumer warps gather A themselves (each warp the 16 rows whose
//   results it computes, 4 cp.async per thread per stage, into the stage its previous
//   wgmma just freed); warp 2 loads B, warps 0, 1, 3 zero-fill.
//   The zero-fill uses 16-byte stores, equal shares per zero-fill warp over all CTAs (paced
//   or concentrated variants measured no better: docs/notes/sm90_row_gather.md).
//   kEpiInA (consumer gather only): the epilogue stages C through the warpgroup's half of
//   the A stage its last wgmma just freed (2 KB per warp, XOR-swizzled), refilled after the
//   epilogue; this frees 18 KB for a fifth B stage.
template <int kStagesA_, int kStagesB_, int kGatherWarps_, bool kEpiInA_ = false, int kBN_ = kBN,
          int kStageBPitch_ = kBN_ * kBKBytes, bool kAltSpace_ = false>
struct Config {
  static constexpr int kStagesA = kStagesA_, kStagesB = kStagesB_, kGatherWarps = kGatherWarps_;
  // Columns per tile: 256 (m64n256 per consumer warpgroup), or 128 (m64n128) for small
  // problems, where twice the tiles spread the work over more SMs, or 208 (m64n208, the
  // narrow tiles: see kNarrowWidth), whose B stage is loaded as 256 columns, the last 48
  // unused (N-major B comes in 64-column swizzle blocks).
  static constexpr int kBN = kBN_;
  static constexpr bool kNarrow = kBN == 208;
  static constexpr int kLoadN = kNarrow ? 256 : kBN;     // B columns loaded per stage
  static constexpr int kStageBBytes = kLoadN * kBKBytes;  // loaded per B stage
  static constexpr int kStageBPitch = kStageBPitch_;      // allocated per B stage
  static_assert(kBN == 256 || kBN == 128 || kBN == 208, "tiles of 256, 208 or 128 columns");
  static_assert(kStageBPitch >= kStageBBytes, "a B stage holds its tile");
  // kAltSpace: the tiles are the alternative tile space of a two-width kernel
  // (Args::n_tiles_alt): Half, this configuration's 128-column form with the same layout
  // (its K-major B through the second tensor map), or Narrow, its 208-column form (B
  // through the same map, the tiles in TileWalk's narrow order).
  static constexpr bool kAltSpace = kAltSpace_;
  using Half = Config<kStagesA_, kStagesB_, kGatherWarps_, kEpiInA_, 128, kStageBPitch_, true>;
  using Narrow = Config<kStagesA_, kStagesB_, kGatherWarps_, kEpiInA_, 208, kStageBPitch_, true>;
  static constexpr bool kBFromAux = kAltSpace && kBN == 128;  // Half's B: the second map
  static constexpr bool kEpiInA = kEpiInA_;
  static_assert(!kEpiInA || kGatherWarps == 0, "epilogue in A needs the consumer gather");
  static_assert(kGatherWarps == 0 || kGatherWarps == 2 || kGatherWarps == 3, "0, 2 or 3 gather warps");
  static constexpr bool kConsumerGather = kGatherWarps == 0;
  static constexpr int kThreads = 384;
  static constexpr int kBWarp = 2;
  static constexpr bool kZeroWarp = kGatherWarps != 3;  // warp 3 (and 0, 1 when idle) zero-fill, else the B warp
  static constexpr int kGatherThreads = 32 * kGatherWarps;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;  // 128 x 40 + 256 x 232 <= 65536
  // Gather rows of warp w (multiples of 4: one cp.async instruction covers 4 rows).
  __host__ __device__ static constexpr int RowBegin(int w) { return kGatherWarps == 2 ? w * 64 : (w == 0 ? 0 : (w == 1 ? 48 : 96)); }
  __host__ __device__ static constexpr int RowCount(int w) { return kGatherWarps == 2 ? 64 : (w == 3 ? 32 : 48); }
  // Offsets from the 1024-aligned base.
  static constexpr int kAOffset = 0;
  static constexpr int kBOffset = kStagesA * kStageABytes;
  static constexpr int kEpiOffset = kBOffset + kStagesB * kStageBPitch;
  static constexpr int kBarOffset = kEpiOffset + (kEpiInA ? 0 : kConsumerWarps * kEpiWarpBytes);
  // fullA: per stage (producer gather) or per consumer warpgroup and stage (consumer gather).
  static constexpr int kFullA = kBarOffset, kEmptyA = kFullA + 8 * 2 * kStagesA;
  static constexpr int kFullB = kEmptyA + 8 * kStagesA, kEmptyB = kFullB + 8 * kStagesB;
  static constexpr int kTableOffset = kEmptyB + 8 * kStagesB;  // row byte offsets (kBM entries)
  static constexpr int kSmemBytes = kTableOffset + (kConsumerGather ? 0 : kBM * 8) + 1024;  // + align slack
  static_assert(kSmemBytes <= 232448, "over the 227 KB opt-in limit");
};

// Diagnostic switches (timing experiments only; results are wrong when set).
enum Diag : int { kDiagNoA = 1, kDiagNoB = 2, kDiagNoFence = 4, kDiagNoStore = 8, kDiagNoZero = 16, kDiagEmpty = 32 };
// Not a timing switch either: kDiagStamp records %globaltimer at fixed points of each CTA's
// work into g_rg_stamps (bench builds only, -DPIT_RG_EXPERIMENTS; results stay right).
constexpr int kDiagStamp = 128;
// An experiment (right results): kDiagWarm prefetches the live count and each consumer
// warp's first list entries into L1 at kernel entry, before the barrier set-up and
// setmaxnreg, so that the first tile's dependent reads (count, then list) hit L1.
constexpr int kDiagWarm = 256;
// Not a diagnostic (carried in the same flags, like kOutParts): kDualWidth compiles both
// tile widths into the kernel, which takes 128-column tiles when they all fit in one wave
// of the grid at the live count (batch 1, single CTAs; see HalfWidth), else 256. Its
// 16-bit store compiles the plain and the bias-only epilogues alone (the launcher sends
// activations elsewhere): two widths of every activation's store doubled the kernel's code.
constexpr int kDualWidth = 512;
// Not a diagnostic either: kNarrowWidth compiles a second tile width into the 2-CTA
// clustered kernel: 128 x 208 tiles (TileWalk's narrow order), taken when the live rows
// fill whole rounds of them better than pairs of 128 x 256 tiles fill theirs (see
// NarrowTiles): at 1638 live rows of 16384 x 4096 x 4096, 6 pairs x 20 + 20 odd tiles make
// 1.97 rounds where 7 pairs x 16 make 1.7 rounds run as 2 (cuBLAS picks 128 x 208 there).
// Batch 1, C whole, plain or bias-only stores, 16-bit types, N-major B.
constexpr int kNarrowWidth = 1024;
constexpr int kStampSlots = 24;
#ifdef PIT_RG_EXPERIMENTS
__device__ unsigned long long g_rg_stamps[1024][kStampSlots];
// Host side, for the bench accessors of each translation unit that includes this header
// (each has its own g_rg_stamps): copy the first `ctas` CTAs' slots out, or zero them all.
inline cudaError_t CopyStamps(unsigned long long* host, int ctas, bool clear) {
  if (clear) {
    void* dev = nullptr;
    const cudaError_t e = cudaGetSymbolAddress(&dev, g_rg_stamps);
    return e != cudaSuccess ? e : cudaMemset(dev, 0, sizeof g_rg_stamps);
  }
  const int n = ctas < 1024 ? ctas : 1024;
  return cudaMemcpyFromSymbol(host, g_rg_stamps, sizeof(unsigned long long) * kStampSlots * n);
}
#endif
template <int kDiag>
__device__ __forceinline__ void Stamp(int slot, unsigned long long value = ~0ull) {
#ifdef PIT_RG_EXPERIMENTS
  if constexpr ((kDiag & kDiagStamp) != 0) {
    if (value == ~0ull) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(value)::"memory");
    if (blockIdx.x < 1024) g_rg_stamps[blockIdx.x][slot] = value;
  }
#endif
}
// Not a diagnostic, but carried in the same template flags: C as column parts
// (Args::part_n > 0), compiled for the default configuration only.
constexpr int kOutParts = 64;

struct Args {
  const char* a = nullptr;          // A base, bytes
  char* c = nullptr;                // C base, bytes
  const int32_t* lists = nullptr;   // [idx_batch, capacity]
  const int32_t* counts = nullptr;  // [idx_batch]
  int64_t a_batch_bytes = 0;        // M * K * es
  int64_t c_batch_bytes = 0;        // M * N * es
  int64_t a_row_bytes = 0;          // K * es
  int64_t c_row_bytes = 0;          // N * es
  // Column parts (MatmulParams::c_parts > 1): C is part_n-column results c_part[i]; tiles
  // never straddle two parts (part_n % kBN == 0). part_n = 0: C alone.
  char* c_part[MatmulParams::kMaxCParts] = {};
  int part_n = 0, parts = 1;
  int64_t out_row_bytes = 0;  // row pitch of what a tile stores: c_row_bytes, or part_n * es
  int M = 0, N = 0;
  int batch = 1, a_div = 1, b_div = 1, idx_div = 1;  // entry b reads A[b / a_div] ...
  int capacity = 0, tile_h = 1, tile_rows = 0;
  int n_tiles = 0, m_tiles = 0, num_kb = 0;  // m_tiles: static bound ceil(capacity*tile_h/kBM)
  int m_groups = 0;                          // ceil(m_tiles / cluster size)
  int total_tiles = 0;                       // batch * m_groups * n_tiles
  // kDualWidth: the 128-column tile space (row tile groups of one CTA); kNarrowWidth: the
  // 208-column tiles of a row (n_tiles_alt) and whether the launcher allows them (batch 1).
  int n_tiles_alt = 0, total_tiles_alt = 0;
  int narrow_ok = 0;
  EpilogueDev epi;                           // bias + activation (live rows), act(bias) (dead rows)
  // A's rows are packed in list order (row j of entry b: the j-th listed row, zeros past
  // the count) and read by TMA through map_aux instead of gathered by cp.async (consumer
  // gather, one width, no split-K): the M axis's dx, whose dy the weight gradient packs.
  int a_tma = 0;
};

// Where the tile (or dead row) of batch entry b in part `part` stores: the base of C, or
// of the part, for its batch entry (row pitch g.out_row_bytes). Constant indices into the
// parameters: a dynamic one would copy them to the stack.
__device__ __forceinline__ char* OutBase(const Args& g, int b, int part) {
  if (g.part_n == 0) return g.c + static_cast<int64_t>(b) * g.c_batch_bytes;
  char* base = part == 0 ? g.c_part[0] : part == 1 ? g.c_part[1] : part == 2 ? g.c_part[2] : g.c_part[3];
  return base + static_cast<int64_t>(b) * g.M * g.out_row_bytes;
}

// ---------------------------------------------------------------------------------
// PTX helpers
// ---------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

// 16-byte async copy global -> shared, L2 only; src_bytes == 0 writes 16 zero bytes.
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

// The barrier gets one arrival once all of this thread's earlier cp.async are done
// (noinc: that arrival counts against the barrier's expected count).
__device__ __forceinline__ void CpAsyncArriveNoinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void CpAsyncWaitAll() { asm volatile("cp.async.wait_all;" ::: "memory"); }

__device__ __forceinline__ void TmaLoad3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// The same, delivered to every CTA of the cluster in `mask` (same smem offsets), each
// CTA's barrier at the same offset receiving the bytes it got.
__device__ __forceinline__ void TmaLoad3dMulticast(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                                   uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(mask)
      : "memory");
}

__device__ __forceinline__ uint32_t ClusterRank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t ClusterId() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t ClusterCount() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}
// Arrive on the barrier at the same offset in CTA `cta` of the cluster.
__device__ __forceinline__ void MbarArriveRemote(uint32_t bar, uint32_t cta) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(bar), "r"(cta));
  // Default semantics (release, CTA scope), as CUTLASS's ClusterBarrier: an explicit
  // .release.cluster fences this thread's outstanding global stores and cp.async first,
  // which measured 2.2x slower overall.
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}
// A consumer's release of a stage that the loaders of all kCluster CTAs fill (B multicast):
// an arrival on the barrier at `bar` in every CTA of the cluster, or the local one alone.
template <int kCluster>
__device__ __forceinline__ void ArriveEveryCta(uint32_t bar) {
  if constexpr (kCluster == 1) {
    MbarArrive(bar);
  } else {
#pragma unroll
    for (int c = 0; c < kCluster; ++c) MbarArriveRemote(bar, c);
  }
}

// 16 bytes from shared memory (a staged epilogue chunk).
__device__ __forceinline__ uint4 LdShared16(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
  return v;
}

__device__ __forceinline__ void FenceProxyAsync() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

__device__ __forceinline__ void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void WgmmaCommit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Pins the accumulators in place around wgmma waits (no reordering of their uses); all N
// of them (a fixed 128 read past the end of the 128- and 208-column tiles' arrays).
template <int N>
__device__ __forceinline__ void FenceOperands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared-memory matrix descriptor, 128-byte swizzle.
//  K-major tile (rows of 128 B, 8-row atoms of 1024 B): lbo unused (16), sbo = 1024.
//  MN-major tile (blocks of 64 columns x K rows of 128 B): lbo = byte step between
//  64-column blocks, sbo = byte step between 8-row K groups (1024).
__device__ __forceinline__ uint64_t MakeDesc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((saddr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16;
  d |= static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32;
  d |= static_cast<uint64_t>(1) << 62;  // SWIZZLE_128B
  return d;
}

// ---------------------------------------------------------------------------------
// Work decoding, shared by every role (each walks the same sequence)
// ---------------------------------------------------------------------------------
struct Tile {
  int b;       // batch entry
  int m0;      // first gathered (virtual) row of the tile: index into the live rows
  int n0;      // first column
  int live;    // live virtual rows of entry b: min(count, capacity) * tile_h
  const int32_t* list;
  bool shared = false;  // its B stages multicast to the cluster (TileWalk::kShareM CTAs)
  int rank = 0;         // this CTA's rank among them
};

// Tile t of this CTA's walk. With clusters of kCluster CTAs along M, one work item is
// kCluster consecutive row tiles on the same column tile (they share B, multicast); the
// CTA of rank `rank` takes row tile group * kCluster + rank, which may lie past the live
// rows (then all its rows are missing: it computes zeros and stores nothing).
// Work item t's batch entry b, row tile group mg and column tile nt (no device reads);
// kAlt: in the two-width kernel's 128-column tile space.
struct TileCoord {
  int b, mg, nt;
};
template <bool kAlt = false>
__device__ __forceinline__ TileCoord CoordOf(const Args& g, int t) {
  const int n_tiles = kAlt ? g.n_tiles_alt : g.n_tiles;
  const int per_b = g.m_groups * n_tiles;
  const int b = t / per_b;
  const int rem = t - b * per_b;
  const int mg = rem / n_tiles;
  return {b, mg, rem - mg * n_tiles};
}

// Index entry ib's count of live list slots, clamped to [0, capacity].
__device__ __forceinline__ int LiveSlots(const Args& g, int ib) {
  const int count = __ldg(g.counts + ib);
  return count < 0 ? 0 : (count > g.capacity ? g.capacity : count);
}

// Batch 1: the row tiles (kBM rows) that the live slots cover.
__device__ __forceinline__ int LiveRowTiles(const Args& g) { return (LiveSlots(g, 0) * g.tile_h + kBM - 1) / kBM; }

template <int kCluster, int kTileN = kBN, bool kAlt = false>
__device__ __forceinline__ bool DecodeTile(const Args& g, int t, int rank, Tile& tile) {
  const auto [b, mg, nt] = CoordOf<kAlt>(g, t);
  const int ib = b / g.idx_div;
  const int live = LiveSlots(g, ib) * g.tile_h;
  if (mg * kCluster * kBM >= live) return false;
  tile.b = b;
  tile.m0 = (mg * kCluster + rank) * kBM;
  tile.n0 = nt * kTileN;
  tile.live = live;
  tile.list = g.lists + static_cast<int64_t>(ib) * g.capacity;
  return true;
}

// The number of tiles of the walk of configuration Cfg (its own tile space, or the
// two-width kernel's 128-column one).
template <class Cfg>
__device__ __forceinline__ int TotalTiles(const Args& g) {
  return Cfg::kAltSpace ? g.total_tiles_alt : g.total_tiles;
}

// kDualWidth: 128-column tiles when all live ones fit in one wave of the grid (then each
// SM's share of the k-loop halves; measured 20 % faster on BERT's 768-wide products),
// else 256 (docs/notes/sm90_row_gather.md, "128-column tiles"). Batch 1; every role
// decides the same from the count.
__device__ __forceinline__ bool HalfWidth(const Args& g) {
  return LiveRowTiles(g) * g.n_tiles_alt <= static_cast<int>(gridDim.x);
}

// kNarrowWidth: whether the clusters walk 128 x 208 tiles (TileWalk's narrow order) rather
// than items of kCluster 128 x 256 row tiles: whichever takes less tile width x rounds, the
// narrow rounds counted 3 % longer (the odd row tile's tiles without multicast, and the 48
// columns of B loaded unused). Batch 1; every role decides the same from the count.
template <int kCluster>
__device__ __forceinline__ bool NarrowTiles(const Args& g) {
  if (!g.narrow_ok) return false;
  const int rt = LiveRowTiles(g);
  if (rt == 0) return false;
  const int ctas = static_cast<int>(gridDim.x), clusters = ctas / kCluster;
  const int rounds_wide = ((rt + kCluster - 1) / kCluster * g.n_tiles + clusters - 1) / clusters;
  const int pair_items = rt / kCluster * g.n_tiles_alt, odd = rt % kCluster ? g.n_tiles_alt : 0;
  const int busiest = pair_items / clusters + (pair_items % clusters ? 1 : 0);  // a CTA's pair items
  const int even = (kCluster * pair_items + odd + ctas - 1) / ctas;  // with the odd tiles spread
  const int rounds_narrow = busiest > even ? busiest : even;
  return rounds_narrow * 208 * 103 < rounds_wide * 256 * 100;
}

// A role's body f(C{}) for the tile width it runs: C = Cfg::Half where kDual and
// HalfWidth, Cfg::Narrow where kNarrow and NarrowTiles, else Cfg (without the flags no
// other width's code is compiled in).
template <class Cfg, bool kDual, bool kNarrow = false, int kCluster = 1, class F>
__device__ __forceinline__ void WithTileWidth(const Args& g, F&& f) {
  if constexpr (kDual) {
    if (HalfWidth(g)) return f(typename Cfg::Half{});
  }
  if constexpr (kNarrow) {
    if (NarrowTiles<kCluster>(g)) return f(typename Cfg::Narrow{});
  }
  f(Cfg{});
}

// Matrix row of live virtual row j of a tile's entry, or -1 (past the count, a bad id,
// or a row past M in the last block).
__device__ __forceinline__ int RowOf(const Args& g, const Tile& tile, int j) {
  if (j >= tile.live) return -1;
  int slot = j, within = 0;
  if (g.tile_h != 1) {
    slot = j / g.tile_h;
    within = j - slot * g.tile_h;
  }
  const int id = __ldg(tile.list + slot);
  if (id < 0 || id >= g.tile_rows) return -1;
  const int64_t row = static_cast<int64_t>(id) * g.tile_h + within;
  return row < g.M ? static_cast<int>(row) : -1;
}

// Split-K (kSplitK, batch 1 only): the kCluster CTAs of a cluster form groups of S that
// share one output tile, CTA r of a group taking k-blocks r, r + S, ...; their fp32
// partials meet in shared memory and are summed over the group by DSMEM reads (see
// ReduceSplit). S is decided on the device from the live row count, the same in every CTA:
// the largest power of two <= kCluster that still gives every group at most one live tile
// (then the stages are idle once a group's tile is done, so they can hold the partials),
// and S = 1 (independent CTAs, no reduction) when the live tiles fill the grid anyway.
template <int kCluster>
__device__ __forceinline__ int SplitOf(const Args& g) {
  const int items = LiveRowTiles(g) * g.n_tiles;
  const int clusters = static_cast<int>(ClusterCount());
  int s = kCluster;
  while (s > 1 && (items > clusters * (kCluster / s) || g.num_kb < s)) s >>= 1;
  return s;
}

// ---------------------------------------------------------------------------------
// Roles. Every role walks the same tiles: t = cluster id, += cluster count (split-K:
// t = group id, += group count), each CTA over its k-blocks kfirst, kfirst + kstep, ...
// ---------------------------------------------------------------------------------
template <int kCluster, bool kSplitK = false>
struct Walk {
  static constexpr int kM = kSplitK ? 1 : kCluster;  // row tiles per work item (B multicast)
  int first, step, rank;
  int kfirst = 0, kstep = 1;
  __device__ __forceinline__ Walk() {  // no split (also what the grouped kernel uses)
    static_assert(!kSplitK, "split-K reads the live count: Walk(args)");
    if constexpr (kCluster == 1) {
      first = blockIdx.x, step = gridDim.x, rank = 0;
    } else {
      first = ClusterId(), step = ClusterCount(), rank = ClusterRank();
    }
  }
  __device__ __forceinline__ explicit Walk(const Args& g) {
    if constexpr (kSplitK) {
      const int s = SplitOf<kCluster>(g);
      const int crank = static_cast<int>(ClusterRank());
      first = static_cast<int>(ClusterId()) * (kCluster / s) + crank / s;
      step = static_cast<int>(ClusterCount()) * (kCluster / s);
      rank = 0, kfirst = crank % s, kstep = s;
    } else {
      *this = Walk();
    }
  }
};

// The tiles of one CTA, in the order every role of it walks them (Next() decodes the next
// one with live rows). Ordinary configurations: Walk's items, kM row tiles each (B shared
// by multicast when kM > 1). Narrow tiles (Config::Narrow, clusters of 2): first the pairs of
// live row tiles, items of 2 row tiles x 208 columns dealt over the clusters as the wide
// ones are (B multicast), then, when the live row tiles are odd, the last one's column tiles
// dealt one a CTA (B loaded alone) from the first CTA whose cluster got a pair item fewer,
// so that the odd row tile costs neither a pair item per column tile nor a round.
template <class Cfg, int kCluster, bool kSplitK, bool kNarrow = Cfg::kNarrow>
struct TileWalk {
  using W = Walk<kCluster, kSplitK>;
  static constexpr int kShareM = W::kM;  // CTAs a shared tile's B stages reach
  W w;
  int t;
  __device__ __forceinline__ explicit TileWalk(const Args& g) : w(g), t(w.first) {}
  __device__ __forceinline__ int kfirst() const { return w.kfirst; }
  __device__ __forceinline__ int kstep() const { return w.kstep; }
  __device__ __forceinline__ bool Next(const Args& g, Tile& tile) {
    for (; t < TotalTiles<Cfg>(g); t += w.step) {
      if (DecodeTile<W::kM, Cfg::kBN, Cfg::kAltSpace>(g, t, w.rank, tile)) {
        t += w.step;
        tile.shared = W::kM > 1, tile.rank = w.rank;
        return true;
      }
    }
    return false;
  }
};

template <class Cfg, int kCluster, bool kSplitK>
struct TileWalk<Cfg, kCluster, kSplitK, true> {
  static_assert(kCluster == 2 && !kSplitK, "narrow tiles: 2-CTA clusters");
  static constexpr int kShareM = kCluster;
  int phase = 0, t, step, end;
  int rt, nta, live;
  __device__ __forceinline__ explicit TileWalk(const Args& g) {
    live = LiveSlots(g, 0) * g.tile_h;
    rt = (live + kBM - 1) / kBM;
    nta = g.n_tiles_alt;
    t = static_cast<int>(ClusterId()), step = static_cast<int>(ClusterCount()), end = rt / 2 * nta;
  }
  __device__ __forceinline__ int kfirst() const { return 0; }
  __device__ __forceinline__ int kstep() const { return 1; }
  __device__ __forceinline__ bool Next(const Args& g, Tile& tile) {
    tile.b = 0, tile.live = live, tile.list = g.lists;
    if (phase == 0) {
      if (t < end) {
        const int pair = t / nta, nt = t - pair * nta;
        tile.rank = static_cast<int>(ClusterRank());
        tile.m0 = (pair * 2 + tile.rank) * kBM, tile.n0 = nt * Cfg::kBN, tile.shared = true;
        t += step;
        return true;
      }
      // The odd row tile: column tile j to CTA (2 * rem + j) mod G, where the clusters below
      // rem (pair items mod clusters) took one pair item more.
      const int G = static_cast<int>(gridDim.x), rem = end % step;
      phase = 1;
      t = (static_cast<int>(blockIdx.x) - kCluster * rem + G) % G, step = G, end = (rt & 1) ? nta : 0;
    }
    if (t < end) {
      tile.rank = 0, tile.m0 = (rt - 1) * kBM, tile.n0 = t * Cfg::kBN, tile.shared = false;
      t += step;
      return true;
    }
    return false;
  }
};

// A consumer warpgroup's release of one of `tile`'s B stages, whose empty barrier expects
// the arrivals of kBCluster CTAs' warpgroups: an arrival on every CTA the stage was
// multicast to, else (a tile loaded alone: kBCluster is 1, or a narrow tile that a CTA of a
// cluster launch loaded alone) all kBCluster arrivals on the local barrier.
template <class TW, int kBCluster>
__device__ __forceinline__ void ReleaseTileB(const Tile& tile, uint32_t bar) {
  static_assert(TW::kShareM == 1 || TW::kShareM == kBCluster, "a stage is shared by the cluster or local");
  if (tile.shared) {
    ArriveEveryCta<TW::kShareM>(bar);
  } else if constexpr (kBCluster == 1) {
    MbarArrive(bar);
  } else {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(kBCluster) : "memory");
  }
}

// A pipeline stage counter.
template <int kStages>
struct Pipe {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void Next() {
    if (++stage == kStages) stage = 0, phase ^= 1;
  }
};

// A rows by cp.async (gather warps). Lane l copies 16-byte chunk (l % 8) of rows
// l/8 + 4i of its warp's rows, so 8 lanes read one row's 128 contiguous bytes and the
// smem chunk lands at (chunk ^ (row % 8)): the 128B swizzle.
template <class Cfg, int kCluster, int kDiag, int kWarp, bool kSplitK>
__device__ __forceinline__ void GatherA(const Args& g, char* smem, int lane) {
  constexpr int row0 = Cfg::RowBegin(kWarp), nrows = Cfg::RowCount(kWarp);
  int64_t* table = reinterpret_cast<int64_t*>(smem + Cfg::kTableOffset) + row0;
  const uint32_t base = SmemAddr(smem);
  const int chunk = lane & 7;
  static_assert(!Cfg::kNarrow, "narrow tiles: consumer gather");
  using W = Walk<kCluster, kSplitK>;
  const W w(g);
  Pipe<Cfg::kStagesA> pipe;
  for (int t = w.first; t < TotalTiles<Cfg>(g); t += w.step) {
    Tile tile;
    if (!DecodeTile<W::kM, Cfg::kBN, Cfg::kAltSpace>(g, t, w.rank, tile)) continue;
    const char* a_b = g.a + static_cast<int64_t>(tile.b / g.a_div) * g.a_batch_bytes;
    __syncwarp();
    for (int r = lane; r < nrows; r += 32) {
      const int row = RowOf(g, tile, tile.m0 + row0 + r);
      table[r] = row < 0 ? int64_t{-1} : row * g.a_row_bytes;
    }
    __syncwarp();
    for (int kb = w.kfirst; kb < g.num_kb; kb += w.kstep) {
      MbarWait(base + Cfg::kEmptyA + pipe.stage * 8, pipe.phase ^ 1);
      const uint32_t sa = base + Cfg::kAOffset + pipe.stage * kStageABytes;
      const int64_t kbyte = static_cast<int64_t>(kb) * kBKBytes + chunk * 16;
      const bool k_ok = kbyte < g.a_row_bytes;
      if constexpr (!(kDiag & kDiagNoA)) {
#pragma unroll 4
        for (int rl = lane >> 3; rl < nrows; rl += 4) {
          const int r = row0 + rl;
          const int64_t off = table[rl];
          const bool ok = k_ok && off >= 0;
          const char* src = ok ? a_b + off + kbyte : g.a;
          CpAsync16(sa + r * kBKBytes + ((chunk ^ (r & 7)) << 4), src, ok ? 16u : 0u);
        }
      }
      CpAsyncArriveNoinc(base + Cfg::kFullA + pipe.stage * 8);
      pipe.Next();
    }
  }
  CpAsyncWaitAll();
}

// Zero-fill of the dead rows (list slots past the count hold -1 - id). One unit = one
// row of one batch entry; units are dealt round-robin over all CTAs, continuing across
// batch entries. Resumable: Next() writes one row (the whole warp) and returns false once
// this CTA has none left (the B warp interleaves it with its stages); RunAll() is a
// dedicated warp's whole share. kParts (C as column parts, Args::part_n > 0): a unit is
// still a row; Next() writes one part of it per call and reads the list once per row (a
// unit per part and row tripled a warp's serial list reads: +4 us on BERT's qkv, H100).
template <bool kParts>
struct ZeroFill {
  int b = -1, u = 0, units = 0, count = 0, offset = 0;
  int worker = blockIdx.x, G = gridDim.x;  // this warp's share: units = worker (mod G)
  int part = 0;                            // kParts: the part Next() writes of row r
  int64_t r = -1;
  __device__ __forceinline__ ZeroFill() {}
  __device__ __forceinline__ ZeroFill(int k, int per_cta) : worker(blockIdx.x * per_cta + k), G(gridDim.x * per_cta) {}
  // Where batch entry b's rows of `part` start (row pitch g.out_row_bytes, which is
  // c_row_bytes without parts); the plain kernels skip OutBase's runtime part check.
  __device__ __forceinline__ static char* Base(const Args& g, int b, int part) {
    if constexpr (kParts) return OutBase(g, b, part);
    return g.c + static_cast<int64_t>(b) * g.c_batch_bytes;
  }
  // The next unit without its list read: false once none is left; *pos = its list entry
  // (an index into g.lists), *within = its row inside the tile. Its batch entry is b.
  __device__ __forceinline__ bool NextSlot(const Args& g, int64_t* pos, int* within) {
    while (b < 0 || u >= units) {
      if (b >= 0) offset = (offset + units % G) % G;  // 32-bit: no 64-bit modulo call
      if (++b >= g.batch) return false;
      count = LiveSlots(g, b / g.idx_div);
      units = g.epi.skip_dead ? 0 : (g.capacity - count) * g.tile_h;  // skip_dead: none to write
      u = worker - offset;
      if (u < 0) u += G;
    }
    int slot = u;
    *within = 0;
    if (g.tile_h != 1) {
      slot = u / g.tile_h;
      *within = u - slot * g.tile_h;
    }
    u += G;
    *pos = static_cast<int64_t>(b / g.idx_div) * g.capacity + count + slot;
    return true;
  }
  // A unit's row (its list entry read), or -1 when it has nothing to write (a bad id, or a
  // row past M in the last block).
  __device__ __forceinline__ static int64_t RowOf(const Args& g, int64_t pos, int within) {
    const int id = -1 - __ldg(g.lists + pos);
    if (id < 0 || id >= g.tile_rows) return -1;
    const int64_t row = static_cast<int64_t>(id) * g.tile_h + within;
    return row < g.M ? row : -1;
  }
  __device__ __forceinline__ bool NextRow(const Args& g, int64_t* r) {
    int64_t pos;
    int within;
    if (!NextSlot(g, &pos, &within)) return false;
    *r = RowOf(g, pos, within);
    return true;
  }
  // A dedicated zero-fill warp's whole share. Dead-row copies go 32 units at a time: lane j
  // reads unit j's list entry (32 reads in flight, not one after another), then the warp
  // stores the 32 rows one 512-byte column block at a time, loading each block of the dead
  // row once. Row by row (Next) each store of a copy waited on its load: BERT's qkv product
  // with column parts ran 25.0 us, batched 21.2 (H100). Zeros stay row by row: batched,
  // their bursts of stores slowed the product (18.0 -> 19.9 us on the same qkv).
  __device__ __forceinline__ void RunAll(const Args& g, int lane) {
    if (!g.epi.dead) {
      while (Next(g, lane)) {
      }
      return;
    }
    const int parts = kParts ? g.parts : 1;
    const int64_t row_bytes = g.out_row_bytes;
    const int n16 = static_cast<int>(row_bytes >> 4);  // N % 8 == 0: whole 16-byte chunks
    for (;;) {
      int64_t pos = -1;
      int within = 0, mine_b = 0, n = 0;
      for (; n < 32; ++n) {
        int64_t p;
        int w;
        if (!NextSlot(g, &p, &w)) break;
        if (lane == n) pos = p, within = w, mine_b = b;
      }
      if (n == 0) return;
      const int64_t r = pos >= 0 ? RowOf(g, pos, within) : -1;
#pragma unroll 1
      for (int part = 0; part < parts; ++part) {
        const uint4* dead = reinterpret_cast<const uint4*>(g.epi.dead + part * row_bytes);
#pragma unroll 1
        for (int x0 = 0; x0 < n16; x0 += 32) {
          const int x = x0 + lane;
          const uint4 v = x < n16 ? __ldg(dead + x) : make_uint4(0, 0, 0, 0);
#pragma unroll 1
          for (int j = 0; j < n; ++j) {
            const int64_t rj = __shfl_sync(0xffffffffu, r, j);
            const int bj = __shfl_sync(0xffffffffu, mine_b, j);
            if (rj >= 0 && x < n16) __stcs(reinterpret_cast<uint4*>(Base(g, bj, part) + rj * row_bytes) + x, v);
          }
        }
      }
    }
  }
  // One row of `row_bytes` (a multiple of 16: N % 8 == 0) with the whole warp: a copy of
  // the dead row `dead` (16-byte aligned, checked by the launcher) or zeros.
  __device__ __forceinline__ static void WriteRow(char* dst, const char* dead, int64_t row_bytes, int lane) {
    uint4* out = reinterpret_cast<uint4*>(dst);
    const int n16 = static_cast<int>(row_bytes >> 4);
    if (dead) {
      const uint4* src = reinterpret_cast<const uint4*>(dead);
      for (int x = lane; x < n16; x += 32) __stcs(out + x, __ldg(src + x));
    } else {
      for (int x = lane; x < n16; x += 32) __stcs(out + x, make_uint4(0, 0, 0, 0));
    }
  }
  // Writes one row (one part of it with kParts) with the whole warp; false once none is left.
  __device__ __forceinline__ bool Next(const Args& g, int lane) {
    if (part == 0 && !NextRow(g, &r)) return false;  // part stays 0 without kParts
    if (r >= 0)
      WriteRow(Base(g, b, part) + r * g.out_row_bytes, g.epi.dead ? g.epi.dead + part * g.out_row_bytes : nullptr,
               g.out_row_bytes, lane);
    if (kParts && ++part == g.parts) part = 0;
    return true;
  }
};

// The zero-fill of a kernel instantiated with template flags kDiag.
template <int kDiag>
using ZeroFillOf = ZeroFill<(kDiag & kOutParts) != 0>;

// One B stage by TMA (lane 0 of the B warp): wait until the consumers (of every CTA in
// the cluster) freed the stage, announce 32 KB, load this CTA's part (multicast).
template <class Cfg, int kKind, bool kTransB, int kCluster, int kDiag>
__device__ __forceinline__ void IssueB(const CUtensorMap* map, uint32_t base, int n0, int bb, int kb, int stage,
                                       uint32_t phase, int rank) {
  constexpr int kBKElems = kKind == kTf32 ? 32 : 64;
  constexpr int kPart = Cfg::kLoadN / kCluster;  // columns this CTA loads
  MbarWait(base + Cfg::kEmptyB + stage * 8, phase ^ 1);
  const uint32_t full = base + Cfg::kFullB + stage * 8;
  if constexpr (kDiag & kDiagNoB) {
    MbarArrive(full);
  } else {
    MbarArriveExpectTx(full, Cfg::kStageBBytes);
    const uint32_t sb = base + Cfg::kBOffset + stage * Cfg::kStageBPitch;
    if constexpr (kTransB) {
      // B stored [N, K]: one box of kPart rows (n) x 128 bytes (k): K-major tile.
      const uint32_t dst = sb + rank * kPart * kBKBytes;
      if constexpr (kCluster == 1) {
        TmaLoad3d(dst, map, kb * kBKElems, n0 + rank * kPart, bb, full);
      } else {
        TmaLoad3dMulticast(dst, map, kb * kBKElems, n0 + rank * kPart, bb, full, (1u << kCluster) - 1);
      }
    } else {
      // B stored [K, N]: boxes of 64 rows (k) x 64 columns (n) = 8 KB each: N-major tile.
#pragma unroll
      for (int j = 0; j < kPart / 64; ++j) {
        const int jj = rank * (kPart / 64) + j;
        if constexpr (kCluster == 1) {
          TmaLoad3d(sb + jj * 8192, map, n0 + 64 * jj, kb * kBKElems, bb, full);
        } else {
          TmaLoad3dMulticast(sb + jj * 8192, map, n0 + 64 * jj, kb * kBKElems, bb, full, (1u << kCluster) - 1);
        }
      }
    }
  }
}

// B tiles by TMA (lane 0 of the B warp). Zero fill past N and K. With a cluster, CTA
// rank r loads columns [r * 256/kCluster, (r+1) * 256/kCluster) of the tile and
// multicasts them to all CTAs of the cluster; every CTA's full barrier expects the whole
// 32 KB. Without a zero-fill warp, the whole warp writes one dead row per stage here.
template <class Cfg, int kKind, bool kTransB, int kCluster, int kDiag, bool kSplitK>
__device__ __forceinline__ void LoadB(const Args& g, const CUtensorMap* map, char* smem, int lane) {
  ZeroFillOf<kDiag> zf;
  bool zero_left = !Cfg::kZeroWarp;
  const uint32_t base = SmemAddr(smem);
  using TW = TileWalk<Cfg, kCluster, kSplitK>;
  TW walk(g);
  Pipe<Cfg::kStagesB> pipe;
  bool first = true;
  for (Tile tile; walk.Next(g, tile);) {
    const int bb = tile.b / g.b_div;
    if (first && lane == 0) Stamp<kDiag>(17);
    for (int kb = walk.kfirst(); kb < g.num_kb; kb += walk.kstep()) {
      if (lane == 0) {
        if (tile.shared)
          IssueB<Cfg, kKind, kTransB, TW::kShareM, kDiag>(map, base, tile.n0, bb, kb, pipe.stage, pipe.phase, tile.rank);
        else
          IssueB<Cfg, kKind, kTransB, 1, kDiag>(map, base, tile.n0, bb, kb, pipe.stage, pipe.phase, 0);
      }
      if (first && lane == 0) Stamp<kDiag>(2);
      first = false;
      __syncwarp();
      if (zero_left) zero_left = zf.Next(g, lane);
      pipe.Next();
    }
  }
  if (zero_left)
    while (zf.Next(g, lane)) {
    }
  if (lane == 0) Stamp<kDiag>(3);
}

template <int kKind, bool kTransB, int kN = kBN>
__device__ __forceinline__ void Mma(float* acc, uint64_t da, uint64_t db) {
  static_assert(kN == 256 || kN == 128 || (kN == 208 && kKind != kTf32 && !kTransB), "m64n256, m64n208 or m64n128");
  if constexpr (kKind == kBf16) {
    if constexpr (kN == 256) sm90::WgmmaBf16N256<0, kTransB ? 0 : 1>(acc, da, db);
    else if constexpr (kN == 208) sm90::WgmmaBf16N208<0, 1>(acc, da, db);
    else sm90::WgmmaBf16N128<0, kTransB ? 0 : 1>(acc, da, db);
  } else if constexpr (kKind == kF16) {
    if constexpr (kN == 256) sm90::WgmmaF16N256<0, kTransB ? 0 : 1>(acc, da, db);
    else if constexpr (kN == 208) sm90::WgmmaF16N208<0, 1>(acc, da, db);
    else sm90::WgmmaF16N128<0, kTransB ? 0 : 1>(acc, da, db);
  } else {
    if constexpr (kN == 256) sm90::WgmmaTf32N256(acc, da, db);
    else sm90::WgmmaTf32N128(acc, da, db);
  }
}

// Two output elements (fp32) as the 4 bytes of C's type (bf16x2 / f16x2), or 8 bytes of f32.
template <int kKind>
__device__ __forceinline__ uint32_t Pack2(float x, float y) {
  if constexpr (kKind == kBf16) {
    __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(x, y);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

template <int kKind>
__device__ __forceinline__ float2 Unpack2(uint32_t w) {
  if constexpr (kKind == kBf16) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
  } else {
    return __half22float2(*reinterpret_cast<const __half2*>(&w));
  }
}

// The epilogue on 8 consecutive 16-bit values of C and their 8 biases b: act(v + b);
// kPre: also z = v + b (the activation's input, rounded) in *pre.
template <int kKind, int kAct, bool kPre = false>
__device__ __forceinline__ uint4 EpilogueChunk(uint4 v, uint4 b, uint4* pre = nullptr) {
  uint32_t w[4] = {v.x, v.y, v.z, v.w}, z[4];
  const uint32_t bw[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 x = Unpack2<kKind>(w[k]), y = Unpack2<kKind>(bw[k]);
    const float u0 = x.x + y.x, u1 = x.y + y.y;
    if constexpr (kPre) z[k] = Pack2<kKind>(u0, u1);
    w[k] = Pack2<kKind>(ActivateT<kAct>(u0), ActivateT<kAct>(u1));
  }
  if constexpr (kPre) *pre = make_uint4(z[0], z[1], z[2], z[3]);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Split-K partial tiles in shared memory (this kernel's split-K and the grouped weight
// gradient's): consumer thread ct (of 256) holds 2 * kPairs fp32 accumulators (128 for a
// 256-column tile), stored as kPairs pairs, pair p at (p * 256 + ct) * 8 from `base`
// (conflict-free).
template <int kPairs = 64>
__device__ __forceinline__ void StorePartials(uint32_t base, int ct, const float* acc) {
#pragma unroll
  for (int p = 0; p < kPairs; ++p)
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(base + (p * 256 + ct) * 8), "f"(acc[2 * p]),
                 "f"(acc[2 * p + 1])
                 : "memory");
}

// The pairs p = rank, rank + S, ... (< 64) of consumer thread ct, each summed over the
// partials of cluster ranks first, first + 1, ..., first + S - 1 in that order (DSMEM
// reads: a fixed summation order, deterministic), handed to f(p, sum). The reads of
// several pairs are issued before any is summed (8 in flight; with 16 the split-K kernels
// spilled): one pair at a time, each pair waited a whole DSMEM round trip.
template <int S, class F, int kAllPairs = 64>
__device__ __forceinline__ void SumPairsOf(uint32_t base, int ct, int rank, int first, F&& f) {
  constexpr int kBatch = S >= 8 ? 1 : 8 / S;  // pairs per batch
  constexpr int kPairs = kAllPairs / S;         // pairs of this rank
  static_assert(kAllPairs % S == 0 && kPairs % kBatch == 0, "S in {1, 2, 4, 8}");
  uint32_t remote[S];  // rank first + s's view of this thread's pair 0
#pragma unroll
  for (int s = 0; s < S; ++s)
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote[s]) : "r"(base + ct * 8), "r"(first + s));
#pragma unroll 1
  for (int i0 = 0; i0 < kPairs; i0 += kBatch) {
    float px[kBatch][S], py[kBatch][S];
#pragma unroll
    for (int i = 0; i < kBatch; ++i)
#pragma unroll
      for (int s = 0; s < S; ++s)
        asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];"
                     : "=f"(px[i][s]), "=f"(py[i][s])
                     : "r"(remote[s] + (rank + S * (i0 + i)) * 256 * 8)
                     : "memory");
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      float x = 0.f, y = 0.f;
#pragma unroll
      for (int s = 0; s < S; ++s) x += px[i][s], y += py[i][s];
      f(rank + S * (i0 + i), make_float2(x, y));
    }
  }
}

// The same for a runtime S of 1, 2, 4 or 8.
template <class F>
__device__ __forceinline__ void SumPairs(uint32_t base, int ct, int rank, int S, int first, F&& f) {
  switch (S) {
    case 1: SumPairsOf<1>(base, ct, rank, first, f); break;
    case 2: SumPairsOf<2>(base, ct, rank, first, f); break;
    case 4: SumPairsOf<4>(base, ct, rank, first, f); break;
    default: SumPairsOf<8>(base, ct, rank, first, f); break;
  }
}

// Consumer-side gather of A (Config kGatherWarps == 0). Each consumer thread owns
// chunk (lane % 8) of rows warp*16 + lane/8 + 4i (i < 4) of its warpgroup's 64 rows
// (the rows its warp computes), and walks the same (tile, k-block) sequence as the
// compute loop, S stages ahead: Issue() loads the next k-block into the stage that the
// warpgroup's previous wgmma has just released.
template <class Cfg, class TW, bool kNoA = false>
struct ALoader {
  TW walk;  // a copy of the consumers' walk, ahead of it
  int kb = 0, stage = 0;
  bool valid = false;
  const char* a_b = nullptr;
  int64_t off[4];  // row byte offsets (or -1: no row)
  int m0 = 0, a_entry = 0;              // Args::a_tma: the tile's first packed row, A's batch entry
  const CUtensorMap* map_a = nullptr;  // Args::a_tma: the packed rows
  __device__ __forceinline__ explicit ALoader(const Args& g) : walk(g) {}
  __device__ __forceinline__ void Start(const Args& g, int wg, int warp, int lane) {
    kb = walk.kfirst();
    NextTile(g, wg, warp, lane);
  }
  __device__ __forceinline__ void NextTile(const Args& g, int wg, int warp, int lane) {
    Tile tile;
    valid = walk.Next(g, tile);
    if (valid) TakeRows(g, tile, wg, warp, lane);
  }
  // This thread's 4 rows of `tile` (their byte offsets, -1: no row) and its batch entry's A.
  __device__ __forceinline__ void TakeRows(const Args& g, const Tile& tile, int wg, int warp, int lane) {
    a_b = g.a + static_cast<int64_t>(tile.b / g.a_div) * g.a_batch_bytes;
    m0 = tile.m0, a_entry = tile.b / g.a_div;
    if (g.a_tma) return;  // packed rows: no lookups
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = RowOf(g, tile, tile.m0 + wg * 64 + warp * 16 + (lane >> 3) + 4 * i);
      off[i] = row < 0 ? int64_t{-1} : row * g.a_row_bytes;
    }
  }
  __device__ __forceinline__ void Issue(const Args& g, uint32_t base, int wg, int warp, int lane) {
    if (!valid) return;
    const int chunk = lane & 7;
    const int64_t kbyte = static_cast<int64_t>(kb) * kBKBytes + chunk * 16;
    const bool k_ok = kbyte < g.a_row_bytes;
    const uint32_t sa = base + Cfg::kAOffset + stage * kStageABytes + wg * (64 * kBKBytes);
    const uint32_t full = base + Cfg::kFullA + (wg * Cfg::kStagesA + stage) * 8;
    if (g.a_tma) {
      // The warpgroup's 64 packed rows x 128 bytes in one box, in the layout the gather
      // writes (128B swizzle); TMA zero-fills past K and past the packed rows.
      if (warp == 0 && lane == 0) {
        MbarArriveExpectTx(full, 64 * kBKBytes);
        TmaLoad3d(sa, map_a, kb * (kBKBytes / 2), m0 + wg * 64, a_entry, full);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int rl = warp * 16 + (lane >> 3) + 4 * i;
        const bool ok = k_ok && off[i] >= 0;
        if constexpr (!kNoA)  // kDiagNoA: the barrier's arrivals without the copies (timing only)
          CpAsync16(sa + rl * kBKBytes + ((chunk ^ (rl & 7)) << 4), ok ? a_b + off[i] + kbyte : g.a, ok ? 16u : 0u);
      }
      CpAsyncArriveNoinc(full);
    }
    if (++stage == Cfg::kStagesA) stage = 0;
    kb += walk.kstep();
    if (kb >= g.num_kb) {
      kb = walk.kfirst();
      NextTile(g, wg, warp, lane);
    }
  }
};

// A split-K group's tile, as one consumer thread sees it (for ReduceSplit).
struct SplitTile {
  bool live = false;
  int n0 = 0;
  int row0 = -1, row8 = -1;  // matrix rows of the thread's accumulator fragment rows lane/4, lane/4 + 8
  char* c_b = nullptr;
};

// 16-bit C of one tile: through the warp's staging rows, 64 columns at a time, then
// 16-byte stores (8 lanes cover one row's 128 contiguous bytes). Staging: padded rows of
// 144 B (own area), or with kEpiInA the warp's 16 rows of the freed A stage (128 B rows,
// the 16-byte chunk XOR-swizzled by row % 8: conflict-free both ways). kAct: -1 no
// epilogue, else act(v + bias) with that activation code (0: bias only), on the staged
// values (rounded once more; the product was rounded when staged). kPre: v + bias also
// stored to Epilogue::pre (C's layout, no parts), the activation's input for its gradient.
template <class Cfg, int kKind, int kAct, bool kPre = false>
__device__ __forceinline__ void StoreTile16(const Args& g, const float (&acc)[Cfg::kBN / 2], int n0, const int (&rows)[4],
                                            char* c_b, uint32_t stage_s, int lane) {
  constexpr int kPitch = Cfg::kEpiInA ? kBKBytes : kEpiPitch;
  auto chunk_at = [](int row, int c) { return Cfg::kEpiInA ? ((c ^ (row & 7)) << 4) : (c << 4); };
  const int fr = lane >> 2, fq = lane & 3;
  // 64-column chunks; a 208-column tile's last one holds 16 (the lanes past them idle).
  constexpr int kChunks = (Cfg::kBN + 63) / 64;
#pragma unroll
  for (int ch = 0; ch < kChunks; ++ch) {
    if (n0 + 64 * ch >= g.N) break;
    const bool in_tile = 64 * ch + 8 * (lane & 7) < Cfg::kBN;
    const int col = in_tile ? n0 + 64 * ch + 8 * (lane & 7) : g.N;  // g.N: stores nothing
    // This lane's 8 biases of the chunk, loaded before the staging so that the load's
    // latency is hidden (16-byte aligned: checked by the launcher).
    // Float32 biases (bias_f32; 32-byte aligned: N % 8 == 0) are rounded to C's dtype after
    // the staging: converting them here would wait for the loads before it.
    uint4 bias8 = make_uint4(0, 0, 0, 0);
    float4 lo = make_float4(0.f, 0.f, 0.f, 0.f), hi = lo;
    if constexpr (kAct >= 0) {
      if (g.epi.bias && col < g.N) {
        if (g.epi.bias_f32) {
          lo = __ldg(reinterpret_cast<const float4*>(g.epi.bias) + (col >> 2));
          hi = __ldg(reinterpret_cast<const float4*>(g.epi.bias) + (col >> 2) + 1);
        } else {
          bias8 = __ldg(reinterpret_cast<const uint4*>(g.epi.bias) + (col >> 3));
        }
      }
    }
    __syncwarp();  // the previous chunk's reads are done
#pragma unroll
    for (int jj = 0; jj < 8; ++jj) {
      const int j = ch * 8 + jj;
      if (j >= Cfg::kBN / 8) break;
      const uint32_t o0 = fr * kPitch + chunk_at(fr, jj) + fq * 4;
      const uint32_t o1 = (fr + 8) * kPitch + chunk_at(fr + 8, jj) + fq * 4;
      asm volatile("st.shared.b32 [%0], %1;" ::"r"(stage_s + o0), "r"(Pack2<kKind>(acc[4 * j], acc[4 * j + 1]))
                   : "memory");
      asm volatile("st.shared.b32 [%0], %1;" ::"r"(stage_s + o1), "r"(Pack2<kKind>(acc[4 * j + 2], acc[4 * j + 3]))
                   : "memory");
    }
    __syncwarp();
    if constexpr (kAct >= 0) {
      if (g.epi.bias_f32)
        bias8 = make_uint4(Pack2<kKind>(lo.x, lo.y), Pack2<kKind>(lo.z, lo.w), Pack2<kKind>(hi.x, hi.y),
                           Pack2<kKind>(hi.z, hi.w));
    }
    // The 4 rows in a rolled loop (8 independent values per pass), which keeps the code
    // 4x smaller. Unrolled, the GELU path ran ~3x slower inside a model than back to back
    // (its instructions fetched cold on every call, it seems), and BERT's ffn_in without
    // an activation 20.7 us in the model against 18.2 with ReLU's rolled loop (H100).
#pragma unroll 1
    for (int i = 0; i < 4; ++i) {
      const int r = (lane >> 3) + 4 * i;
      uint4 v = LdShared16(stage_s + r * kPitch + chunk_at(r, lane & 7));
      uint4 z;
      if constexpr (kAct >= 0) v = EpilogueChunk<kKind, kAct, kPre>(v, bias8, &z);
      const int row = i == 0 ? rows[0] : (i == 1 ? rows[1] : (i == 2 ? rows[2] : rows[3]));  // no indexed array
      if (row >= 0 && col < g.N) {
        const int64_t off = row * g.out_row_bytes + static_cast<int64_t>(col) * 2;
        *reinterpret_cast<uint4*>(c_b + off) = v;
        if constexpr (kPre) *reinterpret_cast<uint4*>(g.epi.pre + (c_b - g.c) + off) = z;
      }
    }
  }
}

// Consumer warpgroup wg (0/1): rows wg*64 .. wg*64+63 of each tile. Split-K: the tile's
// partial sums are left in shared memory and described by the returned SplitTile.
template <class Cfg, int kKind, bool kTransB, int kCluster, int kDiag, bool kSplitK>
__device__ __forceinline__ SplitTile Consume(const Args& g, char* smem, int wg, int tid, const CUtensorMap* map_a) {
  SplitTile split;
  const uint32_t base = SmemAddr(smem);
  const int warp = tid >> 5, lane = tid & 31;
  using TW = TileWalk<Cfg, kCluster, kSplitK>;
  TW walk(g);
  Pipe<Cfg::kStagesA> pa;
  Pipe<Cfg::kStagesB> pb;
  // This warp's epilogue staging: 16 rows x 64 columns at a time (16-bit types).
  char* epi = smem + Cfg::kEpiOffset + (wg * 4 + warp) * kEpiWarpBytes;
  const uint32_t epi_s = SmemAddr(epi);
  constexpr int kAcc = Cfg::kBN / 2;  // fp32 accumulators per thread
  float acc[kAcc];
  ALoader<Cfg, TW, (kDiag & kDiagNoA) != 0> loader(g);
  loader.map_a = map_a;
  const bool stamper = wg == 0 && tid == 0;
  if (stamper) Stamp<kDiag>(20);
  if constexpr (Cfg::kConsumerGather) {
    loader.Start(g, wg, warp, lane);
    if (stamper) Stamp<kDiag>(21);
    for (int s = 0; s < Cfg::kStagesA; ++s) loader.Issue(g, base, wg, warp, lane);  // fill every stage
  }
  int stamp_tiles = 0;
  if (stamper) Stamp<kDiag>(4);
  for (Tile tile; walk.Next(g, tile);) {
    // Rows this lane writes (looked up now; used after the main loop). fp32 C: the rows of
    // the accumulator fragment (lane/4 and lane/4 + 8). 16-bit C (staged): rows lane/8 + 4i
    // of the warp's 16.
    const int wrow = tile.m0 + wg * 64 + warp * 16;
    int rows[4];
    if constexpr (kKind == kTf32) {
      rows[0] = RowOf(g, tile, wrow + (lane >> 2));
      rows[1] = RowOf(g, tile, wrow + (lane >> 2) + 8);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) rows[i] = RowOf(g, tile, wrow + (lane >> 3) + 4 * i);
    }
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
    int prev_a = -1, prev_b = -1;
    for (int kb = walk.kfirst(); kb < g.num_kb; kb += walk.kstep()) {
      MbarWait(base + Cfg::kFullA + ((Cfg::kConsumerGather ? wg * Cfg::kStagesA : 0) + pa.stage) * 8, pa.phase);
      MbarWait(base + Cfg::kFullB + pb.stage * 8, pb.phase);
      // cp.async writes are generic-proxy writes that wgmma reads through the async proxy.
      if constexpr (!(kDiag & kDiagNoFence)) FenceProxyAsync();
      const uint32_t sa = base + Cfg::kAOffset + pa.stage * kStageABytes + wg * (64 * kBKBytes);
      const uint32_t sb = base + Cfg::kBOffset + pb.stage * Cfg::kStageBPitch;
      const uint64_t da = MakeDesc(sa, 16, 1024);
      const uint64_t db = kTransB ? MakeDesc(sb, 16, 1024) : MakeDesc(sb, 8192, 1024);
      WgmmaFence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        // A: +32 bytes of K per step inside the swizzle row. B: the same when K-major;
        // when N-major, +16 K rows = 2048 bytes.
        const uint64_t a_step = static_cast<uint64_t>(kk * 32) >> 4;
        const uint64_t b_step = static_cast<uint64_t>(kTransB ? kk * 32 : kk * 2048) >> 4;
        Mma<kKind, kTransB, Cfg::kBN>(acc, da + a_step, db + b_step);
      }
      WgmmaCommit();
      WgmmaWait<1>();
      // The previous step's stage is free: refill its A (consumer gather), release its B.
      if constexpr (Cfg::kConsumerGather) {
        if (prev_a >= 0) loader.Issue(g, base, wg, warp, lane);
      }
      if (prev_a >= 0 && tid == 0) {
        if constexpr (!Cfg::kConsumerGather) MbarArrive(base + Cfg::kEmptyA + prev_a * 8);
        ReleaseTileB<TW, kSplitK ? 1 : kCluster>(tile, base + Cfg::kEmptyB + prev_b * 8);
      }
      prev_a = pa.stage, prev_b = pb.stage;
      pa.Next(), pb.Next();
    }
    WgmmaWait<0>();
    FenceOperands(acc);
    if (stamper && stamp_tiles == 0) Stamp<kDiag>(7);
    ++stamp_tiles;
    if constexpr (Cfg::kConsumerGather && !Cfg::kEpiInA) loader.Issue(g, base, wg, warp, lane);
    if (tid == 0) {
      if constexpr (!Cfg::kConsumerGather) MbarArrive(base + Cfg::kEmptyA + prev_a * 8);
      ReleaseTileB<TW, kSplitK ? 1 : kCluster>(tile, base + Cfg::kEmptyB + prev_b * 8);
    }
    if constexpr (kSplitK) {
      if (walk.kstep() > 1) {
        // This group has no other tile, so no load is pending and, once both consumer
        // warpgroups are past their last wgmma, the stages are free for the fp32 partials.
        asm volatile("bar.sync 1, 256;" ::: "memory");
        StorePartials<kAcc / 2>(base, wg * 128 + tid, acc);
        if (stamper) Stamp<kDiag>(18);
        split.live = true;
        split.n0 = tile.n0;
        split.row0 = RowOf(g, tile, wrow + (lane >> 2));
        split.row8 = RowOf(g, tile, wrow + (lane >> 2) + 8);
        split.c_b = g.c + static_cast<int64_t>(tile.b) * g.c_batch_bytes;
        continue;
      }
    }
    if constexpr (kDiag & kDiagNoStore) {
      if constexpr (Cfg::kEpiInA) loader.Issue(g, base, wg, warp, lane);
      continue;
    }

    // Epilogue. The thread holds cols n0 + 8j + 2(lane%4) + {0,1} of fragment rows lane/4
    // (acc[4j], acc[4j+1]) and lane/4 + 8 (acc[4j+2], acc[4j+3]).
    if constexpr (kKind == kTf32) {
      // fp32 C: 8-byte stores straight from registers (no column parts: the launcher).
      char* c_b = g.c + static_cast<int64_t>(tile.b) * g.c_batch_bytes;
      char* p0 = rows[0] >= 0 ? c_b + rows[0] * g.c_row_bytes : nullptr;
      char* p1 = rows[1] >= 0 ? c_b + rows[1] * g.c_row_bytes : nullptr;
      const int col0 = tile.n0 + 2 * (lane & 3);
#pragma unroll
      for (int j = 0; j < kAcc / 4; ++j) {
        const int col = col0 + 8 * j;
        if (col < g.N) {
          const int64_t off = static_cast<int64_t>(col) * 4;
          if (p0) *reinterpret_cast<float2*>(p0 + off) = make_float2(acc[4 * j], acc[4 * j + 1]);
          if (p1) *reinterpret_cast<float2*>(p1 + off) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
        }
      }
      // The epilogue on what this thread just stored, 4 column groups at a time (inline at
      // all 128 accumulators, the activations' code would be 128 copies).
      if (g.epi.on) {
        // With Epilogue::pre, v + bias goes there first (the same offsets as in C).
        auto apply = [&](char* p, int64_t off, int col) {
          float2 v = *reinterpret_cast<float2*>(p + off);
          if (g.epi.pre) {
            v = make_float2(v.x + g.epi.Bias(col), v.y + g.epi.Bias(col + 1));
            *reinterpret_cast<float2*>(g.epi.pre + (p - g.c) + off) = v;
            v = make_float2(Activate(v.x, g.epi.act), Activate(v.y, g.epi.act));
          } else {
            v = make_float2(g.epi.Apply(v.x, col), g.epi.Apply(v.y, col + 1));
          }
          *reinterpret_cast<float2*>(p + off) = v;
        };
#pragma unroll 4
        for (int j = 0; j < kAcc / 4; ++j) {
          const int col = col0 + 8 * j;
          const int64_t off = static_cast<int64_t>(col) * 4;
          if (p0 && col < g.N) apply(p0, off, col);
          if (p1 && col < g.N) apply(p1, off, col);
        }
      }
    } else {
      uint32_t stage_s = epi_s;
      if constexpr (Cfg::kEpiInA)
        stage_s = base + Cfg::kAOffset + prev_a * kStageABytes + wg * (64 * kBKBytes) + warp * (16 * kBKBytes);
      // C's rows, or the part's shifted so that the tile's absolute columns index it (16-bit
      // C only has column parts; a tile never straddles two).
      char* c_b = g.c + static_cast<int64_t>(tile.b) * g.c_batch_bytes;
      if constexpr ((kDiag & kOutParts) != 0) {
        const int part = tile.n0 / g.part_n;
        c_b = OutBase(g, tile.b, part) - static_cast<int64_t>(part) * g.part_n * 2;
      }
      // The activation is a template argument of the store, chosen once per tile: a switch
      // per element left the 128-value epilogue serial (about 10 us per tile, measured).
      // The launcher's rules: the two-width kernels' second width (and the dual kernel's
      // first) compile the plain and bias-only stores alone.
      constexpr bool kPreOk = (kDiag & (kDualWidth | kOutParts)) == 0 && !Cfg::kNarrow;
      if (!g.epi.on) {
        StoreTile16<Cfg, kKind, -1>(g, acc, tile.n0, rows, c_b, stage_s, lane);
      } else if (kPreOk && g.epi.pre) {
        switch (g.epi.act) {  // a differentiated step: the activation's input too
          case static_cast<int>(Activation::kRelu): StoreTile16<Cfg, kKind, 1, kPreOk>(g, acc, tile.n0, rows, c_b, stage_s, lane); break;
          case static_cast<int>(Activation::kGeluTanh): StoreTile16<Cfg, kKind, 2, kPreOk>(g, acc, tile.n0, rows, c_b, stage_s, lane); break;
          case static_cast<int>(Activation::kGeluErf): StoreTile16<Cfg, kKind, 3, kPreOk>(g, acc, tile.n0, rows, c_b, stage_s, lane); break;
          default: StoreTile16<Cfg, kKind, 4, kPreOk>(g, acc, tile.n0, rows, c_b, stage_s, lane);
        }
      } else if constexpr ((kDiag & kDualWidth) != 0 || Cfg::kNarrow) {
        StoreTile16<Cfg, kKind, 0>(g, acc, tile.n0, rows, c_b, stage_s, lane);
      } else {
        switch (g.epi.act) {
          case static_cast<int>(Activation::kRelu): StoreTile16<Cfg, kKind, 1>(g, acc, tile.n0, rows, c_b, stage_s, lane); break;
          case static_cast<int>(Activation::kGeluTanh): StoreTile16<Cfg, kKind, 2>(g, acc, tile.n0, rows, c_b, stage_s, lane); break;
          case static_cast<int>(Activation::kGeluErf): StoreTile16<Cfg, kKind, 3>(g, acc, tile.n0, rows, c_b, stage_s, lane); break;
          case static_cast<int>(Activation::kSilu): StoreTile16<Cfg, kKind, 4>(g, acc, tile.n0, rows, c_b, stage_s, lane); break;
          default: StoreTile16<Cfg, kKind, 0>(g, acc, tile.n0, rows, c_b, stage_s, lane);
        }
      }
    }
    if (stamper && stamp_tiles == 1) Stamp<kDiag>(8);
    if constexpr (Cfg::kEpiInA) {
      __syncwarp();  // the warp's staging reads are done before its refill lands there
      if (g.a_tma) {
        // One TMA refills the whole warpgroup's rows: every warp's staging reads first,
        // then the async proxy's write (the fence orders the two proxies).
        asm volatile("bar.sync %0, 128;" ::"r"(2 + wg) : "memory");
        FenceProxyAsync();
      }
      loader.Issue(g, base, wg, warp, lane);
    }
  }
  if constexpr (Cfg::kConsumerGather) CpAsyncWaitAll();
  if (stamper) Stamp<kDiag>(9), Stamp<kDiag>(10, stamp_tiles);
  if (wg == 1 && tid == 0) Stamp<kDiag>(11);
  return split;
}

// Split-K epilogue (after a cluster barrier: every partial of the cluster is written).
// Consumer thread ct of group rank r sums pairs p = r, r + S, ... of its fragment over the
// group's CTAs in rank order (DSMEM reads: deterministic for a given S) and stores them.
// kAct: -1 no epilogue, else act(sum + bias) with that activation code (0: bias only).
template <int kKind, int kAct, int kPairs>
__device__ __forceinline__ void ReduceSplit(const Args& g, const SplitTile& st, uint32_t base, int ct, int rank,
                                            int S, int group_base) {
  const int lane = ct & 31;
  auto store = [&](int p, float2 sum) {
    // acc[2p], acc[2p+1] = acc[4j + 2h + {0,1}]: fragment row lane/4 + 8h, columns 8j + 2(lane%4) + {0,1}.
    const int j = p >> 1, h = p & 1;
    const int row = h ? st.row8 : st.row0, col = st.n0 + 8 * j + 2 * (lane & 3);
    if (row < 0 || col >= g.N) return;
    float x = sum.x, y = sum.y;
    if constexpr (kAct >= 0) {
      if (g.epi.bias) {  // the pair's two biases (col even, N % 8 == 0: aligned)
        if constexpr (kKind == kTf32) {
          const float2 b = __ldg(reinterpret_cast<const float2*>(g.epi.bias) + (col >> 1));
          x += b.x, y += b.y;
        } else {
          float2 b;
          if (g.epi.bias_f32) {  // rounded to C's dtype, as a cast beforehand would
            const float2 f = __ldg(reinterpret_cast<const float2*>(g.epi.bias) + (col >> 1));
            b = Unpack2<kKind>(Pack2<kKind>(f.x, f.y));
          } else {
            b = Unpack2<kKind>(__ldg(reinterpret_cast<const unsigned int*>(g.epi.bias) + (col >> 1)));
          }
          x += b.x, y += b.y;
        }
      }
      if (g.epi.pre) {  // the activation's input, laid out as C
        char* pre = g.epi.pre + (st.c_b - g.c) + row * g.c_row_bytes;
        if constexpr (kKind == kTf32) {
          *reinterpret_cast<float2*>(pre + static_cast<int64_t>(col) * 4) = make_float2(x, y);
        } else {
          *reinterpret_cast<uint32_t*>(pre + static_cast<int64_t>(col) * 2) = Pack2<kKind>(x, y);
        }
      }
      x = ActivateT<kAct>(x), y = ActivateT<kAct>(y);
    }
    char* dst = st.c_b + row * g.c_row_bytes;
    if constexpr (kKind == kTf32) {
      *reinterpret_cast<float2*>(dst + static_cast<int64_t>(col) * 4) = make_float2(x, y);
    } else {
      *reinterpret_cast<uint32_t*>(dst + static_cast<int64_t>(col) * 2) = Pack2<kKind>(x, y);
    }
  };
  if (S == 2) {  // SplitOf: 2 or 4 here (S = 1 does not reduce)
    SumPairsOf<2, decltype(store)&, kPairs>(base, ct, rank, group_base, store);
  } else {
    SumPairsOf<4, decltype(store)&, kPairs>(base, ct, rank, group_base, store);
  }
}

// kCluster: CTAs per cluster along M (1, 2 or 4; B multicast when > 1), or with kSplitK
// the cluster of up to kCluster CTAs sharing a tile's K (no multicast, batch 1). kDiag:
// timing experiments (see Diag), kOutParts, kDualWidth. map_aux: kDualWidth's B map for
// 128-column tiles (its box differs when B is K-major), or with Args::a_tma A's packed
// rows (never both: one width only there); map_b again otherwise.
template <class Cfg, int kKind, bool kTransB, int kCluster, int kDiag, bool kSplitK = false>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    RowGatherGemmKernel(const __grid_constant__ CUtensorMap map_b, const __grid_constant__ CUtensorMap map_aux,
                        const Args g) {
  static_assert(!kSplitK || (kCluster > 1 && Cfg::kConsumerGather), "split-K: clusters, consumer gather");
  constexpr bool kDual = (kDiag & kDualWidth) != 0;
  static_assert(!kDual || (kCluster == 1 && !kSplitK && Cfg::kBN == 256 && Cfg::kConsumerGather),
                "two widths: single CTAs, 256-column primary tiles, consumer gather");
  constexpr bool kNarrow = (kDiag & kNarrowWidth) != 0;
  static_assert(!kNarrow || (!kDual && !kSplitK && Cfg::kBN == 256 && Cfg::kConsumerGather && kKind != kTf32 &&
                             !kTransB && (kDiag & kOutParts) == 0),
                "narrow tiles: 256-column primary tiles, consumer gather, 16-bit, N-major B, C whole");
  static_assert(kKind != kTf32 || kTransB, "tf32 wgmma needs K-major B (trans_b)");
  static_assert(kCluster == 1 || kCluster == 2 || kCluster == 4, "cluster of 1, 2 or 4 CTAs");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kBCluster = kSplitK ? 1 : kCluster;  // CTAs sharing B by multicast
  extern __shared__ __align__(16) char smem_raw[];
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  SplitTile split;
  if constexpr ((kDiag & kDiagWarm) != 0 && !kSplitK) {
    if (lane == 0) {
      asm volatile("prefetch.global.L1 [%0];" ::"l"(g.counts) : "memory");
      if (warp >= 4 && g.total_tiles > 0) {
        // this warp's rows of the CTA's first static tile (the count decides later whether it is live)
        const int t = kCluster == 1 ? static_cast<int>(blockIdx.x) : static_cast<int>(ClusterId());
        if (t < g.total_tiles) {
          const TileCoord c = CoordOf<>(g, t);
          const int rank = kCluster == 1 ? 0 : static_cast<int>(ClusterRank());
          const int64_t j = (static_cast<int64_t>(c.mg) * kCluster + rank) * kBM + (warp - 4) * 16;
          const int64_t slot = j / g.tile_h;
          if (slot < g.capacity)
            asm volatile("prefetch.global.L1 [%0];" ::"l"(g.lists + static_cast<int64_t>(c.b / g.idx_div) * g.capacity + slot)
                         : "memory");
        }
      }
    }
  }
  if (threadIdx.x == 0) {
    Stamp<kDiag>(0);
    const uint32_t base = SmemAddr(smem);
    for (int s = 0; s < Cfg::kStagesA; ++s) {
      if constexpr (Cfg::kConsumerGather) {
        // warpgroup 0's, then 1's: its 128 threads' cp.async (noinc), or its TMA lane (+ bytes)
        const uint32_t arrivals = g.a_tma ? 1 : 128;
        MbarInit(base + Cfg::kFullA + s * 8, arrivals);
        MbarInit(base + Cfg::kFullA + (Cfg::kStagesA + s) * 8, arrivals);
      } else {
        MbarInit(base + Cfg::kFullA + s * 8, Cfg::kGatherThreads);  // cp.async arrivals (noinc)
        MbarInit(base + Cfg::kEmptyA + s * 8, 2);                   // the 2 local consumer warpgroups
      }
    }
    for (int s = 0; s < Cfg::kStagesB; ++s) {
      MbarInit(base + Cfg::kFullB + s * 8, 1);              // the TMA lane (+ bytes)
      MbarInit(base + Cfg::kEmptyB + s * 8, 2 * kBCluster);  // consumer warpgroups sharing the stage
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_b)) : "memory");
    if ((kDual && kTransB) || g.a_tma)
      asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map_aux)) : "memory");
  }
  if constexpr (kCluster == 1) {
    __syncthreads();
  } else {
    ClusterSync();  // the peers' barriers are initialized before any multicast or remote arrive
  }
  if constexpr ((kDiag & kDiagStamp) != 0) {
    if (threadIdx.x == 0) {
      Stamp<kDiag>(1);
      uint32_t smid;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
      Stamp<kDiag>(15, smid);
    }
  }
  if constexpr (kDiag & kDiagEmpty) {  // the launch and set-up alone
    if constexpr (kCluster > 1) ClusterSync();
    return;
  }
  if (warp < 4) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Cfg::kProducerRegs));
    if (warp == Cfg::kBWarp) {
      WithTileWidth<Cfg, kDual, kNarrow, kCluster>(g, [&](auto c) {
        using C = decltype(c);
        LoadB<C, kKind, kTransB, kCluster, kDiag, kSplitK>(g, C::kBFromAux ? &map_aux : &map_b, smem, lane);
      });
    } else if (Cfg::kConsumerGather) {
      ZeroFillOf<kDiag> zf(warp == 3 ? 2 : warp, 3);  // warps 0, 1, 3
      if constexpr ((kDiag & kDiagStamp) != 0 && kCluster == 1 && !kSplitK) {
        // When the first A (warpgroup 0's) and B stages land, seen from warp 3 (a stamp in
        // the consumers' loop serializes their wgmma).
        bool any = false;
        for (int t = blockIdx.x; t < g.total_tiles && !any; t += gridDim.x) {
          Tile tile;
          any = DecodeTile<1, Cfg::kBN>(g, t, 0, tile);
        }
        if (warp == 3 && lane == 0 && any) {
          const uint32_t base = SmemAddr(smem);
          MbarWait(base + Cfg::kFullA, 0);
          Stamp<kDiag>(5);
          MbarWait(base + Cfg::kFullB, 0);
          Stamp<kDiag>(6);
        }
        __syncwarp();
      }
      if (!(kDiag & kDiagNoZero)) zf.RunAll(g, lane);
      if (lane == 0) Stamp<kDiag>(warp == 0 ? 12 : warp == 1 ? 13 : 14);
    } else if (warp == 3 && Cfg::kZeroWarp) {
      ZeroFillOf<kDiag> zf;
      zf.RunAll(g, lane);
    } else {
      // warps 0, 1 (and 3): each its own instantiation, so its row range is a constant
      if (warp == 0) {
        GatherA<Cfg, kCluster, kDiag, 0, kSplitK>(g, smem, lane);
      } else if (warp == 1) {
        GatherA<Cfg, kCluster, kDiag, 1, kSplitK>(g, smem, lane);
      } else {
        GatherA<Cfg, kCluster, kDiag, 3, kSplitK>(g, smem, lane);
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Cfg::kConsumerRegs));
    const int wg = (warp >> 2) - 1;
    const int ct = threadIdx.x - 128 * (wg + 1);
    WithTileWidth<Cfg, kDual, kNarrow, kCluster>(g, [&](auto c) {
      split = Consume<decltype(c), kKind, kTransB, kCluster, kDiag, kSplitK>(g, smem, wg, ct, &map_aux);
    });
  }
  if constexpr (kSplitK) {
    const Walk<kCluster, true> w(g);  // S, the same in every CTA
    if (w.kstep > 1) {
      __syncwarp();
      ClusterSync();  // every partial of the cluster is in shared memory
      if (threadIdx.x == 128) Stamp<kDiag>(19);
      if (warp >= 4 && split.live) {
        const uint32_t sbase = SmemAddr(smem);
        const int ct = threadIdx.x - 128, gb = static_cast<int>(ClusterRank()) - w.kfirst;
        const int act = g.epi.on ? g.epi.act : -1;  // compile-time per branch (see StoreTile16)
        if (act == -1) ReduceSplit<kKind, -1, Cfg::kBN / 4>(g, split, sbase, ct, w.kfirst, w.kstep, gb);
        else if (act == 1) ReduceSplit<kKind, 1, Cfg::kBN / 4>(g, split, sbase, ct, w.kfirst, w.kstep, gb);
        else if (act == 2) ReduceSplit<kKind, 2, Cfg::kBN / 4>(g, split, sbase, ct, w.kfirst, w.kstep, gb);
        else if (act == 3) ReduceSplit<kKind, 3, Cfg::kBN / 4>(g, split, sbase, ct, w.kfirst, w.kstep, gb);
        else if (act == 4) ReduceSplit<kKind, 4, Cfg::kBN / 4>(g, split, sbase, ct, w.kfirst, w.kstep, gb);
        else ReduceSplit<kKind, 0, Cfg::kBN / 4>(g, split, sbase, ct, w.kfirst, w.kstep, gb);
        if (ct == 0) Stamp<kDiag>(8);
      }
    }
  }
  // No CTA may leave while a peer can still multicast into it, arrive on its barriers or
  // read its shared memory.
  if constexpr (kCluster > 1) {
    __syncwarp();
    ClusterSync();
  }
  if constexpr ((kDiag & kDiagStamp) != 0) {
    __syncthreads();
    if (threadIdx.x == 0) Stamp<kDiag>(16);
  }
#endif
}

}  // namespace sm90_rg
}  // namespace pit
