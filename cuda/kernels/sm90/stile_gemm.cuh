// pit_stile_matmul for Hopper (sm_90a): the device side (launcher and covered subset in
// stile_gemm.cu; design and measurements in docs/notes/sm90_stile.md).
//
// Both forward uses reduce, per group of C, over listed ranges of whole rows k of two
// row-major [K, *] matrices: B = w [K, N] and A^T = x stored [K, M] (trans_a). Of the two,
// the "narrow" one is restricted to the group (<= 64 columns: n of the weight block's
// column group, or m of the K axis's row group) and the "wide" one is not (512 columns
// per tile). The kernel computes D = C^T tiles with wgmma (M = n, N = m), both operands
// MN-major from the gathered rows:
//   weight blocks (kWeightBlocks): narrow = w columns [n0, n0+64), wide = x^T columns
//     (m) [m0, m0+512); warpgroup w: D[64 n][256 m] = one m64n256k16 per 16 k.
//   K axis: narrow = x^T columns (m) [m0, m0+64), wide = w columns [n0, n0+512);
//     warpgroup w: 4 x D[64 n][64 m] = four m64n64k16 per 16 k (m64n32k16 for groups of
//     <= 32 rows: kKAxis32).
//   weight blocks with x stored [M, K] (kWeightBlocksXK): wide = x rows m, K-major.
// Persistent CTAs (one per SM) walk the tiles t = blockIdx.x, + gridDim.x, ...; 384
// threads, 4 stages of 32 k rows (128B swizzle, cp.async with zero-fill, each stage's full
// barrier completed by cp.async.mbarrier.arrive.noinc): warpgroup 0 (4 producer warps)
// gathers the narrow block, warpgroups 1-2 gather their own wide blocks (kConsumerWide:
// 12 warps issue cp.async instead of 4; the kernel is gather-bound), run the wgmma and the
// epilogue (stmatrix.trans into a staging buffer of its own, then 16-byte row stores of C),
// so the next tile's stages fill while the consumers store. No atomics: each element of C
// is written by exactly one CTA, with zeros for an empty group.
#pragma once

#include <cstdint>

#include "cuda/kernels/device_utils.cuh"
#include "cuda/kernels/sm90/row_gather_gemm.cuh"
#include "cuda/kernels/sm90/wgmma.cuh"

namespace pit {
namespace sm90_stile {

using sm90_rg::kBf16;
using sm90_rg::kF16;

// kKAxis32: the K axis with groups of <= 32 rows: m64n32k16 on the first 32 columns of the
// narrow block (half the tensor work of kKAxis's m64n64k16).
// kWeightBlocksXK: the weight blocks with x stored [M, K] (trans_a false; bk and K multiples
// of 8): the wide operand is gathered as 16-byte runs of 8 k per row m into a K-major
// tile (rows of 32 k = 64 B, 64B swizzle) and read by wgmma with B K-major.
enum Mode : int { kWeightBlocks = 0, kKAxis = 1, kKAxis32 = 2, kWeightBlocksXK = 3 };

constexpr int kThreads = 384;
constexpr int kTok = 32;                      // k rows per stage
constexpr int kStages = 4;
constexpr int kBlock = kTok * 128;            // one 64-column block: 32 k rows x 128 B
constexpr int kWideBlocks = 8;                // 512 wide columns
constexpr int kWideCols = 64 * kWideBlocks;
constexpr int kStageBytes = (1 + kWideBlocks) * kBlock;  // narrow block, then the wide ones: 36 KB
constexpr int kStaging = kStages * kStageBytes;          // epilogue staging (C rows)
constexpr int kPitchWB = 144;                 // staged C row (weight blocks): 64 n x 2 B + 16 B
constexpr int kPitchKA = 1040;                // staged C row (K axis): 512 n x 2 B + 16 B
constexpr int kStagingBytes = kWideCols * kPitchWB > 64 * kPitchKA ? kWideCols * kPitchWB : 64 * kPitchKA;
constexpr int kFull = kStaging + kStagingBytes;  // full barriers, then empty barriers
constexpr int kEmpty = kFull + 8 * kStages;
// The tile order table (Args::order): the batch * groups groups, listed ones first, then
// 12 warp totals of its scan.
constexpr int kMaxOrder = 4096;
constexpr int kOrder = kEmpty + 8 * kStages;
constexpr int kOrderScan = kOrder + 2 * kMaxOrder;
constexpr int kSmemBytes = kOrderScan + 64 + 1024;  // + alignment slack
#ifndef PIT_STILE_CONSUMER_WIDE
#define PIT_STILE_CONSUMER_WIDE 1
#endif
// The consumer warpgroups gather their own wide blocks (the producers only the narrow one),
// so 12 warps instead of 4 issue the cp.async (docs/notes/sm90_stile.md, run 6).
constexpr bool kConsumerWide = PIT_STILE_CONSUMER_WIDE != 0;
constexpr int kLook = 3;                      // list entries read this many stages ahead
// setmaxnreg moves registers inside the CTA's allocation (384 x 168 at launch): what the
// producers give back must cover what the consumers take, or setmaxnreg.inc waits forever.
constexpr int kLaunchRegs = 168;
constexpr int kProducerRegs = 64;
constexpr int kConsumerRegs = 216;
static_assert(128 * (kLaunchRegs - kProducerRegs) >= 256 * (kConsumerRegs - kLaunchRegs), "register budget");
static_assert(kSmemBytes <= 232448, "over the 227 KB opt-in limit");

struct Args {
  const char* narrow = nullptr;  // stored [.., K, narrow_cols]
  const char* wide = nullptr;    // stored [.., K, wide_cols] ([.., wide_cols, K]: kWeightBlocksXK)
  char* c = nullptr;             // [batch, M, N]
  const int32_t* lists = nullptr;   // [idx_batch, groups, capacity]
  const int32_t* counts = nullptr;  // [idx_batch, groups]
  int64_t narrow_batch_bytes = 0, wide_batch_bytes = 0, c_batch_bytes = 0;
  int64_t narrow_row_bytes = 0, wide_row_bytes = 0;
  int narrow_cols = 0, wide_cols = 0;
  int M = 0, N = 0, K = 0;
  int kt = 1;           // k rows per listed tile
  int tiles_k = 0;      // ceil(K / kt): valid entries are 0 .. tiles_k - 1
  int gs = 64;          // group extent along the narrow columns (<= 64)
  int groups = 1, capacity = 0;
  int narrow_div = 1, wide_div = 1, idx_div = 1;
  int wide_tiles = 1;   // ceil(wide_cols / 512)
  int tiles = 0;        // batch * groups * wide_tiles
  int groups_fastest = 0;  // tile order: groups fastest instead of wide tiles
  int order = 0;  // 1: the tiles of listed groups first, in a table of batch * groups <= kMaxOrder
};

// Group g of batch entry b: its listed tiles, the count clamped to [0, capacity].
__device__ __forceinline__ int ListedTiles(const Args& a, int b, int g) {
  const int c = __ldg(a.counts + static_cast<int64_t>(b / a.idx_div) * a.groups + g);
  return c < 0 ? 0 : (c > a.capacity ? a.capacity : c);
}

// Without a table the tiles are walked t = 0, 1, ... over (b, g, wt) with wt fastest, or
// (b, wt, g) with g fastest (groups_fastest). A static round-robin of that walk over the
// CTAs gives each CTA groups of one residue class, and where the listed groups cluster
// (blocks of left-padded sequences: the last block of each sequence is listed, the first
// ones are not) some CTAs drew 3.5x the mean rows (docs/notes/sm90_stile.md, run 8). The
// table puts the listed groups' tiles first (their order kept), so the round-robin deals
// them evenly, then the empty ones (zero stores only).
struct TileOrder {
  const uint16_t* slot = nullptr;  // [batch * groups]: listed groups, then the others
  int live = 0;                    // listed groups
};

// Every thread of the CTA takes part. Its first barrier also publishes what thread 0 wrote
// before the call (the pipeline barriers' init), so the count reads overlap that. Returns
// the table when a.order and some group is not listed (all listed: the walk without one).
__device__ __forceinline__ TileOrder BuildOrder(const Args& a, char* smem) {
  TileOrder o;
  if (!a.order) {
    __syncthreads();
    return o;
  }
  uint16_t* slot = reinterpret_cast<uint16_t*>(smem + kOrder);
  int* scan = reinterpret_cast<int*>(smem + kOrderScan);
  const int n = a.tiles / a.wide_tiles;  // batch * groups
  const int per = (n + kThreads - 1) / kThreads;  // <= 11: the flags fit one word
  const int tid = threadIdx.x;
  const int beg = min(tid * per, n), end = min(beg + per, n);
  unsigned flags = 0;
  int local = 0;
  for (int q = beg; q < end; ++q)
    if (ListedTiles(a, q / a.groups, q % a.groups) > 0) flags |= 1u << (q - beg), ++local;
  int live;
  int before = BlockExclusiveSumOnce<kThreads>(local, scan, &live);
  if (live == n) return o;  // CTA-uniform
  int dead = live + (beg - before);  // listed groups first, then the others, each in order
  for (int q = beg; q < end; ++q) slot[(flags >> (q - beg)) & 1u ? before++ : dead++] = static_cast<uint16_t>(q);
  __syncthreads();
  o.slot = slot;
  o.live = live;
  return o;
}

// Tile t of the walk: without a table (b * groups + g) * wide_tiles + wt (wide tiles
// fastest: the CTAs running at once share the narrow rows of a few groups) or, with
// groups_fastest, (b * wide_tiles + wt) * groups + g. With a table the same two orders over
// its slots, the listed groups' tiles first.
struct Tile {
  int b, g, wt;
  int rows;  // min(count, capacity) * kt: gathered k rows (those >= K or of bad ids read as 0)
  const int32_t* list;
  template <bool kOrdered>
  __device__ __forceinline__ void Load(const Args& a, const TileOrder& o, int t) {
    if constexpr (kOrdered) {
      const int n = a.tiles / a.wide_tiles, first = o.live * a.wide_tiles;
      const bool listed = t < first;
      const int span = listed ? o.live : n - o.live;  // > 0 on the side t falls on
      if (!listed) t -= first;
      int r;
      if (a.groups_fastest) {
        r = t % span;
        wt = t / span;
      } else {
        wt = t % a.wide_tiles;
        r = t / a.wide_tiles;
      }
      const int bg = o.slot[listed ? r : o.live + r];
      b = bg / a.groups;
      g = bg - b * a.groups;
    } else if (a.groups_fastest) {
      g = t % a.groups;
      t /= a.groups;
      wt = t % a.wide_tiles;
      b = t / a.wide_tiles;
    } else {
      wt = t % a.wide_tiles;
      t /= a.wide_tiles;
      g = t % a.groups;
      b = t / a.groups;
    }
    rows = ListedTiles(a, b, g) * a.kt;
    list = a.lists + (static_cast<int64_t>(b / a.idx_div) * a.groups + g) * a.capacity;
  }
  __device__ __forceinline__ int Stages() const { return (rows + kTok - 1) / kTok; }
};

// The producers' position: tile t (non-empty ones only), stage s of it.
template <bool kOrdered>
struct Cursor {
  int t, s;
  Tile tile;
  TileOrder o;
  __device__ __forceinline__ void Skip(const Args& a) {  // to the first non-empty tile >= t
    if constexpr (kOrdered)
      if (t >= o.live * a.wide_tiles) t = a.tiles;  // the rest are empty
    for (; t < a.tiles; t += gridDim.x) {
      tile.template Load<kOrdered>(a, o, t);
      if (tile.rows > 0) return;
    }
  }
  __device__ __forceinline__ bool Done(const Args& a) const { return t >= a.tiles; }
  __device__ __forceinline__ void Next(const Args& a) {
    if (++s * kTok >= tile.rows) {
      s = 0;
      t += gridDim.x;
      Skip(a);
    }
  }
  // Row k of token j of the current stage, or -1 (zero row).
  __device__ __forceinline__ int RowOf(const Args& a, int j) const {
    if (Done(a)) return -1;
    const int p = s * kTok + j;
    if (p >= tile.rows) return -1;
    const int i = p / a.kt, r = p - i * a.kt;
    const int e = __ldg(tile.list + i);
    if (e < 0 || e >= a.tiles_k) return -1;
    const int k = e * a.kt + r;
    return k < a.K ? k : -1;
  }
};

// Shared-memory matrix descriptor of a K-major tile with the 64-byte swizzle: rows of 64 B
// (32 k), 8-row atoms of 512 B (sbo); lbo unused.
__device__ __forceinline__ uint64_t MakeDescK64(uint32_t saddr) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((saddr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>(1) << 16;
  d |= static_cast<uint64_t>(512 >> 4) << 32;
  d |= static_cast<uint64_t>(2) << 62;  // SWIZZLE_64B
  return d;
}

// Consumer-side gather of a warpgroup's own 4 wide blocks (kConsumerWide), walking the
// same sequence of non-empty stages as the producers, kStages ahead of the consumption:
// the stage a warpgroup's wgmma has just finished is refilled at once with the stage
// kStages later (no other warpgroup reads these blocks). Thread q of the warpgroup copies
// chunk q % 32 of tokens q / 32 + 4 r (r < 8), or, x [M, K], the 8-k run q % 4 of rows
// q / 4 + 32 r; its lane % 8 (lane % 4) holds the row k of token wq + 4 (lane % 8) (of
// run lane % 4), fetched one stage ahead.
template <int kMode, bool kOrdered>
struct WideLoader {
  Cursor<kOrdered> cur;
  int k_next;
  __device__ __forceinline__ int MyRow(const Args& a, int wq, int lane) const {
    return cur.RowOf(a, kMode == kWeightBlocksXK ? 8 * (lane & 3) : wq + 4 * (lane & 7));
  }
  __device__ __forceinline__ void Start(const Args& a, const TileOrder& o, int wq, int lane) {
    cur = Cursor<kOrdered>{static_cast<int>(blockIdx.x), 0, {}, o};
    cur.Skip(a);
    k_next = MyRow(a, wq, lane);
  }
  // Gathers the next stage into `ss` and arrives on `full`; false past the sequence's end.
  __device__ __forceinline__ bool Issue(const Args& a, uint32_t ss, uint32_t full, int wg, int wq, int lane) {
    if (cur.Done(a)) return false;
    const int k = k_next;
    const Tile tile = cur.tile;
    cur.Next(a);
    k_next = MyRow(a, wq, lane);
    const int w0 = tile.wt * kWideCols;
    const char* wb = a.wide + static_cast<int64_t>(tile.b / a.wide_div) * a.wide_batch_bytes;
    if constexpr (kMode == kWeightBlocksXK) {
      const int q = lane & 3;
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        const int ml = 256 * wg + 32 * r + 8 * wq + (lane >> 2), m = w0 + ml;
        const bool ok = k >= 0 && m < a.wide_cols;
        sm90_rg::CpAsync16(ss + kBlock + ml * 64 + ((q ^ ((ml >> 1) & 3)) << 4),
                           ok ? wb + static_cast<int64_t>(m) * a.wide_row_bytes + k * 2 : a.wide, ok ? 16u : 0u);
      }
    } else {
      const char* row = k < 0 ? nullptr : wb + static_cast<int64_t>(k) * a.wide_row_bytes;
      const int col = w0 + 256 * wg + lane * 8;
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        const int kk = wq + 4 * r;
        const char* p = reinterpret_cast<const char*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(row), r));
        const bool ok = p != nullptr && col < a.wide_cols;
        sm90_rg::CpAsync16(ss + (1 + 4 * wg + (lane >> 3)) * kBlock + kk * 128 + (((lane & 7) ^ (kk & 7)) << 4),
                           ok ? p + col * 2 : a.wide, ok ? 16u : 0u);
      }
    }
    sm90_rg::CpAsyncArriveNoinc(full);
    return true;
  }
};

__device__ __forceinline__ void StMatrixT4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// Stores a warp's 16 (n) x 8*kJ (m) slab of D = acc transposed: C row m at staging
// row m_base + m, n at column n_base + n. Pairs (j, j+1) x (n rows 0-7, 8-15) per stmatrix.
template <int kKind, int kJ>
__device__ __forceinline__ void StageSlab(const float* acc, uint32_t staging, int pitch, int m_base, int n_base,
                                          int lane) {
  const int q = lane >> 3, i = lane & 7;
#pragma unroll
  for (int j = 0; j < kJ; j += 2) {
    const uint32_t addr = staging + (m_base + 8 * (j + (q >> 1)) + i) * pitch + (n_base + 8 * (q & 1)) * 2;
    StMatrixT4(addr, sm90_rg::Pack2<kKind>(acc[4 * j], acc[4 * j + 1]),
               sm90_rg::Pack2<kKind>(acc[4 * j + 2], acc[4 * j + 3]),
               sm90_rg::Pack2<kKind>(acc[4 * j + 4], acc[4 * j + 5]),
               sm90_rg::Pack2<kKind>(acc[4 * j + 6], acc[4 * j + 7]));
  }
}

// The kernel after its set-up, for one walk of the tiles: kOrdered by the table (some group
// not listed) or not (every group listed, or no table). Two instantiations so that the walk
// without a table compiles to the code it had before the table existed: with the table's
// branches in one copy, it ran 1-10 % slower (docs/notes/sm90_stile.md, run 9).
template <int kKind, int kMode, bool kNoMma, bool kOrdered>
__device__ __forceinline__ void RunTiles(const Args& a, const TileOrder& order, uint32_t base, int tid, int warp,
                                         int lane) {
  if (warp < 4) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
    // Producer warp w copies tokens 8w .. 8w+7 of each stage; lane l knows token
    // 8w + l % 8's row k, fetched one stage ahead (the list read hides behind a stage).
    // The list entries of the next kLook stages are in flight (lead runs kLook stages ahead):
    // with 1-row tiles every stage reads a new 128-byte line of the list, whose latency
    // would otherwise bound the gather.
    Cursor<kOrdered> cur{static_cast<int>(blockIdx.x), 0, {}, order};
    cur.Skip(a);
    Cursor<kOrdered> lead = cur;
    const int tk = 8 * warp + (lane & 7);
    // kWeightBlocksXK: lane copies the 8-k run 8 (lane % 4) .. of the stage (kt % 8 == 0:
    // one entry, contiguous k).
    const int tc = 8 * (lane & 3);
    int kr[kLook], kcr[kLook];
#pragma unroll
    for (int j = 0; j < kLook; ++j) {
      kr[j] = lead.RowOf(a, tk);
      kcr[j] = kMode == kWeightBlocksXK ? lead.RowOf(a, tc) : -1;
      if (!lead.Done(a)) lead.Next(a);
    }
    int stage = 0;
    uint32_t phase = 0;
    while (!cur.Done(a)) {
      const int k = kr[0], kc = kcr[0];
#pragma unroll
      for (int j = 0; j + 1 < kLook; ++j) kr[j] = kr[j + 1], kcr[j] = kcr[j + 1];
      kr[kLook - 1] = lead.RowOf(a, tk);
      if constexpr (kMode == kWeightBlocksXK) kcr[kLook - 1] = lead.RowOf(a, tc);
      if (!lead.Done(a)) lead.Next(a);
      const Tile tile = cur.tile;
      cur.Next(a);
      const int n0 = tile.g * a.gs, w0 = tile.wt * kWideCols;
      const int n_end = min(n0 + a.gs, a.narrow_cols);
      const char* nrow =
          k < 0 ? nullptr
                : a.narrow + static_cast<int64_t>(tile.b / a.narrow_div) * a.narrow_batch_bytes +
                      static_cast<int64_t>(k) * a.narrow_row_bytes;
      const char* wrow = k < 0 ? nullptr
                               : a.wide + static_cast<int64_t>(tile.b / a.wide_div) * a.wide_batch_bytes +
                                     static_cast<int64_t>(k) * a.wide_row_bytes;
      sm90_rg::MbarWait(base + kEmpty + stage * 8, phase ^ 1);
      const uint32_t ss = base + stage * kStageBytes;
#pragma unroll
      for (int r = 0; r < 2; ++r) {  // narrow: 4 tokens x 8 chunks per instruction
        const int tt = (lane >> 3) + 4 * r, ch = lane & 7, kk = 8 * warp + tt;
        const char* p = reinterpret_cast<const char*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(nrow), tt));
        const int col = n0 + ch * 8;
        const bool ok = p != nullptr && col < n_end;
        sm90_rg::CpAsync16(ss + kk * 128 + ((ch ^ (kk & 7)) << 4), ok ? p + col * 2 : a.narrow, ok ? 16u : 0u);
      }
      if constexpr (kConsumerWide) {
      } else if constexpr (kMode == kWeightBlocksXK) {
        // wide: rows m of x, 8 rows x 4 runs of 8 k per instruction; warp w: m 128 w ..
        const char* xb = a.wide + static_cast<int64_t>(tile.b / a.wide_div) * a.wide_batch_bytes;
        const int q = lane & 3;
#pragma unroll
        for (int r = 0; r < 16; ++r) {
          const int ml = 128 * warp + 8 * r + (lane >> 2), m = w0 + ml;
          const bool ok = kc >= 0 && m < a.wide_cols;
          sm90_rg::CpAsync16(ss + kBlock + ml * 64 + ((q ^ ((ml >> 1) & 3)) << 4),
                             ok ? xb + static_cast<int64_t>(m) * a.wide_row_bytes + kc * 2 : a.wide, ok ? 16u : 0u);
        }
      } else {
  #pragma unroll
        for (int r = 0; r < 16; ++r) {  // wide: half a token's 1024 B per instruction
          const int tt = r >> 1, ch = lane + 32 * (r & 1), kk = 8 * warp + tt;
          const char* p = reinterpret_cast<const char*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(wrow), tt));
          const int col = w0 + ch * 8;
          const bool ok = p != nullptr && col < a.wide_cols;
          sm90_rg::CpAsync16(ss + (1 + (ch >> 3)) * kBlock + kk * 128 + (((ch & 7) ^ (kk & 7)) << 4),
                             ok ? p + col * 2 : a.wide, ok ? 16u : 0u);
        }
      }
      sm90_rg::CpAsyncArriveNoinc(base + kFull + stage * 8);
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    sm90_rg::CpAsyncWaitAll();
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
    const int wg = (warp >> 2) - 1, wq = warp & 3;
    const int ct = tid - 128;  // consumer thread 0..255
    const uint32_t staging = base + kStaging;
    int stage = 0;
    uint32_t phase = 0;
    WideLoader<kMode, kOrdered> wl;
    if constexpr (kConsumerWide) {
      wl.Start(a, order, wq, lane);
      for (int s = 0; s < kStages; ++s)
        if (!wl.Issue(a, base + s * kStageBytes, base + kFull + s * 8, wg, wq, lane)) break;
    }
    float acc[128];
    for (int t = blockIdx.x; t < a.tiles; t += gridDim.x) {
      Tile tile;
      tile.Load<kOrdered>(a, order, t);
      const int nst = tile.Stages();
#pragma unroll
      for (int i = 0; i < 128; ++i) acc[i] = 0.f;
      for (int i = 0; i < nst; ++i) {
        sm90_rg::MbarWait(base + kFull + stage * 8, phase);
        sm90_rg::FenceProxyAsync();  // cp.async (generic proxy) writes -> wgmma (async proxy) reads
        const uint32_t ss = base + stage * kStageBytes;
        sm90_rg::WgmmaFence();
        if constexpr (kNoMma) {
        } else if constexpr (kMode == kWeightBlocksXK) {
          const uint64_t da = sm90_rg::MakeDesc(ss, kBlock, 1024);
          const uint64_t db = MakeDescK64(ss + kBlock + wg * 256 * 64);
#pragma unroll
          for (int kk = 0; kk < kTok / 16; ++kk) {
            const uint64_t a_step = static_cast<uint64_t>(kk * 2048) >> 4;  // 16 k rows of 128 B
            const uint64_t b_step = static_cast<uint64_t>(kk * 32) >> 4;    // 16 k = 32 B of a 64 B row
            if constexpr (kKind == kBf16) {
              sm90::WgmmaBf16N256<1, 0>(acc, da + a_step, db + b_step);
            } else {
              sm90::WgmmaF16N256<1, 0>(acc, da + a_step, db + b_step);
            }
          }
        } else if constexpr (kMode == kWeightBlocks) {
          const uint64_t da = sm90_rg::MakeDesc(ss, kBlock, 1024);
          const uint64_t db = sm90_rg::MakeDesc(ss + (1 + 4 * wg) * kBlock, kBlock, 1024);
#pragma unroll
          for (int kk = 0; kk < kTok / 16; ++kk) {
            const uint64_t step = static_cast<uint64_t>(kk * 2048) >> 4;  // 16 k rows of 128 B
            if constexpr (kKind == kBf16) {
              sm90::WgmmaBf16N256<1, 1>(acc, da + step, db + step);
            } else {
              sm90::WgmmaF16N256<1, 1>(acc, da + step, db + step);
            }
          }
        } else {
          constexpr int kAcc = kMode == kKAxis ? 32 : 16;  // per m64 block of n
          const uint64_t db = sm90_rg::MakeDesc(ss, kBlock, 1024);
#pragma unroll
          for (int kk = 0; kk < kTok / 16; ++kk) {
            const uint64_t step = static_cast<uint64_t>(kk * 2048) >> 4;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const uint64_t da = sm90_rg::MakeDesc(ss + (1 + 4 * wg + j) * kBlock, kBlock, 1024);
              if constexpr (kMode == kKAxis && kKind == kBf16) {
                sm90::WgmmaBf16N64<1, 1>(acc + kAcc * j, da + step, db + step);
              } else if constexpr (kMode == kKAxis) {
                sm90::WgmmaF16N64<1, 1>(acc + kAcc * j, da + step, db + step);
              } else if constexpr (kKind == kBf16) {
                sm90::WgmmaBf16N32<1, 1>(acc + kAcc * j, da + step, db + step);
              } else {
                sm90::WgmmaF16N32<1, 1>(acc + kAcc * j, da + step, db + step);
              }
            }
          }
        }
        sm90_rg::WgmmaCommit();
        // Release the stage as soon as its own wgmma is done (wait_group 0): the kernel is
        // gather-bound, and keeping one wgmma group in flight across stages measured the
        // same (docs/notes/sm90_stile.md, run 5).
        sm90_rg::WgmmaWait<0>();
        if (lane == 0) sm90_rg::MbarArrive(base + kEmpty + stage * 8);
        if constexpr (kConsumerWide) wl.Issue(a, base + stage * kStageBytes, base + kFull + stage * 8, wg, wq, lane);
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
      sm90_rg::FenceOperands(acc);

      // Epilogue: D^T = C rows into the staging buffer (stmatrix.trans), then 16-byte stores.
      asm volatile("bar.sync 1, 256;" ::: "memory");  // the previous tile's stores have read it
      const int n0 = tile.g * a.gs, w0 = tile.wt * kWideCols;
      char* c_b = a.c + static_cast<int64_t>(tile.b) * a.c_batch_bytes;
      if constexpr (kMode == kWeightBlocks || kMode == kWeightBlocksXK) {
        // Warp: D n rows 16 wq .. (+16), m columns 256 wg .. (+256) -> staging [512 m][64 n].
        StageSlab<kKind, 32>(acc, staging, kPitchWB, 256 * wg, 16 * wq, lane);
        asm volatile("bar.sync 1, 256;" ::: "memory");
        const int ch = ct & 7, col = n0 + 8 * ch;
        const bool col_ok = 8 * ch < a.gs && col < a.N;
#pragma unroll 4
        for (int r = ct >> 3; r < kWideCols; r += 32) {
          const int m = w0 + r;
          if (col_ok && m < a.M) {
            uint4 v;
            asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                         : "r"(staging + r * kPitchWB + ch * 16)
                         : "memory");
            *reinterpret_cast<uint4*>(c_b + (static_cast<int64_t>(m) * a.N + col) * 2) = v;
          }
        }
      } else {
        // Warp, block j: D n rows 256 wg + 64 j + 16 wq .., m columns 0..63 (0..31) -> staging [m][512 n].
        constexpr int kAcc = kMode == kKAxis ? 32 : 16;
#pragma unroll
        for (int j = 0; j < 4; ++j)
          StageSlab<kKind, kAcc / 4>(acc + kAcc * j, staging, kPitchKA, 0, 256 * wg + 64 * j + 16 * wq, lane);
        asm volatile("bar.sync 1, 256;" ::: "memory");
        const int ch = ct & 63, col = w0 + 8 * ch;
        const bool col_ok = col < a.N;
        const int m_end = min(a.gs, a.M - n0);
#pragma unroll 4
        for (int r = ct >> 6; r < 64; r += 4) {
          if (col_ok && r < m_end) {
            uint4 v;
            asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                         : "r"(staging + r * kPitchKA + ch * 16)
                         : "memory");
            *reinterpret_cast<uint4*>(c_b + (static_cast<int64_t>(n0 + r) * a.N + col) * 2) = v;
          }
        }
      }
    }
    if constexpr (kConsumerWide) sm90_rg::CpAsyncWaitAll();
  }
}

// kNoMma (harness only): the consumers wait for and release the stages without any wgmma,
// to measure the gather alone.
template <int kKind, int kMode, bool kNoMma = false>
__global__ void __launch_bounds__(kThreads, 1) StileGemmKernel(const Args a) {
  static_assert(kKind == kBf16 || kKind == kF16, "bf16 / f16 only");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) char smem_raw[];
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const uint32_t base = sm90_rg::SmemAddr(smem);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      sm90_rg::MbarInit(base + kFull + s * 8, kConsumerWide ? 384 : 128);  // every gathering thread (noinc)
      sm90_rg::MbarInit(base + kEmpty + s * 8, 8);   // lane 0 of every consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  const TileOrder order = BuildOrder(a, smem);  // includes the barrier after the init
  if (order.slot) {  // CTA-uniform
    RunTiles<kKind, kMode, kNoMma, true>(a, order, base, tid, warp, lane);
  } else {
    RunTiles<kKind, kMode, kNoMma, false>(a, order, base, tid, warp, lane);
  }
#endif
}

}  // namespace sm90_stile
}  // namespace pit
