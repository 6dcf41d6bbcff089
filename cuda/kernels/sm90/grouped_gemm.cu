// Host launcher of the sm_90a MoE grouped GEMM (device code: grouped_gemm.cuh).
// Per call: one tensor-map encode and one launch; no host sync, no allocation, no host
// read of device data (the row tiles come from the counts on the device).
#include "cuda/kernels/sm90/grouped_gemm.h"

#include <algorithm>
#include <cstdint>

#include <cuda.h>

#include "cuda/kernels/sm90/grouped_gemm.cuh"
#include "cuda/kernels/sm90/grouped_wgrad.cuh"
#include "cuda/kernels/sm90/launch_util.h"

namespace pit {
namespace {

static_assert(kPackedRowPad % sm90_grouped::kW3PackedTok == 0 && kPackedRowPad % sm90_grouped::kW3Tok == 0,
              "packed rows are zero-padded to whole stages");

using sm90_grouped::Args;
using sm90_grouped::Layout;
using sm90::ClusterLaunch;
using sm90::DeviceInfo;
using sm90::GetDeviceInfo;
using sm90::GetEncodeTiled;
using sm90::kMaxDevices;

template <int kKind, bool kTransW, int kCluster>
cudaError_t Launch(const CUtensorMap& map_w, const Args& g, int sms, cudaStream_t stream) {
  auto kernel = sm90_grouped::GroupedGemmKernel<kKind, kTransW, kCluster>;
  // Per device: the shared-memory opt-in and how many clusters fit at once (queries, not
  // stream operations: capture-safe).
  static int clusters[kMaxDevices] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return cudaErrorNotSupported;
  ClusterLaunch launch(kCluster, sm90_grouped::kThreads, Layout::kSmemBytes, stream);
  cudaLaunchConfig_t& cfg = launch.cfg;
  if (clusters[dev] == 0) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Layout::kSmemBytes);
    if (e != cudaSuccess) return e;
    int n = sms / kCluster, active = -1;
    if (kCluster > 1) {
      cfg.gridDim = dim3(kCluster * n);
      if (cudaOccupancyMaxActiveClusters(&active, kernel, &cfg) == cudaSuccess && active > 0) n = std::min(n, active);
    }
    clusters[dev] = n;
  }
  cfg.gridDim = dim3(kCluster * clusters[dev]);
  const Args args = g;
  cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, map_w, args);
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}

// The configuration LaunchGroupedGemmSm90 uses (docs/notes/sm90_grouped.md, run 3): single
// CTAs (2-CTA clusters with W multicast measured 2-3 % slower under sustained load), each
// expert's row tiles walked in bands of 8, row tiles fastest inside a band.
constexpr int kDefaultCluster = 1;
constexpr int kDefaultBand = 8;

template <int kKind, bool kTransW>
cudaError_t LaunchCluster(int cluster, const CUtensorMap& map_w, const Args& g, int sms, cudaStream_t s) {
#ifdef PIT_GG_EXPERIMENTS  // the bench's 2-CTA variant; the library compiles only the default
  if (cluster == 2) return Launch<kKind, kTransW, 2>(map_w, g, sms, s);
#endif
  if (cluster != 1) return cudaErrorNotSupported;
  return Launch<kKind, kTransW, 1>(map_w, g, sms, s);
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// cluster, band, diag: see sm90_grouped_testing::LaunchVariant.
cudaError_t LaunchImpl(const GroupedMatmulParams& p, cudaStream_t stream, int cluster, int band, int diag) {
  constexpr cudaError_t kNo = cudaErrorNotSupported;
  using namespace sm90_grouped;
  // ---- what this kernel covers ----
  int kind = -1;
  if (p.dtype == DType::kBF16) kind = kBf16;
  if (p.dtype == DType::kF16) kind = kF16;
  if (p.dtype == DType::kF32 && p.allow_tf32 && p.trans_w) kind = kTf32;
  if (kind < 0) return kNo;
  constexpr int64_t kBig = int64_t{1} << 31;
  if (p.batch < 1 || p.batch >= kBig || p.E < 1 || p.A < 0 || p.D <= 0 || p.F <= 0 || p.row_div < 1) return kNo;
  if (p.A >= kBig || p.D >= kBig || p.F >= kBig || p.A % p.row_div != 0) return kNo;
  if (p.D % 8 != 0 || p.F % 8 != 0) return kNo;  // 16-byte rows for cp.async, TMA and the stores
  if (p.src.batch < 1 || p.batch % p.src.batch != 0 || p.w_batch < 1 || p.batch % p.w_batch != 0) return kNo;
  if (p.index.batch < 1 || p.batch % p.index.batch != 0) return kNo;
  if (p.batch * p.E > kMaxGroups) return kNo;
  if (p.A == 0) return cudaSuccess;  // y is empty
  if (!p.src.data || !p.w || !p.y || !p.index.lists || !p.index.counts) return kNo;
  if (!Aligned16(p.src.data) || !Aligned16(p.w) || !Aligned16(p.y)) return kNo;
  const int64_t n_tiles = (p.F + kBN - 1) / kBN;
  // Work items are at most batch * (A / 128 + E) row tiles x the column tiles.
  if (p.batch * ((p.A + kBM - 1) / kBM + p.E) * n_tiles >= kBig || p.w_batch * p.E >= kBig) return kNo;
  const DeviceInfo* dev = GetDeviceInfo();
  if (!dev || !dev->sm90 || dev->sms <= 0) return kNo;
  auto encode = GetEncodeTiled();
  if (!encode) return kNo;

  const int es = DTypeBytes(p.dtype);
  Args g;
  g.src = static_cast<const char*>(p.src.data);
  g.y = static_cast<char*>(p.y);
  g.lists = p.index.lists;
  g.counts = p.index.counts;
  g.src_batch_bytes = (p.A / p.row_div) * p.D * es;
  g.y_batch_bytes = p.A * p.F * es;
  g.src_row_bytes = p.D * es;
  g.y_row_bytes = p.F * es;
  g.A = static_cast<int>(p.A);
  g.F = static_cast<int>(p.F);
  g.E = static_cast<int>(p.E);
  g.row_div = static_cast<int>(p.row_div);
  g.batch = static_cast<int>(p.batch);
  g.src_div = static_cast<int>(p.batch / p.src.batch);
  g.w_div = static_cast<int>(p.batch / p.w_batch);
  g.idx_div = static_cast<int>(p.batch / p.index.batch);
  g.groups = static_cast<int>(p.batch * p.E);
  g.n_tiles = static_cast<int>(n_tiles);
  g.num_kb = static_cast<int>((p.D * es + kBKBytes - 1) / kBKBytes);
  g.band = band;
  g.diag = diag;
  g.relu = p.relu ? 1 : 0;

  // ---- W's tensor map: 3-D (inner, outer, w_batch * E), 128B swizzle, zero fill out of bounds ----
  const CUtensorMapDataType dt = kind == kBf16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                 : kind == kF16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  const uint64_t inner = p.trans_w ? p.D : p.F, outer = p.trans_w ? p.F : p.D;
  cuuint64_t dims[3] = {inner, outer, static_cast<cuuint64_t>(p.w_batch * p.E)};
  cuuint64_t strides[2] = {inner * es, inner * outer * es};
  // trans_w ([F, D] per expert, K-major): (128 B of D) x (256 / cluster) rows of F;
  // else ([D, F], N-major): (64 columns of F) x 64 rows of D.
  cuuint32_t box[3] = {static_cast<cuuint32_t>(kBKBytes / es), p.trans_w ? static_cast<cuuint32_t>(kBN / cluster) : 64u,
                       1u};
  cuuint32_t estrides[3] = {1, 1, 1};
  CUtensorMap map_w;
  if (encode(&map_w, dt, 3, const_cast<void*>(p.w), dims, strides, box, estrides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
    return kNo;

  const int sms = dev->sms;
  if (kind == kBf16)
    return p.trans_w ? LaunchCluster<kBf16, true>(cluster, map_w, g, sms, stream)
                     : LaunchCluster<kBf16, false>(cluster, map_w, g, sms, stream);
  if (kind == kF16)
    return p.trans_w ? LaunchCluster<kF16, true>(cluster, map_w, g, sms, stream)
                     : LaunchCluster<kF16, false>(cluster, map_w, g, sms, stream);
  return LaunchCluster<kTf32, true>(cluster, map_w, g, sms, stream);
}

}  // namespace

cudaError_t LaunchGroupedGemmSm90(const GroupedMatmulParams& p, cudaStream_t stream) {
  const int diag = sm90_grouped_testing::LagWarps() ? sm90_grouped::kDiagLag : 0;
  return LaunchImpl(p, stream, kDefaultCluster, kDefaultBand, diag);
}

namespace {

// The weight-gradient kernel LaunchGroupedWgradSm90 uses (docs/notes/sm90_grouped.md, runs
// 7-8): v3 (producer warps gather both operands). v2 (classic multistage) and v4 (consumers
// gather src) measured slower on every timed case; they are compiled for the bench only
// (-DPIT_GG_EXPERIMENTS).
constexpr int kWgradDefaultVersion = 3;

// Clusters of `split` v3 CTAs that fit on the device at once (cached per device and split).
int WgradClustersPerWave(int dev, int split, int sms, cudaStream_t stream) {
  static int cache[kMaxDevices][2][9] = {};  // [dev][dtype][split]; 0: not queried, -1: none
  if (split == 1) return sms;
  int& c = cache[dev][0][split];
  if (c == 0) {
    ClusterLaunch launch(split, sm90_grouped::kW3Threads, sm90_grouped::kW3SmemBytes, stream,
                         static_cast<unsigned>(split * (sms / split)));
    int n = -1;
    if (cudaOccupancyMaxActiveClusters(&n, sm90_grouped::GroupedWgradWsKernel<sm90_grouped::kBf16>,
                                       &launch.cfg) !=
            cudaSuccess ||
        n <= 0)
      n = -1;
    cudaGetLastError();  // clear a failed query
    c = n;
  }
  return c;
}

// The v3 split S (CTAs of a cluster sharing one tile's token reduction): only when the tiles
// leave SMs idle. Cost in units of one stage (kW3Tok tokens) per wave: ceil(kb / S) + the
// launch / fill / epilogue overhead (fitted to run 7 in 32-token stages: ~12, ~20 with the
// DSMEM reduction; scaled to the stage size), kb from the caller's token estimate (the
// counts stay on the device; LaunchWgradImpl says how it estimates). S in
// {1, 2, 4, 8}: clusters of 6 measured slow (run 7), 3, 5, 7 not measured.
int ChooseWgradSplit(int64_t tiles, int64_t tokens_per_tile, int tok, int dev, int sms, cudaStream_t stream) {
  if (tiles >= sms) return 1;
  const int64_t kb = std::max<int64_t>(1, (tokens_per_tile + tok - 1) / tok);
  int best = 1;
  double best_cost = 0;
  for (int s = 1; s <= 8; s *= 2) {
    const int per_wave = WgradClustersPerWave(dev, s, sms, stream);
    if (per_wave <= 0) continue;
    const int64_t waves = (tiles + per_wave - 1) / per_wave;
    const double cost = static_cast<double>(waves) * ((kb + s - 1) / s + (s > 1 ? 20.0 : 12.0) * 32 / tok);
    if (s == 1 || cost < best_cost) best = s, best_cost = cost;
  }
  return best;
}

// The library's v3 kernel for bf16 (which 0) or f16 (1): packed rows in stages of
// kW3PackedTok tokens, gathered rows in stages of kW3Tok.
decltype(&sm90_grouped::GroupedWgradWsKernel<sm90_grouped::kBf16>) V3Kernel(int which, bool packed) {
  using namespace sm90_grouped;
  constexpr int kP = kW3ProducerRegs, kC = kW3ConsumerRegs, kPT = kW3PackedTok, kPS = kW3PackedStages;
  if (packed)
    return which == 0 ? GroupedWgradWsKernel<kBf16, 0, kP, kC, kPT, kPS> : GroupedWgradWsKernel<kF16, 0, kP, kC, kPT, kPS>;
  return which == 0 ? GroupedWgradWsKernel<kBf16> : GroupedWgradWsKernel<kF16>;
}

// version: 0 = the launcher's choice, 2 = v2 (classic multistage), 3 = v3 (warp-specialized);
// split: 0 = the launcher's choice, else the v3 cluster size (1..8). always: skip the size gate.
cudaError_t LaunchWgradImpl(const GroupedWgradParams& p, cudaStream_t stream, bool always, int version, int split) {
  constexpr cudaError_t kNo = cudaErrorNotSupported;
  using namespace sm90_grouped;
  if (p.dtype != DType::kBF16 && p.dtype != DType::kF16) return kNo;
  constexpr int64_t kBig = int64_t{1} << 31;
  if (p.batch < 1 || p.batch >= kBig || p.dw_batch < 1 || p.batch % p.dw_batch != 0) return kNo;
  if (p.E < 1 || p.A < 0 || p.D <= 0 || p.F <= 0 || p.row_div < 1 || p.A % p.row_div != 0) return kNo;
  if (p.A >= kBig || p.D >= kBig || p.F >= kBig || p.D % 8 != 0 || p.F % 8 != 0) return kNo;
  if (p.src.batch < 1 || p.batch % p.src.batch != 0 || p.dy.batch < 1 || p.batch % p.dy.batch != 0) return kNo;
  if (p.index.batch < 1 || p.batch % p.index.batch != 0) return kNo;
  if (!p.dw || !Aligned16(p.dw) || !Aligned16(p.src.data) || !Aligned16(p.dy.data)) return kNo;
  if (p.A > 0 && (!p.src.data || !p.dy.data || !p.index.lists || !p.index.counts)) return kNo;
  if (p.A == 0) return kNo;  // nothing to gather: the generic path writes the zeros
  // Gate: v3 measured 1.6x faster than the generic kernel at 32 tokens per expert on average
  // (Fig. 8 T4096 E128; v2 was 13 % slower there); fewer than that not measured: generic
  // (docs/notes/sm90_grouped.md, runs 6-7).
  if (!always && (p.batch / p.dw_batch) * p.A < 32 * p.E) return kNo;
  const int64_t m_tiles = (p.D + 127) / 128, n_tiles = (p.F + 255) / 256;
  const int64_t tiles = p.dw_batch * p.E * m_tiles * n_tiles;
  if (tiles * 8 >= kBig) return kNo;
  const DeviceInfo* dev = GetDeviceInfo();
  if (!dev || !dev->sm90) return kNo;
  int devi = 0;
  if (cudaGetDevice(&devi) != cudaSuccess || devi < 0 || devi >= kMaxDevices) return kNo;

  WgradArgs g;
  g.src = static_cast<const char*>(p.src.data);
  g.dy = static_cast<const char*>(p.dy.data);
  g.dw = static_cast<char*>(p.dw);
  g.lists = p.index.lists;
  g.counts = p.index.counts;
  g.src_batch_bytes = (p.A / p.row_div) * p.D * 2;
  g.dy_batch_bytes = p.A * p.F * 2;
  g.dw_batch_bytes = p.E * p.D * p.F * 2;
  g.src_row_bytes = p.D * 2;
  g.dy_row_bytes = p.F * 2;
  g.A = static_cast<int>(p.A);
  g.D = static_cast<int>(p.D);
  g.F = static_cast<int>(p.F);
  g.E = static_cast<int>(p.E);
  g.row_div = static_cast<int>(p.row_div);
  g.per_c = static_cast<int>(p.batch / p.dw_batch);
  g.src_div = static_cast<int>(p.batch / p.src.batch);
  g.dy_div = static_cast<int>(p.batch / p.dy.batch);
  g.idx_div = static_cast<int>(p.batch / p.index.batch);
  g.m_tiles = static_cast<int>(m_tiles);
  g.n_tiles = static_cast<int>(n_tiles);
  const int which = p.dtype == DType::kBF16 ? 0 : 1;
  if (version == 0) version = kWgradDefaultVersion;
  // Packed rows run in stages of kW3PackedTok tokens, except the bench forms of v3 (13-17,
  // and 18: the packed rows in stages of kW3Tok, as before run 21).
  const bool bench_form = version >= 13 && version <= 18;
  const int tok = p.packed && !bench_form ? kW3PackedTok : kW3Tok;
  // Packed rows: 3-D maps (columns, rows, batch) of src and dy, boxes of 64 columns x
  // `tok` rows with the 128B swizzle, zero fill past the columns. Unused (zeros) otherwise.
  CUtensorMap map_src{}, map_dy{};
  if (p.packed) {
    if (p.row_div != 1) return kNo;
    auto encode = GetEncodeTiled();
    if (!encode) return kNo;
    const CUtensorMapDataType dt =
        which == 0 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    auto make = [&](CUtensorMap* map, const void* data, int64_t cols, int64_t batch) {
      cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(p.A),
                            static_cast<cuuint64_t>(batch)};
      cuuint64_t strides[2] = {static_cast<cuuint64_t>(cols * 2), static_cast<cuuint64_t>(p.A * cols * 2)};
      cuuint32_t box[3] = {64, static_cast<cuuint32_t>(tok), 1};
      cuuint32_t estrides[3] = {1, 1, 1};
      return encode(map, dt, 3, const_cast<void*>(data), dims, strides, box, estrides,
                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
    };
    if (!make(&map_src, p.src.data, p.D, p.src.batch) || !make(&map_dy, p.dy.data, p.F, p.dy.batch)) return kNo;
    g.packed = 1;
  }

#ifdef PIT_GG_EXPERIMENTS
  if (version == 2) {
    auto kernel = which == 0 ? GroupedWgradKernel<kBf16> : GroupedWgradKernel<kF16>;
    static bool attr_set[kMaxDevices][2] = {};
    if (!attr_set[devi][which]) {
      cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kWgSmemBytes);
      if (e != cudaSuccess) return e;
      attr_set[devi][which] = true;
    }
    kernel<<<static_cast<unsigned>(tiles), kWgThreads, kWgSmemBytes, stream>>>(g);
    return cudaGetLastError();
  }
#endif
  // Bench-only forms of v3 (bf16): 13 phase timestamps; 14 / 15 the same without the gather /
  // the wgmma (timing only, wrong results); 16 / 17 producer / consumer registers 56 / 224
  // (the split before run 17) and 96 / 200 instead of 88 / 208; 18 v3 itself (packed rows in
  // stages of kW3Tok). All in stages of kW3Tok.
  decltype(&GroupedWgradWsKernel<kBf16>) bench_kernel = nullptr;
  if (bench_form) {
#if defined(PIT_GG_EXPERIMENTS) && defined(PIT_RG_EXPERIMENTS)
    constexpr int kStamp = sm90_rg::kDiagStamp;
    switch (version) {
      case 13: bench_kernel = GroupedWgradWsKernel<kBf16, kStamp>; break;
      case 14: bench_kernel = GroupedWgradWsKernel<kBf16, kStamp | kWgDiagNoGather>; break;
      case 15: bench_kernel = GroupedWgradWsKernel<kBf16, kStamp | kWgDiagNoMath>; break;
      case 16: bench_kernel = GroupedWgradWsKernel<kBf16, 0, 56, 224>; break;
      case 17: bench_kernel = GroupedWgradWsKernel<kBf16, 0, 96, 200>; break;
      default: bench_kernel = GroupedWgradWsKernel<kBf16>; break;
    }
    static bool attr_bench[kMaxDevices][6] = {};
    if (!attr_bench[devi][version - 13]) {
      cudaError_t e = cudaFuncSetAttribute(bench_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kW3SmemBytes);
      if (e != cudaSuccess) return e;
      attr_bench[devi][version - 13] = true;
    }
#endif
    if (!bench_kernel || which != 0) return kNo;
    version = 3;
  }
  if (version != 3) return kNo;

  // v3.
  static bool attr3_set[kMaxDevices] = {};
  if (!attr3_set[devi]) {
    cudaError_t e = cudaSuccess;
    for (int w : {0, 1})
      for (bool packed : {false, true})
        if (e == cudaSuccess)
          e = cudaFuncSetAttribute(V3Kernel(w, packed), cudaFuncAttributeMaxDynamicSharedMemorySize, kW3SmemBytes);
    if (e != cudaSuccess) return e;
    attr3_set[devi] = true;
  }
  // The split model's tokens per tile: the experts' average (every assignment is routed
  // somewhere), but with one group (the M axis) A is the row capacity, an upper bound of
  // the live rows: taken as half live there. At 31 / 50 / 100 % of 16384 rows (BERT's
  // 72-tile 768 x 3072) the capacity's estimate chose 8-way splits, 14 % / 5 % slower and
  // 6 % faster than the 4-way ones half of it chooses (H200; docs/notes/sm90_grouped.md,
  // run 19).
  int64_t tokens = (p.batch / p.dw_batch) * p.A / p.E;
  if (p.E == 1) tokens = (tokens + 1) / 2;
  int s = split;
  if (s == 0) s = ChooseWgradSplit(tiles, tokens, tok, devi, dev->sms, stream);
  if (s < 1 || s > 8) return kNo;
  ClusterLaunch launch(s, kW3Threads, kW3SmemBytes, stream, static_cast<unsigned>(tiles * s));
  const WgradArgs args = g;
  auto kernel = bench_kernel ? bench_kernel : V3Kernel(which, g.packed);
  cudaError_t e = cudaLaunchKernelEx(&launch.cfg, kernel, args, map_src, map_dy);
  if (e != cudaSuccess) return e;
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchGroupedWgradSm90(const GroupedWgradParams& p, cudaStream_t stream) {
  return LaunchWgradImpl(p, stream, false, 0, 0);
}

namespace sm90_grouped_testing {
cudaError_t LaunchWgradAlways(const GroupedWgradParams& p, cudaStream_t stream) {
  return LaunchWgradImpl(p, stream, true, 0, 0);
}
// Bench only (declared in grouped_bench.cu): version 2 / 3 / 0 (auto), split 0 (auto) or 1..8.
cudaError_t LaunchWgradVariant(const GroupedWgradParams& p, cudaStream_t stream, int version, int split) {
  return LaunchWgradImpl(p, stream, true, version, split);
}
// Bench only: the phase timestamps of the last stamped launch (version 13), or clear them.
cudaError_t WgradStamps(unsigned long long* host, int ctas, bool clear) {
#if defined(PIT_GG_EXPERIMENTS) && defined(PIT_RG_EXPERIMENTS)
  return sm90_rg::CopyStamps(host, ctas, clear);
#else
  (void)host, (void)ctas, (void)clear;
  return cudaErrorNotSupported;
#endif
}
std::atomic<bool>& LagWarps() {
  static std::atomic<bool> on{false};
  return on;
}

cudaError_t LaunchVariant(const GroupedMatmulParams& p, cudaStream_t stream, int cluster, int band, int diag) {
  if (cluster != 1 && cluster != 2) return cudaErrorNotSupported;
  return LaunchImpl(p, stream, cluster, band, diag);
}
}  // namespace sm90_grouped_testing

}  // namespace pit
