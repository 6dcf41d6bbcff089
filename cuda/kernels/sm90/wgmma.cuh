// wgmma.mma_async wrappers for every sm_90a kernel: m64nNk16 (bf16, f16) and m64nNk8 (tf32)
// with fp32 accumulators in registers, N = 256 / 208 / 128 / 64 / 32 (128 / 104 / 64 / 32 /
// 16 per thread). Layout of d: d[4j+0..1] = row lane/4 of the warp's 16, columns 8j+2(lane%4)+{0,1};
// d[4j+2..3] = row lane/4+8. kTransA: 1 = the A tile is M-major (stored [K, M]), 0 = K-major;
// kTransB: 1 = the B tile is N-major (stored [K, N]), 0 = K-major (32-bit types: K-major only).
// Inline PTX takes no parameter packs, so each width's accumulator operands and register
// names are written out once below and the wrappers are built from them.
#pragma once

#include <cstdint>

// "+f"(d[i]) for the first 16 / 32 / 64 / 128 accumulators.
#define PIT_WGMMA_ACC16 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define PIT_WGMMA_ACC32 PIT_WGMMA_ACC16, \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define PIT_WGMMA_ACC64 PIT_WGMMA_ACC32, \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define PIT_WGMMA_ACC104 PIT_WGMMA_ACC64, \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103])
#define PIT_WGMMA_ACC128 PIT_WGMMA_ACC104, \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// Their names in the PTX: %0 .. %(n - 1).
#define PIT_WGMMA_REGS16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define PIT_WGMMA_REGS32 PIT_WGMMA_REGS16 ", " "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define PIT_WGMMA_REGS64 PIT_WGMMA_REGS32 ", " "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define PIT_WGMMA_REGS104 PIT_WGMMA_REGS64 ", " "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103"
#define PIT_WGMMA_REGS128 PIT_WGMMA_REGS104 ", " "%104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"

// The operands after n accumulators: %n desc_a, %n+1 desc_b, %n+2 scale-d (1: accumulate),
// %n+3 / %n+4 the two transposes (16-bit types only).
#define PIT_WGMMA_16BIT(NAME, SHAPE, TYPE, N, A, B, SCALE, TA, TB)                                      \
  template <int kTransA, int kTransB>                                                                     \
  __device__ __forceinline__ void NAME(float* d, uint64_t desc_a, uint64_t desc_b) {                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                                     \
                 "wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPE "." TYPE " {" PIT_WGMMA_REGS##N "}, " \
                 A ", " B ", p, 1, 1, " TA ", " TB ";\n}\n"                                             \
                 : PIT_WGMMA_ACC##N                                                                       \
                 : "l"(desc_a), "l"(desc_b), "r"(1), "n"(kTransA), "n"(kTransB));                         \
  }
#define PIT_WGMMA_TF32(NAME, SHAPE, N, A, B, SCALE)                                                        \
  __device__ __forceinline__ void NAME(float* d, uint64_t desc_a, uint64_t desc_b) {                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                                     \
                 "wgmma.mma_async.sync.aligned." SHAPE ".f32.tf32.tf32 {" PIT_WGMMA_REGS##N "}, "         \
                 A ", " B ", p, 1, 1;\n}\n"                                                              \
                 : PIT_WGMMA_ACC##N                                                                       \
                 : "l"(desc_a), "l"(desc_b), "r"(1));                                                     \
  }

namespace pit {
namespace sm90 {

PIT_WGMMA_16BIT(WgmmaBf16N256, "m64n256k16", "bf16", 128, "%128", "%129", "%130", "%131", "%132")
PIT_WGMMA_16BIT(WgmmaF16N256, "m64n256k16", "f16", 128, "%128", "%129", "%130", "%131", "%132")
PIT_WGMMA_TF32(WgmmaTf32N256, "m64n256k8", 128, "%128", "%129", "%130")
// n208 (16-bit, the row-gather kernel's narrow tiles): B N-major in 64-column swizzle
// blocks reads 3 1/4 of them (verified on the H200, docs/notes/sm90_row_gather.md).
PIT_WGMMA_16BIT(WgmmaBf16N208, "m64n208k16", "bf16", 104, "%104", "%105", "%106", "%107", "%108")
PIT_WGMMA_16BIT(WgmmaF16N208, "m64n208k16", "f16", 104, "%104", "%105", "%106", "%107", "%108")
PIT_WGMMA_16BIT(WgmmaBf16N128, "m64n128k16", "bf16", 64, "%64", "%65", "%66", "%67", "%68")
PIT_WGMMA_16BIT(WgmmaF16N128, "m64n128k16", "f16", 64, "%64", "%65", "%66", "%67", "%68")
PIT_WGMMA_TF32(WgmmaTf32N128, "m64n128k8", 64, "%64", "%65", "%66")
PIT_WGMMA_16BIT(WgmmaBf16N64, "m64n64k16", "bf16", 32, "%32", "%33", "%34", "%35", "%36")
PIT_WGMMA_16BIT(WgmmaF16N64, "m64n64k16", "f16", 32, "%32", "%33", "%34", "%35", "%36")
PIT_WGMMA_16BIT(WgmmaBf16N32, "m64n32k16", "bf16", 16, "%16", "%17", "%18", "%19", "%20")
PIT_WGMMA_16BIT(WgmmaF16N32, "m64n32k16", "f16", 16, "%16", "%17", "%18", "%19", "%20")

}  // namespace sm90
}  // namespace pit

#undef PIT_WGMMA_16BIT
#undef PIT_WGMMA_TF32
#undef PIT_WGMMA_ACC16
#undef PIT_WGMMA_ACC32
#undef PIT_WGMMA_ACC64
#undef PIT_WGMMA_ACC104
#undef PIT_WGMMA_ACC128
#undef PIT_WGMMA_REGS16
#undef PIT_WGMMA_REGS32
#undef PIT_WGMMA_REGS64
#undef PIT_WGMMA_REGS104
#undef PIT_WGMMA_REGS128
