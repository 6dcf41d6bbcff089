// Host launchers of the generic sparse GEMM (sparse_gemm_kernel.cuh): map each target
// onto GemmArgs, pick a tile configuration and the kernel instance for the operand
// layouts, and launch for the static capacity (no host sync, no host reads).
#include <algorithm>
#include <climits>
#include <cstdint>

#include "cuda/kernels/device_utils.cuh"
#include "cuda/kernels/sparse_gemm.h"
#include "cuda/kernels/sm90/row_gather_gemm.h"
#include "cuda/kernels/sm90/stile_gemm.h"
#include "cuda/kernels/sm90/wblock_gemm.h"
#include "cuda/kernels/sparse_gemm_kernel.cuh"

namespace pit {
namespace {

using gemm::GemmArgs;

// float32 (exact FFMA): 128x128 tiles, 8x8 per thread; 64x64, 4x4 per thread for
// narrow groups / small problems. bf16/f16: the same tiles on mma.sync.
using SimtLarge = gemm::SimtCfg<128, 128, 16, 8, 8, 1>;
using SimtSmall = gemm::SimtCfg<64, 64, 16, 4, 4, 3>;
using MmaLarge = gemm::MmaCfg<128, 128, 32, 2, 4, 2>;
using MmaSmall = gemm::MmaCfg<64, 64, 32, 2, 2, 4>;

constexpr int64_t kMaxDim = int64_t{1} << 30;  // keeps every in-kernel int index far from overflow

// Debug switch: PIT_SPARSE_GEMM_SIMT=1 runs bf16/f16 on the SIMT kernel too (isolates
// the tensor-core path when a result looks wrong).
bool ForceSimt() {
  static const bool force = EnvFlag("PIT_SPARSE_GEMM_SIMT", false);
  return force;
}

// What the launchers know besides GemmArgs: extents of one unit's output (for the
// block counts) and how far apart the starts of its row / column ranges can be.
struct Shape {
  int64_t span_m = 0, span_n = 0;  // per unit: rows (positions for row gather) and cols
  int64_t m_align = 0, n_align = 0;  // range starts are multiples of BM/BN plus multiples of these
  int64_t c_batch = 1;
  bool gather = false;  // stile: K runs over the listed tiles
  int64_t kt = 1;       // stile: K extent of a tile
};

bool Aligned(const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <class Cfg, typename T, bool kAK, bool kBK>
cudaError_t LaunchKernel(const GemmArgs& g, bool gather, int grid, cudaStream_t stream) {
  if (gather) {
    gemm::SparseGemmKernel<Cfg, T, kAK, kBK, true><<<grid, Cfg::kThreads, 0, stream>>>(g);
  } else {
    gemm::SparseGemmKernel<Cfg, T, kAK, kBK, false><<<grid, Cfg::kThreads, 0, stream>>>(g);
  }
  return cudaGetLastError();
}

template <class Cfg, typename T>
cudaError_t Run(GemmArgs g, const Shape& s, bool trans_a, bool trans_b, cudaStream_t stream) {
  g.blocks_m = static_cast<int>((s.span_m + Cfg::BM - 1) / Cfg::BM);
  g.blocks_n = static_cast<int>((s.span_n + Cfg::BN - 1) / Cfg::BN);
  const int64_t blocks = s.c_batch * g.units * int64_t{g.blocks_m} * g.blocks_n;
  if (blocks == 0) return cudaSuccess;
  if (blocks > INT_MAX) return cudaErrorInvalidValue;

  constexpr int V = 16 / sizeof(T);
  const bool ak = !trans_a, bk = trans_b;  // stored K-contiguous
  // 16-byte loads need 16-byte aligned rows and vector starts: along K (the listed
  // tiles must not split a vector), or along M/N (range starts multiples of V).
  g.a_vec = Aligned(g.a, 16) && g.lda % V == 0 && (ak ? (!s.gather || s.kt % V == 0) : s.m_align % V == 0);
  g.b_vec = Aligned(g.b, 16) && g.ldb % V == 0 && (bk ? (!s.gather || s.kt % V == 0) : s.n_align % V == 0);
  g.c_vec = !g.trans_c && g.N % Cfg::kCV == 0 && Aligned(g.c, Cfg::kCV * sizeof(T)) && s.n_align % Cfg::kCV == 0;

  const int grid = static_cast<int>(blocks);
  if (ak) {
    return bk ? LaunchKernel<Cfg, T, true, true>(g, s.gather, grid, stream)
              : LaunchKernel<Cfg, T, true, false>(g, s.gather, grid, stream);
  }
  return bk ? LaunchKernel<Cfg, T, false, true>(g, s.gather, grid, stream)
            : LaunchKernel<Cfg, T, false, false>(g, s.gather, grid, stream);
}

// Large tiles when a unit is wider than a small tile on both sides and they still
// give every SM a block; small ones otherwise (less padding, more parallelism).
template <class Large, class Small, typename T>
cudaError_t Pick(const GemmArgs& g, const Shape& s, bool trans_a, bool trans_b, cudaStream_t stream) {
  const int64_t large_blocks = s.c_batch * g.units * ((s.span_m + Large::BM - 1) / Large::BM) *
                               ((s.span_n + Large::BN - 1) / Large::BN);
  const bool large = s.span_m > Small::BM && s.span_n > Small::BN && large_blocks >= DeviceSmCount();
  return large ? Run<Large, T>(g, s, trans_a, trans_b, stream) : Run<Small, T>(g, s, trans_a, trans_b, stream);
}

cudaError_t Dispatch(const MatmulParams& p, const GemmArgs& g, const Shape& s, cudaStream_t stream) {
  switch (p.dtype) {
    case DType::kF32:
      return Pick<SimtLarge, SimtSmall, float>(g, s, p.trans_a, p.trans_b, stream);
    case DType::kBF16:
      if (ForceSimt()) return Run<SimtLarge, __nv_bfloat16>(g, s, p.trans_a, p.trans_b, stream);
      return Pick<MmaLarge, MmaSmall, __nv_bfloat16>(g, s, p.trans_a, p.trans_b, stream);
    case DType::kF16:
      if (ForceSimt()) return Run<SimtLarge, __half>(g, s, p.trans_a, p.trans_b, stream);
      return Pick<MmaLarge, MmaSmall, __half>(g, s, p.trans_a, p.trans_b, stream);
  }
  return cudaErrorInvalidValue;
}

bool Fits(int64_t v) { return v >= 0 && v <= kMaxDim; }

// The fields every target shares. False when a size is past what the kernel indexes.
bool Common(const MatmulParams& p, const TileList& t, GemmArgs* g) {
  if (!Fits(p.M) || !Fits(p.N) || !Fits(p.K) || !Fits(p.batch) || !Fits(t.capacity) || !Fits(t.groups) ||
      !Fits(t.tile_h) || !Fits(t.tile_w) || !Fits(t.batch))
    return false;
  if (p.batch > 0 && (p.a.batch <= 0 || p.b.batch <= 0 || p.c_batch <= 0 || t.batch <= 0)) return false;
  g->a = p.a.data;
  g->b = p.b.data;
  g->c = p.c;
  g->M = static_cast<int>(p.M);
  g->N = static_cast<int>(p.N);
  g->K = static_cast<int>(p.K);
  g->lda = p.a.cols;
  g->ldb = p.b.cols;
  g->a_stride = p.a.rows * p.a.cols;
  g->b_stride = p.b.rows * p.b.cols;
  g->c_stride = p.M * p.N;
  if (p.batch > 0) {
    g->group = static_cast<int>(p.batch / p.c_batch);
    g->a_div = static_cast<int>(p.batch / p.a.batch);
    g->b_div = static_cast<int>(p.batch / p.b.batch);
    g->idx_div = static_cast<int>(p.batch / t.batch);
  }
  g->trans_c = p.trans_c;
  g->lists = t.lists;
  g->counts = t.counts;
  g->groups = static_cast<int>(t.groups);
  g->capacity = static_cast<int>(t.capacity);
  return true;
}

cudaError_t ZeroC(const MatmulParams& p, cudaStream_t stream) {
  const int64_t bytes = p.c_batch * p.M * p.N * DTypeBytes(p.dtype);
  return bytes > 0 ? cudaMemsetAsync(p.c, 0, static_cast<size_t>(bytes), stream) : cudaSuccess;
}

// Every row of C = the dead row (the live rows are written over).
template <typename Word>
__global__ void FillRows(const Word* dead, Word* c, int64_t n_total, int n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n_total; i += int64_t{gridDim.x} * blockDim.x)
    c[i] = dead[i % n];
}

cudaError_t FillC(const MatmulParams& p, cudaStream_t stream) {
  if (!p.epi.dead) return ZeroC(p, stream);
  const int64_t n_total = p.c_batch * p.M * p.N;
  if (n_total == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((n_total + 255) / 256, 4096));
  const int n = static_cast<int>(p.N);
  if (p.dtype == DType::kF32)
    FillRows<<<blocks, 256, 0, stream>>>(static_cast<const uint32_t*>(p.epi.dead), static_cast<uint32_t*>(p.c),
                                         n_total, n);
  else
    FillRows<<<blocks, 256, 0, stream>>>(static_cast<const uint16_t*>(p.epi.dead), static_cast<uint16_t*>(p.c),
                                         n_total, n);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchRowGatherMatmul(const MatmulParams& p, const TileList& rows, cudaStream_t stream) {
  // Fast paths go first. Each launches nothing and returns cudaErrorNotSupported when it
  // does not cover the call (another architecture, dtype or layout).
  const cudaError_t fast = LaunchRowGatherGemmSm90(p, rows, stream);
  if (fast != cudaErrorNotSupported) return fast;
  // Column parts exist on sm_90a only: the lowering asks for them only where it runs.
  if (p.c_parts != 1) return cudaErrorNotSupported;
  GemmArgs g;
  if (p.trans_a || p.trans_c || !Common(p, rows, &g)) return cudaErrorInvalidValue;
  const int64_t positions = rows.capacity * rows.tile_h;  // rows of all slots, concatenated
  if (!Fits(positions)) return cudaErrorInvalidValue;
  // Rows outside the listed blocks are zero (the dead row with an epilogue; unwritten with
  // skip_dead): fill C, then write the live rows.
  g.epi = EpilogueDev::From(p.epi, p.dtype, p.N);
  cudaError_t err = p.epi.skip_dead ? cudaSuccess : FillC(p, stream);
  if (err != cudaSuccess || p.batch == 0 || p.M == 0 || p.N == 0) return err;
  g.mode = gemm::kRowGather;
  g.tile = static_cast<int>(rows.tile_h);
  g.tiles_a = static_cast<int>((p.M + rows.tile_h - 1) / rows.tile_h);
  g.units = 1;
  Shape s;
  s.span_m = positions;
  s.span_n = p.N;
  s.c_batch = p.c_batch;
  return Dispatch(p, g, s, stream);
}

cudaError_t LaunchStileMatmul(const MatmulParams& p, const TileList& lists, bool sparse_b, cudaStream_t stream) {
  cudaError_t fast = LaunchWeightBlockGemmSm90(p, lists, sparse_b, stream);
  if (fast != cudaErrorNotSupported) return fast;
  fast = LaunchStileGemmSm90(p, lists, sparse_b, stream);
  if (fast != cudaErrorNotSupported) return fast;
  GemmArgs g;
  if (!Common(p, lists, &g)) return cudaErrorInvalidValue;
  if (p.batch == 0 || p.M == 0 || p.N == 0) return cudaSuccess;
  // See DecodeStileGeometry: with reduce_cols the groups are tile rows of the stored
  // sparse operand and the entries tile columns; otherwise the other way round.
  const bool reduce_cols = sparse_b ? p.trans_b : !p.trans_a;
  const int64_t gs = reduce_cols ? lists.tile_h : lists.tile_w;  // group extent along M (A) or N (B)
  const int64_t kt = reduce_cols ? lists.tile_w : lists.tile_h;  // K extent of a listed tile
  if (!Fits(lists.capacity * kt) || !Fits(lists.groups * gs)) return cudaErrorInvalidValue;
  g.mode = sparse_b ? gemm::kStileB : gemm::kStileA;
  g.tile = static_cast<int>(gs);
  g.tile2 = static_cast<int>(kt);
  g.tiles_a = static_cast<int>((p.K + kt - 1) / kt);
  g.units = static_cast<int>(lists.groups);
  Shape s;
  s.span_m = sparse_b ? p.M : gs;
  s.span_n = sparse_b ? gs : p.N;
  s.m_align = sparse_b ? 0 : gs;
  s.n_align = sparse_b ? gs : 0;
  s.c_batch = p.c_batch;
  s.gather = true;
  s.kt = kt;
  // Every element of C belongs to exactly one block, which writes it (zeros when its
  // group's lists are empty): no clearing pass.
  return Dispatch(p, g, s, stream);
}

cudaError_t LaunchSddMatmul(const MatmulParams& p, const TileList& tiles, cudaStream_t stream) {
  GemmArgs g;
  if (p.trans_c || !Common(p, tiles, &g)) return cudaErrorInvalidValue;
  const int64_t tile_rows = (p.M + tiles.tile_h - 1) / tiles.tile_h;
  const int64_t tile_cols = (p.N + tiles.tile_w - 1) / tiles.tile_w;
  if (!Fits(tile_rows * tile_cols)) return cudaErrorInvalidValue;
  cudaError_t err = ZeroC(p, stream);  // unlisted tiles are zero
  if (err != cudaSuccess || p.batch == 0 || p.M == 0 || p.N == 0) return err;
  g.mode = gemm::kSdd;
  g.tile = static_cast<int>(tiles.tile_h);
  g.tile2 = static_cast<int>(tiles.tile_w);
  g.tiles_a = static_cast<int>(tile_rows);
  g.tiles_b = static_cast<int>(tile_cols);
  g.units = static_cast<int>(tiles.capacity);
  Shape s;
  s.span_m = std::min<int64_t>(tiles.tile_h, p.M);
  s.span_n = std::min<int64_t>(tiles.tile_w, p.N);
  s.m_align = tiles.tile_h;
  s.n_align = tiles.tile_w;
  s.c_batch = p.c_batch;
  return Dispatch(p, g, s, stream);
}

}  // namespace pit
