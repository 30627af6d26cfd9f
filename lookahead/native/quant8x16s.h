// Integer products of Q4_1, Q5_0 and Q8_0 weights repacked sixteen output rows at a time, as quant8x16.h does for
// the K formats: a 32-bit lane per output row, one byte-dot per four weights of sixteen rows by four inputs
// broadcast, a chunk's unpacking shared by every input row.
//
// Layout: groups of 16 rows (o = 16 g + n), each a run of 32-weight blocks j, each block's chunk:
//   Q4_1 (320 bytes, the rows' own size): quants [4][64]: chunk c, byte 4 n + e = q[n][4 c + e] (low nibble) |
//          q[n][16 + 4 c + e] << 4; d f16 [16]; m f16 [16]
//   Q8_0 (544 bytes, the rows' own size): quants [8][64]: chunk c, byte 4 n + e = q[n][4 c + e] + 128 (the
//          signed value as an offset byte); d f16 [16]
//   Q5_0 (352 bytes, the rows' own size): low nibbles [4][64] as Q4_1's (q's bits 0-3); high bits [64]: byte
//          4 n + e holds bit 4 of q[n][4 c + e] at bit 2 c and of q[n][16 + 4 c + e] at bit 2 c + 1 (c = 0..3);
//          d f16 [16] (q = 0..31, the weight (q - 16) d)
//
// Inputs, per row and block (as llama.cpp quantizes them for these formats): s = max |x| / 127, xq =
// rne(x / s), xsum = the sum of the block's xq. Order, per output (r, o) over blocks in order:
//   Q4_1: acc = fma(float(dot), d * s, acc); acc = fma(float(xsum), m * s, acc)   (dot = sum q xq, exact)
//   Q8_0: acc = fma(float(dot), d * s, acc)   (dot = sum (q + 128) xq - 128 xsum = sum q xq, exact)
//   Q5_0: acc = fma(float(dot), d * s, acc)   (dot = sum q xq - 16 xsum, exact)
//   out = acc (+ bias)
// The same float operations at any row count, thread count or instruction set (AVX-512 VNNI, AMX, AVX2 or plain
// C++).
//
// Worked example (Q8_0, one block, 16 rows): d = 0.5, q = [2, -4, 0 ...]; x = [1, 1, 0 ...] -> s = 1/127,
// xq = [127, 127, 0 ...]; dot = 2 * 127 - 4 * 127 = -254; out = -254 * (0.5 / 127) = -1 for every row.
#pragma once

#include "quant_formats.h"
#include "quant8k.h"
#include "quant8x16.h"

namespace {

inline bool x16s_takes(int64_t format) { return format == Q4_1 || format == Q8_0 || format == Q5_0; }
constexpr int64_t x16s_bytes(int64_t format) { return format == Q4_1 ? 20 : format == Q5_0 ? 22 : 34; }  // a row's
// block; a chunk: x 16

// Where a chunk's 16 scales d (f16) begin
constexpr int64_t x16s_d(int64_t format) { return format == Q4_1 ? 256 : format == Q5_0 ? 320 : 512; }

// Block j of 16 rows (rows[n]: row n's block bytes) into its chunk, and back, byte for byte
inline void pack_chunk32(const uint8_t* const* rows, int64_t format, uint8_t* chunk) {
  if (format == Q4_1) {
    for (int c = 0; c < 4; ++c)
      for (int n = 0; n < 16; ++n)
        for (int e = 0; e < 4; ++e) {
          const uint8_t* qs = rows[n] + 4;
          const int low = qs[4 * c + e] & 15, high = qs[4 * c + e] >> 4;  // weights 4c + e and 16 + 4c + e
          chunk[64 * c + 4 * n + e] = static_cast<uint8_t>(low | high << 4);
        }
    for (int n = 0; n < 16; ++n) {
      std::memcpy(chunk + 256 + 2 * n, rows[n], 2);
      std::memcpy(chunk + 288 + 2 * n, rows[n] + 2, 2);
    }
  } else if (format == Q5_0) {
    for (int n = 0; n < 16; ++n) {
      uint32_t qh;
      std::memcpy(&qh, rows[n] + 2, 4);
      for (int c = 0; c < 4; ++c)
        for (int e = 0; e < 4; ++e) {
          chunk[64 * c + 4 * n + e] = rows[n][6 + 4 * c + e];  // (the nibble pair as it is)
          const int j = 4 * c + e;
          uint8_t& bits = chunk[256 + 4 * n + e];
          if (c == 0) bits = 0;
          bits = static_cast<uint8_t>(bits | ((qh >> j) & 1) << (2 * c) | ((qh >> (16 + j)) & 1) << (2 * c + 1));
        }
      std::memcpy(chunk + 320 + 2 * n, rows[n], 2);
    }
  } else {
    for (int c = 0; c < 8; ++c)
      for (int n = 0; n < 16; ++n)
        for (int e = 0; e < 4; ++e) chunk[64 * c + 4 * n + e] = static_cast<uint8_t>(rows[n][2 + 4 * c + e] ^ 0x80);
    for (int n = 0; n < 16; ++n) std::memcpy(chunk + 512 + 2 * n, rows[n], 2);
  }
}

inline void unpack_chunk32(const uint8_t* chunk, int64_t format, uint8_t* const* rows) {
  if (format == Q4_1) {
    for (int c = 0; c < 4; ++c)
      for (int n = 0; n < 16; ++n)
        for (int e = 0; e < 4; ++e) rows[n][4 + 4 * c + e] = chunk[64 * c + 4 * n + e];  // (the same nibble pair)
    for (int n = 0; n < 16; ++n) {
      std::memcpy(rows[n], chunk + 256 + 2 * n, 2);
      std::memcpy(rows[n] + 2, chunk + 288 + 2 * n, 2);
    }
  } else if (format == Q5_0) {
    for (int n = 0; n < 16; ++n) {
      uint32_t qh = 0;
      for (int c = 0; c < 4; ++c)
        for (int e = 0; e < 4; ++e) {
          rows[n][6 + 4 * c + e] = chunk[64 * c + 4 * n + e];
          const uint32_t bits = chunk[256 + 4 * n + e];
          qh |= ((bits >> (2 * c)) & 1u) << (4 * c + e) | ((bits >> (2 * c + 1)) & 1u) << (16 + 4 * c + e);
        }
      std::memcpy(rows[n] + 2, &qh, 4);
      std::memcpy(rows[n], chunk + 320 + 2 * n, 2);
    }
  } else {
    for (int c = 0; c < 8; ++c)
      for (int n = 0; n < 16; ++n)
        for (int e = 0; e < 4; ++e) rows[n][2 + 4 * c + e] = static_cast<uint8_t>(chunk[64 * c + 4 * n + e] ^ 0x80);
    for (int n = 0; n < 16; ++n) std::memcpy(rows[n], chunk + 512 + 2 * n, 2);
  }
}

struct X16sInputs {
  int64_t blocks = 0;         // blocks per row
  std::vector<int8_t> q;      // [R, 32 * blocks]
  std::vector<float> s;       // [R, blocks]
  std::vector<int32_t> sums;  // [R, blocks]
};

inline X16sInputs quantize_x16s(const float* x, int64_t rows, int64_t inputs) {
  X16sInputs in;
  in.blocks = inputs / 32;
  in.q.resize(static_cast<size_t>(rows * inputs));
  in.s.resize(static_cast<size_t>(rows * in.blocks));
  in.sums.resize(static_cast<size_t>(rows * in.blocks));
  const bool wide = avx512_rounding();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t j = 0; j < in.blocks; ++j) {
        const float* xb = x + r * inputs + 32 * j;
        const float d = largest_abs(xb, 32, wide) / 127.f;
        const float id = d != 0.f ? 1.f / d : 0.f;
        int8_t* qb = in.q.data() + r * inputs + 32 * j;
        in.sums[r * in.blocks + j] = round_run16(xb, id, qb, wide) + round_run16(xb + 16, id, qb + 16, wide);
        in.s[r * in.blocks + j] = d;
      }
    }
  });
  return in;
}

// ---- out[r, 16 g + n] in plain C++: the reference ----

inline void x16s_plain(const uint8_t* group, int64_t format, const X16sInputs& in, int64_t r, float* out) {
  float acc[16] = {};
  const int64_t chunk_bytes = 16 * x16s_bytes(format);
  for (int64_t j = 0; j < in.blocks; ++j) {
    const uint8_t* chunk = group + j * chunk_bytes;
    const int8_t* x = in.q.data() + r * 32 * in.blocks + 32 * j;
    const float s = in.s[r * in.blocks + j];
    const int32_t xsum = in.sums[r * in.blocks + j];
    for (int n = 0; n < 16; ++n) {
      int32_t dot = 0;
      if (format == Q4_1) {
        for (int c = 0; c < 4; ++c)
          for (int e = 0; e < 4; ++e) {
            const uint8_t byte = chunk[64 * c + 4 * n + e];
            dot += (byte & 15) * x[4 * c + e] + (byte >> 4) * x[16 + 4 * c + e];
          }
        const float d = half_of(chunk + 256 + 2 * n), m = half_of(chunk + 288 + 2 * n);
        acc[n] = std::fma(static_cast<float>(dot), d * s, acc[n]);
        acc[n] = std::fma(static_cast<float>(xsum), m * s, acc[n]);
      } else if (format == Q5_0) {
        dot = -16 * xsum;
        for (int c = 0; c < 4; ++c)
          for (int e = 0; e < 4; ++e) {
            const uint8_t byte = chunk[64 * c + 4 * n + e], bits = chunk[256 + 4 * n + e];
            const int low = (byte & 15) | ((bits >> (2 * c)) & 1) << 4, high = (byte >> 4) | ((bits >> (2 * c + 1)) & 1) << 4;
            dot += low * x[4 * c + e] + high * x[16 + 4 * c + e];
          }
        acc[n] = std::fma(static_cast<float>(dot), half_of(chunk + 320 + 2 * n) * s, acc[n]);
      } else {
        dot = -128 * xsum;
        for (int c = 0; c < 8; ++c)
          for (int e = 0; e < 4; ++e) dot += chunk[64 * c + 4 * n + e] * x[4 * c + e];
        acc[n] = std::fma(static_cast<float>(dot), half_of(chunk + 512 + 2 * n) * s, acc[n]);
      }
    }
  }
  for (int n = 0; n < 16; ++n) out[n] = acc[n];
}

// Ask for a chunk's successor `prefetch` bytes ahead, a cache line at a time (0: not). Always inlined: called from
// kernels compiled for other instruction sets, GCC would otherwise keep it a call in their inner loop
__attribute__((always_inline)) inline void prefetch_chunk(const uint8_t* chunk, int64_t bytes, int64_t prefetch) {
  if (prefetch > 0)
    for (int64_t line = 0; line < bytes; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(chunk + line + prefetch), _MM_HINT_T0);
}

// ---- the same in AVX-512 VNNI: RT input rows against G (1 or 2) adjacent groups (group g's blocks at group +
// g group_bytes, its outputs at out + 16 g), each input broadcast once for the G groups' byte-dots ----

template <int64_t F, int RT, int G = 1>
LOOKAHEAD_VNNI_K void x16s_vnni(const uint8_t* group, const X16sInputs& in, int64_t r0, float* out, int64_t outputs,
                               int64_t prefetch, int64_t group_bytes = 0) {
  constexpr int64_t chunk_bytes = 16 * x16s_bytes(F);
  const __m512i fifteen = _mm512_set1_epi8(15);
  __m512 acc[G][RT];
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < RT; ++r) acc[g][r] = _mm512_setzero_ps();
  for (int64_t j = 0; j < in.blocks; ++j) {
    const uint8_t* chunk[G];
    for (int g = 0; g < G; ++g) {
      chunk[g] = group + g * group_bytes + j * chunk_bytes;
      prefetch_chunk(chunk[g], chunk_bytes, prefetch);
    }
    const int8_t* x[RT];
    __m512i dot[G][RT], other[G][RT];  // (two chains of sums, added after: the same exact total)
    for (int r = 0; r < RT; ++r) {
      x[r] = in.q.data() + (r0 + r) * 32 * in.blocks + 32 * j;
      for (int g = 0; g < G; ++g) {
        dot[g][r] = F == Q8_0 ? _mm512_set1_epi32(-128 * in.sums[(r0 + r) * in.blocks + j]) : _mm512_setzero_si512();
        other[g][r] = _mm512_setzero_si512();
      }
    }
    if constexpr (F == Q4_1) {
      for (int c = 0; c < 4; ++c) {
        __m512i low[G], high[G];
        for (int g = 0; g < G; ++g) {
          const __m512i w = _mm512_loadu_si512(chunk[g] + 64 * c);
          low[g] = _mm512_and_si512(w, fifteen), high[g] = _mm512_and_si512(_mm512_srli_epi16(w, 4), fifteen);
        }
        for (int r = 0; r < RT; ++r) {
          int32_t xa, xb;
          std::memcpy(&xa, x[r] + 4 * c, 4);
          std::memcpy(&xb, x[r] + 16 + 4 * c, 4);
          const __m512i sa = _mm512_set1_epi32(xa), sb = _mm512_set1_epi32(xb);
          for (int g = 0; g < G; ++g) {
            dot[g][r] = _mm512_dpbusd_epi32(dot[g][r], low[g], sa);
            other[g][r] = _mm512_dpbusd_epi32(other[g][r], high[g], sb);
          }
        }
      }
    } else {
      for (int c = 0; c < 8; ++c) {
        __m512i w[G];
        for (int g = 0; g < G; ++g) w[g] = _mm512_loadu_si512(chunk[g] + 64 * c);
        for (int r = 0; r < RT; ++r) {
          int32_t xa;
          std::memcpy(&xa, x[r] + 4 * c, 4);
          const __m512i sa = _mm512_set1_epi32(xa);
          for (int g = 0; g < G; ++g) {
            if (c % 2 == 0) dot[g][r] = _mm512_dpbusd_epi32(dot[g][r], w[g], sa);
            else other[g][r] = _mm512_dpbusd_epi32(other[g][r], w[g], sa);
          }
        }
      }
    }
    for (int g = 0; g < G; ++g) {
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk[g] + x16s_d(F))));
      __m512 m = _mm512_setzero_ps();
      if constexpr (F == Q4_1)
        m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk[g] + 288)));
      for (int r = 0; r < RT; ++r) {
        const int64_t at = (r0 + r) * in.blocks + j;
        const __m512 s = _mm512_set1_ps(in.s[at]);
        acc[g][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(dot[g][r], other[g][r])),
                                    _mm512_mul_ps(d, s), acc[g][r]);
        if constexpr (F == Q4_1)
          acc[g][r] = _mm512_fmadd_ps(_mm512_set1_ps(static_cast<float>(in.sums[at])), _mm512_mul_ps(m, s),
                                      acc[g][r]);
      }
    }
  }
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < RT; ++r) _mm512_storeu_ps(out + (r0 + r) * outputs + 16 * g, acc[g][r]);
}

// ---- the same in AVX2 (quant8x16.h's note): the 16 rows' lanes in two 8-lane halves ----
// Q4_1's nibbles by |xq| <= 127 add at most 3810 per 16-bit lane, so a block's 8 products sum in 16 bits exactly
// (<= 30480). Q8_0 takes the weights' signs onto the inputs (|q| <= 128 unsigned by +-xq: <= 32512 a lane), so
// its dot is sum q xq directly: the integer the VNNI path reaches through the offset bytes.

template <int64_t F, int RT>
LOOKAHEAD_AVX2_I void x16s_avx2(const uint8_t* group, const X16sInputs& in, int64_t r0, float* out, int64_t outputs,
                               int64_t prefetch) {
  constexpr int64_t chunk_bytes = 16 * x16s_bytes(F);
  const __m256i fifteen = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  __m256 acc[RT][2];
  for (int r = 0; r < RT; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t j = 0; j < in.blocks; ++j) {
    const uint8_t* chunk = group + j * chunk_bytes;
    prefetch_chunk(chunk, chunk_bytes, prefetch);
    const int8_t* x[RT];
    __m256i dot[RT][2];
    for (int r = 0; r < RT; ++r) {
      x[r] = in.q.data() + (r0 + r) * 32 * in.blocks + 32 * j;
      dot[r][0] = dot[r][1] = _mm256_setzero_si256();
    }
    for (int h = 0; h < 2; ++h) {
      if constexpr (F == Q4_1) {
        __m256i sum[RT];
        for (int r = 0; r < RT; ++r) sum[r] = _mm256_setzero_si256();
        for (int c = 0; c < 4; ++c) {
          const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 64 * c + 32 * h));
          const __m256i low = _mm256_and_si256(w, fifteen), high = _mm256_and_si256(_mm256_srli_epi16(w, 4), fifteen);
          for (int r = 0; r < RT; ++r) {
            int32_t xa, xb;
            std::memcpy(&xa, x[r] + 4 * c, 4);
            std::memcpy(&xb, x[r] + 16 + 4 * c, 4);
            sum[r] = _mm256_add_epi16(sum[r], _mm256_add_epi16(_mm256_maddubs_epi16(low, _mm256_set1_epi32(xa)),
                                                               _mm256_maddubs_epi16(high, _mm256_set1_epi32(xb))));
          }
        }
        for (int r = 0; r < RT; ++r) dot[r][h] = _mm256_madd_epi16(sum[r], ones);
      } else if constexpr (F == Q5_0) {  // (q <= 31: 7874 a 16-bit lane, four chunks of each nibble summed apart)
        const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 256 + 32 * h));
        const __m256i one = _mm256_set1_epi8(1);
        __m256i lows[RT], highs[RT];
        for (int r = 0; r < RT; ++r) lows[r] = highs[r] = _mm256_setzero_si256();
        for (int c = 0; c < 4; ++c) {
          const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 64 * c + 32 * h));
          const __m256i low = _mm256_or_si256(_mm256_and_si256(w, fifteen),
              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bits, 2 * c), one), 4));
          const __m256i high = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w, 4), fifteen),
              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bits, 2 * c + 1), one), 4));
          for (int r = 0; r < RT; ++r) {
            int32_t xa, xb;
            std::memcpy(&xa, x[r] + 4 * c, 4);
            std::memcpy(&xb, x[r] + 16 + 4 * c, 4);
            lows[r] = _mm256_add_epi16(lows[r], _mm256_maddubs_epi16(low, _mm256_set1_epi32(xa)));
            highs[r] = _mm256_add_epi16(highs[r], _mm256_maddubs_epi16(high, _mm256_set1_epi32(xb)));
          }
        }
        for (int r = 0; r < RT; ++r)
          dot[r][h] = _mm256_add_epi32(_mm256_set1_epi32(-16 * in.sums[(r0 + r) * in.blocks + j]),
                                       _mm256_add_epi32(_mm256_madd_epi16(lows[r], ones), _mm256_madd_epi16(highs[r], ones)));
      } else {
        for (int c = 0; c < 8; ++c) {
          const __m256i q = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 64 * c + 32 * h)),
                                             _mm256_set1_epi8(static_cast<char>(0x80)));  // the signed weights
          const __m256i size = _mm256_abs_epi8(q);  // (-128 -> 0x80: 128 unsigned)
          for (int r = 0; r < RT; ++r) {
            int32_t xa;
            std::memcpy(&xa, x[r] + 4 * c, 4);
            const __m256i signed_x = _mm256_sign_epi8(_mm256_set1_epi32(xa), q);
            dot[r][h] = _mm256_add_epi32(dot[r][h], _mm256_madd_epi16(_mm256_maddubs_epi16(size, signed_x), ones));
          }
        }
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + x16s_d(F) + 16 * h)));
      __m256 m = _mm256_setzero_ps();
      if constexpr (F == Q4_1) m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + 288 + 16 * h)));
      for (int r = 0; r < RT; ++r) {
        const int64_t at = (r0 + r) * in.blocks + j;
        const __m256 s = _mm256_set1_ps(in.s[at]);
        acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][h]), _mm256_mul_ps(d, s), acc[r][h]);
        if constexpr (F == Q4_1)
          acc[r][h] = _mm256_fmadd_ps(_mm256_set1_ps(static_cast<float>(in.sums[at])), _mm256_mul_ps(m, s), acc[r][h]);
      }
    }
  }
  for (int r = 0; r < RT; ++r)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out + (r0 + r) * outputs + 8 * h, acc[r][h]);
}

// Q5_0 in AVX2 for two rows (x16s_many takes three or more): one half of the group (8 outputs) at a time over all
// its blocks, and in a block the low nibbles' four chunks for every row, then the high nibbles': the registers then
// hold a row's 16-bit sums of one kind, where both halves and both kinds at once would spill. Per output the same integers and the same float operations in block order as x16s_avx2: the same bits.
constexpr int X16S_ROWS = 8;  // rows a pass of x16s_q8_avx2 serves

template <int RT>
LOOKAHEAD_AVX2_I void x16s_q5_avx2(const uint8_t* group, const X16sInputs& in, int64_t r0, float* out,
                                   int64_t outputs, int64_t prefetch) {
  constexpr int64_t chunk_bytes = 16 * x16s_bytes(Q5_0);
  const __m256i fifteen = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1), ones = _mm256_set1_epi16(1);
  const int8_t* x[RT];
  for (int r = 0; r < RT; ++r) x[r] = in.q.data() + (r0 + r) * 32 * in.blocks;
  for (int h = 0; h < 2; ++h) {
    __m256 acc[RT];
    for (int r = 0; r < RT; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t j = 0; j < in.blocks; ++j) {
      const uint8_t* chunk = group + j * chunk_bytes;
      prefetch_chunk(chunk, chunk_bytes, h == 0 ? prefetch : 0);  // (the second half finds them read)
      const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 256 + 32 * h));
      __m256i dot[RT];
      for (int kind = 0; kind < 2; ++kind) {  // 0: weights 4c + e (low nibbles), 1: 16 + 4c + e (high)
        __m256i sums[RT];
        for (int r = 0; r < RT; ++r) sums[r] = _mm256_setzero_si256();
        for (int c = 0; c < 4; ++c) {
          const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 64 * c + 32 * h));
          const __m256i nibble = _mm256_and_si256(kind == 0 ? w : _mm256_srli_epi16(w, 4), fifteen);
          const __m256i q = _mm256_or_si256(nibble,
              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bits, 2 * c + kind), one), 4));
          for (int r = 0; r < RT; ++r) {
            int32_t xv;
            std::memcpy(&xv, x[r] + 32 * j + 16 * kind + 4 * c, 4);
            sums[r] = _mm256_add_epi16(sums[r], _mm256_maddubs_epi16(q, _mm256_set1_epi32(xv)));
          }
        }
        for (int r = 0; r < RT; ++r) {
          const __m256i part = _mm256_madd_epi16(sums[r], ones);
          dot[r] = kind == 0 ? part : _mm256_add_epi32(dot[r], part);
        }
      }
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + x16s_d(Q5_0) + 16 * h)));
      for (int r = 0; r < RT; ++r) {
        const int64_t at = (r0 + r) * in.blocks + j;
        const __m256i total = _mm256_add_epi32(_mm256_set1_epi32(-16 * in.sums[at]), dot[r]);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(d, _mm256_set1_ps(in.s[at])), acc[r]);
      }
    }
    for (int r = 0; r < RT; ++r) _mm256_storeu_ps(out + (r0 + r) * outputs + 8 * h, acc[r]);
  }
}

// Q4_1 and Q5_0 in AVX2 for many rows (up to X16S_MANY a pass), rows outermost in a block: a half's eight
// unpacked chunks stay in registers while each row in turn takes its eight byte-dots, so the live registers do not
// grow with the rows (the accumulators wait in a small buffer, one load and store a row and block) and a chunk's
// unpacking serves every row of the pass. Per output the same integers and the same float operations in block
// order as x16s_avx2: the same bits.
// Rows a pass of x16s_many and x16s_many_vnni serves: a block's unpacking and a group's reads from cache shared by
// up to 64 rows (passes of 16 or 32 measured slower from 64 rows on, results/RESULTS.md; the accumulators take
// 8 KB at two groups)
constexpr int X16S_MANY = 64;

template <int64_t F>
LOOKAHEAD_AVX2_I void x16s_many(const uint8_t* group, const X16sInputs& in, int64_t r0, int64_t count, float* out,
                                int64_t outputs, int64_t prefetch) {
  static_assert(F == Q4_1 || F == Q5_0, "x16s_many reads Q4_1 and Q5_0 chunks");
  constexpr int64_t chunk_bytes = 16 * x16s_bytes(F);
  const __m256i fifteen = _mm256_set1_epi8(15), sixteen = _mm256_set1_epi8(16), ones = _mm256_set1_epi16(1);
  alignas(32) float acc[X16S_MANY][8];
  for (int h = 0; h < 2; ++h) {
    for (int64_t r = 0; r < count; ++r) _mm256_store_ps(acc[r], _mm256_setzero_ps());
    for (int64_t j = 0; j < in.blocks; ++j) {
      const uint8_t* chunk = group + j * chunk_bytes;
      prefetch_chunk(chunk, chunk_bytes, h == 0 ? prefetch : 0);  // (the second half finds them read)
      __m256i q[8];  // q[4 kind + c]: the weights 16 kind + 4 c + e of the half's 8 outputs (Q5_0: 5 bits)
      for (int c = 0; c < 4; ++c) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 64 * c + 32 * h));
        q[c] = _mm256_and_si256(w, fifteen);
        q[4 + c] = _mm256_and_si256(_mm256_srli_epi16(w, 4), fifteen);
      }
      if constexpr (F == Q5_0) {
        const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 256 + 32 * h));
        for (int k = 0; k < 8; ++k) {  // bit 4 of weight k: the bits' bit 2 c + kind moved to bit 4
          const int shift = 2 * (k % 4) + k / 4;
          const __m256i top = shift <= 4 ? _mm256_slli_epi16(bits, 4 - shift) : _mm256_srli_epi16(bits, shift - 4);
          q[k] = _mm256_or_si256(q[k], _mm256_and_si256(top, sixteen));
        }
      }
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + x16s_d(F) + 16 * h)));
      __m256 m = _mm256_setzero_ps();
      if constexpr (F == Q4_1) m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + 288 + 16 * h)));
      for (int64_t r = 0; r < count; ++r) {
        const int8_t* x = in.q.data() + (r0 + r) * 32 * in.blocks + 32 * j;
        const int64_t at = (r0 + r) * in.blocks + j;
        __m256i products[8];
        for (int k = 0; k < 8; ++k) {
          int32_t xv;
          std::memcpy(&xv, x + 16 * (k / 4) + 4 * (k % 4), 4);
          products[k] = _mm256_maddubs_epi16(q[k], _mm256_set1_epi32(xv));
        }
        __m256i dot;
        if constexpr (F == Q4_1) {  // (q <= 15: the eight chunks sum in 16 bits, <= 30480)
          const __m256i low = _mm256_add_epi16(_mm256_add_epi16(products[0], products[1]),
                                               _mm256_add_epi16(products[2], products[3]));
          const __m256i high = _mm256_add_epi16(_mm256_add_epi16(products[4], products[5]),
                                                _mm256_add_epi16(products[6], products[7]));
          dot = _mm256_madd_epi16(_mm256_add_epi16(low, high), ones);
        } else {  // (q <= 31: each kind's four chunks sum in 16 bits, <= 31496)
          const __m256i low = _mm256_add_epi16(_mm256_add_epi16(products[0], products[1]),
                                               _mm256_add_epi16(products[2], products[3]));
          const __m256i high = _mm256_add_epi16(_mm256_add_epi16(products[4], products[5]),
                                                _mm256_add_epi16(products[6], products[7]));
          dot = _mm256_sub_epi32(_mm256_add_epi32(_mm256_madd_epi16(low, ones), _mm256_madd_epi16(high, ones)),
                                 _mm256_slli_epi32(_mm256_set1_epi32(in.sums[at]), 4));
        }
        const __m256 s = _mm256_set1_ps(in.s[at]);
        __m256 sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d, s), _mm256_load_ps(acc[r]));
        if constexpr (F == Q4_1)
          sum = _mm256_fmadd_ps(_mm256_set1_ps(static_cast<float>(in.sums[at])), _mm256_mul_ps(m, s), sum);
        _mm256_store_ps(acc[r], sum);
      }
    }
    for (int64_t r = 0; r < count; ++r) _mm256_storeu_ps(out + (r0 + r) * outputs + 8 * h, _mm256_load_ps(acc[r]));
  }
}

// The 32-weight formats in AVX-512 VNNI for many rows (up to X16S_MANY a pass), as x16s_many, for G (1 or 2)
// adjacent groups of 16 outputs (group g's blocks at group + g group_bytes, its outputs at out + 16 g): a block's
// eight chunks of each group (16 outputs in one register each; Q4_1's and Q5_0's unpacked, Q8_0's as they are)
// stay in registers while each row in turn takes its eight byte-dots a group (two chains, added after), each of
// its inputs broadcast once for the G groups, its accumulators waiting in a small aligned buffer. Per output the
// same integers and the same float operations in block order as x16s_vnni and x16s_avx2: the same bits. Q5_0
// takes it at every row count, Q4_1 and Q8_0 from five rows (up to four, x16s_vnni's rows held in registers).
template <int64_t F, int G>
LOOKAHEAD_VNNI_K void x16s_many_vnni(const uint8_t* group, int64_t group_bytes, const X16sInputs& in, int64_t r0,
                                     int64_t count, float* out, int64_t outputs, int64_t prefetch) {
  static_assert(F == Q4_1 || F == Q5_0 || F == Q8_0, "x16s_many_vnni reads 32-weight chunks");
  constexpr int64_t chunk_bytes = 16 * x16s_bytes(F);
  const __m512i fifteen = _mm512_set1_epi8(15), sixteen = _mm512_set1_epi8(16);
  alignas(64) float acc[X16S_MANY][G][16];
  for (int64_t r = 0; r < count; ++r)
    for (int g = 0; g < G; ++g) _mm512_store_ps(acc[r][g], _mm512_setzero_ps());
  for (int64_t j = 0; j < in.blocks; ++j) {
    __m512i q[G][8];  // q[g][4 kind + c]: the weights 16 kind + 4 c + e of group g's 16 outputs (Q5_0: 5 bits)
    __m512 d[G], m[G];
    for (int g = 0; g < G; ++g) {
      const uint8_t* chunk = group + g * group_bytes + j * chunk_bytes;
      prefetch_chunk(chunk, chunk_bytes, prefetch);
      if constexpr (F == Q8_0) {
        for (int k = 0; k < 8; ++k) q[g][k] = _mm512_loadu_si512(chunk + 64 * k);
      } else {
        for (int c = 0; c < 4; ++c) {
          const __m512i w = _mm512_loadu_si512(chunk + 64 * c);
          q[g][c] = _mm512_and_si512(w, fifteen);
          q[g][4 + c] = _mm512_and_si512(_mm512_srli_epi16(w, 4), fifteen);
        }
      }
      if constexpr (F == Q5_0) {
        const __m512i bits = _mm512_loadu_si512(chunk + 256);
        for (int k = 0; k < 8; ++k) {  // bit 4 of weight k: the bits' bit 2 c + kind moved to bit 4
          const int shift = 2 * (k % 4) + k / 4;
          const __m512i top = shift <= 4 ? _mm512_slli_epi16(bits, 4 - shift) : _mm512_srli_epi16(bits, shift - 4);
          q[g][k] = _mm512_or_si512(q[g][k], _mm512_and_si512(top, sixteen));
        }
        m[g] = _mm512_setzero_ps();
      } else if constexpr (F == Q8_0) {
        m[g] = _mm512_setzero_ps();
      } else {
        m[g] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 288)));
      }
      d[g] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + x16s_d(F))));
    }
    for (int64_t r = 0; r < count; ++r) {
      const int8_t* x = in.q.data() + (r0 + r) * 32 * in.blocks + 32 * j;
      const int64_t at = (r0 + r) * in.blocks + j;
      __m512i dot[G], other[G];
      for (int g = 0; g < G; ++g) {
        dot[g] = F == Q5_0 ? _mm512_set1_epi32(-16 * in.sums[at])
                 : F == Q8_0 ? _mm512_set1_epi32(-128 * in.sums[at]) : _mm512_setzero_si512();
        other[g] = _mm512_setzero_si512();
      }
      for (int k = 0; k < 8; ++k) {  // (Q8_0: chunk k holds inputs 4 k .. 4 k + 3)
        int32_t xv;
        std::memcpy(&xv, x + (F == Q8_0 ? 4 * k : 16 * (k / 4) + 4 * (k % 4)), 4);
        const __m512i xs = _mm512_set1_epi32(xv);
        for (int g = 0; g < G; ++g) {
          if (k % 2 == 0) dot[g] = _mm512_dpbusd_epi32(dot[g], q[g][k], xs);
          else other[g] = _mm512_dpbusd_epi32(other[g], q[g][k], xs);
        }
      }
      const __m512 s = _mm512_set1_ps(in.s[at]);
      for (int g = 0; g < G; ++g) {
        __m512 sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(dot[g], other[g])), _mm512_mul_ps(d[g], s),
                                     _mm512_load_ps(acc[r][g]));
        if constexpr (F == Q4_1)
          sum = _mm512_fmadd_ps(_mm512_set1_ps(static_cast<float>(in.sums[at])), _mm512_mul_ps(m[g], s), sum);
        _mm512_store_ps(acc[r][g], sum);
      }
    }
  }
  for (int64_t r = 0; r < count; ++r)
    for (int g = 0; g < G; ++g) _mm512_storeu_ps(out + (r0 + r) * outputs + 16 * g, _mm512_load_ps(acc[r][g]));
}

// ---- the same with AMX tiles: up to 16 input rows against one group, a block's dots per tile product ----
// A block's 32 weights of the 16 outputs are a tile of 8 rows by 64 bytes, row k holding weights 4k .. 4k + 3 of
// each output (byte 4 n + e), the low nibbles' four chunks first, then the high nibbles'. Q5_0's and Q8_0's as
// signed bytes, the weight itself (q - 16, q), so that a signed tile product (TDPBSSD) gives the dot with its
// offset term already in it; Q4_1's nibbles unsigned (TDPBSUD). Tiles (configured as amx_configure<Q4_K>): 0, 1
// dots [M, 16] int32 of blocks j and j + 1; 2, 3 their inputs [M, 32]; 4, 5 their weights. A dot is then the VNNI
// path's integer, closed by the same float operations in block order: the same bits.

// Block j's weights as a tile, into `buffer`
template <int64_t F>
LOOKAHEAD_AMX inline void x16s_tile_weights(const uint8_t* chunk, uint8_t (*buffer)[64]) {
  if constexpr (F == Q8_0) {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));  // (the offset byte q + 128 back to q)
    for (int k = 0; k < 8; ++k) _mm512_store_si512(buffer[k], _mm512_xor_si512(_mm512_loadu_si512(chunk + 64 * k), flip));
  } else {
    const __m512i fifteen = _mm512_set1_epi8(15), sixteen = _mm512_set1_epi8(16);
    __m512i q[8];
    for (int c = 0; c < 4; ++c) {
      const __m512i w = _mm512_loadu_si512(chunk + 64 * c);
      q[c] = _mm512_and_si512(w, fifteen);
      q[4 + c] = _mm512_and_si512(_mm512_srli_epi16(w, 4), fifteen);
    }
    if constexpr (F == Q5_0) {
      const __m512i bits = _mm512_loadu_si512(chunk + 256);
      for (int k = 0; k < 8; ++k) {  // (x16s_many_vnni's fifth bits, then the offset: q - 16 in -16 .. 15)
        const int shift = 2 * (k % 4) + k / 4;
        const __m512i top = shift <= 4 ? _mm512_slli_epi16(bits, 4 - shift) : _mm512_srli_epi16(bits, shift - 4);
        q[k] = _mm512_sub_epi8(_mm512_or_si512(q[k], _mm512_and_si512(top, sixteen)), sixteen);
      }
    }
    for (int k = 0; k < 8; ++k) _mm512_store_si512(buffer[k], q[k]);
  }
}

// acc (M rows, in registers where M is a constant) += block j's dots [m][16] by their scales
template <int64_t F, int M>
LOOKAHEAD_AMX inline void x16s_amx_close(const uint8_t* chunk, const X16sInputs& in, int64_t r0, int m, int64_t j,
                                         const int32_t (*dots)[16], __m512* acc) {
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + x16s_d(F))));
  __m512 mins = _mm512_setzero_ps();
  if constexpr (F == Q4_1) mins = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 288)));
  const int rows = M > 0 ? M : m;
  for (int r = 0; r < rows; ++r) {
    const int64_t at = (r0 + r) * in.blocks + j;
    const __m512 s = _mm512_set1_ps(in.s[at]);
    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(dots[r])), _mm512_mul_ps(d, s), acc[r]);
    if constexpr (F == Q4_1)
      acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(static_cast<float>(in.sums[at])), _mm512_mul_ps(mins, s), acc[r]);
  }
}

// m (<= 16; M: m as a constant, or 0) input rows from r0 against one group, the tiles configured for m
// (amx_configure<Q4_K>; quant8x16.h's amx_groups runs the passes)
template <int64_t F, int M>
LOOKAHEAD_AMX void amx_pass(const uint8_t* group, const X16sInputs& in, int64_t r0, int m, float* out,
                            int64_t outputs, int64_t prefetch) {
  constexpr int64_t chunk_bytes = 16 * x16s_bytes(F);
  const int64_t inputs = 32 * in.blocks;
  alignas(64) uint8_t weights[2][8][64];
  alignas(64) int32_t dots[2][AMX_ROWS][16];  // [block of the pair, row, output]
  __m512 acc[AMX_ROWS];
  for (int r = 0; r < AMX_ROWS; ++r) acc[r] = _mm512_setzero_ps();
  const int8_t* x = in.q.data() + r0 * inputs;
  int64_t j = 0;
  for (; j + 1 < in.blocks; j += 2) {
    const uint8_t* chunk = group + j * chunk_bytes;
    prefetch_chunk(chunk, 2 * chunk_bytes, prefetch);
    x16s_tile_weights<F>(chunk, weights[0]);
    x16s_tile_weights<F>(chunk + chunk_bytes, weights[1]);
    amx_dot_pair<F != Q4_1>(x + 32 * j, x + 32 * (j + 1), inputs, weights, dots[0], dots[1]);
    x16s_amx_close<F, M>(chunk, in, r0, m, j, dots[0], acc);
    x16s_amx_close<F, M>(chunk + chunk_bytes, in, r0, m, j + 1, dots[1], acc);
  }
  if (j < in.blocks) {  // (an odd block count's last block)
    const uint8_t* chunk = group + j * chunk_bytes;
    x16s_tile_weights<F>(chunk, weights[0]);
    _tile_loadd(2, x + 32 * j, inputs);
    _tile_loadd(4, weights[0], 64);
    _tile_zero(0);
    if constexpr (F == Q4_1) _tile_dpbsud(0, 2, 4);
    else _tile_dpbssd(0, 2, 4);
    _tile_stored(0, dots[0], 64);
    x16s_amx_close<F, M>(chunk, in, r0, m, j, dots[0], acc);
  }
  for (int r = 0; r < m; ++r) _mm512_storeu_ps(out + (r0 + r) * outputs, acc[r]);
}

// Q8_0 in AVX2 for several rows, as x16s_q5_avx2: one half of the group at a time over all its blocks, so a row
// holds one 32-bit dot and one accumulator (8 rows: 16 registers, against 32 for both halves). The same integers
// and float operations in block order as x16s_avx2: the same bits.
template <int RT>
LOOKAHEAD_AVX2_I void x16s_q8_avx2(const uint8_t* group, const X16sInputs& in, int64_t r0, float* out,
                                   int64_t outputs, int64_t prefetch) {
  constexpr int64_t chunk_bytes = 16 * x16s_bytes(Q8_0);
  const __m256i ones = _mm256_set1_epi16(1), offset = _mm256_set1_epi8(static_cast<char>(0x80));
  const int8_t* x[RT];
  for (int r = 0; r < RT; ++r) x[r] = in.q.data() + (r0 + r) * 32 * in.blocks;
  for (int h = 0; h < 2; ++h) {
    __m256 acc[RT];
    for (int r = 0; r < RT; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t j = 0; j < in.blocks; ++j) {
      const uint8_t* chunk = group + j * chunk_bytes;
      prefetch_chunk(chunk, chunk_bytes, h == 0 ? prefetch : 0);  // (the second half finds them read)
      __m256i dot[RT];
      for (int r = 0; r < RT; ++r) dot[r] = _mm256_setzero_si256();
      for (int c = 0; c < 8; ++c) {
        const __m256i q = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 64 * c + 32 * h)),
                                           offset);  // the signed weights
        const __m256i size = _mm256_abs_epi8(q);  // (-128 -> 0x80: 128 unsigned)
        for (int r = 0; r < RT; ++r) {
          int32_t xa;
          std::memcpy(&xa, x[r] + 32 * j + 4 * c, 4);
          const __m256i signed_x = _mm256_sign_epi8(_mm256_set1_epi32(xa), q);
          dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(_mm256_maddubs_epi16(size, signed_x), ones));
        }
      }
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + x16s_d(Q8_0) + 16 * h)));
      for (int r = 0; r < RT; ++r) {
        const __m256 s = _mm256_set1_ps(in.s[(r0 + r) * in.blocks + j]);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r]), _mm256_mul_ps(d, s), acc[r]);
      }
    }
    for (int r = 0; r < RT; ++r) _mm256_storeu_ps(out + (r0 + r) * outputs + 8 * h, acc[r]);
  }
}

static_assert(X16S_ROWS == 8, "with_rows dispatches 2 .. 8 rows");

// run(std::integral_constant<int, count>{}) for a count of 2 .. X16S_ROWS (a kernel's rows as a type); false for
// another count, run not called
template <typename Run>
inline bool with_rows(int64_t count, Run&& run) {
  switch (count) {
    case 8: run(std::integral_constant<int, 8>{}); return true;
    case 7: run(std::integral_constant<int, 7>{}); return true;
    case 6: run(std::integral_constant<int, 6>{}); return true;
    case 5: run(std::integral_constant<int, 5>{}); return true;
    case 4: run(std::integral_constant<int, 4>{}); return true;
    case 3: run(std::integral_constant<int, 3>{}); return true;
    case 2: run(std::integral_constant<int, 2>{}); return true;
    default: return false;
  }
}

template <int64_t F>
void x16s_rows_avx2(const uint8_t* group, const X16sInputs& in, int64_t r0, int64_t count, float* out,
                    int64_t outputs, int64_t prefetch) {
  // (one row: x16s_avx2's both halves at once, the weights read once)
  if constexpr (F == Q4_1 || F == Q5_0) {
    if (count >= 3) {  // (two rows: the kernels whose registers hold them are as fast)
      x16s_many<F>(group, in, r0, count, out, outputs, prefetch);
      return;
    }
  }
  if constexpr (F == Q5_0) {
    if (count == 2) {
      x16s_q5_avx2<2>(group, in, r0, out, outputs, prefetch);
      return;
    }
  }
  if constexpr (F == Q8_0) {
    if (with_rows(count, [&](auto rt) { x16s_q8_avx2<decltype(rt)::value>(group, in, r0, out, outputs, prefetch); }))
      return;
  }
  switch (count) {
    case 4: x16s_avx2<F, 4>(group, in, r0, out, outputs, prefetch); break;
    case 3: x16s_avx2<F, 3>(group, in, r0, out, outputs, prefetch); break;
    case 2: x16s_avx2<F, 2>(group, in, r0, out, outputs, prefetch); break;
    default: x16s_avx2<F, 1>(group, in, r0, out, outputs, prefetch); break;
  }
}

template <int64_t F>
void x16s_rows(const uint8_t* group, const X16sInputs& in, int64_t r0, int64_t count, float* out, int64_t outputs,
               int64_t prefetch) {
  if (F == Q5_0 || count > 4) {
    x16s_many_vnni<F, 1>(group, 0, in, r0, count, out, outputs, prefetch);
  } else {
    switch (count) {
      case 4: x16s_vnni<F, 4>(group, in, r0, out, outputs, prefetch); break;
      case 3: x16s_vnni<F, 3>(group, in, r0, out, outputs, prefetch); break;
      case 2: x16s_vnni<F, 2>(group, in, r0, out, outputs, prefetch); break;
      default: x16s_vnni<F, 1>(group, in, r0, out, outputs, prefetch); break;
    }
  }
}

// Two adjacent groups' products in VNNI: by x16s_many_vnni<F, 2> (Q5_0 at any rows, Q4_1 and Q8_0 from five, up to
// X16S_MANY), else by x16s_vnni with G = 2 (up to 4)
template <int64_t F>
void x16s_pair(const uint8_t* group, int64_t group_bytes, const X16sInputs& in, int64_t r0, int64_t count,
               float* out, int64_t outputs, int64_t prefetch) {
  if (F == Q5_0 || count > 4) {
    x16s_many_vnni<F, 2>(group, group_bytes, in, r0, count, out, outputs, prefetch);
  } else {
    switch (count) {
      case 4: x16s_vnni<F, 4, 2>(group, in, r0, out, outputs, prefetch, group_bytes); break;
      case 3: x16s_vnni<F, 3, 2>(group, in, r0, out, outputs, prefetch, group_bytes); break;
      case 2: x16s_vnni<F, 2, 2>(group, in, r0, out, outputs, prefetch, group_bytes); break;
      default: x16s_vnni<F, 1, 2>(group, in, r0, out, outputs, prefetch, group_bytes); break;
    }
  }
}

// out [R, O] = x [R, I] by the packed weights (path: quant8x16.h's X16Path), groups split between threads
inline void product_x16s(const uint8_t* packed, int64_t format, const float* x, float* out, int64_t rows,
                         int64_t inputs, int64_t outputs, int64_t path, int64_t prefetch) {
  const X16sInputs in = quantize_x16s(x, rows, inputs);
  const int64_t group_bytes = in.blocks * 16 * x16s_bytes(format), groups = outputs / 16;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    if (path == X16_AMX) {
      // (the tiles' shapes, inputs [M, 32] and weights [8, 64], are a Q4_K sub-block's: amx_configure<Q4_K>)
      if (format == Q4_1) amx_groups<Q4_1, Q4_K>(packed, group_bytes, in, rows, out, outputs, begin, end, prefetch);
      else if (format == Q5_0) amx_groups<Q5_0, Q4_K>(packed, group_bytes, in, rows, out, outputs, begin, end, prefetch);
      else amx_groups<Q8_0, Q4_K>(packed, group_bytes, in, rows, out, outputs, begin, end, prefetch);
      return;
    }
    // (rows a pass serves: x16s_many (Q4_1, Q5_0) and x16s_many_vnni up to X16S_MANY, the AVX2 Q8_0 kernel
    // X16S_ROWS, the others 4)
    const int64_t pass = (format == Q5_0 && path != X16_PLAIN) || (format == Q4_1 && path == X16_AVX2) ||
                         (path == X16_VNNI && rows > 4) ? X16S_MANY
                         : format == Q8_0 && path == X16_AVX2 ? X16S_ROWS : 4;
    // (VNNI: two groups a pass, x16s_pair; a last odd one alone)
    const auto pair = [&](int64_t p, int64_t r0, int64_t count) {
      const uint8_t* at = packed + p * group_bytes;
      if (format == Q5_0) x16s_pair<Q5_0>(at, group_bytes, in, r0, count, out + 16 * p, outputs, prefetch);
      else if (format == Q4_1) x16s_pair<Q4_1>(at, group_bytes, in, r0, count, out + 16 * p, outputs, prefetch);
      else x16s_pair<Q8_0>(at, group_bytes, in, r0, count, out + 16 * p, outputs, prefetch);
    };
    int64_t g = path != X16_VNNI ? begin : each_pair(begin, end, rows, pass, pair);
    for (; g < end; ++g) {
      const uint8_t* group = packed + g * group_bytes;
      each_pass(rows, pass, [&](int64_t r0, int64_t count) {
        if (path == X16_PLAIN) {
          for (int64_t r = r0; r < r0 + count; ++r) x16s_plain(group, format, in, r, out + r * outputs + 16 * g);
        } else if (path == X16_AVX2) {
          if (format == Q4_1) x16s_rows_avx2<Q4_1>(group, in, r0, count, out + 16 * g, outputs, prefetch);
          else if (format == Q5_0) x16s_rows_avx2<Q5_0>(group, in, r0, count, out + 16 * g, outputs, prefetch);
          else x16s_rows_avx2<Q8_0>(group, in, r0, count, out + 16 * g, outputs, prefetch);
        } else if (format == Q4_1) {
          x16s_rows<Q4_1>(group, in, r0, count, out + 16 * g, outputs, prefetch);
        } else if (format == Q5_0) {
          x16s_rows<Q5_0>(group, in, r0, count, out + 16 * g, outputs, prefetch);
        } else {
          x16s_rows<Q8_0>(group, in, r0, count, out + 16 * g, outputs, prefetch);
        }
      });
    }
  });
}

}  // namespace
