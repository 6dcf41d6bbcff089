// Standalone microbenchmark (not part of the library; sm_80 and up, here with the other
// bench-only harnesses): a product with a 32x1-strip sparse operand scattered by output
// column, against cuBLAS's dense product of the same shapes (docs/notes/weight_strips.md,
// "The 32-deep form scattered by column"). Refuted at BERT-base's sizes: not faster than
// cuBLAS at 2 % density, slower above.
//
//   y [M, N] = x [M, R] @ S,   S = w ∘ m (w [R, N])   or   S = (w ∘ m)^T (w [N, R], "rows")
//
// m keeps whole strips S[32 rb .. 32 rb + 31, n]: the forward of 32x1 weight strips and the
// dx of 1x32 ones, the two strip products whose listed tiles are 32 deep. The PIT axis is
// n: each reduction block rb lists its live columns (any order); a bucketing kernel copies
// each listed strip (64 bytes) into the bucket of its (rb, 256-column chunk), and the
// product kernel gives each warp 16 rows of x and one chunk: per rb one m16n8k16 pair
// multiplies x's contiguous 32-element slice by 8 of the bucket's strips, and the 16 x 8
// result is added into the warp's float32 rows of the chunk in shared memory at the
// strips' columns (deterministic: each column sums over rb in order). The k order inside a
// block is free, so each lane's fragment slots take 8 contiguous elements of x's row and
// of the strip (one 16-byte load each).
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I. \
//     cuda/kernels/sm90/strip_scatter_bench.cu -lcublas -o strip_bench && ./strip_bench [density]
// Variants: -DPIT_STRIP_WARPS=1|2|4 (warps a CTA), -DPIT_STRIP_UNROLL=4|8|12 (reduction
// blocks whose loads are issued together), -DPIT_STRIP_CHUNK=256|512 (columns a warp
// accumulates); switches that bound the time (results then wrong): -DPIT_STRIP_NO_WALK
// (zero the accumulators and store them, nothing else), -DPIT_STRIP_FIXED_COLUMNS (the
// walk with each lane adding into fixed columns instead of the strips'). Prints, per shape and density, the bucketing + product time and cuBLAS's,
// both from CUDA graphs of 100 calls, and the largest error against a float64 host
// reference (outputs poisoned first).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/kernels/elem_types.cuh"
#include "cuda/kernels/mma_sync.cuh"

namespace pit {

constexpr int kStripDepth = 32;   // a strip's extent along the reduction
#ifndef PIT_STRIP_CHUNK
#define PIT_STRIP_CHUNK 256
#endif
constexpr int kStripChunk = PIT_STRIP_CHUNK;  // output columns a CTA accumulates in shared memory

struct StripMatmulArgs {
  const void* x = nullptr;       // [M, R]
  const void* w = nullptr;       // [R, N] or, with strips_on_rows, [N, R]
  const int32_t* lists = nullptr;   // [RB, cap]
  const int32_t* counts = nullptr;  // [RB]
  void* y = nullptr;             // [M, N]
  void* scratch = nullptr;       // StripMatmulScratchBytes
  int64_t m = 0, r = 0, n = 0, cap = 0;
  bool strips_on_rows = false;
  bool bf16 = true;  // else float16
};

// Whether the kernels take these extents: R and N multiples of 8 (16-byte rows), at most
// 1024 reduction blocks.
bool StripMatmulCovers(int64_t m, int64_t r, int64_t n);

// Scratch the launch needs: per (reduction block, column chunk) a count, the live
// columns and a copy of their strips (the bucketed operand, as large as w at most).
size_t StripMatmulScratchBytes(int64_t r, int64_t n);

// Every element of y is written (columns without live strips get 0).
cudaError_t LaunchStripMatmul(const StripMatmulArgs& args, cudaStream_t stream);

namespace {

constexpr int kChunkStride = kStripChunk + 4;  // floats a row of the accumulators: rows 8 apart in other banks
constexpr int kMaxBlocks = 1024;
#ifndef PIT_STRIP_WARPS
#define PIT_STRIP_WARPS 2
#endif
#ifndef PIT_STRIP_UNROLL
#define PIT_STRIP_UNROLL 8
#endif
constexpr int kWarps = PIT_STRIP_WARPS;
constexpr int kUnroll = PIT_STRIP_UNROLL;

struct ScratchLayout {
  int32_t* counts;   // [RB, C]
  uint16_t* cols;    // [RB, C, kStripChunk]: column inside the chunk
  uint16_t* strips;  // [RB, C, kStripChunk, kStripDepth]
};

inline size_t Align16(size_t v) { return (v + 15) / 16 * 16; }

ScratchLayout Layout(void* base, int64_t blocks, int64_t chunks) {
  char* p = static_cast<char*>(base);
  const size_t buckets = static_cast<size_t>(blocks * chunks);
  ScratchLayout s;
  s.counts = reinterpret_cast<int32_t*>(p);
  p += Align16(buckets * sizeof(int32_t));
  s.cols = reinterpret_cast<uint16_t*>(p);
  p += Align16(buckets * kStripChunk * sizeof(uint16_t));
  s.strips = reinterpret_cast<uint16_t*>(p);
  return s;
}

// One CTA per reduction block: slots from shared-memory counters (one per chunk), the
// counts written at the end (no memset launch before it).
__global__ void StripBucketKernel(const uint16_t* __restrict__ w, const int32_t* __restrict__ lists,
                                  const int32_t* __restrict__ counts, ScratchLayout s, int64_t r, int64_t n,
                                  int64_t cap, int chunks, bool strips_on_rows) {
  extern __shared__ int slots[];  // [chunks]
  const int rb = blockIdx.x;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) slots[c] = 0;
  __syncthreads();
  const int64_t count = min(static_cast<int64_t>(max(counts[rb], 0)), cap);
  const int64_t k0 = static_cast<int64_t>(rb) * kStripDepth;
  const int depth = static_cast<int>(min(static_cast<int64_t>(kStripDepth), r - k0));  // a multiple of 8
  for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
    const int col = lists[rb * cap + e];
    if (col < 0 || col >= n) continue;
    const int chunk = col / kStripChunk;
    const int bucket = rb * chunks + chunk;
    const int slot = atomicAdd(&slots[chunk], 1);
    if (slot >= kStripChunk) continue;  // a column listed twice: never from pit_jax's builders
    s.cols[bucket * kStripChunk + slot] = static_cast<uint16_t>(col - chunk * kStripChunk);
    uint4* dst = reinterpret_cast<uint4*>(s.strips + (static_cast<size_t>(bucket) * kStripChunk + slot) * kStripDepth);
    if (strips_on_rows) {  // w [N, R]: the strip is 64 contiguous bytes of row col
      const uint4* src = reinterpret_cast<const uint4*>(w + col * r + k0);
#pragma unroll
      for (int v = 0; v < kStripDepth / 8; ++v) dst[v] = v * 8 < depth ? src[v] : make_uint4(0, 0, 0, 0);
    } else {  // w [R, N]: one element of each of 32 rows
      uint16_t e16[kStripDepth];
#pragma unroll
      for (int i = 0; i < kStripDepth; ++i) e16[i] = i < depth ? w[(k0 + i) * n + col] : uint16_t{0};
#pragma unroll
      for (int v = 0; v < kStripDepth / 8; ++v) {
        uint4 q;
        q.x = e16[8 * v] | (static_cast<uint32_t>(e16[8 * v + 1]) << 16);
        q.y = e16[8 * v + 2] | (static_cast<uint32_t>(e16[8 * v + 3]) << 16);
        q.z = e16[8 * v + 4] | (static_cast<uint32_t>(e16[8 * v + 5]) << 16);
        q.w = e16[8 * v + 6] | (static_cast<uint32_t>(e16[8 * v + 7]) << 16);
        dst[v] = q;
      }
    }
  }
  __syncthreads();
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) s.counts[rb * chunks + c] = min(slots[c], kStripChunk);
}

// The k order inside a block is free (a sum), so each lane's fragment slots (pairs 2t,
// 2t + 1 and 2t + 8, 2t + 9 of both k16 steps, t = lane % 4) take the 8 contiguous
// elements 8t .. 8t + 7 of x's row and of the strip: one 16-byte load each instead of
// four 4-byte ones. Step s, pair p (0: slots 2t.., 1: 2t + 8..) is word 2s + p.
struct BlockLoads {
  uint4 a_lo, a_hi;  // x rows lane / 4 and + 8, elements 8t .. 8t + 7 of the block
  uint4 b;           // strip j0 + lane / 4, elements 8t .. 8t + 7
  uint32_t cols;     // columns of strips j0 + 2t and + 1
  int count;
};

__device__ __forceinline__ uint4 Load16(const uint16_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ uint32_t LoadPair(const uint16_t* p) { return __ldg(reinterpret_cast<const uint32_t*>(p)); }

template <typename T>
__device__ __forceinline__ void BlockMma(float (&d)[4], const uint4& a_lo, const uint4& a_hi, const uint4& b) {
  const uint32_t a0[4] = {a_lo.x, a_hi.x, a_lo.y, a_hi.y};
  const uint32_t a1[4] = {a_lo.z, a_hi.z, a_lo.w, a_hi.w};
  gemm::Mma16816<T>(d, a0, b.x, b.y);
  gemm::Mma16816<T>(d, a1, b.z, b.w);
}

// d: rows lane / 4 and + 8 of the warp, strips j and j + 1 (this lane's pair, columns in
// `cols`). Strips past the count hold stale data: their products are dropped here.
__device__ __forceinline__ void Scatter(float* acc, const float (&d)[4], uint32_t cols, int j, int count, int lane) {
  float* row = acc + (lane / 4) * kChunkStride;
#ifdef PIT_STRIP_FIXED_COLUMNS  // switch: each lane's own columns, no dependence on the strips' (a bound, wrong results)
  row[2 * (lane % 4) + (j & 248)] += d[0] + d[1];
  row[8 * kChunkStride + 2 * (lane % 4) + (j & 248)] += d[2] + d[3];
  return;
#endif
  if (j < count) {
    const int c = cols & 0xffff;
    row[c] += d[0];
    row[8 * kChunkStride + c] += d[2];
  }
  if (j + 1 < count) {
    const int c = cols >> 16;
    row[c] += d[1];
    row[8 * kChunkStride + c] += d[3];
  }
}

template <typename T>
__global__ void __launch_bounds__(kWarps * 32) StripMatmulKernel(const uint16_t* __restrict__ x, ScratchLayout s,
                                                                   uint16_t* __restrict__ y, int64_t m, int64_t r,
                                                                   int64_t n, int blocks, int chunks) {
  extern __shared__ float4 smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
  const int chunk = blockIdx.x;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.y) * kWarps + warp) * 16;
  float* acc = reinterpret_cast<float*>(smem) + warp * 16 * kChunkStride;
  for (int i = lane; i < 16 * kStripChunk / 4; i += 32) {
    const int rr = i / (kStripChunk / 4), cc = i % (kStripChunk / 4);
    reinterpret_cast<float4*>(acc + rr * kChunkStride)[cc] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  __syncwarp();

  // This lane's two rows of x (rows past M read row 0: their results are never stored).
  const int64_t ra = row0 + lane / 4, rb8 = ra + 8;
  const uint16_t* xa = x + (ra < m ? ra : 0) * r + 8 * t;
  const uint16_t* xb = x + (rb8 < m ? rb8 : 0) * r + 8 * t;
  const size_t bucket_stride = static_cast<size_t>(kStripChunk) * kStripDepth;
  const uint16_t* lane_strip = s.strips + (lane / 4) * kStripDepth + 8 * t;
  const uint16_t* lane_cols = s.cols + 2 * t;

#ifdef PIT_STRIP_NO_WALK  // switch: only the accumulators' zeroing and the stores (a bound, wrong results)
  for (int base = blocks; base < blocks; base += kUnroll) {
#else
  for (int base = 0; base < blocks; base += kUnroll) {
#endif
    BlockLoads ld[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int blk = base + u;
      ld[u].count = 0;
      if (blk < blocks) {
        const int bucket = blk * chunks + chunk;
        ld[u].count = __ldg(s.counts + bucket);
        const int64_t k = static_cast<int64_t>(blk) * kStripDepth + 8 * t;  // r is a multiple of 8
        const bool in = k < r;
        ld[u].a_lo = in ? Load16(xa + k - 8 * t) : make_uint4(0, 0, 0, 0);
        ld[u].a_hi = in ? Load16(xb + k - 8 * t) : make_uint4(0, 0, 0, 0);
        ld[u].b = Load16(lane_strip + bucket * bucket_stride);
        ld[u].cols = LoadPair(lane_cols + static_cast<size_t>(bucket) * kStripChunk);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int count = min(ld[u].count, kStripChunk);
      if (count <= 0) continue;
      const int bucket = (base + u) * chunks + chunk;
      float d[4] = {0.f, 0.f, 0.f, 0.f};
      BlockMma<T>(d, ld[u].a_lo, ld[u].a_hi, ld[u].b);
      Scatter(acc, d, ld[u].cols, 2 * t, count, lane);
      // Buckets of more than 8 strips (above ~3 % density): the rest, 8 at a time.
      for (int j0 = 8; j0 < count; j0 += 8) {
        const uint4 b = Load16(lane_strip + bucket * bucket_stride + j0 * kStripDepth);
        const uint32_t cc = LoadPair(lane_cols + static_cast<size_t>(bucket) * kStripChunk + j0);
        float e[4] = {0.f, 0.f, 0.f, 0.f};
        BlockMma<T>(e, ld[u].a_lo, ld[u].a_hi, b);
        Scatter(acc, e, cc, j0 + 2 * t, count, lane);
      }
    }
  }
  __syncwarp();

  // The warp's 16 rows of the chunk, 8 columns (16 bytes) a lane.
  const int64_t col0 = static_cast<int64_t>(chunk) * kStripChunk;
  for (int rr = 0; rr < 16; ++rr) {
    const int64_t row = row0 + rr;
    if (row >= m) break;
#pragma unroll
    for (int h = 0; h < kStripChunk / 256; ++h) {
      const int c = (h * 32 + lane) * 8;
      if (col0 + c >= n) continue;
      const float4* src = reinterpret_cast<const float4*>(acc + rr * kChunkStride + c);
      const float4 f0 = src[0], f1 = src[1];
      uint4 q;
      q.x = gemm::Elem<T>::Pack2(f0.x, f0.y);
      q.y = gemm::Elem<T>::Pack2(f0.z, f0.w);
      q.z = gemm::Elem<T>::Pack2(f1.x, f1.y);
      q.w = gemm::Elem<T>::Pack2(f1.z, f1.w);
      *reinterpret_cast<uint4*>(y + row * n + col0 + c) = q;
    }
  }
}

template <typename T>
cudaError_t Launch(const StripMatmulArgs& a, cudaStream_t stream) {
  const int blocks = static_cast<int>((a.r + kStripDepth - 1) / kStripDepth);
  const int chunks = static_cast<int>((a.n + kStripChunk - 1) / kStripChunk);
  const ScratchLayout s = Layout(a.scratch, blocks, chunks);
  StripBucketKernel<<<blocks, 256, sizeof(int) * chunks, stream>>>(static_cast<const uint16_t*>(a.w), a.lists,
                                                                   a.counts, s, a.r, a.n, a.cap, chunks,
                                                                   a.strips_on_rows);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || a.m == 0) return err;
  const size_t smem = sizeof(float) * kWarps * 16 * kChunkStride;
  auto kernel = StripMatmulKernel<T>;
  static const cudaError_t configured = [&] {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    // as many CTAs an SM as the accumulators allow: the walk is a chain of L2 round trips
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    return e;
  }();
  if (configured != cudaSuccess) return configured;
  const dim3 grid(chunks, static_cast<unsigned>((a.m + kWarps * 16 - 1) / (kWarps * 16)));
  kernel<<<grid, kWarps * 32, smem, stream>>>(static_cast<const uint16_t*>(a.x), s, static_cast<uint16_t*>(a.y),
                                                a.m, a.r, a.n, blocks, chunks);
  return cudaGetLastError();
}

}  // namespace

bool StripMatmulCovers(int64_t m, int64_t r, int64_t n) {
  return m >= 0 && r > 0 && n > 0 && r % 8 == 0 && n % 8 == 0 && (r + kStripDepth - 1) / kStripDepth <= kMaxBlocks &&
         m < (int64_t{1} << 31) / 16;
}

size_t StripMatmulScratchBytes(int64_t r, int64_t n) {
  const size_t buckets = static_cast<size_t>((r + kStripDepth - 1) / kStripDepth) *
                         static_cast<size_t>((n + kStripChunk - 1) / kStripChunk);
  return Align16(buckets * sizeof(int32_t)) + Align16(buckets * kStripChunk * sizeof(uint16_t)) +
         buckets * kStripChunk * kStripDepth * sizeof(uint16_t);
}

cudaError_t LaunchStripMatmul(const StripMatmulArgs& args, cudaStream_t stream) {
  if (!StripMatmulCovers(args.m, args.r, args.n)) return cudaErrorNotSupported;
  return args.bf16 ? Launch<__nv_bfloat16>(args, stream) : Launch<__half>(args, stream);
}

}  // namespace pit

using namespace pit;
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1);} } while (0)
static uint16_t f2bf(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return u >> 16; }
static float bf2f(uint16_t h) { uint32_t u = uint32_t(h) << 16; float f; memcpy(&f, &u, 4); return f; }

int main(int argc, char** argv) {
  struct Case { int m, r, n; bool rows; };
  std::vector<Case> cases = {{4096, 768, 2304, false}, {4096, 768, 768, false}, {4096, 768, 3072, false}, {4096, 3072, 768, false},
                             {4096, 2304, 768, true}, {4096, 768, 768, true}, {4096, 3072, 768, true}, {4096, 768, 3072, true},
                             {1000, 72, 520, false}, {1000, 72, 520, true}};
  std::vector<double> dens = {0.02, 0.05, 0.1, 0.2};
  if (argc > 1) { cases.resize(1); dens = {atof(argv[1])}; }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int cublas_version = 0;
  cublasHandle_t h; cublasCreate(&h);
  cublasGetVersion(h, &cublas_version);
  printf("# %s, cuBLAS %d; warps %d, unroll %d, chunk %d; us from CUDA graphs of 100 calls (best of 5)\n", prop.name,
         cublas_version, kWarps, kUnroll, kStripChunk);
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd;
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (auto c : cases) {
    for (double d : dens) {
      const bool small = c.m < 4096;
      const int RB = (c.r + 31) / 32;
      std::vector<uint16_t> x(size_t(c.m) * c.r), w(size_t(c.r) * c.n);
      for (auto& v : x) v = f2bf(nd(rng));
      for (auto& v : w) v = f2bf(nd(rng));
      std::vector<int> lists(size_t(RB) * c.n, -1), counts(RB, 0);
      std::vector<char> live(size_t(RB) * c.n, 0);
      std::uniform_real_distribution<double> ud;
      for (int rb = 0; rb < RB; ++rb) {
        std::vector<int> l;
        for (int n = 0; n < c.n; ++n) if (ud(rng) < d) { l.push_back(n); live[size_t(rb) * c.n + n] = 1; }
        std::shuffle(l.begin(), l.end(), rng);
        counts[rb] = l.size();
        for (size_t i = 0; i < l.size(); ++i) lists[size_t(rb) * c.n + i] = l[i];
      }
      uint16_t *dx, *dw, *dy, *dy2; int *dl, *dc; void* scr;
      CK(cudaMalloc(&dx, x.size() * 2)); CK(cudaMalloc(&dw, w.size() * 2)); CK(cudaMalloc(&dy, size_t(c.m) * c.n * 2));
      CK(cudaMalloc(&dy2, size_t(c.m) * c.n * 2));
      CK(cudaMalloc(&dl, lists.size() * 4)); CK(cudaMalloc(&dc, counts.size() * 4));
      CK(cudaMalloc(&scr, StripMatmulScratchBytes(c.r, c.n)));
      CK(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dl, lists.data(), lists.size() * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dc, counts.data(), counts.size() * 4, cudaMemcpyHostToDevice));
      CK(cudaMemset(dy, 0xff, size_t(c.m) * c.n * 2));
      StripMatmulArgs a; a.x = dx; a.w = dw; a.lists = dl; a.counts = dc; a.y = dy; a.scratch = scr;
      a.m = c.m; a.r = c.r; a.n = c.n; a.cap = c.n; a.strips_on_rows = c.rows; a.bf16 = true;
      CK(LaunchStripMatmul(a, 0)); CK(cudaDeviceSynchronize());
      double maxerr = 0, maxref = 0;
      if (small || d <= 0.05) {
        std::vector<uint16_t> y(size_t(c.m) * c.n);
        CK(cudaMemcpy(y.data(), dy, y.size() * 2, cudaMemcpyDeviceToHost));
        std::vector<float> xf(x.size()); for (size_t i = 0; i < x.size(); ++i) xf[i] = bf2f(x[i]);
        int rows_checked = small ? c.m : 256;
        for (int i = 0; i < rows_checked; ++i) {
          int row = small ? i : (i * 16 + 7) % c.m;
          for (int n = 0; n < c.n; ++n) {
            double s = 0;
            for (int rb = 0; rb < RB; ++rb) if (live[size_t(rb) * c.n + n])
              for (int k = rb * 32; k < std::min(c.r, rb * 32 + 32); ++k)
                s += double(xf[size_t(row) * c.r + k]) * bf2f(c.rows ? w[size_t(n) * c.r + k] : w[size_t(k) * c.n + n]);
            float got = bf2f(y[size_t(row) * c.n + n]);
            if (!std::isfinite(got)) { maxerr = INFINITY; }
            maxerr = std::max(maxerr, std::fabs(got - s)); maxref = std::max(maxref, std::fabs(s));
          }
        }
      }
      const int reps = 100;
      StripMatmulArgs b = a; b.m = 0;
      auto graph_time = [&](auto&& fn) {
        cudaStream_t st; cudaStreamCreate(&st);
        cudaGraph_t g; cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
        for (int i = 0; i < reps; ++i) fn(st);
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphLaunch(ge, st)); CK(cudaStreamSynchronize(st));
        float best = 1e30f;
        for (int rep = 0; rep < 5; ++rep) {
          cudaEventRecord(e0, st); cudaGraphLaunch(ge, st); cudaEventRecord(e1, st); CK(cudaEventSynchronize(e1));
          float t; cudaEventElapsedTime(&t, e0, e1); best = std::min(best, t);
        }
        cudaGraphExecDestroy(ge); cudaGraphDestroy(g); cudaStreamDestroy(st);
        return best;
      };
      float t_all = graph_time([&](cudaStream_t st) { LaunchStripMatmul(a, st); });
      float t_bucket = graph_time([&](cudaStream_t st) { LaunchStripMatmul(b, st); });
      float alpha = 1, beta = 0;
      auto gemm = [&]() {
        if (!c.rows)  // y[M,N] = x[M,R] w[R,N]  (column-major: y^T = w^T x^T)
          cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, c.n, c.m, c.r, &alpha, dw, CUDA_R_16BF, c.n, dx, CUDA_R_16BF, c.r, &beta, dy2, CUDA_R_16BF, c.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        else        // y = x w^T, w [N, R]
          cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, c.n, c.m, c.r, &alpha, dw, CUDA_R_16BF, c.r, dx, CUDA_R_16BF, c.r, &beta, dy2, CUDA_R_16BF, c.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      };
      for (int i = 0; i < 10; ++i) gemm();
      cudaEventRecord(e0); for (int i = 0; i < reps; ++i) gemm(); cudaEventRecord(e1); CK(cudaEventSynchronize(e1));
      float t_cublas; cudaEventElapsedTime(&t_cublas, e0, e1);
      { cudaStream_t st0; cudaStreamCreate(&st0); cublasSetStream(h, st0);
        float tg = graph_time([&](cudaStream_t st) { cublasSetStream(h, st); gemm(); });
        t_cublas = std::min(t_cublas, tg); cublasSetStream(h, 0); cudaStreamDestroy(st0); }
      printf("M %5d R %5d N %5d %s d %.2f | strip %7.2f us (bucket %6.2f) | cublas %7.2f us | x%.2f | err %.3g / ref %.3g\n",
             c.m, c.r, c.n, c.rows ? "rows" : "cols", d, t_all * 1e3 / reps, t_bucket * 1e3 / reps, t_cublas * 1e3 / reps,
             t_cublas / t_all, maxerr, maxref);
      fflush(stdout);
      cudaFree(dx); cudaFree(dw); cudaFree(dy); cudaFree(dy2); cudaFree(dl); cudaFree(dc); cudaFree(scr);
    }
  }
  return 0;
}
