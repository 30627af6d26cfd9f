// lookahead_native::qlinear, ::qdequantize, ::qrows: GGUF block formats kept as shipped, de-quantized inside
// the product.
//
// Formats (ggml's block layouts, little-endian; d and m are IEEE half floats):
//   Q4_0  32 weights in 18 bytes: d, 16 bytes of nibbles          w = d * (q - 8)
//   Q4_1  32 weights in 20 bytes: d, m, 16 bytes of nibbles       w = d * q + m
//   Q5_0  32 weights in 22 bytes: d, 32 high bits, 16 bytes       w = d * (q - 16)
//   Q5_1  32 weights in 24 bytes: d, m, 32 high bits, 16 bytes    w = d * q + m
//   Q8_0  32 weights in 34 bytes: d, 32 signed bytes              w = q * d
//   Q4_K  256 weights in 144 bytes: d, dmin, 12 bytes of eight 6-bit scales and mins, 128 bytes of nibbles
//                                                                 w = (d * sc) * q - (dmin * mn)
//   Q5_K  256 weights in 176 bytes: as Q4_K with 32 bytes of fifth bits before the nibbles
//   Q6_K  256 weights in 210 bytes: 128 bytes of low nibbles, 64 of high pairs, 16 signed scales, d
//                                                                 w = (d * sc) * (q - 32)
// Every de-quantized weight is the float32 value the `gguf` package's `dequantize` gives (the same
// operations in the same order, each rounded to float32: no fused multiply-add inside a weight), so a model
// computed through this file holds exactly the weights a de-quantized float32 copy holds.
//
// The product's summation order (the contract that makes a row's bits independent of the call): out[r, o]
// is the sum over i of w[o, i] * x[r, i] in 16 lanes, lane j taking i = j mod 16 in increasing order with a
// fused multiply-add, then the lanes added as (j, j + 8), then (j, j + 4), (j, j + 2), (0, 1); the bias is
// added last. Each (r, o) is computed by one thread alone, in that order, whatever the row count, the
// tiling, the thread count or the instruction set (AVX-512F, AVX2 with FMA, or plain C++ with std::fma all
// give the same bits), so a row's output does not depend on the other rows of the step.
//
// Worked example (Q8_0, one block): d = 0.5, q = [2, -4, 0, ..., 0]; x = [1, 1, 0, ..., 0]
//   w = [1, -2, 0, ...], out = 1 * 1 + (-2) * 1 = -1.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>
#include <cstdint>
#include <cstring>

namespace {

// ggml's type codes (gguf.GGMLQuantizationType) of the formats this file reads
enum Format : int64_t { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

struct Layout {
  int64_t block_weights;  // weights a block holds
  int64_t block_bytes;    // bytes it takes
};

bool layout_of(int64_t format, Layout* layout) {
  switch (format) {
    case Q4_0: *layout = {32, 18}; return true;
    case Q4_1: *layout = {32, 20}; return true;
    case Q5_0: *layout = {32, 22}; return true;
    case Q5_1: *layout = {32, 24}; return true;
    case Q8_0: *layout = {32, 34}; return true;
    case Q4_K: *layout = {256, 144}; return true;
    case Q5_K: *layout = {256, 176}; return true;
    case Q6_K: *layout = {256, 210}; return true;
    default: return false;
  }
}

// IEEE half -> float, exact (as numpy's astype(np.float32) of a float16)
inline float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF, bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal half: normalise
    int shift = 0;
    while ((mantissa & 0x400) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    bits = sign | (static_cast<uint32_t>(113 - shift) << 23) | ((mantissa & 0x3FF) << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

// Q4_K / Q5_K: the six-bit scale and min of sub-block j (0..7) of a super-block's 12 scale bytes
inline void scale_min_k4(const uint8_t* s, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 0x3F;
    *mn = s[j + 4] & 0x3F;
  } else {
    *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// What a 32-weight unit u of a row needs besides its quantized values: the factors of its formula.
// Unit u of a row is weights 32u .. 32u + 31; a 32-weight format's unit is its block, a K format's is a
// sub-block (Q6_K: two halves of 16 with their own scale).
struct Unit {
  float a0, a1;  // multiplier (Q6_K: one for each half; else a1 == a0)
  float b;       // the added (Q4_1, Q5_1) or subtracted (K) term; unused by the others
  int offset;    // Q4_0: -8, Q5_0: -16, Q6_K: -32, else 0
};

// unit u's 32 integer values q (before any offset) and its factors
inline Unit decode_ints(int64_t format, const uint8_t* row, int64_t u, int32_t* q) {
  Unit unit{0.f, 0.f, 0.f, 0};
  switch (format) {
    case Q4_0:
    case Q4_1: {
      const uint8_t* block = row + u * (format == Q4_0 ? 18 : 20);
      const uint8_t* qs = block + (format == Q4_0 ? 2 : 4);
      for (int i = 0; i < 16; ++i) {
        q[i] = qs[i] & 0x0F;
        q[i + 16] = qs[i] >> 4;
      }
      unit.a0 = unit.a1 = half_to_float(block);
      if (format == Q4_1) unit.b = half_to_float(block + 2);
      unit.offset = format == Q4_0 ? -8 : 0;
      return unit;
    }
    case Q5_0:
    case Q5_1: {
      const uint8_t* block = row + u * (format == Q5_0 ? 22 : 24);
      const uint8_t* high = block + (format == Q5_0 ? 2 : 4);
      const uint8_t* qs = high + 4;
      uint32_t bits;
      std::memcpy(&bits, high, 4);
      for (int i = 0; i < 16; ++i) {
        q[i] = (qs[i] & 0x0F) | (((bits >> i) & 1) << 4);
        q[i + 16] = (qs[i] >> 4) | (((bits >> (i + 16)) & 1) << 4);
      }
      unit.a0 = unit.a1 = half_to_float(block);
      if (format == Q5_1) unit.b = half_to_float(block + 2);
      unit.offset = format == Q5_0 ? -16 : 0;
      return unit;
    }
    case Q8_0: {
      const uint8_t* block = row + u * 34;
      for (int i = 0; i < 32; ++i) q[i] = static_cast<int8_t>(block[2 + i]);
      unit.a0 = unit.a1 = half_to_float(block);
      return unit;
    }
    case Q4_K:
    case Q5_K: {
      const int64_t bytes = format == Q4_K ? 144 : 176;
      const uint8_t* block = row + (u / 8) * bytes;
      const int j = static_cast<int>(u % 8);
      int sc, mn;
      scale_min_k4(block + 4, j, &sc, &mn);
      const uint8_t* qs = block + (format == Q4_K ? 16 : 48) + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int i = 0; i < 32; ++i) q[i] = (qs[i] >> shift) & 0x0F;
      if (format == Q5_K) {
        const uint8_t* high = block + 16;
        for (int i = 0; i < 32; ++i) q[i] |= ((high[i] >> j) & 1) << 4;
      }
      unit.a0 = unit.a1 = half_to_float(block) * static_cast<float>(sc);
      unit.b = half_to_float(block + 2) * static_cast<float>(mn);
      return unit;
    }
    case Q6_K: {
      const uint8_t* block = row + (u / 8) * 210;
      const int j = static_cast<int>(u % 8), h = j / 4, k = j % 4;
      const uint8_t* ql = block + 64 * h + 32 * (k % 2);
      const uint8_t* qh = block + 128 + 32 * h;
      const int8_t* scales = reinterpret_cast<const int8_t*>(block + 192);
      const float d = half_to_float(block + 208);
      for (int i = 0; i < 32; ++i) q[i] = ((ql[i] >> (4 * (k / 2))) & 0x0F) | (((qh[i] >> (2 * k)) & 3) << 4);
      unit.a0 = d * static_cast<float>(scales[2 * j]);
      unit.a1 = d * static_cast<float>(scales[2 * j + 1]);
      unit.offset = -32;
      return unit;
    }
    default:
      return unit;
  }
}

// The weight of value q in a unit of `format`, as gguf's dequantize computes it (each step rounded to float32)
inline float weight_of(int64_t format, const Unit& unit, float a, int32_t q) {
  const float v = static_cast<float>(q + unit.offset);
  switch (format) {
    case Q4_1:
    case Q5_1: {
      const float product = a * v;  // (two roundings: the library is built with -ffp-contract=off)
      return product + unit.b;
    }
    case Q4_K:
    case Q5_K: {
      const float product = a * v;
      return product - unit.b;
    }
    case Q8_0:
      return v * a;
    default:
      return a * v;
  }
}

// unit u's 32 weights as float32
inline void decode_unit(int64_t format, const uint8_t* row, int64_t u, float* w) {
  int32_t q[32];
  const Unit unit = decode_ints(format, row, u, q);
  for (int i = 0; i < 32; ++i) w[i] = weight_of(format, unit, i < 16 ? unit.a0 : unit.a1, q[i]);
}

// ---- the product in plain C++: lanes as arrays, std::fma (the reference every path equals) ----

template <int RT>
void rows_plain(int64_t format, const uint8_t* row, const float* x, float* out, int64_t rows_stride, int64_t units,
                int64_t r0, int64_t o, int64_t outputs) {
  float acc[RT][16] = {};
  float w[32];
  for (int64_t u = 0; u < units; ++u) {
    decode_unit(format, row, u, w);
    for (int r = 0; r < RT; ++r) {
      const float* xr = x + (r0 + r) * rows_stride + 32 * u;
      for (int i = 0; i < 16; ++i) acc[r][i] = std::fma(w[i], xr[i], acc[r][i]);
      for (int i = 0; i < 16; ++i) acc[r][i] = std::fma(w[16 + i], xr[16 + i], acc[r][i]);
    }
  }
  for (int r = 0; r < RT; ++r) {
    float* a = acc[r];
    for (int i = 0; i < 8; ++i) a[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; ++i) a[i] = a[i] + a[i + 4];
    for (int i = 0; i < 2; ++i) a[i] = a[i] + a[i + 2];
    out[(r0 + r) * outputs + o] = a[0] + a[1];
  }
}

// ---- AVX2 with FMA: the 16 lanes as two 8-lane halves, weights decoded in C++ ----

__attribute__((target("avx2,fma"))) inline float reduce16(__m256 low, __m256 high) {
  const __m256 eight = _mm256_add_ps(low, high);  // (j, j + 8)
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));  // (j, j + 4)
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));  // (j, j + 2)
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 0x55)));  // (0, 1)
}

template <int RT>
struct Avx2 {
  __attribute__((target("avx2,fma"))) static void run(int64_t format, const uint8_t* row, const float* x, float* out,
                                                      int64_t stride, int64_t units, int64_t r0, int64_t o,
                                                      int64_t outputs) {
    __m256 lo[RT], hi[RT];
    for (int r = 0; r < RT; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
    alignas(32) float w[32];
    for (int64_t u = 0; u < units; ++u) {
      decode_unit(format, row, u, w);
      for (int half = 0; half < 2; ++half) {
        const __m256 w0 = _mm256_load_ps(w + 16 * half), w1 = _mm256_load_ps(w + 16 * half + 8);
        for (int r = 0; r < RT; ++r) {
          const float* xr = x + (r0 + r) * stride + 32 * u + 16 * half;
          lo[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xr), lo[r]);
          hi[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr + 8), hi[r]);
        }
      }
    }
    for (int r = 0; r < RT; ++r) out[(r0 + r) * outputs + o] = reduce16(lo[r], hi[r]);
  }
};

// ---- AVX-512F: a unit's distinct weights as a table, the values picked from it by permutes ----

__attribute__((target("avx512f"))) inline float reduce16(__m512 v) {
  const __m256 low = _mm512_castps512_ps256(v);
  const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return reduce16(low, high);
}

// The table of a unit's weights by value: entry k is weight_of(q = k) (k + 16 for the upper table), the same
// operations on the same floats as decode_unit's, in 16 lanes.
__attribute__((target("avx512f"))) inline __m512 table(int64_t format, const Unit& unit, int first) {
  const __m512 v = _mm512_cvtepi32_ps(_mm512_add_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(first + unit.offset)));
  const __m512 product = _mm512_mul_ps(_mm512_set1_ps(unit.a0), v);
  switch (format) {
    case Q4_1:
    case Q5_1: return _mm512_add_ps(product, _mm512_set1_ps(unit.b));
    case Q4_K:
    case Q5_K: return _mm512_sub_ps(product, _mm512_set1_ps(unit.b));
    default: return product;
  }
}

// A unit's two weight vectors (weights 0-15, 16-31), decoded in registers for the nibble formats, in C++
// for the others.
struct Decoded {
  __m512 w0, w1;
};

__attribute__((target("avx512f"))) inline Decoded decode512(int64_t format, const uint8_t* row, int64_t u) {
  switch (format) {
    case Q4_0:
    case Q4_1: {
      const uint8_t* block = row + u * (format == Q4_0 ? 18 : 20);
      Unit unit{half_to_float(block), 0.f, format == Q4_1 ? half_to_float(block + 2) : 0.f, format == Q4_0 ? -8 : 0};
      const __m512 values = table(format, unit, 0);
      const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + (format == Q4_0 ? 2 : 4))));
      return {_mm512_permutexvar_ps(bytes, values), _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), values)};
    }
    case Q4_K: {
      const uint8_t* block = row + (u / 8) * 144;
      const int j = static_cast<int>(u % 8);
      int sc, mn;
      scale_min_k4(block + 4, j, &sc, &mn);
      Unit unit{half_to_float(block) * static_cast<float>(sc), 0.f, half_to_float(block + 2) * static_cast<float>(mn), 0};
      const __m512 values = table(format, unit, 0);
      const uint8_t* qs = block + 16 + 32 * (j / 2);
      __m512i b0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
      __m512i b1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16)));
      if (j % 2) {
        b0 = _mm512_srli_epi32(b0, 4);
        b1 = _mm512_srli_epi32(b1, 4);
      }
      return {_mm512_permutexvar_ps(b0, values), _mm512_permutexvar_ps(b1, values)};
    }
    case Q5_0:
    case Q5_1: {
      const uint8_t* block = row + u * (format == Q5_0 ? 22 : 24);
      const uint8_t* high = block + (format == Q5_0 ? 2 : 4);
      Unit unit{half_to_float(block), 0.f, format == Q5_1 ? half_to_float(block + 2) : 0.f, format == Q5_0 ? -16 : 0};
      const __m512 low_values = table(format, unit, 0), high_values = table(format, unit, 16);
      uint32_t bits;
      std::memcpy(&bits, high, 4);
      const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      const __m512i one = _mm512_set1_epi32(1), all = _mm512_set1_epi32(static_cast<int>(bits));
      const __m512i h0 = _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(all, lanes), one), 4);
      const __m512i h1 = _mm512_slli_epi32(
          _mm512_and_si512(_mm512_srlv_epi32(all, _mm512_add_epi32(lanes, _mm512_set1_epi32(16))), one), 4);
      const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(high + 4)));
      const __m512i i0 = _mm512_or_si512(_mm512_and_si512(bytes, _mm512_set1_epi32(15)), h0);
      const __m512i i1 = _mm512_or_si512(_mm512_srli_epi32(bytes, 4), h1);
      return {_mm512_permutex2var_ps(low_values, i0, high_values), _mm512_permutex2var_ps(low_values, i1, high_values)};
    }
    case Q8_0: {
      const uint8_t* block = row + u * 34;
      const __m512 d = _mm512_set1_ps(half_to_float(block));
      const __m512 v0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2))));
      const __m512 v1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 18))));
      return {_mm512_mul_ps(v0, d), _mm512_mul_ps(v1, d)};  // q * d, as gguf multiplies
    }
    case Q5_K: {
      const uint8_t* block = row + (u / 8) * 176;
      const int j = static_cast<int>(u % 8);
      int sc, mn;
      scale_min_k4(block + 4, j, &sc, &mn);
      Unit unit{half_to_float(block) * static_cast<float>(sc), 0.f, half_to_float(block + 2) * static_cast<float>(mn), 0};
      const __m512 low_values = table(format, unit, 0), high_values = table(format, unit, 16);
      const uint8_t* qs = block + 48 + 32 * (j / 2);
      const uint8_t* qh = block + 16;
      const __m512i fifteen = _mm512_set1_epi32(15), one = _mm512_set1_epi32(1);
      Decoded out{};
      for (int half = 0; half < 2; ++half) {
        __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16 * half)));
        if (j % 2) b = _mm512_srli_epi32(b, 4);
        const __m512i h = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + 16 * half)));
        const __m512i bit = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h, j), one), 4);
        const __m512 w = _mm512_permutex2var_ps(low_values, _mm512_or_si512(_mm512_and_si512(b, fifteen), bit),
                                                high_values);
        if (half == 0) out.w0 = w; else out.w1 = w;
      }
      return out;
    }
    case Q6_K: {
      const uint8_t* block = row + (u / 8) * 210;
      const int j = static_cast<int>(u % 8), h = j / 4, k = j % 4;
      const uint8_t* ql = block + 64 * h + 32 * (k % 2);
      const uint8_t* qh = block + 128 + 32 * h;
      const int8_t* scales = reinterpret_cast<const int8_t*>(block + 192);
      const float d = half_to_float(block + 208);
      const __m512i fifteen = _mm512_set1_epi32(15), three = _mm512_set1_epi32(3), offset = _mm512_set1_epi32(32);
      Decoded out{};
      for (int half = 0; half < 2; ++half) {
        const __m512i low = _mm512_and_si512(
            _mm512_srli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ql + 16 * half))),
                              4 * (k / 2)), fifteen);
        const __m512i top = _mm512_and_si512(
            _mm512_srli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + 16 * half))),
                              2 * k), three);
        const __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_or_si512(low, _mm512_slli_epi32(top, 4)), offset));
        const __m512 w = _mm512_mul_ps(_mm512_set1_ps(d * static_cast<float>(scales[2 * j + half])), v);
        if (half == 0) out.w0 = w; else out.w1 = w;
      }
      return out;
    }
    default: {
      alignas(64) float w[32];
      decode_unit(format, row, u, w);
      return {_mm512_load_ps(w), _mm512_load_ps(w + 16)};
    }
  }
}

template <int RT>
struct Avx512 {
  __attribute__((target("avx512f"))) static void run(int64_t format, const uint8_t* row, const float* x, float* out,
                                                     int64_t stride, int64_t units, int64_t r0, int64_t o,
                                                     int64_t outputs) {
    __m512 acc[RT];
    for (int r = 0; r < RT; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t u = 0; u < units; ++u) {
      const Decoded w = decode512(format, row, u);
      for (int r = 0; r < RT; ++r) {
        const float* xr = x + (r0 + r) * stride + 32 * u;
        acc[r] = _mm512_fmadd_ps(w.w0, _mm512_loadu_ps(xr), acc[r]);
        acc[r] = _mm512_fmadd_ps(w.w1, _mm512_loadu_ps(xr + 16), acc[r]);
      }
    }
    for (int r = 0; r < RT; ++r) out[(r0 + r) * outputs + o] = reduce16(acc[r]);
  }
};

template <int RT>
struct Plain {
  static void run(int64_t format, const uint8_t* row, const float* x, float* out, int64_t stride, int64_t units,
                  int64_t r0, int64_t o, int64_t outputs) {
    rows_plain<RT>(format, row, x, out, stride, units, r0, o, outputs);
  }
};

constexpr int TILE = 8;            // input rows a pass over one weight row serves
constexpr int64_t ROW_BLOCK = 64;  // input rows kept in cache while every weight row of a thread passes over them

// out[r0 .. r0 + count, o] for count <= TILE rows
template <template <int> class Path>
void tile(int64_t format, const uint8_t* row, const float* x, float* out, int64_t stride, int64_t units, int64_t r0,
          int64_t count, int64_t o, int64_t outputs) {
  switch (count) {
    case 8: Path<8>::run(format, row, x, out, stride, units, r0, o, outputs); break;
    case 7: Path<7>::run(format, row, x, out, stride, units, r0, o, outputs); break;
    case 6: Path<6>::run(format, row, x, out, stride, units, r0, o, outputs); break;
    case 5: Path<5>::run(format, row, x, out, stride, units, r0, o, outputs); break;
    case 4: Path<4>::run(format, row, x, out, stride, units, r0, o, outputs); break;
    case 3: Path<3>::run(format, row, x, out, stride, units, r0, o, outputs); break;
    case 2: Path<2>::run(format, row, x, out, stride, units, r0, o, outputs); break;
    case 1: Path<1>::run(format, row, x, out, stride, units, r0, o, outputs); break;
    default: break;
  }
}

// out [R, O] = x [R, I] @ W^T, W's O rows of `row_bytes` bytes each; output rows split between torch's threads
template <template <int> class Path>
void product(int64_t format, const uint8_t* w, int64_t row_bytes, const float* x, float* out, int64_t rows,
             int64_t inputs, int64_t outputs) {
  const int64_t units = inputs / 32;
  const int64_t grain = std::max<int64_t>(1, std::min<int64_t>(16, outputs / (4 * at::get_num_threads() + 1)));
  at::parallel_for(0, outputs, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b0 = 0; b0 < rows; b0 += ROW_BLOCK) {
      const int64_t b1 = std::min(rows, b0 + ROW_BLOCK);
      for (int64_t o = begin; o < end; ++o) {
        const uint8_t* row = w + o * row_bytes;
        for (int64_t r0 = b0; r0 < b1; r0 += TILE) {
          tile<Path>(format, row, x, out, inputs, units, r0, std::min<int64_t>(TILE, b1 - r0), o, outputs);
        }
      }
    }
  });
}

// The instruction sets this CPU runs the product in, best first: 2 AVX-512F, 1 AVX2 with FMA, 0 plain C++
int64_t best_isa() {
  static const int64_t isa = __builtin_cpu_supports("avx512f")                                    ? 2
                             : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1
                                                                                                : 0;
  return isa;
}

void check_blocks(const at::Tensor& blocks, int64_t format, int64_t inputs, Layout* layout) {
  TORCH_CHECK(layout_of(format, layout), "lookahead_native: GGML type ", format,
              " is not one of the block formats this kernel reads (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)");
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.is_contiguous() && blocks.is_cpu(),
              "lookahead_native: blocks must be a contiguous uint8 CPU tensor [O, row bytes]");
  TORCH_CHECK(inputs > 0 && inputs % layout->block_weights == 0 &&
                  blocks.size(1) == inputs / layout->block_weights * layout->block_bytes,
              "lookahead_native: a row of ", inputs, " weights in this format takes ",
              inputs / layout->block_weights * layout->block_bytes, " bytes, the blocks have ", blocks.size(1));
}

// x [..., I] float32 @ W [O, I]^T (+ bias [O]) -> [..., O]; isa -1: the best this CPU runs
at::Tensor qlinear(const at::Tensor& x, const at::Tensor& blocks, int64_t format, int64_t inputs,
                   const std::optional<at::Tensor>& bias, int64_t isa) {
  Layout layout{};
  check_blocks(blocks, format, inputs, &layout);
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_cpu() && x.size(-1) == inputs,
              "lookahead_native::qlinear: x must be a float32 CPU tensor [..., ", inputs, "]");
  const int64_t chosen = isa < 0 ? best_isa() : isa;
  TORCH_CHECK(chosen <= best_isa(), "lookahead_native::qlinear: this CPU does not run instruction set ", isa);
  const at::Tensor flat = x.reshape({-1, inputs}).contiguous();  // [R, I]
  const int64_t rows = flat.size(0), outputs = blocks.size(0);
  at::Tensor out = at::empty({rows, outputs}, x.options());  // [R, O]
  if (rows > 0) {
    const uint8_t* w = blocks.data_ptr<uint8_t>();
    const float* xp = flat.data_ptr<float>();
    float* op = out.data_ptr<float>();
    if (chosen == 2) {
      product<Avx512>(format, w, blocks.size(1), xp, op, rows, inputs, outputs);
    } else if (chosen == 1) {
      product<Avx2>(format, w, blocks.size(1), xp, op, rows, inputs, outputs);
    } else {
      product<Plain>(format, w, blocks.size(1), xp, op, rows, inputs, outputs);
    }
  }
  if (bias.has_value() && bias->defined()) out.add_(*bias);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = outputs;
  return out.view(shape);
}

// The rows `ids` [...] of W as float32 [..., I] (an embedding's lookup); ids out of range are an error
at::Tensor qrows(const at::Tensor& blocks, const at::Tensor& ids, int64_t format, int64_t inputs) {
  Layout layout{};
  check_blocks(blocks, format, inputs, &layout);
  const at::Tensor flat = ids.reshape({-1}).to(at::kLong).contiguous();
  const int64_t count = flat.size(0), units = inputs / 32, total = blocks.size(0);
  at::Tensor out = at::empty({count, inputs}, at::TensorOptions().dtype(at::kFloat));
  const int64_t* index = flat.data_ptr<int64_t>();
  for (int64_t k = 0; k < count; ++k) {
    TORCH_CHECK(index[k] >= 0 && index[k] < total, "lookahead_native::qrows: id ", index[k], " is out of range [0, ",
                total, ")");
  }
  const uint8_t* w = blocks.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      for (int64_t u = 0; u < units; ++u) decode_unit(format, w + index[k] * blocks.size(1), u, op + k * inputs + 32 * u);
    }
  });
  std::vector<int64_t> shape(ids.sizes().begin(), ids.sizes().end());
  shape.push_back(inputs);
  return out.view(shape);
}

// Every row of W as float32 [O, I]
at::Tensor qdequantize(const at::Tensor& blocks, int64_t format, int64_t inputs) {
  return qrows(blocks, at::arange(blocks.size(0), at::TensorOptions().dtype(at::kLong)), format, inputs);
}

int64_t qisa() { return best_isa(); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(lookahead_native, m) {
  m.def("qlinear(Tensor x, Tensor blocks, int format, int inputs, Tensor? bias, int isa=-1) -> Tensor");
  m.def("qrows(Tensor blocks, Tensor ids, int format, int inputs) -> Tensor");
  m.def("qdequantize(Tensor blocks, int format, int inputs) -> Tensor");
  m.def("qisa() -> int", &qisa);
  m.impl("qlinear", c10::DispatchKey::CPU, TORCH_FN(qlinear));
  m.impl("qrows", c10::DispatchKey::CPU, TORCH_FN(qrows));
  m.impl("qdequantize", c10::DispatchKey::CPU, TORCH_FN(qdequantize));
}
