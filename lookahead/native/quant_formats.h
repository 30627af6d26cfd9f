// GGUF block formats: layouts, the de-quantization formula of each (the `gguf` package's, in the same float32
// operations), and the checks every op of native/quant.cpp and native/quant8.cpp makes of its blocks.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

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
inline float half_of(const uint8_t* p) {
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

// IEEE half -> float in one instruction (F16C): the same values as half_to_float
__attribute__((target("f16c"))) inline float half_fast(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// unit u's 32 integer values q (before any offset) and its factors; F: the format, a template constant (its
// switch resolved when made) or -1 (read from `runtime`); HW: halves through F16C
template <int64_t F, bool HW>
inline Unit decode_ints(int64_t runtime, const uint8_t* row, int64_t u, int32_t* q) {
  const int64_t format = F < 0 ? runtime : F;
  auto half_to_float = [](const uint8_t* p) {
    if constexpr (HW) {
      return half_fast(p);
    } else {
      return half_of(p);
    }
  };
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

// unit u's 32 weights as float32 (F, HW: as decode_ints)
template <int64_t F = -1, bool HW = false>
inline void decode_unit(int64_t runtime, const uint8_t* row, int64_t u, float* w) {
  const int64_t format = F < 0 ? runtime : F;
  int32_t q[32];
  const Unit unit = decode_ints<F, HW>(runtime, row, u, q);
  for (int i = 0; i < 16; ++i) w[i] = weight_of(format, unit, unit.a0, q[i]);
  for (int i = 16; i < 32; ++i) w[i] = weight_of(format, unit, unit.a1, q[i]);
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

// ---- shared by the products: the lanes' reduction, the factors of 64 units at a time ----

__attribute__((target("avx2,fma,f16c"))) inline float reduce16(__m256 low, __m256 high) {
  const __m256 eight = _mm256_add_ps(low, high);  // (j, j + 8)
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));  // (j, j + 4)
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));  // (j, j + 2)
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 0x55)));  // (0, 1)
}

__attribute__((target("avx512f,f16c"))) inline float reduce16(__m512 v) {
  const __m256 low = _mm512_castps512_ps256(v);
  const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return reduce16(low, high);
}

// The offset a format's values carry (w = a * (q + offset) ...), a constant of the format
constexpr int offset_of(int64_t format) { return format == Q4_0 ? -8 : format == Q5_0 ? -16 : format == Q6_K ? -32 : 0; }

constexpr int64_t AHEAD = 64;  // units whose factors are decoded together, ahead of their values

// The factors of a row's units u0 .. u0 + count (count <= AHEAD): the halves' bits and the scales gathered with
// integer work, then converted and multiplied 16 units at a time (the same float operations as factors<F>)
struct Factors {
  alignas(64) float a0[AHEAD + 16];  // (16 past the last: vector reads of a last partial group stay inside)
  alignas(64) float a1[AHEAD + 16];
  alignas(64) float b[AHEAD + 16];
};

// Q4_K / Q5_K: the eight six-bit scales and mins of a super-block's 12 scale bytes, as scale_min_k4 reads
// them one by one, in 32-bit words: bytes 0-3 of *sc and *mn are sub-blocks 0-3, bytes 4-7 sub-blocks 4-7
inline void scales_mins_k4(const uint8_t* s, uint64_t* sc, uint64_t* mn) {
  uint32_t a, b, c;
  std::memcpy(&a, s, 4);
  std::memcpy(&b, s + 4, 4);
  std::memcpy(&c, s + 8, 4);
  const uint32_t low6 = 0x3F3F3F3Fu, low4 = 0x0F0F0F0Fu, low2 = 0x03030303u;
  const uint32_t sc_high = (c & low4) | (((a >> 6) & low2) << 4), mn_high = ((c >> 4) & low4) | (((b >> 6) & low2) << 4);
  *sc = static_cast<uint64_t>(a & low6) | (static_cast<uint64_t>(sc_high) << 32);
  *mn = static_cast<uint64_t>(b & low6) | (static_cast<uint64_t>(mn_high) << 32);
}

template <int64_t F>
__attribute__((target("avx512f,f16c"))) inline void factors_ahead(const uint8_t* row, int64_t u0, int64_t count,
                                                                   Factors* f) {
  if constexpr (F == Q4_K || F == Q5_K || F == Q6_K) {  // (u0 is a multiple of 8: whole super-blocks)
    for (int64_t k = 0; k < count; k += 8) {
      const int64_t u = u0 + k;
      if constexpr (F == Q6_K) {
        const uint8_t* block = row + (u / 8) * 210;
        const __m512 v = _mm512_mul_ps(_mm512_set1_ps(half_fast(block + 208)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 192)))));  // d * scale, the 16 of them
        const __m512 split = _mm512_permutexvar_ps(
            _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15), v);  // [even | odd]
        _mm256_storeu_ps(f->a0 + k, _mm512_castps512_ps256(split));
        _mm256_storeu_ps(f->a1 + k, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(split), 1)));
      } else {
        const uint8_t* block = row + (u / 8) * (F == Q4_K ? 144 : 176);
        uint64_t sc, mn;
        scales_mins_k4(block + 4, &sc, &mn);
        const __m256 scales = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(sc))));
        const __m256 mins = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(mn))));
        _mm256_storeu_ps(f->a0 + k, _mm256_mul_ps(_mm256_set1_ps(half_fast(block)), scales));
        _mm256_storeu_ps(f->b + k, _mm256_mul_ps(_mm256_set1_ps(half_fast(block + 2)), mins));
      }
    }
    return;
  }
  alignas(64) uint16_t hd[AHEAD] = {}, hb[AHEAD] = {};
  for (int64_t k = 0; k < count; ++k) {
    constexpr int64_t bytes = F == Q4_0 ? 18 : F == Q4_1 ? 20 : F == Q5_0 ? 22 : F == Q5_1 ? 24 : 34;
    std::memcpy(&hd[k], row + (u0 + k) * bytes, 2);
    if constexpr (F == Q4_1 || F == Q5_1) std::memcpy(&hb[k], row + (u0 + k) * bytes + 2, 2);
  }
  for (int64_t k = 0; k < count; k += 16) {
    _mm512_store_ps(f->a0 + k, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(hd + k))));
    if constexpr (F == Q4_1 || F == Q5_1) {
      _mm512_store_ps(f->b + k, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(hb + k))));
    }
  }
}

// ---- how a product's (input row, weight row) pairs are split: shared by the float and the integer products ----

constexpr int TILE = 8;            // input rows a pass over weight rows serves
constexpr int64_t ROW_BLOCK = 64;  // input rows kept in cache while every weight row of a thread passes over them

// Weight rows a pass takes at once for a tile of `count` input rows: each (weight row, input row) pair is a chain
// of multiply-adds in its own registers, and a few chains at once keep the multipliers busy while each waits
// for its last sum. The same chains, the same order: the bits do not depend on this choice.
constexpr int weight_rows_for(int64_t count) { return count <= 2 ? 4 : 2; }

// Calls tile(r0, count, o0, ot) for tiles of `count` <= TILE input rows by `ot` weight rows (weight_rows_for's,
// or 1) covering rows x outputs: the output rows split between torch's threads, input rows in blocks of
// ROW_BLOCK. Worked example: 3 rows, 5 outputs, one thread -> tile(0, 3, 0, 2), (0, 3, 2, 2), (0, 3, 4, 1).
template <class Tile>
void for_each_tile(int64_t rows, int64_t outputs, const Tile& tile) {
  const int64_t grain = std::max<int64_t>(4, std::min<int64_t>(16, outputs / (4 * at::get_num_threads() + 1)));
  at::parallel_for(0, outputs, grain, [&](int64_t begin, int64_t end) {
    for (int64_t b0 = 0; b0 < rows; b0 += ROW_BLOCK) {
      const int64_t b1 = std::min(rows, b0 + ROW_BLOCK);
      const int64_t wide = weight_rows_for(std::min<int64_t>(TILE, b1 - b0));
      for (int64_t o0 = begin; o0 < end;) {
        const int64_t ot = o0 + wide <= end ? wide : 1;
        for (int64_t r0 = b0; r0 < b1; r0 += TILE) {
          const int64_t count = std::min<int64_t>(TILE, b1 - r0);
          const int64_t fits = weight_rows_for(count);  // (a short last tile: its own width, where it divides ot)
          const int64_t take = fits <= ot && ot % fits == 0 ? fits : 1;
          for (int64_t o = o0; o < o0 + ot; o += take) tile(r0, count, o, take);
        }
        o0 += ot;
      }
    }
  });
}

// Calls run(OT, RT) with OT and RT as std::integral_constant values for a tile of `count` input rows by `ot`
// weight rows (ot 4: count 1-2; ot 2: count 3-8; ot 1: count 1-8), so that each path's Rows<OT, RT> is made
// for exactly the shapes for_each_tile hands out
template <class Run>
void dispatch_tile(int64_t ot, int64_t count, const Run& run) {
  using std::integral_constant;
  if (ot == 4) {
    if (count == 1) run(integral_constant<int, 4>{}, integral_constant<int, 1>{});
    else run(integral_constant<int, 4>{}, integral_constant<int, 2>{});
    return;
  }
  auto rows = [&](auto weight_rows) {
    switch (count) {
      case 8: run(weight_rows, integral_constant<int, 8>{}); break;
      case 7: run(weight_rows, integral_constant<int, 7>{}); break;
      case 6: run(weight_rows, integral_constant<int, 6>{}); break;
      case 5: run(weight_rows, integral_constant<int, 5>{}); break;
      case 4: run(weight_rows, integral_constant<int, 4>{}); break;
      case 3: run(weight_rows, integral_constant<int, 3>{}); break;
      case 2: if constexpr (decltype(weight_rows)::value == 1) run(weight_rows, integral_constant<int, 2>{}); break;
      case 1: if constexpr (decltype(weight_rows)::value == 1) run(weight_rows, integral_constant<int, 1>{}); break;
      default: break;
    }
  };
  if (ot == 2) rows(integral_constant<int, 2>{}); else rows(integral_constant<int, 1>{});
}

// A linear op over blocks: x [..., I] float32 @ W [O, I]^T (+ bias [O]) -> [..., O], W's blocks checked, x made
// [R, I] contiguous, compute(w, row bytes, x, out, R, O) filling out [R, O]; `name` for the errors
template <class Compute>
at::Tensor blocks_linear(const char* name, const at::Tensor& x, const at::Tensor& blocks, int64_t format,
                         int64_t inputs, const std::optional<at::Tensor>& bias, const Compute& compute) {
  Layout layout{};
  check_blocks(blocks, format, inputs, &layout);
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_cpu() && x.size(-1) == inputs, "lookahead_native::", name,
              ": x must be a float32 CPU tensor [..., ", inputs, "]");
  const at::Tensor flat = x.reshape({-1, inputs}).contiguous();  // [R, I]
  const int64_t rows = flat.size(0), outputs = blocks.size(0);
  at::Tensor out = at::empty({rows, outputs}, x.options());  // [R, O]
  if (rows > 0) {
    compute(blocks.data_ptr<uint8_t>(), blocks.size(1), flat.data_ptr<float>(), out.data_ptr<float>(), rows, outputs);
  }
  if (bias.has_value() && bias->defined()) out.add_(*bias);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = outputs;
  return out.view(shape);
}

}  // namespace
