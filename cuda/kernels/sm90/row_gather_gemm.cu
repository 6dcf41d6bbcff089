// Host launcher of the sm_90a row-gather GEMM (device code: row_gather_gemm.cuh).
#include "cuda/kernels/sm90/row_gather_gemm.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <cuda.h>

#include "cuda/kernels/sm90/launch_util.h"
#include "cuda/kernels/sm90/row_gather_gemm.cuh"

namespace pit {
namespace {

using sm90_rg::Args;
using sm90::ClusterLaunch;
using sm90::DeviceInfo;
using sm90::GetDeviceInfo;
using sm90::GetEncodeTiled;
using sm90::kMaxDevices;

struct Variant {
  int cluster = 1;     // CTAs per cluster along M (B multicast when > 1)
  int stages_a = 6;    // A pipeline depth (16 KB a stage)
  int stages_b = 3;    // B pipeline depth (32 KB a stage)
  int gather_warps = 3;
  bool carve = false;  // ask for the smallest shared-memory carve-out that fits (more L1)
  int diag = 0;        // timing experiments only
  bool epi_in_a = false;  // epilogue staging in the freed A stage (consumer gather only)
  bool split_k = false;   // the cluster splits K instead of M (no multicast; batch 1)
  bool auto_split = false;  // take kSplit or kSingle where the static tile space is small (see LaunchImpl)
  int bn = 256;             // columns per tile: 256, or 128 (Config kBN)
  bool dual = false;        // both widths compiled, chosen on the device (kDualWidth; single CTAs, batch 1)
  bool narrow = false;      // 2-CTA clusters with 128 x 208 tiles too, taken where they fill rounds better (kNarrowWidth)
};

// The variant LaunchRowGatherGemmSm90 uses (see docs/notes/sm90_row_gather.md): 2-CTA
// clusters sharing B by multicast, the consumer warps gather A, 3 A + 5 B stages, the
// epilogue staged in the freed A stage; where it applies (batch 1, C whole, 16-bit, N-major
// B, no activation), with 128 x 208 tiles compiled in for low live counts (kNarrowWidth).
constexpr Variant kDefault{2, 3, 5, 0, false, 0, true, false, true, 256, false, true};
// Small problems with long reductions (batch 1, at most kSplitTilesPerSm tiles per SM at
// full density, at least kSplitMinKBlocks k-blocks): clusters of 4 that split K (2 or 4
// ways, chosen on the device from the live count) when the live tiles are too few to fill
// the GPU, else work as 4 independent CTAs. With short reductions the split's fixed costs
// ate the gain, and with more static tiles the live ones rarely leave enough SMs idle
// (then S = 1, which runs ~5-8 % behind the multicast pairs) (docs/notes/sm90_row_gather.md,
// "split-K").
constexpr Variant kSplit{4, 3, 5, 0, false, 0, true, true, false};
constexpr int kSplitTilesPerSm = 2;
constexpr int kSplitMinKBlocks = 32;
// Other small problems (at most kSingleTilesPerSm static tiles per SM): the default's CTAs
// alone, without clusters. A cluster launch and its barriers cost ~1 us per call (an empty
// kernel: 2.4 us in 2-CTA clusters, 1.2 us alone), more than the multicast saves on a
// round or two of tiles (BERT batch 32's products: 0.5-0.8 us faster each, H100).
constexpr Variant kSingle{1, 3, 5, 0, false, 0, true, false, false};
// kSingle with both tile widths (batch 1, C whole, no activation): 128-column tiles where
// all live ones fit in one wave of the grid, which halves each SM's share of a short
// product's k-loop (BERT b32's attn_out: 13.0 -> 10.8 us, H100), else 256. Only for
// narrow products (N <= kDualMaxN): at 4096 live rows, N 3072, its 256-column path ran
// 3-4 % behind the single-width kernel, at N 768 within 0.2 us
// (docs/notes/sm90_row_gather.md, stops 30-31).
constexpr Variant kSingleDual{1, 3, 5, 0, false, 0, true, false, false, 256, true};
constexpr int64_t kDualMaxN = 1024;
constexpr int kSingleTilesPerSm = 4;

template <class Cfg, int kKind, bool kTransB, int kCluster, int kDiag, bool kSplitK = false>
cudaError_t Launch(const Variant& v, const CUtensorMap& map_b, const CUtensorMap& map_aux, const Args& g_in, int sms,
                   cudaStream_t stream) {
  auto kernel = sm90_rg::RowGatherGemmKernel<Cfg, kKind, kTransB, kCluster, kDiag, kSplitK>;
  // Per device: the shared-memory opt-in and how many clusters fit at once (queries, not
  // stream operations: capture-safe).
  static int clusters[kMaxDevices] = {};
  static int carve_set[kMaxDevices] = {};  // 0 unset, 1 default, 2 minimal
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return cudaErrorNotSupported;
  ClusterLaunch launch(kCluster, Cfg::kThreads, Cfg::kSmemBytes, stream);
  cudaLaunchConfig_t& cfg = launch.cfg;
  if (v.carve != (carve_set[dev] == 2)) {  // experiment only: the default never sets it
    // Carve-out in percent of the 228 KB maximum; the driver rounds up to a supported size.
    const int pct = v.carve ? static_cast<int>((int64_t{Cfg::kSmemBytes + 1024} * 100 + 233471) / 233472) : -1;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, pct);
    if (e != cudaSuccess) return e;
    carve_set[dev] = v.carve ? 2 : 1;
  }
  if (clusters[dev] == 0) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
    if (e != cudaSuccess) return e;
    // One CTA per SM; with clusters, as many clusters as fit at once (the occupancy query).
    int n = sms / kCluster, active = -1;
    if (kCluster > 1) {
      cfg.gridDim = dim3(kCluster * n);
      if (cudaOccupancyMaxActiveClusters(&active, kernel, &cfg) == cudaSuccess && active > 0) n = std::min(n, active);
    }
#ifdef PIT_RG_EXPERIMENTS
    // Bench-only knobs: PIT_RG_CLUSTERS=N caps the cluster count; PIT_RG_DEBUG=1 prints the grid.
    if (const char* nc = getenv("PIT_RG_CLUSTERS"); nc && atoi(nc) > 0) n = std::min(n, atoi(nc));
    if (const char* dbg = getenv("PIT_RG_DEBUG"); dbg && dbg[0] == '1')
      fprintf(stderr, "row_gather sm90: cluster %d, %d clusters (occupancy query %d), smem %d B, %d threads\n", kCluster,
              n, active, Cfg::kSmemBytes, Cfg::kThreads);
#endif
    clusters[dev] = n;
  }
  cfg.gridDim = dim3(kCluster * clusters[dev]);
  const Args g = g_in;
  cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, map_b, map_aux, g);
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}

using sm90_rg::Config;

template <int kKind, bool kTransB>
cudaError_t LaunchKind(const Variant& v, const CUtensorMap& mb, const CUtensorMap& mb2, const Args& g, int sms,
                       cudaStream_t s) {
  auto is = [&](int c, int sa, int sb, int gw, int d, bool ea, bool sk = false, int bn = 256, bool dual = false,
                bool narrow = false) {
    return v.cluster == c && v.stages_a == sa && v.stages_b == sb && v.gather_warps == gw && v.diag == d &&
           v.epi_in_a == ea && v.split_k == sk && v.bn == bn && v.dual == dual && v.narrow == narrow;
  };
  // Column parts: the default configuration's own kernel (16-bit C; see ZeroFill<true>).
  if (g.part_n > 0) {
    if constexpr (kKind != sm90_rg::kTf32)
      if (is(2, 3, 5, 0, 0, true)) return Launch<Config<3, 5, 0, true>, kKind, kTransB, 2, sm90_rg::kOutParts>(v, mb, mb2, g, sms, s);
    if constexpr (kKind != sm90_rg::kTf32)
      if (is(1, 3, 5, 0, 0, true)) return Launch<Config<3, 5, 0, true>, kKind, kTransB, 1, sm90_rg::kOutParts>(v, mb, mb2, g, sms, s);
    return cudaErrorNotSupported;
  }
  // The default configuration (clustered, and alone for small problems) and the split-K
  // one, for every type and layout.
  if (is(2, 3, 5, 0, 0, true)) return Launch<Config<3, 5, 0, true>, kKind, kTransB, 2, 0>(v, mb, mb2, g, sms, s);
  if constexpr (kKind != sm90_rg::kTf32 && !kTransB)
    if (is(2, 3, 5, 0, 0, true, false, 256, false, true))
      return Launch<Config<3, 5, 0, true>, kKind, kTransB, 2, sm90_rg::kNarrowWidth>(v, mb, mb2, g, sms, s);
  if (is(1, 3, 5, 0, 0, true)) return Launch<Config<3, 5, 0, true>, kKind, kTransB, 1, 0>(v, mb, mb2, g, sms, s);
  if (is(1, 3, 5, 0, 0, true, false, 256, true))
    return Launch<Config<3, 5, 0, true>, kKind, kTransB, 1, sm90_rg::kDualWidth>(v, mb, mb2, g, sms, s);
  if (is(4, 3, 5, 0, 0, true, true))
    return Launch<Config<3, 5, 0, true>, kKind, kTransB, 4, 0, true>(v, mb, mb2, g, sms, s);
#ifdef PIT_RG_EXPERIMENTS
  // Experiments of docs/notes/sm90_row_gather.md (bf16 only; the bench builds with
  // -DPIT_RG_EXPERIMENTS, the library without).
  using namespace sm90_rg;
  if constexpr (kKind == kBf16) {
    // 128-column tiles
    if (is(1, 3, 5, 0, 0, true, false, 128)) return Launch<Config<3, 5, 0, true, 128>, kKind, kTransB, 1, 0>(v, mb, mb2, g, sms, s);
    if (is(2, 3, 5, 0, 0, true, false, 128)) return Launch<Config<3, 5, 0, true, 128>, kKind, kTransB, 2, 0>(v, mb, mb2, g, sms, s);
    if (is(2, 3, 8, 0, 0, true, false, 128)) return Launch<Config<3, 8, 0, true, 128>, kKind, kTransB, 2, 0>(v, mb, mb2, g, sms, s);
    if (is(1, 3, 8, 0, 0, true, false, 128)) return Launch<Config<3, 8, 0, true, 128>, kKind, kTransB, 1, 0>(v, mb, mb2, g, sms, s);
    if (is(1, 4, 8, 0, 0, true, false, 128)) return Launch<Config<4, 8, 0, true, 128>, kKind, kTransB, 1, 0>(v, mb, mb2, g, sms, s);
    if (is(1, 6, 6, 0, 0, true, false, 128)) return Launch<Config<6, 6, 0, true, 128>, kKind, kTransB, 1, 0>(v, mb, mb2, g, sms, s);
    if (is(1, 8, 5, 0, 0, true, false, 128)) return Launch<Config<8, 5, 0, true, 128>, kKind, kTransB, 1, 0>(v, mb, mb2, g, sms, s);
    if (is(1, 5, 7, 0, 0, true, false, 128)) return Launch<Config<5, 7, 0, true, 128>, kKind, kTransB, 1, 0>(v, mb, mb2, g, sms, s);
    if (is(1, 5, 4, 0, 0, true)) return Launch<Config<5, 4, 0, true>, kKind, kTransB, 1, 0>(v, mb, mb2, g, sms, s);
    if (is(1, 3, 5, 0, kDiagNoFence, true)) return Launch<Config<3, 5, 0, true>, kKind, kTransB, 1, kDiagNoFence>(v, mb, mb2, g, sms, s);
    if (is(1, 3, 5, 0, kDiagNoFence, true, false, 128))
      return Launch<Config<3, 5, 0, true, 128>, kKind, kTransB, 1, kDiagNoFence>(v, mb, mb2, g, sms, s);
    if (is(1, 6, 6, 0, kDiagNoFence, true, false, 128))
      return Launch<Config<6, 6, 0, true, 128>, kKind, kTransB, 1, kDiagNoFence>(v, mb, mb2, g, sms, s);
    if (is(1, 3, 5, 0, kDiagNoFence, true, false, 256, true))
      return Launch<Config<3, 5, 0, true>, kKind, kTransB, 1, kDualWidth | kDiagNoFence>(v, mb, mb2, g, sms, s);
    if (is(4, 3, 5, 0, kDiagNoFence, true, true))
      return Launch<Config<3, 5, 0, true>, kKind, kTransB, 4, kDiagNoFence, true>(v, mb, mb2, g, sms, s);
    if constexpr (!kTransB) {
      if (is(1, 3, 5, 0, kDiagStamp | kDiagNoA, true, false, 128))
        return Launch<Config<3, 5, 0, true, 128>, kKind, kTransB, 1, kDiagStamp | kDiagNoA>(v, mb, mb2, g, sms, s);
      if (is(1, 3, 5, 0, kDiagStamp | kDiagNoB, true, false, 128))
        return Launch<Config<3, 5, 0, true, 128>, kKind, kTransB, 1, kDiagStamp | kDiagNoB>(v, mb, mb2, g, sms, s);
      if (is(1, 3, 5, 0, kDiagStamp | kDiagNoA | kDiagNoB, true, false, 128))
        return Launch<Config<3, 5, 0, true, 128>, kKind, kTransB, 1, kDiagStamp | kDiagNoA | kDiagNoB>(v, mb, mb2, g, sms, s);
      if (is(1, 3, 5, 0, kDiagStamp | kDiagNoA | kDiagNoB, true))
        return Launch<Config<3, 5, 0, true>, kKind, kTransB, 1, kDiagStamp | kDiagNoA | kDiagNoB>(v, mb, mb2, g, sms, s);
    }
    if (is(1, 3, 5, 0, kDiagStamp | kDiagNoFence, true, false, 128))
      return Launch<Config<3, 5, 0, true, 128>, kKind, kTransB, 1, kDiagStamp | kDiagNoFence>(v, mb, mb2, g, sms, s);
    if (is(1, 6, 6, 0, kDiagStamp, true, false, 128))
      return Launch<Config<6, 6, 0, true, 128>, kKind, kTransB, 1, kDiagStamp>(v, mb, mb2, g, sms, s);
    if (is(4, 3, 5, 0, 0, true, true, 128))
      return Launch<Config<3, 5, 0, true, 128>, kKind, kTransB, 4, 0, true>(v, mb, mb2, g, sms, s);
    if (is(4, 3, 8, 0, 0, true, true, 128))
      return Launch<Config<3, 8, 0, true, 128>, kKind, kTransB, 4, 0, true>(v, mb, mb2, g, sms, s);
    if (is(4, 3, 5, 0, kDiagStamp, true, true))
      return Launch<Config<3, 5, 0, true>, kKind, kTransB, 4, kDiagStamp, true>(v, mb, mb2, g, sms, s);
    if (is(4, 3, 5, 0, kDiagStamp, true, true, 128))
      return Launch<Config<3, 5, 0, true, 128>, kKind, kTransB, 4, kDiagStamp, true>(v, mb, mb2, g, sms, s);
    if (is(1, 3, 5, 0, kDiagStamp, true, false, 128))
      return Launch<Config<3, 5, 0, true, 128>, kKind, kTransB, 1, kDiagStamp>(v, mb, mb2, g, sms, s);
    // producer warps gather A (2 or 3 warps)
    if (is(1, 4, 4, 2, 0, false)) return Launch<Config<4, 4, 2>, kKind, kTransB, 1, 0>(v, mb, mb2, g, sms, s);
    if (is(1, 6, 3, 2, 0, false)) return Launch<Config<6, 3, 2>, kKind, kTransB, 1, 0>(v, mb, mb2, g, sms, s);
    if (is(1, 6, 3, 3, 0, false)) return Launch<Config<6, 3, 3>, kKind, kTransB, 1, 0>(v, mb, mb2, g, sms, s);
    if (is(1, 4, 4, 3, 0, false)) return Launch<Config<4, 4, 3>, kKind, kTransB, 1, 0>(v, mb, mb2, g, sms, s);
    if (is(1, 4, 3, 3, 0, false)) return Launch<Config<4, 3, 3>, kKind, kTransB, 1, 0>(v, mb, mb2, g, sms, s);
    // consumer warps gather A
    if (is(1, 4, 4, 0, 0, false)) return Launch<Config<4, 4, 0>, kKind, kTransB, 1, 0>(v, mb, mb2, g, sms, s);
    if (is(1, 3, 4, 0, 0, false)) return Launch<Config<3, 4, 0>, kKind, kTransB, 1, 0>(v, mb, mb2, g, sms, s);
    if (is(1, 4, 4, 0, 0, true)) return Launch<Config<4, 4, 0, true>, kKind, kTransB, 1, 0>(v, mb, mb2, g, sms, s);
    if (is(2, 4, 4, 0, 0, false)) return Launch<Config<4, 4, 0>, kKind, kTransB, 2, 0>(v, mb, mb2, g, sms, s);
    if (is(4, 3, 5, 0, 0, true)) return Launch<Config<3, 5, 0, true>, kKind, kTransB, 4, 0>(v, mb, mb2, g, sms, s);
    if (is(4, 4, 4, 0, 0, true)) return Launch<Config<4, 4, 0, true>, kKind, kTransB, 4, 0>(v, mb, mb2, g, sms, s);
    // L1-warmed start (right results), alone and with the phase timestamps
    if (is(1, 3, 5, 0, kDiagWarm, true)) return Launch<Config<3, 5, 0, true>, kKind, kTransB, 1, kDiagWarm>(v, mb, mb2, g, sms, s);
    if (is(1, 3, 5, 0, kDiagWarm | kDiagStamp, true))
      return Launch<Config<3, 5, 0, true>, kKind, kTransB, 1, kDiagWarm | kDiagStamp>(v, mb, mb2, g, sms, s);
    // phase timestamps (right results; g_rg_stamps)
    if (is(1, 3, 5, 0, kDiagStamp, true)) return Launch<Config<3, 5, 0, true>, kKind, kTransB, 1, kDiagStamp>(v, mb, mb2, g, sms, s);
    if constexpr (!kTransB) {  // diagnostics (wrong results)
      if (is(2, 3, 5, 0, kDiagNoZero, true))
        return Launch<Config<3, 5, 0, true>, kKind, kTransB, 2, kDiagNoZero>(v, mb, mb2, g, sms, s);
      if (is(2, 3, 5, 0, kDiagNoStore, true))
        return Launch<Config<3, 5, 0, true>, kKind, kTransB, 2, kDiagNoStore>(v, mb, mb2, g, sms, s);
      if (is(2, 3, 5, 0, kDiagNoA | kDiagNoB, true))
        return Launch<Config<3, 5, 0, true>, kKind, kTransB, 2, kDiagNoA | kDiagNoB>(v, mb, mb2, g, sms, s);
      if (is(2, 3, 5, 0, kDiagNoA, true))
        return Launch<Config<3, 5, 0, true>, kKind, kTransB, 2, kDiagNoA>(v, mb, mb2, g, sms, s);
      if (is(2, 3, 5, 0, kDiagEmpty, true))
        return Launch<Config<3, 5, 0, true>, kKind, kTransB, 2, kDiagEmpty>(v, mb, mb2, g, sms, s);
      if (is(1, 3, 5, 0, kDiagEmpty, true))
        return Launch<Config<3, 5, 0, true>, kKind, kTransB, 1, kDiagEmpty>(v, mb, mb2, g, sms, s);
      if (is(1, 3, 5, 0, kDiagNoZero, true))
        return Launch<Config<3, 5, 0, true>, kKind, kTransB, 1, kDiagNoZero>(v, mb, mb2, g, sms, s);
    }
  }
#endif
  return cudaErrorNotSupported;
}

cudaError_t LaunchImpl(const MatmulParams& p, const TileList& rows, cudaStream_t stream, const Variant& v);

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

cudaError_t LaunchImpl(const MatmulParams& p, const TileList& rows, cudaStream_t stream, const Variant& v_in) {
  constexpr cudaError_t kNo = cudaErrorNotSupported;
  Variant v = v_in;
  using namespace sm90_rg;
  // ---- what this kernel covers ----
  int kind = -1;
  if (p.dtype == DType::kBF16) kind = kBf16;
  if (p.dtype == DType::kF16) kind = kF16;
  if (p.dtype == DType::kF32 && p.allow_tf32 && p.trans_b) kind = kTf32;
  if (kind < 0) return kNo;
  if (p.trans_a || p.trans_c) return kNo;
  if (p.M < 0 || p.N < 0 || p.K <= 0 || p.batch < 1) return kNo;
  if (p.N % 8 != 0 || p.K % 8 != 0) return kNo;
  if (p.M >= (int64_t{1} << 31) || p.N >= (int64_t{1} << 31) || p.K >= (int64_t{1} << 31)) return kNo;
  if (p.batch >= (int64_t{1} << 31)) return kNo;
  if (p.c_batch != p.batch) return kNo;
  if (p.a.batch < 1 || p.batch % p.a.batch != 0 || p.b.batch < 1 || p.batch % p.b.batch != 0) return kNo;
  if (rows.batch < 1 || p.batch % rows.batch != 0 || rows.groups != 1 || rows.tile_h < 1) return kNo;
  if (!rows.lists || !rows.counts) return kNo;
  if (p.M == 0 || p.N == 0) return cudaSuccess;  // nothing to write
  const int64_t tile_rows = (p.M + rows.tile_h - 1) / rows.tile_h;
  if (rows.capacity != tile_rows) return kNo;  // dead ids are only listed at full capacity
  // Column parts: 16-bit C, whole 128 x 256 tiles per part, the plain persistent walk.
  const bool parts = p.c_parts > 1;
  if (p.c_parts < 1 || p.c_parts > MatmulParams::kMaxCParts) return kNo;
  if (parts && (kind == kTf32 || p.N % p.c_parts != 0 || (p.N / p.c_parts) % v.bn != 0 || v.split_k)) return kNo;
  for (int i = 0; parts && i < p.c_parts; ++i)
    if (!p.c_part[i] || !Aligned16(p.c_part[i])) return kNo;
  if (!Aligned16(p.a.data) || !Aligned16(p.b.data) || (!parts && !Aligned16(p.c)) || !Aligned16(p.epi.dead) ||
      !Aligned16(p.epi.bias) || !Aligned16(p.epi.pre) || (parts && p.epi.pre))
    return kNo;
  const DeviceInfo* dev = GetDeviceInfo();
  if (!dev || !dev->sm90 || dev->sms <= 0) return kNo;
  auto encode = GetEncodeTiled();
  if (!encode) return kNo;

  const int es = DTypeBytes(p.dtype);
  Args g;
  g.a = static_cast<const char*>(p.a.data);
  g.c = static_cast<char*>(p.c);
  g.lists = rows.lists;
  g.counts = rows.counts;
  g.a_batch_bytes = p.M * p.K * es;
  g.c_batch_bytes = p.M * p.N * es;
  g.a_row_bytes = p.K * es;
  g.c_row_bytes = p.N * es;
  g.M = static_cast<int>(p.M);
  g.N = static_cast<int>(p.N);
  g.batch = static_cast<int>(p.batch);
  g.a_div = static_cast<int>(p.batch / p.a.batch);
  g.b_div = static_cast<int>(p.batch / p.b.batch);
  g.idx_div = static_cast<int>(p.batch / rows.batch);
  g.capacity = static_cast<int>(rows.capacity);
  g.tile_h = static_cast<int>(rows.tile_h);
  g.tile_rows = static_cast<int>(tile_rows);
  g.m_tiles = static_cast<int>((rows.capacity * rows.tile_h + kBM - 1) / kBM);
  g.num_kb = static_cast<int>((p.K * es + kBKBytes - 1) / kBKBytes);
  g.epi = EpilogueDev::From(p.epi, p.dtype, p.N);
  g.out_row_bytes = g.c_row_bytes;
  if (parts) {
    g.part_n = static_cast<int>(p.N / p.c_parts);
    g.parts = p.c_parts;
    g.out_row_bytes = int64_t{g.part_n} * es;
    for (int i = 0; i < p.c_parts; ++i) g.c_part[i] = static_cast<char*>(p.c_part[i]);
  }
  // The static tile space at 128 x 256 tiles decides the form (the live count is on the device).
  // What the two-width kernel can run: batch 1, C whole, plain or bias-only stores.
  const bool dual_ok = p.batch == 1 && !parts && p.epi.act == Activation::kNone;
  const int64_t static_tiles = p.batch * int64_t{g.m_tiles} * ((p.N + kBN - 1) / kBN);
  if (v.auto_split && !parts && p.batch == 1 && g.num_kb >= kSplitMinKBlocks &&
      static_tiles <= int64_t{kSplitTilesPerSm} * dev->sms)
    v = kSplit;
  else if (v.auto_split && static_tiles <= int64_t{kSingleTilesPerSm} * dev->sms)
    v = dual_ok && p.N <= kDualMaxN ? kSingleDual : kSingle;
  if (v.dual && (!dual_ok || v.cluster != 1 || v.split_k || v.bn != 256)) return kNo;
  // The narrow tiles' kernel where they may pay (their stores: plain or bias-only), else the
  // clustered kernel alone (its code without a second width).
  if (v.narrow && !(dual_ok && !p.epi.pre && kind != kTf32 && !p.trans_b && v.cluster > 1 && !v.split_k && v.bn == 256))
    v.narrow = false;
  if (v.split_k && p.batch != 1) return kNo;
  g.n_tiles = static_cast<int>((p.N + v.bn - 1) / v.bn);
  const int m_cluster = v.split_k ? 1 : v.cluster;  // row tiles per work item
  g.m_groups = (g.m_tiles + m_cluster - 1) / m_cluster;
  const int64_t total = p.batch * int64_t{g.m_groups} * g.n_tiles;
  if (total >= (int64_t{1} << 31) || rows.capacity * rows.tile_h >= (int64_t{1} << 31)) return kNo;
  g.total_tiles = static_cast<int>(total);
  if (v.dual) {  // the 128-column tile space (batch 1)
    g.n_tiles_alt = static_cast<int>((p.N + 127) / 128);
    g.total_tiles_alt = g.m_groups * g.n_tiles_alt;
  }
  if (v.narrow) {  // 208-column tiles (batch 1; TileWalk walks them from the count)
    g.n_tiles_alt = static_cast<int>((p.N + 207) / 208);
    g.narrow_ok = 1;
  }

  // ---- tensor maps: 3-D (inner, outer, batch), 128B swizzle, zero fill out of bounds ----
  const CUtensorMapDataType dt = kind == kBf16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                 : kind == kF16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  const uint32_t box_inner = kBKBytes / es;  // 128 bytes: 64 bf16/f16 or 32 f32
  auto make_map = [&](CUtensorMap* map, const void* data, uint64_t inner, uint64_t outer, uint64_t batch,
                      uint32_t box_outer) {
    cuuint64_t dims[3] = {inner, outer, batch};
    cuuint64_t strides[2] = {inner * es, inner * outer * es};
    cuuint32_t box[3] = {box_inner, box_outer, 1u};
    cuuint32_t estrides[3] = {1, 1, 1};
    return encode(map, dt, 3, const_cast<void*>(data), dims, strides, box, estrides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                  CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  };
  CUtensorMap map_b;
  const uint64_t inner = p.trans_b ? p.K : p.N, outer = p.trans_b ? p.N : p.K;
  // B box: trans_b: (128 B of K) x (256 / cluster) rows of N; else (64 columns of N) x 64 rows of K.
  if (!make_map(&map_b, p.b.data, inner, outer, p.b.batch, p.trans_b ? v.bn / m_cluster : 64u)) return kNo;
  // The second map: the two-width kernel's for 128-column tiles (another box only when B
  // is K-major), or A's packed rows (boxes of 64 rows x 128 bytes) where the form reads A
  // by TMA: one width, no split-K, 16-bit (a packed operand the caller has anyway: the
  // TMA-fed A measured 3-4 % faster than the gather, docs/notes/sm90_row_gather.md).
  CUtensorMap map_aux = map_b;
  if (v.dual && p.trans_b && !make_map(&map_aux, p.b.data, inner, outer, p.b.batch, 128u)) return kNo;
  if (p.a_packed && kind != kTf32 && !v.dual && !v.split_k && v.gather_warps == 0 && v.epi_in_a &&
      Aligned16(p.a_packed)) {
    if (!make_map(&map_aux, p.a_packed, p.K, rows.capacity * rows.tile_h, p.a.batch, 64u)) return kNo;
    g.a_tma = 1;
  }

  const int sms = dev->sms;
  if (kind == kBf16)
    return p.trans_b ? LaunchKind<kBf16, true>(v, map_b, map_aux, g, sms, stream)
                     : LaunchKind<kBf16, false>(v, map_b, map_aux, g, sms, stream);
  if (kind == kF16)
    return p.trans_b ? LaunchKind<kF16, true>(v, map_b, map_aux, g, sms, stream)
                     : LaunchKind<kF16, false>(v, map_b, map_aux, g, sms, stream);
  return LaunchKind<kTf32, true>(v, map_b, map_aux, g, sms, stream);
}

}  // namespace

cudaError_t LaunchRowGatherGemmSm90(const MatmulParams& p, const TileList& rows, cudaStream_t stream) {
  return LaunchImpl(p, rows, stream, kDefault);
}

namespace sm90_rg_testing {
cudaError_t LaunchVariant(const MatmulParams& p, const TileList& rows, cudaStream_t stream, int cluster, int stages_a,
                          int stages_b, int gather_warps, bool carve, int diag, bool epi_in_a, bool split_k, int bn,
                          bool dual, bool narrow) {
  Variant v;
  v.epi_in_a = epi_in_a, v.split_k = split_k, v.bn = bn, v.dual = dual, v.narrow = narrow;
  v.cluster = cluster, v.stages_a = stages_a, v.stages_b = stages_b, v.gather_warps = gather_warps;
  v.carve = carve, v.diag = diag;
  if (cluster != 1 && cluster != 2 && cluster != 4) return cudaErrorNotSupported;
  return LaunchImpl(p, rows, stream, v);
}
#ifdef PIT_RG_EXPERIMENTS
cudaError_t Stamps(unsigned long long* host, int ctas, bool clear) { return sm90_rg::CopyStamps(host, ctas, clear); }
#endif
}  // namespace sm90_rg_testing

}  // namespace pit
