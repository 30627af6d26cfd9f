// lookahead_native::qlinear_int8: a GGUF block-format product in integers, as llama.cpp computes it.
//
// The inputs are quantized first, each row by units of 32 (the weights' units, native/quant_formats.h):
// s = max |x| / 127, xq = round-to-nearest-even(x * (1 / s)) in [-127, 127] (s = 0: all zero), and per
// (half-)unit the sum of its xq. A unit's weights stay as their quantized integers q (unsigned; Q8_0's signed
// q as |q| against xq negated where q < 0), and the products are exact integer dot products (AVX-512 VNNI's
// vpdpbusd, or plain C++); only the scales are floats. So a row's output is no longer the float32 product
// over the de-quantized weights (the inputs were rounded to 8 bits, as llama.cpp rounds them), but it is
// computed in one fixed order (below), the same bits at any row count, thread count or instruction set.
//
// Order, per output (r, o), in 16 float lanes, units taken two at a time (pair p = units 2p, 2p + 1; an odd
// last unit paired with zeros): lane l holds the integer dot product of the 4 weights 4l .. 4l + 3 of the pair
// (l < 8: unit 2p; else 2p + 1), converted to float, and acc[l] = fma(dot, A[l] * S[l], acc[l]) with A the
// unit's multiplier (Q6_K: each half's) and S its input scale; then the terms of the offsets and mins:
// m[l] = fma(beta, c, m[l]) over (half-)units 16 at a time in order, beta the unit's (-min, +m, or offset *
// multiplier) and c = s * (sum of the unit's xq); out = reduce16(acc) + reduce16(m) (+ bias).
//
// Worked example (Q8_0, one block): d = 0.5, q = [2, -4, 0 ...]; x = [1, 1, 0 ...] -> s = 1/127, xq = [127,
// 127, 0 ...]; the dot is 2 * 127 - 4 * 127 = -254; out = -254 * (0.5 * s) = -1 (to float32 rounding).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include "quant_formats.h"
#include "quant8k.h"
#include "quant8x16.h"
#include "quant8x16s.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// Halves of a unit with their own multiplier and offset term: Q6_K's 16-weight scales
constexpr int halves_of(int64_t format) { return format == Q6_K ? 2 : 1; }

// ---- the inputs, quantized once per call ----

struct Inputs {
  int64_t units, pairs, terms;  // units per row, unit pairs per row, offset/min terms per row (padded to 16)
  std::vector<int8_t> q;        // [R, 64 * pairs]: each row's xq, zero past the row's end
  std::vector<float> s;         // [R, 2 * pairs]: each unit's scale (zero for the padding unit)
  std::vector<float> c;         // [R, terms]: s * the (half-)unit's sum of xq, zero past the last
};

Inputs quantize_inputs(const float* x, int64_t rows, int64_t inputs, int64_t halves) {
  Inputs in;
  in.units = inputs / 32;
  in.pairs = (in.units + 1) / 2;
  in.terms = (in.units * halves + 15) / 16 * 16;
  in.q.assign(static_cast<size_t>(rows * 64 * in.pairs), 0);
  in.s.assign(static_cast<size_t>(rows * 2 * in.pairs), 0.f);
  in.c.assign(static_cast<size_t>(rows * in.terms), 0.f);
  const bool wide = avx512_rounding();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t u = 0; u < in.units; ++u) {
        const float* xu = x + r * inputs + 32 * u;
        const float d = largest_abs(xu, 32, wide) / 127.f;
        const float id = d != 0.f ? 1.f / d : 0.f;
        int8_t* qu = in.q.data() + r * 64 * in.pairs + 32 * u;
        const int sums[2] = {round_run16(xu, id, qu, wide), round_run16(xu + 16, id, qu + 16, wide)};
        in.s[r * 2 * in.pairs + u] = d;
        if (halves == 2) {
          in.c[r * in.terms + 2 * u] = d * static_cast<float>(sums[0]);
          in.c[r * in.terms + 2 * u + 1] = d * static_cast<float>(sums[1]);
        } else {
          in.c[r * in.terms + u] = d * static_cast<float>(sums[0] + sums[1]);
        }
      }
    }
  });
  return in;
}

// ---- a unit's weights as 32 integers (bytes), and its factors ----

// unit u's 32 quantized values as unsigned bytes (Q8_0: the signed bytes as they are)
template <int64_t F>
inline void unit_bytes(const uint8_t* row, int64_t u, uint8_t* out) {
  if constexpr (F == Q8_0) {
    std::memcpy(out, row + u * 34 + 2, 32);
  } else {
    int32_t q[32];
    decode_ints<F, false>(F, row, u, q);
    for (int i = 0; i < 32; ++i) out[i] = static_cast<uint8_t>(q[i]);
  }
}

// The per-unit multipliers (a0, a1) and the offset/min factor beta of each (half-)unit of a row's units
// u0 .. u0 + count, through factors<F> of quant_formats.h's formulas (scalar, halves exact)
template <int64_t F>
inline void unit_factors(const uint8_t* row, int64_t u, float* a0, float* a1, float* beta) {
  int32_t q[32];
  const Unit unit = decode_ints<F, false>(F, row, u, q);
  *a0 = unit.a0;
  *a1 = unit.a1;
  if constexpr (F == Q4_1 || F == Q5_1) {
    beta[0] = unit.b;
  } else if constexpr (F == Q4_K || F == Q5_K) {
    beta[0] = -unit.b;
  } else if constexpr (F == Q6_K) {
    beta[0] = static_cast<float>(unit.offset) * unit.a0;
    beta[1] = static_cast<float>(unit.offset) * unit.a1;
  } else if constexpr (F == Q8_0) {
    beta[0] = 0.f;
  } else {
    beta[0] = static_cast<float>(unit.offset) * unit.a0;
  }
}

// One weight row's pairs, ready for every input row: bytes [pairs, 64] (zero past the last unit), A [pairs, 16]
// (each lane's multiplier), beta [terms] (zero past the last (half-)unit)
struct Row {
  std::vector<uint8_t> bytes;
  std::vector<float> a;
  std::vector<float> beta;
};

template <int64_t F>
void prepare_row(const uint8_t* row, const Inputs& in, Row* out) {
  constexpr int64_t halves = halves_of(F);
  out->bytes.assign(static_cast<size_t>(64 * in.pairs), 0);
  out->a.assign(static_cast<size_t>(16 * in.pairs), 0.f);
  out->beta.assign(static_cast<size_t>(in.terms), 0.f);
  for (int64_t u = 0; u < in.units; ++u) {
    unit_bytes<F>(row, u, out->bytes.data() + 32 * u);
    float a0, a1;
    unit_factors<F>(row, u, &a0, &a1, out->beta.data() + halves * u);
    float* lanes = out->a.data() + 8 * u;  // (unit u's 8 lanes of its pair)
    for (int l = 0; l < 8; ++l) lanes[l] = l < 4 ? a0 : a1;
  }
}

// ---- out[r, o] in plain C++: the reference ----

template <int64_t F>
float output_plain(const Row& w, const Inputs& in, int64_t r) {
  float acc[16] = {}, m[16] = {};
  const int8_t* xq = in.q.data() + r * 64 * in.pairs;
  const float* s = in.s.data() + r * 2 * in.pairs;
  for (int64_t p = 0; p < in.pairs; ++p) {
    for (int l = 0; l < 16; ++l) {
      int32_t dot = 0;
      for (int k = 0; k < 4; ++k) {
        const int64_t i = 64 * p + 4 * l + k;
        const uint8_t b = w.bytes[i];
        if constexpr (F == Q8_0) {
          const int8_t q = static_cast<int8_t>(b);
          dot += static_cast<int32_t>(q < 0 ? -q : q) * static_cast<int32_t>(q < 0 ? -xq[i] : xq[i]);
        } else {
          dot += static_cast<int32_t>(b) * static_cast<int32_t>(xq[i]);
        }
      }
      const float scale = w.a[16 * p + l] * s[2 * p + l / 8];
      acc[l] = std::fma(static_cast<float>(dot), scale, acc[l]);
    }
  }
  const float* c = in.c.data() + r * in.terms;
  for (int64_t t = 0; t < in.terms; t += 16)
    for (int l = 0; l < 16; ++l) m[l] = std::fma(w.beta[t + l], c[t + l], m[l]);
  auto reduce = [](float* a) {
    for (int i = 0; i < 8; ++i) a[i] = a[i] + a[i + 8];
    for (int i = 0; i < 4; ++i) a[i] = a[i] + a[i + 4];
    for (int i = 0; i < 2; ++i) a[i] = a[i] + a[i + 2];
    return a[0] + a[1];
  };
  return reduce(acc) + reduce(m);
}

bool vnni_available() {
  static const bool available = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("f16c");
  return available;
}

#define LOOKAHEAD_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c")))

// 32 bytes of nibbles as two units' values: [low nibbles | high nibbles]
LOOKAHEAD_VNNI inline __m512i nibbles64(__m256i q) {
  const __m256i fifteen = _mm256_set1_epi8(15);
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(q, fifteen)),
                            _mm256_and_si256(_mm256_srli_epi16(q, 4), fifteen), 1);
}

// 16 bytes of nibbles as one 32-weight block's values: [low nibbles (weights 0-15) | high nibbles (16-31)]
LOOKAHEAD_VNNI inline __m256i nibbles32(const uint8_t* p) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), fifteen = _mm_set1_epi8(15);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), fifteen), _mm_and_si128(q, fifteen));
}

// A 32-weight block's values (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) as bytes
template <int64_t F>
LOOKAHEAD_VNNI inline __m256i block_bytes(const uint8_t* row, int64_t u) {
  if constexpr (F == Q8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + u * 34 + 2));
  } else if constexpr (F == Q4_0 || F == Q4_1) {
    return nibbles32(row + u * (F == Q4_0 ? 18 : 20) + (F == Q4_0 ? 2 : 4));
  } else {  // Q5_0, Q5_1: the fifth bits from 32 bits, bit i for weight i
    const uint8_t* high = row + u * (F == Q5_0 ? 22 : 24) + (F == Q5_0 ? 2 : 4);
    uint32_t bits;
    std::memcpy(&bits, high, 4);
    return _mm256_or_si256(nibbles32(high + 4), _mm256_maskz_mov_epi8(bits, _mm256_set1_epi8(16)));
  }
}

// Units 2k, 2k + 1 of a row (u = 2k; `second`: whether unit u + 1 exists) as 64 bytes of values
template <int64_t F>
LOOKAHEAD_VNNI inline __m512i pair_bytes(const uint8_t* row, int64_t u, bool second) {
  if constexpr (F == Q4_K || F == Q5_K) {  // (sub-blocks j, j + 1 share 32 bytes: low and high nibbles)
    const uint8_t* block = row + (u / 8) * (F == Q4_K ? 144 : 176);
    const int j = static_cast<int>(u % 8);
    __m512i v = nibbles64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + (F == Q4_K ? 16 : 48) + 16 * j)));
    if constexpr (F == Q5_K) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16)), one = _mm256_set1_epi8(1);
      const __m256i b0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, j), one), 4);
      const __m256i b1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, j + 1), one), 4);
      v = _mm512_or_si512(v, _mm512_inserti64x4(_mm512_castsi256_si512(b0), b1, 1));
    }
    return v;
  } else if constexpr (F == Q6_K) {
    const uint8_t* block = row + (u / 8) * 210;
    const int j = static_cast<int>(u % 8), h = j / 4, k = j % 4;  // (k is 0 or 2: units k and k + 1)
    const uint8_t* ql = block + 64 * h;
    const __m256i fifteen = _mm256_set1_epi8(15), three = _mm256_set1_epi8(3);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * h));
    __m256i v[2];
    for (int e = 0; e < 2; ++e) {
      const __m256i low = _mm256_and_si256(
          _mm256_srli_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32 * e)), 4 * (k / 2)), fifteen);
      const __m256i top = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * (k + e)), three);
      v[e] = _mm256_or_si256(low, _mm256_slli_epi16(top, 4));
    }
    return _mm512_inserti64x4(_mm512_castsi256_si512(v[0]), v[1], 1);
  } else {
    const __m256i first = block_bytes<F>(row, u);
    const __m256i next = second ? block_bytes<F>(row, u + 1) : _mm256_setzero_si256();
    return _mm512_inserti64x4(_mm512_castsi256_si512(first), next, 1);
  }
}

// The lanes' multipliers of units k, k + 1 of a chunk's factors (the second absent: zero)
template <int64_t F>
LOOKAHEAD_VNNI inline __m512 pair_multipliers(const Factors& f, int64_t k, bool second) {
  const __m512 first = _mm512_set1_ps(f.a0[k]);
  const __m512 next = second ? _mm512_set1_ps(f.a0[k + 1]) : _mm512_setzero_ps();
  __m512 a = _mm512_mask_blend_ps(0xFF00, first, next);
  if constexpr (F == Q6_K) {  // lanes 4-7 and 12-15: the second half's
    a = _mm512_mask_blend_ps(0x00F0, a, _mm512_set1_ps(f.a1[k]));
    if (second) a = _mm512_mask_blend_ps(0xF000, a, _mm512_set1_ps(f.a1[k + 1]));
  }
  return a;
}

// The offset/min factors (beta) of a chunk's `count` units into beta [round16(count * halves)], zeros after
// (each the same float operation as unit_factors')
template <int64_t F>
LOOKAHEAD_VNNI inline void chunk_betas(const Factors& f, int64_t count, float* beta) {
  constexpr int64_t halves = halves_of(F);
  const int64_t terms = (count * halves + 15) / 16 * 16;
  const __m512 offset = _mm512_set1_ps(static_cast<float>(offset_of(F)));
  for (int64_t t = 0; t < terms; t += 16) {
    const int64_t k = t / halves;  // the first unit of these 16 terms
    const __mmask16 live = count * halves - t >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (count * halves - t)) - 1);
    __m512 v;
    if constexpr (F == Q4_1 || F == Q5_1) {
      v = _mm512_load_ps(f.b + k);
    } else if constexpr (F == Q4_K || F == Q5_K) {
      v = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_load_ps(f.b + k)),
                                               _mm512_set1_epi32(static_cast<int>(0x80000000u))));  // -b, exactly
    } else if constexpr (F == Q6_K) {  // [off * a0[k], off * a1[k], off * a0[k + 1], ...]
      const __m512 a0 = _mm512_mul_ps(offset, _mm512_loadu_ps(f.a0 + k));
      const __m512 a1 = _mm512_mul_ps(offset, _mm512_loadu_ps(f.a1 + k));
      v = _mm512_permutex2var_ps(a0, _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23), a1);
    } else if constexpr (F == Q4_0 || F == Q5_0) {
      v = _mm512_mul_ps(offset, _mm512_load_ps(f.a0 + k));
    } else {
      v = _mm512_setzero_ps();
    }
    _mm512_store_ps(beta + t, _mm512_maskz_mov_ps(live, v));
  }
}

// out[r0 .. r0 + RT, o0 .. o0 + OT] in AVX-512 VNNI, in the order the file's head states
template <int64_t F>
struct Vnni {
  template <int OT, int RT>
  struct Rows {
    LOOKAHEAD_VNNI static void run(const uint8_t* w, int64_t row_bytes, const Inputs& in, float* out, int64_t r0,
                                   int64_t o0, int64_t outputs) {
      constexpr int64_t halves = halves_of(F);
      __m512 acc[OT][RT], m[OT][RT];
      for (int o = 0; o < OT; ++o)
        for (int r = 0; r < RT; ++r) acc[o][r] = m[o][r] = _mm512_setzero_ps();
      Factors f[OT];
      alignas(64) float beta[OT][2 * AHEAD];
      for (int64_t u0 = 0; u0 < in.units; u0 += AHEAD) {
        const int64_t count = std::min<int64_t>(AHEAD, in.units - u0);
        for (int o = 0; o < OT; ++o) {
          factors_ahead<F>(w + (o0 + o) * row_bytes, u0, count, &f[o]);
          chunk_betas<F>(f[o], count, beta[o]);
        }
        for (int64_t k = 0; k < count; k += 2) {
          const int64_t p = (u0 + k) / 2;
          const bool second = k + 1 < count;
          for (int o = 0; o < OT; ++o) {
            __m512i b = pair_bytes<F>(w + (o0 + o) * row_bytes, u0 + k, second);
            __mmask64 negative = 0;
            if constexpr (F == Q8_0) {  // |q| against xq negated where q < 0
              negative = _mm512_movepi8_mask(b);
              b = _mm512_abs_epi8(b);
            }
            const __m512 a = pair_multipliers<F>(f[o], k, second);
            for (int r = 0; r < RT; ++r) {
              __m512i x = _mm512_loadu_si512(in.q.data() + (r0 + r) * 64 * in.pairs + 64 * p);
              if constexpr (F == Q8_0) x = _mm512_mask_sub_epi8(x, negative, _mm512_setzero_si512(), x);
              const float* s = in.s.data() + (r0 + r) * 2 * in.pairs + 2 * p;
              const __m512 scale = _mm512_mul_ps(a, _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(s[0]),
                                                                         _mm512_set1_ps(s[1])));
              const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), b, x);
              acc[o][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[o][r]);
            }
          }
        }
        const int64_t terms = (count * halves + 15) / 16 * 16;
        for (int64_t t = 0; t < terms; t += 16) {
          for (int o = 0; o < OT; ++o) {
            const __m512 bv = _mm512_load_ps(beta[o] + t);
            for (int r = 0; r < RT; ++r) {
              const __m512 c = _mm512_loadu_ps(in.c.data() + (r0 + r) * in.terms + u0 * halves + t);
              m[o][r] = _mm512_fmadd_ps(bv, c, m[o][r]);
            }
          }
        }
      }
      for (int o = 0; o < OT; ++o)
        for (int r = 0; r < RT; ++r) out[(r0 + r) * outputs + o0 + o] = reduce16(acc[o][r]) + reduce16(m[o][r]);
    }
  };
};

// The K formats a super-block at a time (quant8k.h)
template <int64_t F>
void product_super(const uint8_t* w, int64_t row_bytes, const float* x, float* out, int64_t rows, int64_t inputs,
                   int64_t outputs, bool vnni) {
  const SuperInputs in = quantize_super(x, rows, inputs, F);
  if (!vnni) {
    at::parallel_for(0, outputs, 8, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o)
        for (int64_t r = 0; r < rows; ++r) out[r * outputs + o] = super_plain<F>(w + o * row_bytes, in, r);
    });
    return;
  }
  for_each_tile(rows, outputs, [&](int64_t r0, int64_t count, int64_t o0, int64_t ot) {
    dispatch_tile(ot, count, [&](auto weight_rows, auto input_rows) {
      SuperVnni<F>::template Rows<decltype(weight_rows)::value, decltype(input_rows)::value>::run(w, row_bytes, in,
                                                                                                  out, r0, o0, outputs);
    });
  });
}

template <int64_t F>
void product8(const uint8_t* w, int64_t row_bytes, const float* x, float* out, int64_t rows, int64_t inputs,
              int64_t outputs, bool vnni) {
  if constexpr (F == Q4_K || F == Q5_K || F == Q6_K) {
    product_super<F>(w, row_bytes, x, out, rows, inputs, outputs, vnni);
    return;
  }
  const Inputs in = quantize_inputs(x, rows, inputs, halves_of(F));
  if (!vnni) {
    at::parallel_for(0, outputs, 8, [&](int64_t begin, int64_t end) {
      Row row;
      for (int64_t o = begin; o < end; ++o) {
        prepare_row<F>(w + o * row_bytes, in, &row);
        for (int64_t r = 0; r < rows; ++r) out[r * outputs + o] = output_plain<F>(row, in, r);
      }
    });
    return;
  }
  for_each_tile(rows, outputs, [&](int64_t r0, int64_t count, int64_t o0, int64_t ot) {
    dispatch_tile(ot, count, [&](auto weight_rows, auto input_rows) {
      Vnni<F>::template Rows<decltype(weight_rows)::value, decltype(input_rows)::value>::run(w, row_bytes, in, out,
                                                                                             r0, o0, outputs);
    });
  });
}

// x [..., I] float32 @ W [O, I]^T (+ bias [O]) -> [..., O] in integers; isa -1: the best this CPU runs (1: VNNI,
// 0: plain C++)
at::Tensor qlinear_int8(const at::Tensor& x, const at::Tensor& blocks, int64_t format, int64_t inputs,
                        const std::optional<at::Tensor>& bias, int64_t isa) {
  const bool vnni = isa < 0 ? vnni_available() : isa == 1;
  TORCH_CHECK(!vnni || vnni_available(), "lookahead_native::qlinear_int8: this CPU has no AVX-512 VNNI");
  return blocks_linear("qlinear_int8", x, blocks, format, inputs, bias,
                       [&](const uint8_t* w, int64_t row_bytes, const float* xp, float* op, int64_t rows,
                           int64_t outputs) {
                         switch (format) {
                           case Q4_0: product8<Q4_0>(w, row_bytes, xp, op, rows, inputs, outputs, vnni); break;
                           case Q4_1: product8<Q4_1>(w, row_bytes, xp, op, rows, inputs, outputs, vnni); break;
                           case Q5_0: product8<Q5_0>(w, row_bytes, xp, op, rows, inputs, outputs, vnni); break;
                           case Q5_1: product8<Q5_1>(w, row_bytes, xp, op, rows, inputs, outputs, vnni); break;
                           case Q8_0: product8<Q8_0>(w, row_bytes, xp, op, rows, inputs, outputs, vnni); break;
                           case Q4_K: product8<Q4_K>(w, row_bytes, xp, op, rows, inputs, outputs, vnni); break;
                           case Q5_K: product8<Q5_K>(w, row_bytes, xp, op, rows, inputs, outputs, vnni); break;
                           case Q6_K: product8<Q6_K>(w, row_bytes, xp, op, rows, inputs, outputs, vnni); break;
                           default: break;
                         }
                       });
}

bool qint8_vnni() { return vnni_available(); }

bool qint8_amx() { return amx_available(); }

bool qint8_avx2() { return avx2_int8_available(); }

// ---- Q4_K / Q6_K (quant8x16.h), Q4_1 / Q5_0 / Q8_0 (quant8x16s.h) repacked sixteen rows at a time ----

// Weights per block of the 16-row layout's formats, and a chunk's bytes (a block of 16 rows)
int64_t x16_weights(int64_t format) { return x16_takes(format) ? 256 : 32; }
int64_t x16_chunk(int64_t format) { return x16_takes(format) ? x16_chunk_bytes(format) : 16 * x16s_bytes(format); }

void check_x16(const char* name, int64_t format, int64_t inputs, int64_t outputs) {
  TORCH_CHECK(x16_takes(format) || x16s_takes(format), "lookahead_native::", name, ": GGML type ", format,
              " has no 16-row layout (Q4_1, Q5_0, Q8_0, Q4_K and Q6_K have one): keep its blocks as they are");
  TORCH_CHECK(inputs > 0 && inputs % x16_weights(format) == 0 && outputs > 0 && outputs % 16 == 0,
              "lookahead_native::", name, ": the 16-row layout needs a multiple of ", x16_weights(format),
              " inputs and of 16 outputs, got [", outputs, ", ", inputs, "]: keep its blocks as they are");
}

// blocks [O, row bytes] -> packed [O / 16, blocks per row * chunk bytes]
at::Tensor qpack16(const at::Tensor& blocks, int64_t format, int64_t inputs) {
  Layout layout{};
  check_blocks(blocks, format, inputs, &layout);
  const int64_t outputs = blocks.size(0);
  check_x16("qpack16", format, inputs, outputs);
  const int64_t count = inputs / x16_weights(format), chunk = x16_chunk(format);
  at::Tensor packed = at::empty({outputs / 16, count * chunk}, blocks.options());
  const uint8_t* w = blocks.data_ptr<uint8_t>();
  uint8_t* out = packed.data_ptr<uint8_t>();
  at::parallel_for(0, outputs / 16, 1, [&](int64_t begin, int64_t end) {
    std::vector<PlainSuper> rows(16);
    for (int64_t g = begin; g < end; ++g)
      for (int64_t b = 0; b < count; ++b) {
        uint8_t* target = out + g * packed.size(1) + b * chunk;
        if (x16s_takes(format)) {
          const uint8_t* sources[16];
          for (int n = 0; n < 16; ++n) sources[n] = w + (16 * g + n) * blocks.size(1) + b * x16s_bytes(format);
          pack_chunk32(sources, format, target);
          continue;
        }
        for (int n = 0; n < 16; ++n)
          read_super(w + (16 * g + n) * blocks.size(1) + b * x16_block_bytes(format), format, &rows[static_cast<size_t>(n)]);
        pack_chunk(rows.data(), format, target);
      }
  });
  return packed;
}

// packed [O / 16, ...] -> the GGUF blocks [O, row bytes] it was made from, byte for byte
at::Tensor qunpack16(const at::Tensor& packed, int64_t format, int64_t inputs) {
  check_x16("qunpack16", format, inputs, 16);
  const int64_t count = inputs / x16_weights(format), chunk = x16_chunk(format);
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 2 && packed.is_contiguous() && packed.is_cpu() &&
                  packed.size(1) == count * chunk,
              "lookahead_native::qunpack16: packed must be a contiguous uint8 CPU tensor [O / 16, ", count * chunk, "]");
  const int64_t groups = packed.size(0), row = count * (x16_takes(format) ? x16_block_bytes(format) : x16s_bytes(format));
  const int64_t block = row / count;  // (a row's block bytes)
  at::Tensor blocks = at::empty({16 * groups, row}, packed.options());
  const uint8_t* in = packed.data_ptr<uint8_t>();
  uint8_t* out = blocks.data_ptr<uint8_t>();
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    std::vector<PlainSuper> rows(16);
    for (int64_t g = begin; g < end; ++g)
      for (int64_t b = 0; b < count; ++b) {
        const uint8_t* source = in + g * packed.size(1) + b * chunk;
        if (x16s_takes(format)) {
          uint8_t* targets[16];
          for (int n = 0; n < 16; ++n) targets[n] = out + (16 * g + n) * row + b * block;
          unpack_chunk32(source, format, targets);
          continue;
        }
        std::memset(rows.data(), 0, 16 * sizeof(PlainSuper));
        unpack_chunk(source, format, rows.data());
        for (int n = 0; n < 16; ++n) write_super(rows[static_cast<size_t>(n)], format, out + (16 * g + n) * row + b * block);
      }
  });
  return blocks;
}

// x [..., I] float32 by packed weights [O / 16, ...] (+ bias [O]) -> [..., O]. isa: 0 plain C++, 1 AVX-512 VNNI,
// 2 AMX tiles, 3 AVX2, -1 the best this CPU runs: VNNI, or AMX from amx_rows rows (0: never), else
// AVX2, else plain C++; the same bits every way. prefetch: bytes ahead of its reads the weights are asked for (0: left to the hardware), a speed
// choice only.
at::Tensor qlinear_int8_x16(const at::Tensor& x, const at::Tensor& packed, int64_t format, int64_t inputs,
                            const std::optional<at::Tensor>& bias, int64_t isa, int64_t amx_rows, int64_t prefetch) {
  TORCH_CHECK(prefetch >= 0 && prefetch <= (1 << 20), "lookahead_native::qlinear_int8_x16: prefetch must be 0 to ",
              1 << 20, " bytes, got ", prefetch);
  TORCH_CHECK(isa >= -1 && isa <= 3, "lookahead_native::qlinear_int8_x16: isa must be -1, 0, 1, 2 or 3, got ", isa);
  const int64_t outputs = 16 * packed.size(0);
  check_x16("qlinear_int8_x16", format, inputs, outputs);
  TORCH_CHECK(isa != 2 || x16_takes(format) || x16s_takes(format), "lookahead_native::qlinear_int8_x16: AMX "
              "tiles take the packed formats (Q4_1, Q5_0, Q8_0, Q4_K, Q6_K), not GGML type ", format);
  TORCH_CHECK(isa != 1 || vnni_available(), "lookahead_native::qlinear_int8_x16: this CPU has no AVX-512 VNNI");
  TORCH_CHECK(isa != 3 || avx2_int8_available(), "lookahead_native::qlinear_int8_x16: this CPU has no AVX2, FMA "
              "and F16C");
  TORCH_CHECK(isa != 2 || amx_available(), "lookahead_native::qlinear_int8_x16: this CPU or OS offers no AMX tiles");
  const int64_t width = inputs / x16_weights(format) * x16_chunk(format);
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 2 && packed.is_contiguous() && packed.is_cpu() &&
                  packed.size(1) == width,
              "lookahead_native::qlinear_int8_x16: packed must be qpack16's uint8 CPU tensor [O / 16, ", width, "]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_cpu() && x.size(-1) == inputs,
              "lookahead_native::qlinear_int8_x16: x must be a float32 CPU tensor [..., ", inputs, "]");
  const at::Tensor flat = x.reshape({-1, inputs}).contiguous();  // [R, I]
  const int64_t rows = flat.size(0);
  int64_t path = isa;
  if (isa < 0) {
    path = !vnni_available() ? (avx2_int8_available() ? X16_AVX2 : X16_PLAIN)
           : amx_rows > 0 && rows >= amx_rows && amx_available() ? X16_AMX : X16_VNNI;
  }
  at::Tensor out = at::empty({rows, outputs}, x.options());  // [R, O]
  if (rows > 0 && x16s_takes(format)) {
    product_x16s(packed.data_ptr<uint8_t>(), format, flat.data_ptr<float>(), out.data_ptr<float>(), rows, inputs,
                 outputs, path, prefetch);
  } else if (rows > 0) {
    product_x16(packed.data_ptr<uint8_t>(), format, flat.data_ptr<float>(), out.data_ptr<float>(), rows, inputs,
                outputs, path, prefetch);
  }
  if (bias.has_value() && bias->defined()) out.add_(*bias);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = outputs;
  return out.view(shape);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lookahead_native, m) {
  m.def("qlinear_int8(Tensor x, Tensor blocks, int format, int inputs, Tensor? bias, int isa=-1) -> Tensor");
  m.def("qint8_vnni() -> bool", &qint8_vnni);
  m.impl("qlinear_int8", c10::DispatchKey::CPU, TORCH_FN(qlinear_int8));
  m.def("qpack16(Tensor blocks, int format, int inputs) -> Tensor", &qpack16);
  m.def("qunpack16(Tensor packed, int format, int inputs) -> Tensor", &qunpack16);
  m.def("qlinear_int8_x16(Tensor x, Tensor packed, int format, int inputs, Tensor? bias, int isa=-1, "
        "int amx_rows=0, int prefetch=0) -> Tensor");
  m.def("qint8_amx() -> bool", &qint8_amx);
  m.def("qint8_avx2() -> bool", &qint8_avx2);
  m.impl("qlinear_int8_x16", c10::DispatchKey::CPU, TORCH_FN(qlinear_int8_x16));
}
