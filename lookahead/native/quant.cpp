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

#include "quant_formats.h"

#include <algorithm>
#include <cmath>
#include <vector>
#include <cstdint>
#include <cstring>

namespace {
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

template <int64_t F>
struct Avx2 {
  // out[r0 .. r0 + RT, o] for one weight row: 2 * RT sums in the 16 ymm registers (RT <= 4)
  template <int RT>
  __attribute__((target("avx2,fma,f16c"))) static void row(int64_t format, const uint8_t* wrow, const float* x,
                                                           float* out, int64_t stride, int64_t units, int64_t r0,
                                                           int64_t o, int64_t outputs) {
    __m256 lo[RT], hi[RT];
    for (int r = 0; r < RT; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
    alignas(32) float wv[32];
    for (int64_t u = 0; u < units; ++u) {
      decode_unit<F, true>(format, wrow, u, wv);
      for (int half = 0; half < 2; ++half) {
        const __m256 w0 = _mm256_load_ps(wv + 16 * half), w1 = _mm256_load_ps(wv + 16 * half + 8);
        for (int r = 0; r < RT; ++r) {
          const float* xr = x + (r0 + r) * stride + 32 * u + 16 * half;
          lo[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xr), lo[r]);
          hi[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr + 8), hi[r]);
        }
      }
    }
    for (int r = 0; r < RT; ++r) out[(r0 + r) * outputs + o] = reduce16(lo[r], hi[r]);
  }

  // out[r0 .. r0 + RT, o0 .. o0 + OT], one weight row and up to four input rows at a time (16 registers)
  template <int OT, int RT>
  struct Rows {
    static void run(int64_t format, const uint8_t* w, int64_t row_bytes, const float* x, float* out, int64_t stride,
                    int64_t units, int64_t r0, int64_t o0, int64_t outputs) {
      for (int o = 0; o < OT; ++o) {
        const uint8_t* wrow = w + (o0 + o) * row_bytes;
        int64_t r = 0;
        for (; r + 4 <= RT; r += 4) row<4>(format, wrow, x, out, stride, units, r0 + r, o0 + o, outputs);
        switch (RT - r) {
          case 3: row<3>(format, wrow, x, out, stride, units, r0 + r, o0 + o, outputs); break;
          case 2: row<2>(format, wrow, x, out, stride, units, r0 + r, o0 + o, outputs); break;
          case 1: row<1>(format, wrow, x, out, stride, units, r0 + r, o0 + o, outputs); break;
          default: break;
        }
      }
    }
  };
};

// ---- AVX-512F: a unit's distinct weights as a table, the values picked from it by permutes ----

// The table of a unit's weights by value: entry k is weight_of(q = first + k), the same operations on the same
// floats as decode_unit's, in 16 lanes
template <int64_t F>
__attribute__((target("avx512f,f16c"))) inline __m512 table(const Unit& unit, int first) {
  const __m512 v = _mm512_cvtepi32_ps(_mm512_add_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(first + offset_of(F))));
  const __m512 product = _mm512_mul_ps(_mm512_set1_ps(unit.a0), v);
  if constexpr (F == Q4_1 || F == Q5_1) return _mm512_add_ps(product, _mm512_set1_ps(unit.b));
  if constexpr (F == Q4_K || F == Q5_K) return _mm512_sub_ps(product, _mm512_set1_ps(unit.b));
  return product;
}

// A unit's factors alone (decode_ints without its values), halves through F16C
template <int64_t F>
__attribute__((target("avx512f,f16c"))) inline Unit factors(const uint8_t* row, int64_t u) {
  Unit unit{0.f, 0.f, 0.f, offset_of(F)};
  if constexpr (F == Q4_0 || F == Q4_1 || F == Q5_0 || F == Q5_1 || F == Q8_0) {
    constexpr int64_t bytes = F == Q4_0 ? 18 : F == Q4_1 ? 20 : F == Q5_0 ? 22 : F == Q5_1 ? 24 : 34;
    const uint8_t* block = row + u * bytes;
    unit.a0 = unit.a1 = half_fast(block);
    if constexpr (F == Q4_1 || F == Q5_1) unit.b = half_fast(block + 2);
  } else if constexpr (F == Q4_K || F == Q5_K) {
    const uint8_t* block = row + (u / 8) * (F == Q4_K ? 144 : 176);
    int sc, mn;
    scale_min_k4(block + 4, static_cast<int>(u % 8), &sc, &mn);
    unit.a0 = unit.a1 = half_fast(block) * static_cast<float>(sc);
    unit.b = half_fast(block + 2) * static_cast<float>(mn);
  } else if constexpr (F == Q6_K) {
    const uint8_t* block = row + (u / 8) * 210;
    const int8_t* scales = reinterpret_cast<const int8_t*>(block + 192);
    const float d = half_fast(block + 208);
    const int j = static_cast<int>(u % 8);
    unit.a0 = d * static_cast<float>(scales[2 * j]);
    unit.a1 = d * static_cast<float>(scales[2 * j + 1]);
  }
  return unit;
}

// A unit's two weight vectors (weights 0-15, 16-31) from its factors, decoded in registers
struct Decoded {
  __m512 w0, w1;
};

__attribute__((target("avx512f,f16c"))) inline __m512i bytes16(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

template <int64_t F>
__attribute__((target("avx512f,f16c"))) inline Decoded decode512(const uint8_t* row, int64_t u, const Unit& unit) {
  const __m512i fifteen = _mm512_set1_epi32(15), one = _mm512_set1_epi32(1);
  if constexpr (F == Q4_0 || F == Q4_1) {
    const __m512 values = table<F>(unit, 0);
    const __m512i bytes = bytes16(row + u * (F == Q4_0 ? 18 : 20) + (F == Q4_0 ? 2 : 4));
    return {_mm512_permutexvar_ps(bytes, values), _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), values)};
  } else if constexpr (F == Q4_K) {
    const __m512 values = table<F>(unit, 0);
    const int j = static_cast<int>(u % 8);
    const uint8_t* qs = row + (u / 8) * 144 + 16 + 32 * (j / 2);
    __m512i b0 = bytes16(qs), b1 = bytes16(qs + 16);
    if (j % 2) {
      b0 = _mm512_srli_epi32(b0, 4);
      b1 = _mm512_srli_epi32(b1, 4);
    }
    return {_mm512_permutexvar_ps(b0, values), _mm512_permutexvar_ps(b1, values)};
  } else if constexpr (F == Q5_0 || F == Q5_1) {
    const uint8_t* high = row + u * (F == Q5_0 ? 22 : 24) + (F == Q5_0 ? 2 : 4);
    const __m512 low_values = table<F>(unit, 0), high_values = table<F>(unit, 16);
    uint32_t bits;
    std::memcpy(&bits, high, 4);
    const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i all = _mm512_set1_epi32(static_cast<int>(bits));
    const __m512i h0 = _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(all, lanes), one), 4);
    const __m512i h1 = _mm512_slli_epi32(
        _mm512_and_si512(_mm512_srlv_epi32(all, _mm512_add_epi32(lanes, _mm512_set1_epi32(16))), one), 4);
    const __m512i bytes = bytes16(high + 4);
    const __m512i i0 = _mm512_or_si512(_mm512_and_si512(bytes, fifteen), h0);
    const __m512i i1 = _mm512_or_si512(_mm512_srli_epi32(bytes, 4), h1);
    return {_mm512_permutex2var_ps(low_values, i0, high_values), _mm512_permutex2var_ps(low_values, i1, high_values)};
  } else if constexpr (F == Q8_0) {
    const uint8_t* block = row + u * 34;
    const __m512 d = _mm512_set1_ps(unit.a0);
    const __m512 v0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2))));
    const __m512 v1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 18))));
    return {_mm512_mul_ps(v0, d), _mm512_mul_ps(v1, d)};  // q * d, as gguf multiplies
  } else if constexpr (F == Q5_K) {
    const int j = static_cast<int>(u % 8);
    const uint8_t* block = row + (u / 8) * 176;
    const __m512 low_values = table<F>(unit, 0), high_values = table<F>(unit, 16);
    const uint8_t* qs = block + 48 + 32 * (j / 2);
    const uint8_t* qh = block + 16;
    Decoded out{};
    for (int half = 0; half < 2; ++half) {
      __m512i b = bytes16(qs + 16 * half);
      if (j % 2) b = _mm512_srli_epi32(b, 4);
      const __m512i bit = _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(bytes16(qh + 16 * half), j), one), 4);
      const __m512 w = _mm512_permutex2var_ps(low_values, _mm512_or_si512(_mm512_and_si512(b, fifteen), bit),
                                              high_values);
      if (half == 0) out.w0 = w; else out.w1 = w;
    }
    return out;
  } else {  // Q6_K
    const int j = static_cast<int>(u % 8), h = j / 4, k = j % 4;
    const uint8_t* block = row + (u / 8) * 210;
    const uint8_t* ql = block + 64 * h + 32 * (k % 2);
    const uint8_t* qh = block + 128 + 32 * h;
    const __m512i three = _mm512_set1_epi32(3), offset = _mm512_set1_epi32(32);
    Decoded out{};
    for (int half = 0; half < 2; ++half) {
      const __m512i low = _mm512_and_si512(_mm512_srli_epi32(bytes16(ql + 16 * half), 4 * (k / 2)), fifteen);
      const __m512i top = _mm512_and_si512(_mm512_srli_epi32(bytes16(qh + 16 * half), 2 * k), three);
      const __m512 v = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_or_si512(low, _mm512_slli_epi32(top, 4)), offset));
      const __m512 w = _mm512_mul_ps(_mm512_set1_ps(half == 0 ? unit.a0 : unit.a1), v);
      if (half == 0) out.w0 = w; else out.w1 = w;
    }
    return out;
  }
}

template <int64_t F>
struct Avx512 {
  template <int OT, int RT>
  struct Rows {
  __attribute__((target("avx512f,f16c"))) static void run(int64_t, const uint8_t* w, int64_t row_bytes, const float* x,
                                                          float* out, int64_t stride, int64_t units, int64_t r0,
                                                          int64_t o0, int64_t outputs) {
    __m512 acc[OT][RT];
    for (int o = 0; o < OT; ++o)
      for (int r = 0; r < RT; ++r) acc[o][r] = _mm512_setzero_ps();
    Factors f[OT];
    for (int64_t u0 = 0; u0 < units; u0 += AHEAD) {
      const int64_t count = std::min<int64_t>(AHEAD, units - u0);
      for (int o = 0; o < OT; ++o) factors_ahead<F>(w + (o0 + o) * row_bytes, u0, count, &f[o]);
      for (int64_t k = 0; k < count; ++k) {
        const int64_t u = u0 + k;
        for (int o = 0; o < OT; ++o) {
          const Unit unit{f[o].a0[k], F == Q6_K ? f[o].a1[k] : f[o].a0[k], f[o].b[k], offset_of(F)};
          const Decoded d = decode512<F>(w + (o0 + o) * row_bytes, u, unit);
          for (int r = 0; r < RT; ++r) {
            const float* xr = x + (r0 + r) * stride + 32 * u;
            acc[o][r] = _mm512_fmadd_ps(d.w0, _mm512_loadu_ps(xr), acc[o][r]);
            acc[o][r] = _mm512_fmadd_ps(d.w1, _mm512_loadu_ps(xr + 16), acc[o][r]);
          }
        }
      }
    }
    for (int o = 0; o < OT; ++o)
      for (int r = 0; r < RT; ++r) out[(r0 + r) * outputs + o0 + o] = reduce16(acc[o][r]);
  }
  };
};

template <int64_t F>
struct Plain {
  template <int OT, int RT>
  struct Rows {
    static void run(int64_t format, const uint8_t* w, int64_t row_bytes, const float* x, float* out, int64_t stride,
                    int64_t units, int64_t r0, int64_t o0, int64_t outputs) {
      for (int o = 0; o < OT; ++o) rows_plain<RT>(format, w + (o0 + o) * row_bytes, x, out, stride, units, r0, o0 + o, outputs);
    }
  };
};

// out [R, O] = x [R, I] @ W^T, W's O rows of `row_bytes` bytes each (for_each_tile's split)
template <template <int, int> class Rows>
void product(int64_t format, const uint8_t* w, int64_t row_bytes, const float* x, float* out, int64_t rows,
             int64_t inputs, int64_t outputs) {
  const int64_t units = inputs / 32;
  for_each_tile(rows, outputs, [&](int64_t r0, int64_t count, int64_t o0, int64_t ot) {
    dispatch_tile(ot, count, [&](auto weight_rows, auto input_rows) {
      Rows<decltype(weight_rows)::value, decltype(input_rows)::value>::run(format, w, row_bytes, x, out, inputs,
                                                                           units, r0, o0, outputs);
    });
  });
}

// The product of an instruction set's path (Avx512, Avx2), its format made a template constant
template <template <int64_t> class Path>
void product_for(int64_t format, const uint8_t* w, int64_t row_bytes, const float* x, float* out, int64_t rows,
                 int64_t inputs, int64_t outputs) {
  switch (format) {
    case Q4_0: product<Path<Q4_0>::template Rows>(format, w, row_bytes, x, out, rows, inputs, outputs); break;
    case Q4_1: product<Path<Q4_1>::template Rows>(format, w, row_bytes, x, out, rows, inputs, outputs); break;
    case Q5_0: product<Path<Q5_0>::template Rows>(format, w, row_bytes, x, out, rows, inputs, outputs); break;
    case Q5_1: product<Path<Q5_1>::template Rows>(format, w, row_bytes, x, out, rows, inputs, outputs); break;
    case Q8_0: product<Path<Q8_0>::template Rows>(format, w, row_bytes, x, out, rows, inputs, outputs); break;
    case Q4_K: product<Path<Q4_K>::template Rows>(format, w, row_bytes, x, out, rows, inputs, outputs); break;
    case Q5_K: product<Path<Q5_K>::template Rows>(format, w, row_bytes, x, out, rows, inputs, outputs); break;
    case Q6_K: product<Path<Q6_K>::template Rows>(format, w, row_bytes, x, out, rows, inputs, outputs); break;
    default: break;
  }
}

// The instruction sets this CPU runs the product in, best first: 2 AVX-512F, 1 AVX2 with FMA, 0 plain C++
int64_t best_isa() {
  static const bool f16c = __builtin_cpu_supports("f16c");
  static const int64_t isa = __builtin_cpu_supports("avx512f") && f16c                                ? 2
                             : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c ? 1
                                                                                                : 0;
  return isa;
}


// x [..., I] float32 @ W [O, I]^T (+ bias [O]) -> [..., O]; isa -1: the best this CPU runs
at::Tensor qlinear(const at::Tensor& x, const at::Tensor& blocks, int64_t format, int64_t inputs,
                   const std::optional<at::Tensor>& bias, int64_t isa) {
  const int64_t chosen = isa < 0 ? best_isa() : isa;
  TORCH_CHECK(chosen <= best_isa(), "lookahead_native::qlinear: this CPU does not run instruction set ", isa);
  return blocks_linear("qlinear", x, blocks, format, inputs, bias,
                       [&](const uint8_t* w, int64_t row_bytes, const float* xp, float* op, int64_t rows,
                           int64_t outputs) {
                         if (chosen == 2) {
                           product_for<Avx512>(format, w, row_bytes, xp, op, rows, inputs, outputs);
                         } else if (chosen == 1) {
                           product_for<Avx2>(format, w, row_bytes, xp, op, rows, inputs, outputs);
                         } else {
                           product_for<Plain>(format, w, row_bytes, xp, op, rows, inputs, outputs);
                         }
                       });
}

// A row's `units` units as float32 [32 * units] through the AVX-512 decoder (the same values as decode_unit)
template <int64_t F>
__attribute__((target("avx512f,f16c"))) void decode_row512_for(const uint8_t* row, int64_t units, float* out) {
  Factors f;
  for (int64_t u0 = 0; u0 < units; u0 += AHEAD) {
    const int64_t count = std::min<int64_t>(AHEAD, units - u0);
    factors_ahead<F>(row, u0, count, &f);
    for (int64_t k = 0; k < count; ++k) {
      const Unit unit{f.a0[k], F == Q6_K ? f.a1[k] : f.a0[k], f.b[k], offset_of(F)};
      const Decoded d = decode512<F>(row, u0 + k, unit);
      _mm512_storeu_ps(out + 32 * (u0 + k), d.w0);
      _mm512_storeu_ps(out + 32 * (u0 + k) + 16, d.w1);
    }
  }
}

void decode_row512(int64_t format, const uint8_t* row, int64_t units, float* out) {
  switch (format) {
    case Q4_0: decode_row512_for<Q4_0>(row, units, out); break;
    case Q4_1: decode_row512_for<Q4_1>(row, units, out); break;
    case Q5_0: decode_row512_for<Q5_0>(row, units, out); break;
    case Q5_1: decode_row512_for<Q5_1>(row, units, out); break;
    case Q8_0: decode_row512_for<Q8_0>(row, units, out); break;
    case Q4_K: decode_row512_for<Q4_K>(row, units, out); break;
    case Q5_K: decode_row512_for<Q5_K>(row, units, out); break;
    case Q6_K: decode_row512_for<Q6_K>(row, units, out); break;
    default: break;
  }
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
  const bool fast = best_isa() == 2;
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      const uint8_t* row = w + index[k] * blocks.size(1);
      if (fast) {
        decode_row512(format, row, units, op + k * inputs);
      } else {
        for (int64_t u = 0; u < units; ++u) decode_unit(format, row, u, op + k * inputs + 32 * u);
      }
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
