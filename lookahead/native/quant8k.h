// Integer products of the K formats (Q4_K, Q5_K, Q6_K), a 256-weight super-block at a time: the inputs are
// quantized per super-block (llama.cpp's Q8_K scheme), so a super-block's whole dot product, its sub-block
// scales included, is one exact integer sum, converted to float once. native/quant8.cpp's op calls it for
// these formats; the 32-weight formats keep quant8.cpp's unit pairs.
//
// Inputs, per row and super-block: s = max |x| / 127, xq = round-to-nearest-even(x * (1 / s)) in [-127, 127]
// (s = 0: all zero), the sums of xq per 32-weight sub-block (Q4_K, Q5_K) or per 16-weight group (Q6_K).
//
// A super-block is read as four registers R = 0..3 of 64 values each (what a 64-byte load of its quantized
// bytes gives) against 64 input bytes placed where those values sit (k_position), each pair of bytes t
// (0..31) of a register with one 16-bit scale S_R[t]. Order, per output (r, o), 16 int32 lanes then 16
// float lanes:
//   isum[l] = sum over R, t in {2l, 2l + 1} of S_R[t] * (W_R[2t] X_R[2t] + W_R[2t + 1] X_R[2t + 1])   (exact)
//   Q6_K:       isum[l] -= 32 * (sc[2l] g[2l] + sc[2l + 1] g[2l + 1]) for l < 8   (its offset, exact; g: group sums)
//   acc[l] = fma(float(isum[l]), d * s, acc[l])
//   Q4_K, Q5_K: acc[l] = fma(float(mn[2l] b[2l] + mn[2l + 1] b[2l + 1]) (0 for l >= 4), -(dmin * s), acc[l])
//               (the mins against the sub-block sums b, exact integers before the conversion)
//   out = reduce16(acc) (+ bias)
// over super-blocks in order. Every term is the same whatever the rows, threads or instruction set (AVX-512
// VNNI: vpmaddubsw then vpdpwssd; plain C++ the same lanes), so a row's output has the same bits at any row
// count. No 16-bit product saturates: |W X + W X| <= 2 * 63 * 127.
//
// Worked example (Q4_K, one super-block): d = 1, dmin = 0, every scale 1 and every q = 2, x all 1 -> s =
// 1/127, xq = 127 everywhere; isum over the lanes = 256 * 2 * 127 = 65024; out = 65024 * (1/127) = 512.
#pragma once

#include "quant_formats.h"

namespace {

// Q4_K, Q5_K: the sub-block whose values the 32 bytes at slot k (0..7) of a super-block's register order hold
// (a 64-byte load of nibbles holds sub-blocks j and j + 2 in its low nibbles, j + 1 and j + 3 in its high)
constexpr int SUB_AT_SLOT[8] = {0, 2, 1, 3, 4, 6, 5, 7};  // (its own inverse)

// Where weight i (0..255) of a super-block sits in the 256 input bytes the products read
inline int64_t k_position(int64_t format, int64_t i) {
  return format == Q6_K ? i : SUB_AT_SLOT[i / 32] * 32 + i % 32;
}

struct SuperInputs {
  int64_t blocks = 0;          // super-blocks per row
  std::vector<int8_t> q;       // [R, 256 * blocks]: xq at k_position
  std::vector<float> s;        // [R, blocks]
  std::vector<int16_t> sums;   // [R, 16 * blocks]: Q4_K, Q5_K: the 8 sub-blocks' sums of xq, then 8 zeros;
                               // Q6_K: the 16 groups' of 16
};

// The largest |x| of n (a multiple of 16) floats, and xq = round-to-nearest-even(x * id) of 16 floats with their
// sum: in AVX-512 where the CPU has it, else one at a time; the same numbers either way (max is exact, and the
// vector conversion rounds to nearest even as nearbyint does)
__attribute__((target("avx512f"))) inline float largest_abs16(const float* x, int64_t n) {
  __m512 top = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) top = _mm512_max_ps(top, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
  return _mm512_reduce_max_ps(top);
}

__attribute__((target("avx512f"))) inline int round16(const float* x, float id, int8_t* out) {
  const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), _mm512_set1_ps(id)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(q));
  return _mm512_reduce_add_epi32(q);
}

inline float largest_abs(const float* x, int64_t n, bool wide) {
  if (wide) return largest_abs16(x, n);
  float amax = 0.f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}

// xq of 16 floats into out, returning their sum
inline int round_run16(const float* x, float id, int8_t* out, bool wide) {
  if (wide) return round16(x, id, out);
  int sum = 0;
  for (int i = 0; i < 16; ++i) {
    const int v = static_cast<int>(std::nearbyint(x[i] * id));
    out[i] = static_cast<int8_t>(v);
    sum += v;
  }
  return sum;
}

bool avx512_rounding() {
  static const bool available = __builtin_cpu_supports("avx512f");
  return available;
}

SuperInputs quantize_super(const float* x, int64_t rows, int64_t inputs, int64_t format) {
  SuperInputs in;
  in.blocks = inputs / 256;
  in.q.resize(static_cast<size_t>(rows * inputs));
  in.s.resize(static_cast<size_t>(rows * in.blocks));
  in.sums.assign(static_cast<size_t>(rows * 16 * in.blocks), 0);
  const bool wide = avx512_rounding();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t b = 0; b < in.blocks; ++b) {
        const float* xb = x + r * inputs + 256 * b;
        const float d = largest_abs(xb, 256, wide) / 127.f;
        const float id = d != 0.f ? 1.f / d : 0.f;
        int8_t* qb = in.q.data() + r * inputs + 256 * b;
        int16_t* sums = in.sums.data() + (r * in.blocks + b) * 16;
        for (int i = 0; i < 256; i += 16) {  // (runs of 16 stay together at k_position)
          const int sum = round_run16(xb + i, id, qb + k_position(format, i), wide);
          if (format == Q6_K) {
            sums[i / 16] = static_cast<int16_t>(sum);
          } else {
            sums[i / 32] = static_cast<int16_t>(sums[i / 32] + sum);
          }
        }
        in.s[r * in.blocks + b] = d;
      }
    }
  });
  return in;
}

// One weight row's super-block as the products read it: the four registers' values W [4][64], their pairs'
// scales S [4][32], the mins (Q4_K, Q5_K) or the 16 group scales (Q6_K) for the sums' term, d and dmin
struct SuperBlock {
  uint8_t w[4][64];
  int16_t scale[4][32];
  int16_t terms[16];  // Q4_K, Q5_K: mn[0..7], then zeros; Q6_K: sc[0..15]
  float d, dmin;
};

template <int64_t F>
void decode_super(const uint8_t* block, SuperBlock* out) {
  if constexpr (F == Q6_K) {
    const int8_t* sc = reinterpret_cast<const int8_t*>(block + 192);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = block + 64 * h;
      const uint8_t* qh = block + 128 + 32 * h;
      for (int e = 0; e < 2; ++e) {  // register 2h + e: weights 128h + 64e .. + 63 (sub-blocks k = 2e, 2e + 1)
        for (int b = 0; b < 64; ++b) {
          const int k = 2 * e + b / 32, i = b % 32;
          const int low = (ql[32 * (k % 2) + i] >> (4 * (k / 2))) & 0x0F;
          out->w[2 * h + e][b] = static_cast<uint8_t>(low | (((qh[i] >> (2 * k)) & 3) << 4));
        }
        for (int t = 0; t < 32; ++t) out->scale[2 * h + e][t] = sc[4 * (2 * h + e) + t / 8];
      }
    }
    for (int g = 0; g < 16; ++g) out->terms[g] = sc[g];
    out->d = half_of(block + 208);
    out->dmin = 0.f;
  } else {
    const uint8_t* qs = block + (F == Q4_K ? 16 : 48);
    for (int slot = 0; slot < 8; ++slot) {
      const int j = SUB_AT_SLOT[slot];
      int sc, mn;
      scale_min_k4(block + 4, j, &sc, &mn);
      for (int i = 0; i < 32; ++i) {
        int q = (qs[32 * (j / 2) + i] >> (4 * (j % 2))) & 0x0F;
        if constexpr (F == Q5_K) q |= ((block[16 + i] >> j) & 1) << 4;
        out->w[slot / 2][32 * (slot % 2) + i] = static_cast<uint8_t>(q);
      }
      for (int t = 0; t < 16; ++t) out->scale[slot / 2][16 * (slot % 2) + t] = static_cast<int16_t>(sc);
    }
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      scale_min_k4(block + 4, j, &sc, &mn);
      out->terms[j] = static_cast<int16_t>(mn);
      out->terms[8 + j] = 0;
    }
    out->d = half_of(block);
    out->dmin = half_of(block + 2);
  }
}

// ---- out[r, o] in plain C++: the reference ----

template <int64_t F>
float super_plain(const uint8_t* row, const SuperInputs& in, int64_t r) {
  float acc[16] = {};
  SuperBlock sb;
  for (int64_t b = 0; b < in.blocks; ++b) {
    decode_super<F>(row + b * (F == Q4_K ? 144 : F == Q5_K ? 176 : 210), &sb);
    const int8_t* x = in.q.data() + r * 256 * in.blocks + 256 * b;
    const int16_t* sums = in.sums.data() + (r * in.blocks + b) * 16;
    const float s = in.s[r * in.blocks + b];
    int32_t isum[16] = {}, term[8] = {};
    for (int reg = 0; reg < 4; ++reg) {
      for (int t = 0; t < 32; ++t) {
        const int32_t pair = sb.w[reg][2 * t] * x[64 * reg + 2 * t] + sb.w[reg][2 * t + 1] * x[64 * reg + 2 * t + 1];
        isum[t / 2] += sb.scale[reg][t] * pair;
      }
    }
    for (int l = 0; l < 8; ++l) term[l] = sb.terms[2 * l] * sums[2 * l] + sb.terms[2 * l + 1] * sums[2 * l + 1];
    if constexpr (F == Q6_K) {
      for (int l = 0; l < 8; ++l) isum[l] -= 32 * term[l];
    }
    const float ds = sb.d * s;
    for (int l = 0; l < 16; ++l) acc[l] = std::fma(static_cast<float>(isum[l]), ds, acc[l]);
    if constexpr (F != Q6_K) {
      const float ms = -(sb.dmin * s);
      for (int l = 0; l < 16; ++l) acc[l] = std::fma(l < 4 ? static_cast<float>(term[l]) : 0.f, ms, acc[l]);
    }
  }
  for (int i = 0; i < 8; ++i) acc[i] = acc[i] + acc[i + 8];
  for (int i = 0; i < 4; ++i) acc[i] = acc[i] + acc[i + 4];
  for (int i = 0; i < 2; ++i) acc[i] = acc[i] + acc[i + 2];
  return acc[0] + acc[1];
}

// ---- the same in AVX-512 VNNI (with BW for the 16-bit products and permutes) ----

#define LOOKAHEAD_VNNI_K __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c")))

// A super-block's registers, pair scales and terms, decoded once per weight row for every input row
struct SuperVectors {
  __m512i w[4];
  __m512i scale[4];
  __m256i terms;  // 16 int16
  __m512 d, neg_dmin;  // d and -dmin in every lane
};

// The index vector that spreads 16-bit scale v[first] over pairs 0-15 and v[second] over 16-31
LOOKAHEAD_VNNI_K inline __m512i spread(int first, int second) {
  return _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16(static_cast<int16_t>(first)),
                                 _mm512_set1_epi16(static_cast<int16_t>(second)));
}

template <int64_t F>
LOOKAHEAD_VNNI_K inline void decode_vectors(const uint8_t* block, SuperVectors* v) {
  const __m512i fifteen = _mm512_set1_epi8(15);
  if constexpr (F == Q6_K) {
    const __m512i three = _mm512_set1_epi8(3);
    const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 192)));
    const __m512i sc512 = _mm512_castsi256_si512(sc);
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(block + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * h)));
      // register 2h: low nibbles, sub-blocks k = 0 (bytes 0-31) and 1 (32-63): qh bits 0-1 and 2-3
      const __m512i high_a = _mm512_and_si512(_mm512_srlv_epi16(qh, _mm512_mask_blend_epi16(0xFFFF0000u,
                                                _mm512_set1_epi16(0), _mm512_set1_epi16(2))), three);
      const __m512i high_b = _mm512_and_si512(_mm512_srlv_epi16(qh, _mm512_mask_blend_epi16(0xFFFF0000u,
                                                _mm512_set1_epi16(4), _mm512_set1_epi16(6))), three);
      v->w[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, fifteen), _mm512_slli_epi16(high_a, 4));
      v->w[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), fifteen), _mm512_slli_epi16(high_b, 4));
      for (int e = 0; e < 2; ++e) {  // pairs t: scale 4R + t / 8
        const int R = 2 * h + e;
        const __m512i index = _mm512_add_epi16(_mm512_set1_epi16(static_cast<int16_t>(4 * R)),
                                               _mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16,
                                                                                  15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 3));
        v->scale[R] = _mm512_permutexvar_epi16(index, sc512);
      }
    }
    v->terms = sc;
    v->d = _mm512_set1_ps(half_fast(block + 208));
    v->neg_dmin = _mm512_setzero_ps();
  } else {
    uint64_t sc, mn;
    scales_mins_k4(block + 4, &sc, &mn);
    const __m512i sc512 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(sc))));
    const uint8_t* qs = block + (F == Q4_K ? 16 : 48);
    __m512i qh;
    if constexpr (F == Q5_K) qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16)));
    for (int half = 0; half < 2; ++half) {  // registers 2 half (low nibbles) and 2 half + 1 (high)
      const __m512i q = _mm512_loadu_si512(qs + 64 * half);
      __m512i low = _mm512_and_si512(q, fifteen), high = _mm512_and_si512(_mm512_srli_epi16(q, 4), fifteen);
      if constexpr (F == Q5_K) {  // sub-blocks 4 half + (0, 2) and 4 half + (1, 3): bits j of qh
        const __m512i one = _mm512_set1_epi8(1);
        const int j = 4 * half;
        const __m512i bits_low = _mm512_and_si512(_mm512_srlv_epi16(qh, _mm512_mask_blend_epi16(0xFFFF0000u,
                                                  _mm512_set1_epi16(static_cast<int16_t>(j)), _mm512_set1_epi16(static_cast<int16_t>(j + 2)))), one);
        const __m512i bits_high = _mm512_and_si512(_mm512_srlv_epi16(qh, _mm512_mask_blend_epi16(0xFFFF0000u,
                                                   _mm512_set1_epi16(static_cast<int16_t>(j + 1)), _mm512_set1_epi16(static_cast<int16_t>(j + 3)))), one);
        low = _mm512_or_si512(low, _mm512_slli_epi16(bits_low, 4));
        high = _mm512_or_si512(high, _mm512_slli_epi16(bits_high, 4));
      }
      v->w[2 * half] = low;
      v->w[2 * half + 1] = high;
      const int j = 4 * half;
      v->scale[2 * half] = _mm512_permutexvar_epi16(spread(j, j + 2), sc512);
      v->scale[2 * half + 1] = _mm512_permutexvar_epi16(spread(j + 1, j + 3), sc512);
    }
    v->terms = _mm256_zextsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(mn))));
    v->d = _mm512_set1_ps(half_fast(block));
    v->neg_dmin = _mm512_set1_ps(-half_fast(block + 2));
  }
}

// acc += one super-block of one input row against one weight row, in the order the file's head states
template <int64_t F>
LOOKAHEAD_VNNI_K inline __m512 super_step(const SuperVectors& v, const int8_t* x, const int16_t* sums, float s,
                                         __m512 acc) {
  // (two chains of integer sums, added after: the same exact total, half the wait)
  __m512i low = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(v.w[0], _mm512_loadu_si512(x)),
                                    v.scale[0]);
  __m512i high = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(v.w[2], _mm512_loadu_si512(x + 128)),
                                     v.scale[2]);
  low = _mm512_dpwssd_epi32(low, _mm512_maddubs_epi16(v.w[1], _mm512_loadu_si512(x + 64)), v.scale[1]);
  high = _mm512_dpwssd_epi32(high, _mm512_maddubs_epi16(v.w[3], _mm512_loadu_si512(x + 192)), v.scale[3]);
  __m512i isum = _mm512_add_epi32(low, high);
  const __m256i term = _mm256_madd_epi16(v.terms, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums)));
  const __m512 sv = _mm512_set1_ps(s);
  if constexpr (F == Q6_K) {
    isum = _mm512_sub_epi32(isum, _mm512_zextsi256_si512(_mm256_slli_epi32(term, 5)));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(v.d, sv), acc);
  } else {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(v.d, sv), acc);
    const __m512 mins = _mm512_zextps256_ps512(_mm256_cvtepi32_ps(term));  // (lanes 4-7 zero: the terms' padding)
    return _mm512_fmadd_ps(mins, _mm512_mul_ps(v.neg_dmin, sv), acc);  // (-dmin * s: -(dmin * s) exactly)
  }
}

template <int64_t F>
struct SuperVnni {
  template <int OT, int RT>
  struct Rows {
    LOOKAHEAD_VNNI_K static void run(const uint8_t* w, int64_t row_bytes, const SuperInputs& in, float* out,
                                     int64_t r0, int64_t o0, int64_t outputs) {
      constexpr int64_t bytes = F == Q4_K ? 144 : F == Q5_K ? 176 : 210;
      __m512 acc[OT][RT];
      for (int o = 0; o < OT; ++o)
        for (int r = 0; r < RT; ++r) acc[o][r] = _mm512_setzero_ps();
      const int64_t stride = 256 * in.blocks;
      for (int64_t b = 0; b < in.blocks; ++b) {
        for (int o = 0; o < OT; ++o) {
          SuperVectors v;
          decode_vectors<F>(w + (o0 + o) * row_bytes + b * bytes, &v);
          for (int r = 0; r < RT; ++r) {
            const int64_t row = r0 + r;
            const int8_t* x = in.q.data() + row * stride + 256 * b;
            // (the input row read afresh for each weight row, straight into the products: kept in registers
            // across the weight rows, eight rows' inputs would not fit and spill)
            asm("" : "+r"(x));
            acc[o][r] = super_step<F>(v, x, in.sums.data() + (row * in.blocks + b) * 16, in.s[row * in.blocks + b],
                                      acc[o][r]);
          }
        }
      }
      for (int o = 0; o < OT; ++o)
        for (int r = 0; r < RT; ++r) out[(r0 + r) * outputs + o0 + o] = reduce16(acc[o][r]);
    }
  };
};

}  // namespace
