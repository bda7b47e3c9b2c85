// fast_math.cuh: special functions on the FMA/ALU pipes, for kernels whose MUFU unit is the bottleneck
// (softcap's tanh plus the softmax exponentials). Plain C++ as well as CUDA, so that the host tests
// (tests/test_build_sm90.py) check the very code the kernels run.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define ATTNGEN_FAST_MATH_FN __host__ __device__ __forceinline__
#else
#define ATTNGEN_FAST_MATH_FN inline
#endif

namespace attngen {

ATTNGEN_FAST_MATH_FN float bits_to_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
ATTNGEN_FAST_MATH_FN uint32_t float_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

// 2^x for x <= 8 (softmax arguments): x = n + f with n = round(x), read from the low mantissa bits of
// x + 1.5 * 2^23 (whose ulp is 1), f in [-0.5, 0.5]; 2^f by a degree-3 polynomial fitted for relative
// error (7.5e-5 at most in fp32 for x >= -125, below half an fp16 ulp); 2^n added to the exponent
// field. Arguments below -126 (masked scores are -inf) give exactly 0, as ex2.approx.ftz does; in
// [-126, -125) the result loses precision at the denormal boundary (weights far below a row sum's ulp).
ATTNGEN_FAST_MATH_FN float exp2_poly(float x) {
  const float xc = fmaxf(x, -127.f);
  const float t = xc + 12582912.f;
  const float f = xc - (t - 12582912.f);
  const float p = fmaf(fmaf(fmaf(0.05517132f, f, 0.24261054f), f, 0.69326097f), f, 0.99992812f);
  const float r = bits_to_float(float_to_bits(p) + (float_to_bits(t) << 23));
  return x < -126.f ? 0.f : r;
}

}  // namespace attngen
