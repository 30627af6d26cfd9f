// Integer products of Q4_K and Q6_K weights repacked sixteen output rows at a time ("x16"): a 32-bit lane per
// output row, so one byte-dot instruction multiplies four weights of sixteen rows by four inputs broadcast, and
// a super-block's unpacking serves every input row. native/quant8.cpp's qpack16 / qunpack16 convert a GGUF
// tensor [O, row bytes] (O a multiple of 16) to this layout and back, losslessly; qlinear_int8_x16 multiplies.
//
// Layout: groups of 16 rows (o = 16 g + n), each a run of super-blocks b, each super-block's chunk:
//   Q4_K (2368 bytes): quants [32][64]: chunk c = 8 p + i, byte 4 n + e = q[n][64 p + 4 i + e] (low nibble) |
//          q[n][64 p + 32 + 4 i + e] << 4; scales u8 [8][16] (sub-block j, row n); mins u8 [4][16][2] (t, n,
//          sub-block 2 t + e); d f16 [16]; dmin f16 [16]
//   Q6_K (3360 bytes, the rows' own size): low nibbles [32][64] as Q4_K's (of the six-bit q); high bits
//          [16][64]: chunk h, byte 4 n + e = hb(A(2h)) | hb(B(2h)) << 2 | hb(A(2h + 1)) << 4 | hb(B(2h + 1)) << 6,
//          A(c) / B(c) the quads of chunk c's low / high nibble; scales i8 [16][16] (group g, row n); d f16 [16]
//
// Inputs, per row and super-block (quantize_super in natural order): s = max |x| / 127, xq = rne(x / s), the
// sums of xq per 16-weight group. Order, per output (r, o) over super-blocks in order, in exact integers then
// two (Q6_K: one) float multiply-adds:
//   Q4_K: I1 = sum_j sc_j dot_j, I2 = sum_j mn_j xsum_j (dot_j: sub-block j's weights by xq; xsum_j its xq sum)
//         acc = fma(float(I1), d * s, acc); acc = fma(float(I2), -(dmin * s), acc)
//   Q6_K: I1 = sum_g sc_g (dot_g - 32 xsum_g); acc = fma(float(I1), d * s, acc)
//   out = acc (+ bias)
// The integers are exact (no lane overflows: |I1| < 2^31), so their order is free; the float operations are
// the same at any row count, thread count or instruction set (AVX-512 VNNI, AMX, AVX2 or plain C++): a row's output has
// the same bits however many rows the step holds.
//
// Worked example (Q4_K, one super-block, one group): d = 1, dmin = 0, every scale 1 and every q = 2, x all 1 ->
// s = 1/127, xq = 127; I1 = 8 * (32 * 2 * 127) = 65024; out = 65024 * (1/127) = 512 for each of the 16 rows.
#pragma once

#include "quant_formats.h"
#include "quant8k.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace {

constexpr int64_t x16_chunk_bytes(int64_t format) { return format == Q4_K ? 2368 : 3360; }
constexpr int64_t x16_block_bytes(int64_t format) { return format == Q4_K ? 144 : 210; }

inline bool x16_takes(int64_t format) { return format == Q4_K || format == Q6_K; }

// The quad (4 weights, 0..63) of a super-block chunk c's low (high = 0) or high (1) nibble holds
inline int x16_quad(int c, int high) { return 16 * (c / 8) + 8 * high + c % 8; }

// One row's super-block as plain numbers: q [256], scales and mins (Q4_K: 8 each; Q6_K: 16 scales), d, dmin halves
struct PlainSuper {
  uint8_t q[256];
  int sc[16], mn[8];
  uint16_t d, dmin;
};

inline void read_super(const uint8_t* block, int64_t format, PlainSuper* out) {
  if (format == Q4_K) {
    for (int j = 0; j < 8; ++j) {
      scale_min_k4(block + 4, j, &out->sc[j], &out->mn[j]);
      for (int i = 0; i < 32; ++i) out->q[32 * j + i] = static_cast<uint8_t>((block[16 + 32 * (j / 2) + i] >> (4 * (j % 2))) & 15);
    }
    std::memcpy(&out->d, block, 2);
    std::memcpy(&out->dmin, block + 2, 2);
  } else {
    for (int h = 0; h < 2; ++h) {  // weights 128 h + 32 k + i: ql nibble, qh bits 2k
      for (int k = 0; k < 4; ++k) {
        for (int i = 0; i < 32; ++i) {
          const int low = (block[64 * h + 32 * (k % 2) + i] >> (4 * (k / 2))) & 15;
          const int top = (block[128 + 32 * h + i] >> (2 * k)) & 3;
          out->q[128 * h + 32 * k + i] = static_cast<uint8_t>(low | top << 4);
        }
      }
    }
    for (int g = 0; g < 16; ++g) out->sc[g] = static_cast<int8_t>(block[192 + g]);
    std::memcpy(&out->d, block + 208, 2);
    out->dmin = 0;
  }
}

// The inverse of read_super (Q4_K's six-bit scales and mins packed back as get_scale_min_k4 reads them)
inline void write_super(const PlainSuper& in, int64_t format, uint8_t* block) {
  if (format == Q4_K) {
    std::memcpy(block, &in.d, 2);
    std::memcpy(block + 2, &in.dmin, 2);
    uint8_t* s = block + 4;
    for (int j = 0; j < 4; ++j) {
      s[j] = static_cast<uint8_t>((in.sc[j] & 63) | ((in.sc[j + 4] >> 4) << 6));
      s[j + 4] = static_cast<uint8_t>((in.mn[j] & 63) | ((in.mn[j + 4] >> 4) << 6));
      s[j + 8] = static_cast<uint8_t>((in.sc[j + 4] & 15) | ((in.mn[j + 4] & 15) << 4));
    }
    for (int j = 0; j < 8; j += 2)
      for (int i = 0; i < 32; ++i) block[16 + 16 * j + i] = static_cast<uint8_t>(in.q[32 * j + i] | in.q[32 * (j + 1) + i] << 4);
  } else {
    std::memset(block, 0, 192);
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < 4; ++k)
        for (int i = 0; i < 32; ++i) {
          const int v = in.q[128 * h + 32 * k + i];
          block[64 * h + 32 * (k % 2) + i] |= static_cast<uint8_t>((v & 15) << (4 * (k / 2)));
          block[128 + 32 * h + i] |= static_cast<uint8_t>((v >> 4) << (2 * k));
        }
    for (int g = 0; g < 16; ++g) block[192 + g] = static_cast<uint8_t>(static_cast<int8_t>(in.sc[g]));
    std::memcpy(block + 208, &in.d, 2);
  }
}

// Super-block b of 16 rows (rows[n]: row n's blocks) into its chunk, and back
inline void pack_chunk(const PlainSuper* rows, int64_t format, uint8_t* chunk) {
  for (int c = 0; c < 32; ++c)
    for (int n = 0; n < 16; ++n)
      for (int e = 0; e < 4; ++e) {
        const int low = rows[n].q[4 * x16_quad(c, 0) + e], high = rows[n].q[4 * x16_quad(c, 1) + e];
        chunk[64 * c + 4 * n + e] = static_cast<uint8_t>((low & 15) | (high & 15) << 4);
      }
  if (format == Q4_K) {
    for (int j = 0; j < 8; ++j)
      for (int n = 0; n < 16; ++n) chunk[2048 + 16 * j + n] = static_cast<uint8_t>(rows[n].sc[j]);
    for (int t = 0; t < 4; ++t)
      for (int n = 0; n < 16; ++n)
        for (int e = 0; e < 2; ++e) chunk[2176 + 32 * t + 2 * n + e] = static_cast<uint8_t>(rows[n].mn[2 * t + e]);
    for (int n = 0; n < 16; ++n) {
      std::memcpy(chunk + 2304 + 2 * n, &rows[n].d, 2);
      std::memcpy(chunk + 2336 + 2 * n, &rows[n].dmin, 2);
    }
  } else {
    for (int h = 0; h < 16; ++h)
      for (int n = 0; n < 16; ++n)
        for (int e = 0; e < 4; ++e) {
          int byte = 0;
          for (int k = 0; k < 4; ++k) {  // A(2h), B(2h), A(2h + 1), B(2h + 1)
            const int c = 2 * h + k / 2;
            byte |= (rows[n].q[4 * x16_quad(c, k % 2) + e] >> 4) << (2 * k);
          }
          chunk[2048 + 64 * h + 4 * n + e] = static_cast<uint8_t>(byte);
        }
    for (int g = 0; g < 16; ++g)
      for (int n = 0; n < 16; ++n) chunk[3072 + 16 * g + n] = static_cast<uint8_t>(static_cast<int8_t>(rows[n].sc[g]));
    for (int n = 0; n < 16; ++n) std::memcpy(chunk + 3328 + 2 * n, &rows[n].d, 2);
  }
}

inline void unpack_chunk(const uint8_t* chunk, int64_t format, PlainSuper* rows) {
  for (int c = 0; c < 32; ++c)
    for (int n = 0; n < 16; ++n)
      for (int e = 0; e < 4; ++e) {
        const uint8_t byte = chunk[64 * c + 4 * n + e];
        rows[n].q[4 * x16_quad(c, 0) + e] = byte & 15;
        rows[n].q[4 * x16_quad(c, 1) + e] = byte >> 4;
      }
  if (format == Q4_K) {
    for (int n = 0; n < 16; ++n) {
      for (int j = 0; j < 8; ++j) rows[n].sc[j] = chunk[2048 + 16 * j + n];
      for (int j = 0; j < 8; ++j) rows[n].mn[j] = chunk[2176 + 32 * (j / 2) + 2 * n + j % 2];
      std::memcpy(&rows[n].d, chunk + 2304 + 2 * n, 2);
      std::memcpy(&rows[n].dmin, chunk + 2336 + 2 * n, 2);
    }
  } else {
    for (int h = 0; h < 16; ++h)
      for (int n = 0; n < 16; ++n)
        for (int e = 0; e < 4; ++e) {
          const int byte = chunk[2048 + 64 * h + 4 * n + e];
          for (int k = 0; k < 4; ++k) rows[n].q[4 * x16_quad(2 * h + k / 2, k % 2) + e] |= static_cast<uint8_t>(((byte >> (2 * k)) & 3) << 4);
        }
    for (int n = 0; n < 16; ++n) {
      for (int g = 0; g < 16; ++g) rows[n].sc[g] = static_cast<int8_t>(chunk[3072 + 16 * g + n]);
      std::memcpy(&rows[n].d, chunk + 3328 + 2 * n, 2);
      rows[n].dmin = 0;
    }
  }
}

// ---- the inputs: quantize_super's xq in natural order with the 16 group sums; Q4_K's sub-block sums as pairs ----

struct X16Inputs {
  SuperInputs super;           // xq [R, I] (natural order), s [R, blocks], sums [R, blocks, 16] (per 16 weights)
  std::vector<int32_t> pairs;  // [R, blocks, 4]: Q4_K: (xsum_2t, xsum_2t+1) as two int16 in one int32
};

inline X16Inputs quantize_x16(const float* x, int64_t rows, int64_t inputs, int64_t format) {
  X16Inputs in;
  in.super = quantize_super(x, rows, inputs, Q6_K);  // (Q6_K's k_position is the identity)
  const int64_t blocks = in.super.blocks;
  if (format == Q4_K) {
    in.pairs.resize(static_cast<size_t>(rows * blocks * 4));
    for (int64_t rb = 0; rb < rows * blocks; ++rb) {
      const int16_t* g = in.super.sums.data() + 16 * rb;
      for (int t = 0; t < 4; ++t) {
        const int16_t a = static_cast<int16_t>(g[4 * t] + g[4 * t + 1]), b = static_cast<int16_t>(g[4 * t + 2] + g[4 * t + 3]);
        in.pairs[4 * rb + t] = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(a)) |
                                                    static_cast<uint32_t>(static_cast<uint16_t>(b)) << 16);
      }
    }
  }
  return in;
}

// ---- out[r, 16 g + n] in plain C++: the reference ----

inline void x16_plain(const uint8_t* group, int64_t format, const X16Inputs& in, int64_t r, float* out) {
  const int64_t blocks = in.super.blocks;
  float acc[16] = {};
  PlainSuper rows[16];
  for (int64_t b = 0; b < blocks; ++b) {
    std::memset(rows, 0, sizeof rows);
    unpack_chunk(group + b * x16_chunk_bytes(format), format, rows);
    const int8_t* x = in.super.q.data() + r * 256 * blocks + 256 * b;
    const int16_t* sums = in.super.sums.data() + (r * blocks + b) * 16;
    const float s = in.super.s[r * blocks + b];
    for (int n = 0; n < 16; ++n) {
      int32_t i1 = 0, i2 = 0;
      if (format == Q4_K) {
        for (int j = 0; j < 8; ++j) {
          int32_t dot = 0;
          for (int i = 0; i < 32; ++i) dot += rows[n].q[32 * j + i] * x[32 * j + i];
          i1 += rows[n].sc[j] * dot;
          i2 += rows[n].mn[j] * (sums[2 * j] + sums[2 * j + 1]);
        }
      } else {
        for (int g = 0; g < 16; ++g) {
          int32_t dot = -32 * sums[g];
          for (int i = 0; i < 16; ++i) dot += rows[n].q[16 * g + i] * x[16 * g + i];
          i1 += rows[n].sc[g] * dot;
        }
      }
      const float d = half_of(reinterpret_cast<const uint8_t*>(&rows[n].d));
      acc[n] = std::fma(static_cast<float>(i1), d * s, acc[n]);
      if (format == Q4_K) {
        const float dmin = half_of(reinterpret_cast<const uint8_t*>(&rows[n].dmin));
        acc[n] = std::fma(static_cast<float>(i2), -(dmin * s), acc[n]);
      }
    }
  }
  for (int n = 0; n < 16; ++n) out[n] = acc[n];
}

// ---- the same in AVX-512 VNNI: RT input rows against one group ----

// Chunk c of a super-block's chunk as two registers of byte values: the quads A(c) (low) and B(c) (high), Q6_K's
// two high bits joined on; the weights `prefetch` bytes ahead asked for (0: not)
template <int64_t F>
LOOKAHEAD_VNNI_K inline void chunk_values(const uint8_t* chunk, int c, int64_t prefetch, __m512i* low, __m512i* high) {
  const __m512i fifteen = _mm512_set1_epi8(15);
  const __m512i w = _mm512_loadu_si512(chunk + 64 * c);
  if (prefetch > 0) _mm_prefetch(reinterpret_cast<const char*>(chunk + 64 * c + prefetch), _MM_HINT_T0);
  *low = _mm512_and_si512(w, fifteen);
  *high = _mm512_and_si512(_mm512_srli_epi16(w, 4), fifteen);
  if constexpr (F == Q6_K) {
    const __m512i hb = _mm512_loadu_si512(chunk + 2048 + 64 * (c / 2)), bits = _mm512_set1_epi8(0x30);
    if (prefetch > 0 && c % 2 == 0)
      _mm_prefetch(reinterpret_cast<const char*>(chunk + 2048 + 64 * (c / 2) + prefetch), _MM_HINT_T0);
    if (c % 2 == 0) {  // (bits 0-1 and 2-3 of each byte to 4-5; chunk c + 1's at 4-5 and 6-7)
      *low = _mm512_or_si512(*low, _mm512_and_si512(_mm512_slli_epi16(hb, 4), bits));
      *high = _mm512_or_si512(*high, _mm512_and_si512(_mm512_slli_epi16(hb, 2), bits));
    } else {
      *low = _mm512_or_si512(*low, _mm512_and_si512(hb, bits));
      *high = _mm512_or_si512(*high, _mm512_and_si512(_mm512_srli_epi16(hb, 2), bits));
    }
  }
}

// The 16 rows' integer scales of pass p's two sums as 32-bit lanes: Q4_K's sub-blocks 2p (sa) and 2p + 1 (sb);
// Q6_K's groups 4p + half (sa) and 4p + 2 + half (sb)
template <int64_t F>
LOOKAHEAD_VNNI_K inline void pass_scales(const uint8_t* chunk, int p, int half, __m512i* sa, __m512i* sb) {
  if constexpr (F == Q6_K) {
    *sa = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + 3072 + 16 * (4 * p + half))));
    *sb = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + 3072 + 16 * (4 * p + 2 + half))));
  } else {
    *sa = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + 2048 + 16 * (2 * p))));
    *sb = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + 2048 + 16 * (2 * p + 1))));
  }
}

// acc + super-block b's terms of input row `row` for the group's 16 outputs, from its I1 (the scaled dots):
// Q4_K's mins term I2, then the float operations of the order above (shared by the VNNI and AMX paths)
template <int64_t F>
LOOKAHEAD_VNNI_K inline __m512 x16_close(const uint8_t* chunk, const X16Inputs& in, int64_t row, int64_t b, __m512i i1,
                                         __m512 acc) {
  const int64_t at = row * in.super.blocks + b;
  const __m512 s = _mm512_set1_ps(in.super.s[at]);
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + (F == Q6_K ? 3328 : 2304))));
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), _mm512_mul_ps(d, s), acc);
  if constexpr (F == Q4_K) {
    __m512i i2 = _mm512_setzero_si512();
    for (int t = 0; t < 4; ++t) {
      const __m512i mn = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 2176 + 32 * t)));
      i2 = _mm512_dpwssd_epi32(i2, mn, _mm512_set1_epi32(in.pairs[4 * at + t]));
    }
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 2336)));
    const __m512 ms = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_mul_ps(dmin, s)),
                                                            _mm512_set1_epi32(static_cast<int>(0x80000000u))));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i2), ms, acc);
  }
  return acc;
}

// (prefetch: how far ahead of each 64 bytes of weights read their successors are asked for, 0 none; G: 1, or 2
// adjacent groups, group g's super-blocks at group + g group_bytes and its outputs at out + 16 g, each input
// broadcast once for both)
template <int64_t F, int RT, int G = 1>
LOOKAHEAD_VNNI_K void x16_vnni(const uint8_t* group, const X16Inputs& in, int64_t r0, float* out, int64_t outputs,
                              int64_t prefetch, int64_t group_bytes = 0) {
  const int64_t blocks = in.super.blocks;
  __m512 acc[G][RT];
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < RT; ++r) acc[g][r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* chunk[G];
    for (int g = 0; g < G; ++g) chunk[g] = group + g * group_bytes + b * x16_chunk_bytes(F);
    const int8_t* x[RT];
    for (int r = 0; r < RT; ++r) x[r] = in.super.q.data() + (r0 + r) * 256 * blocks + 256 * b;
    __m512i i1[G][RT];
    for (int g = 0; g < G; ++g)
      for (int r = 0; r < RT; ++r) i1[g][r] = _mm512_setzero_si512();
    for (int p = 0; p < 4; ++p) {
      for (int half = 0; half < (F == Q6_K ? 2 : 1); ++half) {  // Q6_K: groups 4p + half (low) and 4p + 2 + half
        __m512i a[G][RT], bq[G][RT];
        for (int r = 0; r < RT; ++r) {
          for (int g = 0; g < G; ++g) {
            if constexpr (F == Q6_K) {
              const int16_t* sums = in.super.sums.data() + ((r0 + r) * blocks + b) * 16;
              a[g][r] = _mm512_set1_epi32(-32 * sums[4 * p + half]);
              bq[g][r] = _mm512_set1_epi32(-32 * sums[4 * p + 2 + half]);
            } else {
              a[g][r] = bq[g][r] = _mm512_setzero_si512();
            }
          }
        }
        const int first = F == Q6_K ? 4 * half : 0, last = F == Q6_K ? 4 * half + 4 : 8;
        for (int i = first; i < last; ++i) {
          const int c = 8 * p + i;
          __m512i low[G], high[G];
          for (int g = 0; g < G; ++g) chunk_values<F>(chunk[g], c, prefetch, &low[g], &high[g]);
          const int qa = x16_quad(c, 0), qb = x16_quad(c, 1);
          for (int r = 0; r < RT; ++r) {
            int32_t xa, xb;
            std::memcpy(&xa, x[r] + 4 * qa, 4);
            std::memcpy(&xb, x[r] + 4 * qb, 4);
            const __m512i va = _mm512_set1_epi32(xa), vb = _mm512_set1_epi32(xb);
            for (int g = 0; g < G; ++g) {
              a[g][r] = _mm512_dpbusd_epi32(a[g][r], low[g], va);
              bq[g][r] = _mm512_dpbusd_epi32(bq[g][r], high[g], vb);
            }
          }
        }
        for (int g = 0; g < G; ++g) {
          __m512i sa, sb;
          pass_scales<F>(chunk[g], p, half, &sa, &sb);
          for (int r = 0; r < RT; ++r)
            i1[g][r] = _mm512_add_epi32(i1[g][r], _mm512_add_epi32(_mm512_mullo_epi32(a[g][r], sa),
                                                                   _mm512_mullo_epi32(bq[g][r], sb)));
        }
      }
    }
    for (int g = 0; g < G; ++g)
      for (int r = 0; r < RT; ++r) acc[g][r] = x16_close<F>(chunk[g], in, r0 + r, b, i1[g][r], acc[g][r]);
  }
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < RT; ++r) _mm512_storeu_ps(out + (r0 + r) * outputs + 16 * g, acc[g][r]);
}

// ---- the same in AVX2: RT input rows against one group, the 16 rows' lanes in two 8-lane halves ----
//
// AVX2 has no byte-dot: vpmaddubsw multiplies the weight bytes (unsigned) by the input bytes (signed) and adds
// neighbours into 16-bit lanes, which saturate past 32767. Q4_K's weights (0..15) by inputs (|xq| <= 127) add at
// most 3810 per lane, so a sub-block's 8 chunks sum in 16 bits exactly (<= 30480); Q6_K's (0..63, <= 16002 a
// lane) two chunks at a time. vpmaddwd by the scale (both halves of a 32-bit lane the row's scale) then gives
// the scaled dots in 32 bits: the same integers as the VNNI path, so the same bits.

#define LOOKAHEAD_AVX2_I __attribute__((target("avx2,fma,f16c")))

inline bool avx2_int8_available() {
  static const bool available =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return available;
}

// 8 rows' scales (bytes, signed or not) as one 32-bit lane per row holding the scale in both 16-bit halves
template <bool Signed>
LOOKAHEAD_AVX2_I inline __m256i scale_pairs(const uint8_t* bytes) {
  const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes));
  const __m256i wide = Signed ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v);
  return _mm256_or_si256(_mm256_and_si256(wide, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(wide, 16));
}

// Half h (rows 8h..8h+7) of chunk c's quads A(c) (low) and B(c) (high), Q6_K's two high bits joined on
template <int64_t F>
LOOKAHEAD_AVX2_I inline void chunk_half(const uint8_t* chunk, int c, int h, int64_t prefetch, __m256i* low,
                                        __m256i* high) {
  const __m256i fifteen = _mm256_set1_epi8(15);
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 64 * c + 32 * h));
  if (prefetch > 0 && h == 0) _mm_prefetch(reinterpret_cast<const char*>(chunk + 64 * c + prefetch), _MM_HINT_T0);
  *low = _mm256_and_si256(w, fifteen);
  *high = _mm256_and_si256(_mm256_srli_epi16(w, 4), fifteen);
  if constexpr (F == Q6_K) {
    const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 2048 + 64 * (c / 2) + 32 * h));
    const __m256i bits = _mm256_set1_epi8(0x30);
    if (prefetch > 0 && h == 0 && c % 2 == 0)
      _mm_prefetch(reinterpret_cast<const char*>(chunk + 2048 + 64 * (c / 2) + prefetch), _MM_HINT_T0);
    if (c % 2 == 0) {
      *low = _mm256_or_si256(*low, _mm256_and_si256(_mm256_slli_epi16(hb, 4), bits));
      *high = _mm256_or_si256(*high, _mm256_and_si256(_mm256_slli_epi16(hb, 2), bits));
    } else {
      *low = _mm256_or_si256(*low, _mm256_and_si256(hb, bits));
      *high = _mm256_or_si256(*high, _mm256_and_si256(_mm256_srli_epi16(hb, 2), bits));
    }
  }
}

// Q6_K's scales of half h (rows 8h..8h+7) as pairs: pairs[k] holds groups 2k and 2k + 1 as the two 16-bit halves
// of each row's 32-bit lane, for q6_offset
LOOKAHEAD_AVX2_I inline void q6_group_pairs(const uint8_t* chunk, int h, __m256i* pairs) {
  for (int k = 0; k < 8; ++k) {
    const __m256i even = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(chunk + 3072 + 16 * (2 * k) + 8 * h)));
    const __m256i odd = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(chunk + 3072 + 16 * (2 * k + 1) + 8 * h)));
    pairs[k] = _mm256_or_si256(_mm256_and_si256(even, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(odd, 16));
  }
}

// 32 sum_g sc_g xsum_g for one input row's super-block (sums: its 16 group sums of xq), 8 rows' lanes: what Q6_K's
// I1 loses to the weights' offset of 32
LOOKAHEAD_AVX2_I inline __m256i q6_offset(const __m256i* pairs, const int16_t* sums) {
  __m256i total = _mm256_setzero_si256();
  for (int k = 0; k < 8; ++k) {
    int32_t both;
    std::memcpy(&both, sums + 2 * k, 4);
    total = _mm256_add_epi32(total, _mm256_madd_epi16(pairs[k], _mm256_set1_epi32(both)));
  }
  return _mm256_slli_epi32(total, 5);
}

// acc (half h) + super-block b's float terms of input row `row` from its I1: as x16_close, 8 lanes
template <int64_t F>
LOOKAHEAD_AVX2_I inline __m256 x16_close8(const uint8_t* chunk, const X16Inputs& in, int64_t row, int64_t b, int h,
                                          __m256i i1, __m256 acc) {
  const int64_t at = row * in.super.blocks + b;
  const __m256 s = _mm256_set1_ps(in.super.s[at]);
  const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + (F == Q6_K ? 3328 : 2304) + 16 * h)));
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_mul_ps(d, s), acc);
  if constexpr (F == Q4_K) {
    __m256i i2 = _mm256_setzero_si256();
    for (int t = 0; t < 4; ++t) {  // (mins of sub-blocks 2t, 2t + 1 by their input sums, as 16-bit pairs)
      const __m256i mn = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + 2176 + 32 * t + 16 * h)));
      i2 = _mm256_add_epi32(i2, _mm256_madd_epi16(mn, _mm256_set1_epi32(in.pairs[4 * at + t])));
    }
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + 2336 + 16 * h)));
    const __m256 ms = _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(_mm256_mul_ps(dmin, s)),
                                                           _mm256_set1_epi32(static_cast<int>(0x80000000u))));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i2), ms, acc);
  }
  return acc;
}

template <int64_t F, int RT>
LOOKAHEAD_AVX2_I void x16_avx2(const uint8_t* group, const X16Inputs& in, int64_t r0, float* out, int64_t outputs,
                               int64_t prefetch) {
  const int64_t blocks = in.super.blocks;
  __m256 acc[RT][2];
  for (int r = 0; r < RT; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* chunk = group + b * x16_chunk_bytes(F);
    const int8_t* x[RT];
    __m256i i1[RT][2];
    for (int r = 0; r < RT; ++r) {
      x[r] = in.super.q.data() + (r0 + r) * 256 * blocks + 256 * b;
      i1[r][0] = i1[r][1] = _mm256_setzero_si256();
    }
    // Q4_K: pass p covers sub-blocks 2p (the chunks' low quads) and 2p + 1 (high), 8 chunks summed in 16 bits;
    // Q6_K: groups 4p + k (low) and 4p + 2 + k (high) over chunks 8p + 4k .. + 3, two chunks at a time
    constexpr int run = F == Q4_K ? 8 : 2;
    for (int p = 0; p < 4; ++p) {
      for (int first = 0; first < 8; first += run) {
        __m256i a[RT][2], bq[RT][2];
        for (int r = 0; r < RT; ++r) a[r][0] = a[r][1] = bq[r][0] = bq[r][1] = _mm256_setzero_si256();
        for (int i = first; i < first + run; ++i) {
          const int c = 8 * p + i;
          const int qa = x16_quad(c, 0), qb = x16_quad(c, 1);
          for (int h = 0; h < 2; ++h) {
            __m256i low, high;
            chunk_half<F>(chunk, c, h, prefetch, &low, &high);
            for (int r = 0; r < RT; ++r) {
              int32_t xa, xb;
              std::memcpy(&xa, x[r] + 4 * qa, 4);
              std::memcpy(&xb, x[r] + 4 * qb, 4);
              a[r][h] = _mm256_add_epi16(a[r][h], _mm256_maddubs_epi16(low, _mm256_set1_epi32(xa)));
              bq[r][h] = _mm256_add_epi16(bq[r][h], _mm256_maddubs_epi16(high, _mm256_set1_epi32(xb)));
            }
          }
        }
        for (int h = 0; h < 2; ++h) {
          __m256i sa, sb;
          if constexpr (F == Q6_K) {
            const int ga = 4 * p + first / 4, gb = 4 * p + 2 + first / 4;
            sa = scale_pairs<true>(chunk + 3072 + 16 * ga + 8 * h);
            sb = scale_pairs<true>(chunk + 3072 + 16 * gb + 8 * h);
          } else {
            sa = scale_pairs<false>(chunk + 2048 + 16 * (2 * p) + 8 * h);
            sb = scale_pairs<false>(chunk + 2048 + 16 * (2 * p + 1) + 8 * h);
          }
          for (int r = 0; r < RT; ++r)
            i1[r][h] = _mm256_add_epi32(i1[r][h], _mm256_add_epi32(_mm256_madd_epi16(a[r][h], sa),
                                                                   _mm256_madd_epi16(bq[r][h], sb)));
        }
      }
    }
    if constexpr (F == Q6_K) {  // I1 -= 32 sum_g sc_g xsum_g
      for (int h = 0; h < 2; ++h) {
        __m256i pairs[8];
        q6_group_pairs(chunk, h, pairs);
        for (int r = 0; r < RT; ++r)
          i1[r][h] = _mm256_sub_epi32(i1[r][h], q6_offset(pairs, in.super.sums.data() + ((r0 + r) * blocks + b) * 16));
      }
    }
    for (int r = 0; r < RT; ++r)
      for (int h = 0; h < 2; ++h) acc[r][h] = x16_close8<F>(chunk, in, r0 + r, b, h, i1[r][h], acc[r][h]);
  }
  for (int r = 0; r < RT; ++r)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out + (r0 + r) * outputs + 8 * h, acc[r][h]);
}

// The same for many rows (up to X16_MANY a pass), rows outermost: a super-block's half, a pass p and four of its
// chunks at a time (their eight unpacked quads held in registers), each row in turn takes its eight byte-dots and
// adds their scaled sums to its I1, which waits in a small buffer with the row's accumulator. The registers do
// not grow with the rows, and the unpacking serves every row of the pass. The integers are exact, so their order
// is free: Q4_K's sub-block sums split in two runs of 4 chunks (madd by the same scale), Q6_K's in pairs as above;
// the float operations are x16_close8's, the same bits as x16_avx2.
// Rows a pass of x16_many and x16_many_vnni serves: 32 measured faster than 16 from 32 rows on, and than 64 over a
// whole prompt's rows (each row's inputs are a stream of their own through the caches; results/RESULTS.md)
constexpr int X16_MANY = 32;

template <int64_t F>
LOOKAHEAD_AVX2_I void x16_many(const uint8_t* group, const X16Inputs& in, int64_t r0, int64_t count, float* out,
                               int64_t outputs, int64_t prefetch) {
  const int64_t blocks = in.super.blocks;
  // (a row's sums beside its accumulators: as two arrays a multiple of 4 KB apart they ran slower)
  struct alignas(32) Row {
    float acc[2][8];
    int32_t i1[8];
  } rows[X16_MANY];
  for (int64_t r = 0; r < count; ++r)
    for (int h = 0; h < 2; ++h) _mm256_store_ps(rows[r].acc[h], _mm256_setzero_ps());
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* chunk = group + b * x16_chunk_bytes(F);
    for (int h = 0; h < 2; ++h) {
      for (int64_t r = 0; r < count; ++r) _mm256_store_si256(reinterpret_cast<__m256i*>(rows[r].i1), _mm256_setzero_si256());
      for (int p = 0; p < 4; ++p) {
        for (int set = 0; set < 2; ++set) {  // chunks 8 p + 4 set .. + 3
          __m256i low[4], high[4];
          int qa[4], qb[4];
          for (int i = 0; i < 4; ++i) {
            const int c = 8 * p + 4 * set + i;
            chunk_half<F>(chunk, c, h, prefetch, &low[i], &high[i]);
            qa[i] = x16_quad(c, 0);
            qb[i] = x16_quad(c, 1);
          }
          __m256i sa, sb;  // Q4_K: sub-blocks 2p, 2p + 1; Q6_K: groups 4p + set, 4p + 2 + set
          if constexpr (F == Q6_K) {
            sa = scale_pairs<true>(chunk + 3072 + 16 * (4 * p + set) + 8 * h);
            sb = scale_pairs<true>(chunk + 3072 + 16 * (4 * p + 2 + set) + 8 * h);
          } else {
            sa = scale_pairs<false>(chunk + 2048 + 16 * (2 * p) + 8 * h);
            sb = scale_pairs<false>(chunk + 2048 + 16 * (2 * p + 1) + 8 * h);
          }
          for (int64_t r = 0; r < count; ++r) {
            const int8_t* x = in.super.q.data() + (r0 + r) * 256 * blocks + 256 * b;
            __m256i a[4], bq[4];
            for (int i = 0; i < 4; ++i) {
              int32_t xa, xb;
              std::memcpy(&xa, x + 4 * qa[i], 4);
              std::memcpy(&xb, x + 4 * qb[i], 4);
              a[i] = _mm256_maddubs_epi16(low[i], _mm256_set1_epi32(xa));
              bq[i] = _mm256_maddubs_epi16(high[i], _mm256_set1_epi32(xb));
            }
            __m256i sum;
            if constexpr (F == Q4_K) {  // (four chunks of 0..15 weights: <= 15240 a 16-bit lane)
              sum = _mm256_add_epi32(
                  _mm256_madd_epi16(_mm256_add_epi16(_mm256_add_epi16(a[0], a[1]), _mm256_add_epi16(a[2], a[3])), sa),
                  _mm256_madd_epi16(_mm256_add_epi16(_mm256_add_epi16(bq[0], bq[1]), _mm256_add_epi16(bq[2], bq[3])), sb));
            } else {  // (two chunks of 0..63 weights: <= 32004 a 16-bit lane)
              sum = _mm256_add_epi32(
                  _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(a[0], a[1]), sa),
                                   _mm256_madd_epi16(_mm256_add_epi16(a[2], a[3]), sa)),
                  _mm256_add_epi32(_mm256_madd_epi16(_mm256_add_epi16(bq[0], bq[1]), sb),
                                   _mm256_madd_epi16(_mm256_add_epi16(bq[2], bq[3]), sb)));
            }
            __m256i* held = reinterpret_cast<__m256i*>(rows[r].i1);
            _mm256_store_si256(held, _mm256_add_epi32(_mm256_load_si256(held), sum));
          }
        }
      }
      if constexpr (F == Q6_K) {  // I1 -= 32 sum_g sc_g xsum_g, as x16_avx2
        __m256i pairs[8];
        q6_group_pairs(chunk, h, pairs);
        for (int64_t r = 0; r < count; ++r) {
          __m256i* held = reinterpret_cast<__m256i*>(rows[r].i1);
          _mm256_store_si256(held, _mm256_sub_epi32(_mm256_load_si256(held),
                                                    q6_offset(pairs, in.super.sums.data() + ((r0 + r) * blocks + b) * 16)));
        }
      }
      for (int64_t r = 0; r < count; ++r)
        _mm256_store_ps(rows[r].acc[h], x16_close8<F>(chunk, in, r0 + r, b, h,
                                                 _mm256_load_si256(reinterpret_cast<const __m256i*>(rows[r].i1)),
                                                 _mm256_load_ps(rows[r].acc[h])));
    }
  }
  for (int64_t r = 0; r < count; ++r)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out + (r0 + r) * outputs + 8 * h, _mm256_load_ps(rows[r].acc[h]));
}

// The same in AVX-512 VNNI for many rows (up to X16_MANY a pass), rows outermost, for G (1 or 2) adjacent groups
// (group g's super-blocks at group + g group_bytes, its outputs at out + 16 g): a pass p's eight chunks (Q6_K, or
// two groups: each half's four) unpacked into registers, each row in turn takes its byte-dots, each input
// broadcast once for the G groups, and adds their scaled sums to its I1, which waits in a small buffer with the
// row's accumulator. The unpacking serves every row of the pass and a group's weights are read once a call, not
// once per four rows. The integers are exact, so their order is free (a Q4_K sub-block's dots scaled half by half
// give the same I1); the float operations are x16_close's: the same bits as x16_vnni.
template <int64_t F, int G = 1>
LOOKAHEAD_VNNI_K void x16_many_vnni(const uint8_t* group, const X16Inputs& in, int64_t r0, int64_t count, float* out,
                                    int64_t outputs, int64_t prefetch, int64_t group_bytes = 0) {
  const int64_t blocks = in.super.blocks;
  constexpr int halves = F == Q6_K || G == 2 ? 2 : 1;
  constexpr int held = 8 / halves;  // chunks unpacked at a time, a group
  // (a row's sums beside its accumulators: as two arrays a multiple of 4 KB apart they ran slower)
  struct alignas(64) Row {
    float acc[G][16];
    int32_t i1[G][16];
  } rows[X16_MANY];
  for (int64_t r = 0; r < count; ++r)
    for (int g = 0; g < G; ++g) _mm512_store_ps(rows[r].acc[g], _mm512_setzero_ps());
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* chunk[G];
    for (int g = 0; g < G; ++g) chunk[g] = group + g * group_bytes + b * x16_chunk_bytes(F);
    for (int64_t r = 0; r < count; ++r)
      for (int g = 0; g < G; ++g) _mm512_store_si512(rows[r].i1[g], _mm512_setzero_si512());
    for (int p = 0; p < 4; ++p) {
      for (int half = 0; half < halves; ++half) {  // Q6_K: groups 4p + half (low) and 4p + 2 + half
        __m512i low[G][held], high[G][held], sa[G], sb[G];
        int qa[held], qb[held];
        for (int i = 0; i < held; ++i) {
          const int c = 8 * p + (halves == 2 ? 4 * half : 0) + i;
          for (int g = 0; g < G; ++g) chunk_values<F>(chunk[g], c, prefetch, &low[g][i], &high[g][i]);
          qa[i] = x16_quad(c, 0);
          qb[i] = x16_quad(c, 1);
        }
        for (int g = 0; g < G; ++g) pass_scales<F>(chunk[g], p, half, &sa[g], &sb[g]);
        for (int64_t r = 0; r < count; ++r) {
          const int8_t* x = in.super.q.data() + (r0 + r) * 256 * blocks + 256 * b;
          __m512i a[G], bq[G];
          for (int g = 0; g < G; ++g) {
            a[g] = bq[g] = _mm512_setzero_si512();
            if constexpr (F == Q6_K) {
              const int16_t* sums = in.super.sums.data() + ((r0 + r) * blocks + b) * 16;
              a[g] = _mm512_set1_epi32(-32 * sums[4 * p + half]);
              bq[g] = _mm512_set1_epi32(-32 * sums[4 * p + 2 + half]);
            }
          }
          for (int i = 0; i < held; ++i) {
            int32_t xa, xb;
            std::memcpy(&xa, x + 4 * qa[i], 4);
            std::memcpy(&xb, x + 4 * qb[i], 4);
            const __m512i va = _mm512_set1_epi32(xa), vb = _mm512_set1_epi32(xb);
            for (int g = 0; g < G; ++g) {
              a[g] = _mm512_dpbusd_epi32(a[g], low[g][i], va);
              bq[g] = _mm512_dpbusd_epi32(bq[g], high[g][i], vb);
            }
          }
          for (int g = 0; g < G; ++g) {
            const __m512i sum = _mm512_add_epi32(_mm512_mullo_epi32(a[g], sa[g]), _mm512_mullo_epi32(bq[g], sb[g]));
            _mm512_store_si512(rows[r].i1[g], _mm512_add_epi32(_mm512_load_si512(rows[r].i1[g]), sum));
          }
        }
      }
    }
    for (int64_t r = 0; r < count; ++r)
      for (int g = 0; g < G; ++g)
        _mm512_store_ps(rows[r].acc[g], x16_close<F>(chunk[g], in, r0 + r, b, _mm512_load_si512(rows[r].i1[g]),
                                                _mm512_load_ps(rows[r].acc[g])));
  }
  for (int64_t r = 0; r < count; ++r)
    for (int g = 0; g < G; ++g) _mm512_storeu_ps(out + (r0 + r) * outputs + 16 * g, _mm512_load_ps(rows[r].acc[g]));
}

// ---- the same with AMX tiles: up to 16 input rows against one group, a (sub-)block's dots per tile product ----

#define LOOKAHEAD_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,amx-tile,amx-int8")))

constexpr int AMX_ROWS = 16;  // input rows a tile holds

inline bool vnni_k_available() {
  static const bool available = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("f16c");
  return available;
}

// Whether this CPU has AMX-INT8 and the OS lets this process use the tiles (asked once)
inline bool amx_available() {
  static const bool available = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const bool tile = (edx >> 24) & 1, int8 = (edx >> 25) & 1;
    constexpr long request_permission = 0x1023, tile_data = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    return tile && int8 && vnni_k_available() && syscall(SYS_arch_prctl, request_permission, tile_data) == 0;
  }();
  return available;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0, 1: dots [M, 16] int32; 2, 3: inputs [M, K]; 4, 5: weights [K / 4, 64] (K: 32 for Q4_K's sub-blocks,
// 16 for Q6_K's groups)
template <int64_t F>
LOOKAHEAD_AMX inline void amx_configure(int m) {
  constexpr int k = F == Q4_K ? 32 : 16;
  TileConfig config;
  for (int t = 0; t < 2; ++t) {
    config.rows[t] = static_cast<uint8_t>(m);
    config.colsb[t] = 64;
    config.rows[2 + t] = static_cast<uint8_t>(m);
    config.colsb[2 + t] = k;
    config.rows[4 + t] = k / 4;
    config.colsb[4 + t] = 64;
  }
  _tile_loadconfig(&config);
}

// Two tile products side by side (tiles as amx_configure sets them): inputs a and b (the configured rows, `stride`
// bytes apart) by weights[0] and weights[1], their dots [m][16] stored to da and db; the inputs signed, the weights
// signed (TDPBSSD) or unsigned (TDPBSUD)
template <bool SignedWeights>
LOOKAHEAD_AMX inline void amx_dot_pair(const int8_t* a, const int8_t* b, int64_t stride,
                                       const uint8_t (*weights)[8][64], int32_t (*da)[16], int32_t (*db)[16]) {
  _tile_loadd(2, a, stride);
  _tile_loadd(3, b, stride);
  _tile_loadd(4, weights[0], 64);
  _tile_loadd(5, weights[1], 64);
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (SignedWeights) {
    _tile_dpbssd(0, 2, 4);
    _tile_dpbssd(1, 3, 5);
  } else {
    _tile_dpbsud(0, 2, 4);
    _tile_dpbsud(1, 3, 5);
  }
  _tile_stored(0, da, 64);
  _tile_stored(1, db, 64);
}

// m (<= 16; M: m as a constant, or 0) input rows from r0 against one group, the tiles configured for m
// (amx_configure). Q6_K's weights go in as signed bytes (q - 32), so that the signed tile product (TDPBSSD) holds
// the offset term; Q4_K's unsigned (TDPBSUD). A group's scales are read once for all the rows, and the rows'
// accumulators stay in registers where M is a constant.
template <int64_t F, int M>
LOOKAHEAD_AMX void amx_pass(const uint8_t* group, const X16Inputs& in, int64_t r0, int m, float* out, int64_t outputs,
                            int64_t prefetch) {
  constexpr int groups = F == Q4_K ? 8 : 16, k = F == Q4_K ? 32 : 16;  // scale groups of a super-block, their weights
  const int64_t blocks = in.super.blocks, inputs = 256 * blocks;
  const int rows = M > 0 ? M : m;
  alignas(64) uint8_t weights[2][8][64];          // the tile products' weights: low, high nibbles
  alignas(64) int32_t dots[groups][AMX_ROWS][16];  // [scale group, row, output]
  __m512 acc[AMX_ROWS];
  for (int r = 0; r < AMX_ROWS; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i offset = _mm512_set1_epi8(32);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* chunk = group + b * x16_chunk_bytes(F);
    const int8_t* x = in.super.q.data() + r0 * inputs + 256 * b;
    for (int p = 0; p < 4; ++p) {
      for (int half = 0; half < (F == Q6_K ? 2 : 1); ++half) {
        const int first = F == Q6_K ? 4 * half : 0, count = F == Q6_K ? 4 : 8;
        for (int i = 0; i < count; ++i) {
          const int c = 8 * p + first + i;
          __m512i low, high;
          chunk_values<F>(chunk, c, prefetch, &low, &high);
          if constexpr (F == Q6_K) {
            low = _mm512_sub_epi8(low, offset);
            high = _mm512_sub_epi8(high, offset);
          }
          _mm512_store_si512(weights[0][i], low);
          _mm512_store_si512(weights[1][i], high);
        }
        // scale groups ga (the low nibbles' quads) and gb (the high): Q4_K sub-blocks 2p, 2p + 1; Q6_K groups
        // 4p + half, 4p + 2 + half; their inputs at 16 ga and 16 gb (Q6_K), 32 ga and 32 gb (Q4_K)
        const int ga = F == Q4_K ? 2 * p : 4 * p + half, gb = F == Q4_K ? 2 * p + 1 : 4 * p + 2 + half;
        amx_dot_pair<F == Q6_K>(x + k * ga, x + k * gb, inputs, weights, dots[ga], dots[gb]);
      }
    }
    __m512i scales[groups];
    for (int g = 0; g < groups; ++g) {
      if constexpr (F == Q6_K)
        scales[g] = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + 3072 + 16 * g)));
      else
        scales[g] = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(chunk + 2048 + 16 * g)));
    }
    for (int r = 0; r < rows; ++r) {
      __m512i i1 = _mm512_setzero_si512();
      for (int g = 0; g < groups; ++g) i1 = _mm512_add_epi32(i1, _mm512_mullo_epi32(_mm512_load_si512(dots[g][r]), scales[g]));
      acc[r] = x16_close<F>(chunk, in, r0 + r, b, i1, acc[r]);
    }
  }
  for (int r = 0; r < rows; ++r) _mm512_storeu_ps(out + (r0 + r) * outputs, acc[r]);
}

// A pass's AMX kernel (``amx_pass``: this file's for the K formats, quant8x16s.h's for the 32-weight blocks, told
// apart by their inputs' type) with its rows m as a constant (1 .. AMX_ROWS), so that their accumulators stay in
// registers
template <int64_t F, int M = AMX_ROWS, typename Inputs>
LOOKAHEAD_AMX void amx_pass_rows(const uint8_t* group, const Inputs& in, int64_t r0, int m, float* out,
                                 int64_t outputs, int64_t prefetch) {
  if constexpr (M > 1) {
    if (m < M) {
      amx_pass_rows<F, M - 1>(group, in, r0, m, out, outputs, prefetch);
      return;
    }
  }
  amx_pass<F, M>(group, in, r0, M, out, outputs, prefetch);
}

template <int64_t F>
void x16_rows(const uint8_t* group, const X16Inputs& in, int64_t r0, int64_t count, float* out, int64_t outputs,
              int64_t prefetch) {
  if (count >= 5) {  // (up to four rows: x16_vnni, whose registers hold them, is faster)
    x16_many_vnni<F>(group, in, r0, count, out, outputs, prefetch);
    return;
  }
  switch (count) {
    case 4: x16_vnni<F, 4>(group, in, r0, out, outputs, prefetch); break;
    case 3: x16_vnni<F, 3>(group, in, r0, out, outputs, prefetch); break;
    case 2: x16_vnni<F, 2>(group, in, r0, out, outputs, prefetch); break;
    default: x16_vnni<F, 1>(group, in, r0, out, outputs, prefetch); break;
  }
}

template <int64_t F>
void x16_rows_avx2(const uint8_t* group, const X16Inputs& in, int64_t r0, int64_t count, float* out, int64_t outputs,
                   int64_t prefetch) {
  if (count >= 5) {  // (up to four rows: x16_avx2, whose registers hold them, is faster)
    x16_many<F>(group, in, r0, count, out, outputs, prefetch);
    return;
  }
  switch (count) {
    case 4: x16_avx2<F, 4>(group, in, r0, out, outputs, prefetch); break;
    case 3: x16_avx2<F, 3>(group, in, r0, out, outputs, prefetch); break;
    case 2: x16_avx2<F, 2>(group, in, r0, out, outputs, prefetch); break;
    default: x16_avx2<F, 1>(group, in, r0, out, outputs, prefetch); break;
  }
}

// fn(r0, count) for each pass over a call's `rows` rows, at most `most` rows a pass, the rows split evenly between
// the passes (no short last pass). Worked example: 17 rows, at most 16 -> (0, 8), (8, 9).
template <typename Fn>
inline void each_pass(int64_t rows, int64_t most, const Fn& fn) {
  const int64_t passes = (rows + most - 1) / most;
  for (int64_t p = 0, r0 = 0; p < passes; ++p) {
    const int64_t count = rows * (p + 1) / passes - rows * p / passes;
    fn(r0, count);
    r0 += count;
  }
}

// fn(g, r0, count) for the pairs of adjacent groups g, g + 1 in [begin, end), from begin, each pair's rows in passes
// as each_pass splits them; the first group no pair took (end, or a last odd one). Worked example: groups [0, 5),
// 17 rows, at most 16 -> (0, 0, 8), (0, 8, 9), (2, 0, 8), (2, 8, 9); returns 4.
template <typename Fn>
inline int64_t each_pair(int64_t begin, int64_t end, int64_t rows, int64_t most, const Fn& fn) {
  int64_t g = begin;
  for (; g + 2 <= end; g += 2) each_pass(rows, most, [&](int64_t r0, int64_t count) { fn(g, r0, count); });
  return g;
}

// Groups [begin, end) of format F on AMX tiles, every group's rows in passes of at most AMX_ROWS split evenly (no
// short last pass), the tiles configured with TILES's shapes (amx_configure)
template <int64_t F, int64_t TILES, typename Inputs>
LOOKAHEAD_AMX void amx_groups(const uint8_t* packed, int64_t group_bytes, const Inputs& in, int64_t rows, float* out,
                              int64_t outputs, int64_t begin, int64_t end, int64_t prefetch) {
  int configured = 0;  // (the tiles' rows as configured in this thread; another op may have reconfigured them
                       // before this call)
  const int64_t passes = (rows + AMX_ROWS - 1) / AMX_ROWS;  // (each_pass's split, written out: a lambda here
  for (int64_t g = begin; g < end; ++g) {                       // would not be compiled for the tiles)
    for (int64_t p = 0, r0 = 0; p < passes; ++p) {
      const int m = static_cast<int>(rows * (p + 1) / passes - rows * p / passes);
      if (m != configured) {
        amx_configure<TILES>(m);
        configured = m;
      }
      amx_pass_rows<F>(packed + g * group_bytes, in, r0, m, out + 16 * g, outputs, prefetch);
      r0 += m;
    }
  }
  _tile_release();
}

// How qlinear_int8_x16 computes: 0 plain C++, 1 AVX-512 VNNI, 2 AMX tiles, 3 AVX2 (the same bits each way)
enum X16Path : int64_t { X16_PLAIN = 0, X16_VNNI = 1, X16_AMX = 2, X16_AVX2 = 3 };

// Two adjacent groups' products in VNNI: x16_many_vnni from five rows, x16_vnni (both groups' sums in registers)
// up to four
template <int64_t F>
void x16_pair(const uint8_t* group, const X16Inputs& in, int64_t r0, int64_t count, float* out, int64_t outputs,
              int64_t prefetch, int64_t group_bytes) {
  switch (count) {
    case 4: x16_vnni<F, 4, 2>(group, in, r0, out, outputs, prefetch, group_bytes); break;
    case 3: x16_vnni<F, 3, 2>(group, in, r0, out, outputs, prefetch, group_bytes); break;
    case 2: x16_vnni<F, 2, 2>(group, in, r0, out, outputs, prefetch, group_bytes); break;
    case 1: x16_vnni<F, 1, 2>(group, in, r0, out, outputs, prefetch, group_bytes); break;
    default: x16_many_vnni<F, 2>(group, in, r0, count, out, outputs, prefetch, group_bytes); break;
  }
}

// out [R, O] = x [R, I] by the packed weights, groups split between torch's threads
inline void product_x16(const uint8_t* packed, int64_t format, const float* x, float* out, int64_t rows,
                        int64_t inputs, int64_t outputs, int64_t path, int64_t prefetch) {
  const X16Inputs in = quantize_x16(x, rows, inputs, format);
  const int64_t group_bytes = in.super.blocks * x16_chunk_bytes(format), groups = outputs / 16;
  at::parallel_for(0, groups, 1, [&](int64_t begin, int64_t end) {
    if (path == X16_AMX) {
      if (format == Q4_K) amx_groups<Q4_K, Q4_K>(packed, group_bytes, in, rows, out, outputs, begin, end, prefetch);
      else amx_groups<Q6_K, Q6_K>(packed, group_bytes, in, rows, out, outputs, begin, end, prefetch);
      return;
    }
    // (passes of up to X16_MANY rows: up to four rows a kernel whose registers hold them, else x16_many*)
    // (VNNI: two groups a pass, x16_pair; a last odd one alone)
    const auto pair = [&](int64_t p, int64_t r0, int64_t count) {
      const uint8_t* at = packed + p * group_bytes;
      if (format == Q4_K) x16_pair<Q4_K>(at, in, r0, count, out + 16 * p, outputs, prefetch, group_bytes);
      else x16_pair<Q6_K>(at, in, r0, count, out + 16 * p, outputs, prefetch, group_bytes);
    };
    int64_t g = path != X16_VNNI ? begin : each_pair(begin, end, rows, X16_MANY, pair);
    for (; g < end; ++g) {
      const uint8_t* group = packed + g * group_bytes;
      each_pass(rows, X16_MANY, [&](int64_t r0, int64_t count) {
        if (path == X16_PLAIN) {
          for (int64_t r = r0; r < r0 + count; ++r) x16_plain(group, format, in, r, out + r * outputs + 16 * g);
        } else if (path == X16_AVX2) {
          if (format == Q4_K) x16_rows_avx2<Q4_K>(group, in, r0, count, out + 16 * g, outputs, prefetch);
          else x16_rows_avx2<Q6_K>(group, in, r0, count, out + 16 * g, outputs, prefetch);
        } else if (format == Q4_K) {
          x16_rows<Q4_K>(group, in, r0, count, out + 16 * g, outputs, prefetch);
        } else {
          x16_rows<Q6_K>(group, in, r0, count, out + 16 * g, outputs, prefetch);
        }
      });
    }
  });
}

}  // namespace
