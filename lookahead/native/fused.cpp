// lookahead_native::rms_norm, ::rotate_half and ::kv_write: chains of a decoder layer's small ops as one op each;
// ::attend: grouped-query attention over a step's few rows under its mask, in 8 lanes or (AVX-512F) 16.
//
// A traced step (lookahead/model/traced.py) replays some 1,900 tensor ops a forward for SmolLM2-135M, and
// each costs the interpreter and torch's dispatcher a few microseconds however little it computes. Most of
// them sit in two chains every Llama-style layer runs: the RMS norm (pow, mean, add, rsqrt, mul, to, mul)
// and the rotary embedding's half rotation of the queries and keys (mul, size, floor_divide, slice, slice,
// neg, cat, mul, add). lookahead/model/fusion.py rewrites a trace's graph to call these ops in their place.
//
// Each op gives the chain's result to the bit: the mean's sum is torch's own (at::sum, its summation order),
// and every other element is computed by the same IEEE operations in the same order, one rounding each
// (this file is compiled with -ffp-contract=off, so no multiply and add are fused). An op checks the
// arguments the chain was recorded with (exponent 2, the last dimension, halves, alpha 1, float32) and,
// where they are not what it computes, runs the recorded chain itself through ATen, so a rewrite that
// matched another chain still gives that chain's result.
//
// Worked example (rms_norm): h = [[3, 4]], weight = [1, 2], eps = 0 -> mean(h^2) = 12.5, rsqrt = 0.28284...,
// out = [[0.84853, 2.26274]]. (rotate_half): q = [1, 2, 3, 4], cos = 1, sin = 1 -> q + [-3, -4, 1, 2] =
// [-2, -2, 4, 6].
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

int64_t lookahead_tiled_lanes();  // linear.cpp: the lanes this process's tiled kernel runs in (8 or 16)

namespace {

bool last_dim(int64_t dim, int64_t rank) { return dim == -1 || dim == rank - 1; }

// weight * (h * rsqrt(mean(h^exponent, dims, keepdim, mean_dtype) + eps)) cast to out_dtype before the last
// product, as transformers' LlamaRMSNorm computes it (h already in float32 there).
at::Tensor rms_norm(const at::Tensor& h, const at::Tensor& weight, double eps, const at::Scalar& exponent,
                    at::IntArrayRef dims, bool keepdim, std::optional<at::ScalarType> mean_dtype,
                    const at::Scalar& alpha, at::ScalarType out_dtype) {
  const bool fast = h.scalar_type() == at::kFloat && h.dim() >= 1 && weight.scalar_type() == at::kFloat &&
                    weight.dim() == 1 && weight.size(0) == h.size(-1) && exponent.toDouble() == 2.0 &&
                    dims.size() == 1 && last_dim(dims[0], h.dim()) && keepdim && !mean_dtype.has_value() &&
                    alpha.toDouble() == 1.0 && out_dtype == at::kFloat &&
                    h.device().is_cpu() && weight.device().is_cpu();
  if (!fast) {  // the recorded chain, op by op
    const at::Tensor variance = at::mean(at::pow(h, exponent), dims, keepdim, mean_dtype);
    const at::Tensor scaled = at::mul(h, at::rsqrt(at::add(variance, eps, alpha)));
    return at::mul(weight, scaled.to(out_dtype));
  }
  const int64_t d = h.size(-1);
  const int64_t rows = d > 0 ? h.numel() / d : 0;
  const at::Tensor x = h.contiguous();
  const at::Tensor w = weight.contiguous();
  at::Tensor out = at::empty_like(x, at::MemoryFormat::Contiguous);
  const float* xp = x.const_data_ptr<float>();
  const float* wp = w.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  // The mean of the squares as torch's CPU mean takes it: its sum (at::sum, torch's summation order) over
  // the squares (pow(h, 2) is h * h there), then divided by d in float32 (mean is sum, then div_ by the
  // count); the squares are written into `out`, which the last loop overwrites. (Two dispatched ops where
  // pow and mean took four, with mean's division and its scalar: about 4 us less a norm.)
  for (int64_t i = 0; i < rows * d; ++i) op[i] = xp[i] * xp[i];
  const at::Tensor sums = at::sum(out, dims, /*keepdim=*/true).contiguous();  // [..., 1]
  const float* sp = sums.const_data_ptr<float>();
  const float count = static_cast<float>(d);
  const float e = static_cast<float>(eps);  // (torch casts a double operand to the float32 tensor's type)
  for (int64_t r = 0; r < rows; ++r) {
    const float s = 1.0f / std::sqrt(sp[r] / count + e);  // torch's rsqrt: one over the rounded square root
    const float* xr = xp + r * d;
    float* outr = op + r * d;
    for (int64_t j = 0; j < d; ++j) outr[j] = wp[j] * (xr[j] * s);
  }
  return out;
}

// q * cos + cat(-q[..., half:], q[..., :half]) * sin for q [A, H, Q, D] (any strides) and cos, sin
// [A or 1, 1, Q, D]: transformers' apply_rotary_pos_emb with rotate_half. The slices' bounds come as
// recorded (half = D // 2 both, computed by the graph).
at::Tensor rotate_half(const at::Tensor& q, const at::Tensor& cos, const at::Tensor& sin, int64_t dim_a,
                       std::optional<int64_t> start_a, std::optional<int64_t> end_a, int64_t step_a, int64_t dim_b,
                       std::optional<int64_t> start_b, std::optional<int64_t> end_b, int64_t step_b,
                       int64_t cat_dim, const at::Scalar& alpha) {
  const int64_t rank = q.dim();
  const int64_t width = rank > 0 ? q.size(-1) : 0;
  const int64_t half = width / 2;
  const bool shapes = rank == 4 && cos.dim() == 4 && sin.sizes() == cos.sizes() && cos.size(1) == 1 &&
                      (cos.size(0) == 1 || cos.size(0) == q.size(0)) && cos.size(2) == q.size(2) &&
                      cos.size(3) == width;
  const bool fast = shapes && width % 2 == 0 && q.scalar_type() == at::kFloat && cos.scalar_type() == at::kFloat &&
                    sin.scalar_type() == at::kFloat && last_dim(dim_a, rank) && last_dim(dim_b, rank) &&
                    last_dim(cat_dim, rank) && start_a.value_or(0) == 0 && end_a == half && start_b == half &&
                    end_b.value_or(width) >= width && step_a == 1 && step_b == 1 && alpha.toDouble() == 1.0 &&
                    q.device().is_cpu() && cos.device().is_cpu() && sin.device().is_cpu();
  if (!fast) {  // the recorded chain, op by op
    const at::Tensor first = at::slice(q, dim_a, start_a, end_a, step_a);
    const at::Tensor second = at::slice(q, dim_b, start_b, end_b, step_b);
    const at::Tensor rotated = at::cat({at::neg(second), first}, cat_dim);
    return at::add(at::mul(q, cos), at::mul(rotated, sin), alpha);
  }
  const int64_t batch = q.size(0), heads = q.size(1), rows = q.size(2);
  at::Tensor out = at::empty({batch, heads, rows, width}, q.options());
  const at::Tensor c = cos.expand({batch, 1, rows, width}).contiguous();  // [A, 1, Q, D]
  const at::Tensor s = sin.expand({batch, 1, rows, width}).contiguous();
  const float* qp = q.const_data_ptr<float>();
  const float* cp = c.const_data_ptr<float>();
  const float* sp = s.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  const auto stride = q.strides();
  for (int64_t a = 0; a < batch; ++a) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t t = 0; t < rows; ++t) {
        const float* qr = qp + a * stride[0] + h * stride[1] + t * stride[2];
        const float* cr = cp + (a * rows + t) * width;
        const float* sr = sp + (a * rows + t) * width;
        float* outr = op + ((a * heads + h) * rows + t) * width;
        for (int64_t j = 0; j < width; ++j) {
          const float rotated = j < half ? -qr[(j + half) * stride[3]] : qr[(j - half) * stride[3]];
          const float direct = qr[j * stride[3]] * cr[j];
          const float turned = rotated * sr[j];
          outr[j] = direct + turned;
        }
      }
    }
  }
  return out;
}

// A traced layer's cache update (lookahead/model/traced.py, TraceLayer): the step's keys and values k, v
// [A, H, Q, D] written at slots past .. past + Q - 1 of the layer's buffers [A, H, C, D], which are returned
// as the views of slots 0 .. past + Q - 1 the attention reads; past is the size of past_ [P] (a size, which a
// trace follows; an int argument would be recorded as a constant). (In Python: two narrows and copies, two
// narrows, and the tensor arithmetic of their bounds, which a trace records as a dozen nodes a layer.)
// Where all four are CPU tensors of one dtype with rows of D contiguous elements (a trace's values come
// transposed, [A, Q, H, D] in memory), each row is copied as it is (the same bytes copy_ writes, without
// its two dispatched calls and their iterators).
bool rows_copyable(const at::Tensor& buffer, const at::Tensor& step, int64_t past) {
  return buffer.dim() == 4 && step.dim() == 4 && buffer.scalar_type() == step.scalar_type() &&
         buffer.device().is_cpu() && step.device().is_cpu() && buffer.stride(3) == 1 && step.stride(3) == 1 &&
         buffer.size(0) == step.size(0) && buffer.size(1) == step.size(1) && buffer.size(3) == step.size(3) &&
         past >= 0 && past + step.size(2) <= buffer.size(2);
}

void copy_rows(const at::Tensor& buffer, const at::Tensor& step, int64_t past) {
  const int64_t size = step.element_size(), width = step.size(3) * size;
  char* to = static_cast<char*>(buffer.data_ptr());
  const char* from = static_cast<const char*>(step.const_data_ptr());
  for (int64_t a = 0; a < step.size(0); ++a) {
    for (int64_t h = 0; h < step.size(1); ++h) {
      for (int64_t q = 0; q < step.size(2); ++q) {
        std::memcpy(to + (a * buffer.stride(0) + h * buffer.stride(1) + (past + q) * buffer.stride(2)) * size,
                    from + (a * step.stride(0) + h * step.stride(1) + q * step.stride(2)) * size, width);
      }
    }
  }
}

std::tuple<at::Tensor, at::Tensor> kv_write(const at::Tensor& keys, const at::Tensor& values, const at::Tensor& k,
                                            const at::Tensor& v, const at::Tensor& past_) {
  const int64_t past = past_.size(0), rows = k.size(2);
  if (rows_copyable(keys, k, past) && rows_copyable(values, v, past)) {
    copy_rows(keys, k, past);
    copy_rows(values, v, past);
  } else {
    keys.narrow(2, past, rows).copy_(k);
    values.narrow(2, past, rows).copy_(v);
  }
  return {keys.narrow(2, 0, past + rows), values.narrow(2, 0, past + rows)};
}

// ---- attend: softmax(q k^T * scale + mask) v for a step's few query rows, grouped heads read in place ----
//
// q [B, Hq, Q, D], k and v [B, Hk, S, D] (query head h reads key/value head h / (Hq / Hk), as torch's
// enable_gqa), mask [B or 1, 1, Q, S] added to the scaled scores -> [B, Q, Hq, D] (the layout transformers
// reshapes the heads from). torch's SDPA over a few rows spends most of its time on blocking and buffers
// sized for long queries; `lookahead roofline` and tests/test_attend.py's comparisons time the two.
//
// The contract: a query row's output is a function of its own visible keys, in slot order, and nothing
// else: not the step's other rows, the batch, hidden keys between visible ones (a tree row's siblings, a
// batch's padding), the blocking or the threads. A key is hidden where its mask is -inf or the float's
// lowest value (the masks transformers and lookahead build); a hidden key takes no place in the row's
// order. So a row attending over keys [0, P] alone, or as the last node of a tree path whose siblings sit
// between its ancestors, gets the same bits.
//
// The computation, per row: its visible keys, numbered 0, 1, ... (their rank) in slot order, are cut into
// chunks of KEY_CHUNK ranks (flash-decoding's split: where a step has few blocks, a one-row step's Hk, each
// chunk is a work item of its own, so both cores read keys and values side by side). Per chunk, a score is
// the dot product in pieces of the vector width in order of the dimension (fused multiply-adds into one
// vector), then the width's fixed horizontal sum, times scale, plus the mask; the chunk's largest score is
// subtracted and exp taken lane-wise; the chunk's sum adds the key of rank r into lane r mod width, in
// rank order, then the horizontal sum; its part of an output element sums exp(score) * v over its keys in
// rank order (one fused multiply-add each). Then, in chunk order, each part and sum is scaled by exp(its
// largest - the row's largest) and added up, and the output is the parts' total over the sums' (one chunk:
// a factor of exactly 1). A row with no visible key gives 0. The query vectors of one row that read the
// same key/value head (grouped heads) are attended together, up to QB at a time, so each of the row's key
// and value rows is read from cache once for them.
//
// Worked example: one head, D = 16 (every q and k element 0), v rows [1 ... 1] and [3 ... 3], mask [0 0]:
// equal scores, weights 1/2 each -> [2 ... 2]; mask [0 -inf] -> [1 ... 1]; three keys with v rows
// [1 ...], [5 ...], [3 ...] and mask [0 -inf 0] -> [2 ... 2], the same bits as the first case.

constexpr int QB = 4;  // query vectors attended together
constexpr int64_t ATTEND_ROWS_MAX = 1 << 20;  // (a bound on the shapes it takes, not a policy): a prompt's prefill of
// any length attends here too, so a prompt's cache has the same bits however it is cut into forwards (lookahead's
// prefill, model.generate's in one) -- integer products turn any last-bit difference into another 8-bit input.
constexpr int64_t KEY_CHUNK = 256;  // keys a work item attends to: a row's keys are cut at multiples of this (128
// and 512 measured no better over 1-16 rows and 256-1024 keys)
constexpr int64_t ATTEND_PAIRS = 2048;  // query-key pairs a thread takes at least (16384 before the keys were
// split: a four-row step over 256 keys then ran on one core)
constexpr int64_t SPLIT_UNITS = 4;  // blocks of vectors per thread from which a block's chunks stay on one thread

__attribute__((target("avx2,fma"))) inline float hsum8(__m256 v) {  // ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 0x55)));
}

// exp(x) lane by lane for x <= 0 (the softmax's shifted scores; -inf gives 0): Cephes' single-precision
// polynomial after x = n ln 2 + r, scaled by 2^n through the exponent bits; 0 below EXP_LOW (2^-125). Its
// constants, which exp8 and exp16 share:
constexpr float EXP_LOW = -87.0f;
constexpr float LOG2E = 1.44269504088896341f;
constexpr float LN2_HIGH = 0.693359375f, LN2_LOW = -2.12194440e-4f;  // ln 2 in two parts: r = x - n ln 2 exactly
constexpr float EXP_POLY[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                               4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};  // Horner, highest first

__attribute__((target("avx2,fma"))) inline __m256 exp8(__m256 x) {
  const __m256 low = _mm256_set1_ps(EXP_LOW);
  const __m256 under = _mm256_cmp_ps(x, low, _CMP_LT_OQ);
  x = _mm256_max_ps(x, low);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HIGH), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LOW), r);
  __m256 p = _mm256_set1_ps(EXP_POLY[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_POLY[i]));
  __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(scale));
  return _mm256_andnot_ps(under, y);
}

// scores[n][p + j] = q_n . k_j for NQ query vectors and NK key rows (k[j]: key j's row)
template <int NQ, int NK>
__attribute__((target("avx2,fma"), always_inline)) inline void score_tile(const float* const* q,
                                                                          const float* const* k, int64_t d,
                                                                          float* const* scores, int64_t p) {
  __m256 acc[NQ][NK];
  for (int n = 0; n < NQ; ++n)
    for (int j = 0; j < NK; ++j) acc[n][j] = _mm256_setzero_ps();
  for (int64_t c = 0; c < d; c += 8) {
    __m256 kv[NK];
    for (int j = 0; j < NK; ++j) kv[j] = _mm256_loadu_ps(k[j] + c);
    for (int n = 0; n < NQ; ++n) {
      const __m256 qv = _mm256_loadu_ps(q[n] + c);
      for (int j = 0; j < NK; ++j) acc[n][j] = _mm256_fmadd_ps(qv, kv[j], acc[n][j]);
    }
  }
  for (int n = 0; n < NQ; ++n)
    for (int j = 0; j < NK; ++j) scores[n][p + j] = hsum8(acc[n][j]);
}

// s[p] = s[p] * scale + m[slots[p]] for the `keys` scores (each a product then a sum, one rounding each), -inf
// from there to `padded`; their largest. Both widths' blocks start their softmax here, a vector of 8 (or 16)
// scores at a time: the mask's values read in one load where the vector's slots are consecutive (a prompt's rows,
// a tree path's ancestors), else gathered. Lane by lane the same operations as one score at a time, and the
// largest is the same whatever the lanes (a NaN score never becomes the largest: max keeps the other operand).
__attribute__((target("avx2,fma"))) inline float masked_scores8(float* s, const float* m, const int32_t* slots,
                                                                int64_t keys, int64_t padded, float scale) {
  const float none = -std::numeric_limits<float>::infinity();
  const __m256 factor = _mm256_set1_ps(scale);
  __m256 tops = _mm256_set1_ps(none);
  int64_t p = 0;
  for (; p + 8 <= keys; p += 8) {
    const __m256 values = slots[p + 7] - slots[p] == 7
        ? _mm256_loadu_ps(m + slots[p])
        : _mm256_i32gather_ps(m, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(slots + p)), 4);
    const __m256 x = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(s + p), factor), values);
    _mm256_storeu_ps(s + p, x);
    tops = _mm256_max_ps(x, tops);
  }
  __m128 four = _mm_max_ps(_mm256_castps256_ps128(tops), _mm256_extractf128_ps(tops, 1));
  four = _mm_max_ps(four, _mm_movehl_ps(four, four));
  float top = _mm_cvtss_f32(_mm_max_ss(four, _mm_shuffle_ps(four, four, 0x55)));
  for (; p < keys; ++p) {
    const float x = s[p] * scale + m[slots[p]];
    s[p] = x;
    top = x > top ? x : top;
  }
  for (; p < padded; ++p) s[p] = none;
  return top;
}

__attribute__((target("avx512f"))) inline float masked_scores16(float* s, const float* m, const int32_t* slots,
                                                                int64_t keys, int64_t padded, float scale) {
  const __m512 none = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 factor = _mm512_set1_ps(scale);
  __m512 tops = none;
  for (int64_t p = 0; p < padded; p += 16) {
    const int64_t left = keys - p;  // (<= 0 past the keys: an all-padding vector)
    const __mmask16 live = left >= 16 ? __mmask16(0xFFFF) : left > 0 ? __mmask16((1u << left) - 1) : __mmask16(0);
    __m512 values = none;
    if (left > 0) {
      const int64_t last = std::min<int64_t>(left, 16) - 1;
      values = slots[p + last] - slots[p] == last
          ? _mm512_maskz_loadu_ps(live, m + slots[p])
          : _mm512_mask_i32gather_ps(none, live, _mm512_maskz_loadu_epi32(live, slots + p), m, 4);
    }
    const __m512 x = _mm512_mask_blend_ps(
        live, none, _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(live, s + p), factor), values));
    _mm512_storeu_ps(s + p, x);
    tops = _mm512_max_ps(x, tops);
  }
  return _mm512_reduce_max_ps(tops);
}

// NQ query vectors of one row against `keys` (>= 1) of its visible key and value rows of one key/value head,
// slots[p] the slot of the p-th (row strides ks, vs; k, v and mask at slot 0): each vector's largest masked
// score over them, the sum of exp(score - largest) and out[n] [d] = sum of exp(score - largest) * v,
// unnormalized (the parts `combine` adds up); a vector whose every score there is -inf gets largest -inf,
// sum 0 and zeros. scores[n]: room for `keys` rounded up to 8.
template <int NQ>
__attribute__((target("avx2,fma"))) void attend_block(const float* const* q, const float* k, int64_t ks,
                                                      const float* v, int64_t vs, const float* mask,
                                                      const int32_t* slots, int64_t keys, int64_t d, float scale,
                                                      float* const* scores, float* const* out, float* largest,
                                                      float* sums) {
  int64_t p = 0;
  for (; p + 3 <= keys; p += 3) {
    const float* rows[3] = {k + slots[p] * ks, k + slots[p + 1] * ks, k + slots[p + 2] * ks};
    score_tile<NQ, 3>(q, rows, d, scores, p);
  }
  for (; p < keys; ++p) {
    const float* rows[1] = {k + slots[p] * ks};
    score_tile<NQ, 1>(q, rows, d, scores, p);
  }
  const int64_t padded = (keys + 7) & ~int64_t{7};
  bool empty[NQ];
  for (int n = 0; n < NQ; ++n) {
    float* s = scores[n];
    const float top = masked_scores8(s, mask, slots, keys, padded, scale);
    empty[n] = top == -std::numeric_limits<float>::infinity();
    largest[n] = top;
    const __m256 shift = _mm256_set1_ps(empty[n] ? 0.0f : top);
    __m256 total = _mm256_setzero_ps();
    for (p = 0; p < padded; p += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + p), shift));
      _mm256_storeu_ps(s + p, e);
      total = _mm256_add_ps(total, e);
    }
    sums[n] = hsum8(total);
  }
  for (int64_t c = 0; c < d; c += 16) {  // two vectors of every output at a time, over all the keys
    __m256 acc[NQ][2];
    for (int n = 0; n < NQ; ++n) acc[n][0] = acc[n][1] = _mm256_setzero_ps();
    for (p = 0; p < keys; ++p) {
      const float* vp = v + slots[p] * vs + c;
      const __m256 v0 = _mm256_loadu_ps(vp), v1 = _mm256_loadu_ps(vp + 8);
      for (int n = 0; n < NQ; ++n) {
        const __m256 e = _mm256_broadcast_ss(scores[n] + p);
        acc[n][0] = _mm256_fmadd_ps(e, v0, acc[n][0]);
        acc[n][1] = _mm256_fmadd_ps(e, v1, acc[n][1]);
      }
    }
    for (int n = 0; n < NQ; ++n) {
      const __m256 zero = _mm256_setzero_ps();
      _mm256_storeu_ps(out[n] + c, empty[n] ? zero : acc[n][0]);
      _mm256_storeu_ps(out[n] + c + 8, empty[n] ? zero : acc[n][1]);
    }
  }
}

// ---- the same in 16 lanes (AVX-512F), where the process's tiled kernel runs in 16 (linear.cpp tiled_lanes:
// the width measured faster for the linears on this machine, so a CPU whose wide vectors cost more than they
// give keeps 8 here too): scores in pieces of 16 of the dimension, the sums of four query vectors by four keys
// reduced together (fold_halves, fold_pairs); exp16; the softmax sum in lane r mod 16; an output's part over up
// to 64 elements at a time, every key and value row read once for it (in 8 lanes, four passes of 16). Its
// numbers differ from the 8 lanes' in the last bits; a process runs one width, and every row's numbers are as
// independent of the rest of the step as in 8.

__attribute__((target("avx512f"))) inline float hsum16(__m512 v) {  // hsum8(v0..7 + v8..15)
  const __m256 low = _mm512_castps512_ps256(v);
  const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return hsum8(_mm256_add_ps(low, high));
}

// exp8's polynomial in 16 lanes.
__attribute__((target("avx512f"))) inline __m512 exp16(__m512 x) {
  const __m512 low = _mm512_set1_ps(EXP_LOW);
  const __mmask16 kept = _mm512_cmp_ps_mask(x, low, _CMP_GE_OQ);
  x = _mm512_max_ps(x, low);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HIGH), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LOW), r);
  __m512 p = _mm512_set1_ps(EXP_POLY[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_POLY[i]));
  __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  const __m512i scale = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  y = _mm512_mul_ps(y, _mm512_castsi512_ps(scale));
  return _mm512_maskz_mov_ps(kept, y);
}

// The lane sums of 16 vectors a at once, each in one order, ((b0 + b1) + (b2 + b3)) + ((b4 + b5) + (b6 + b7)) of
// b_i = a[i] + a[i + 8], whichever vectors it is reduced with: a level of the tree adds the pairs of partial sums
// of two vectors side by side, so the 16 sums take 15 vector additions (two shuffles each), a quarter of what
// reducing each vector alone takes.
// [a_i + a_i+8 | b_i + b_i+8]
__attribute__((target("avx512f"))) inline __m512 fold_halves(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                       _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}
// per 128 bits [a0 + a1, a2 + a3, b0 + b1, b2 + b3]
__attribute__((target("avx512f"))) inline __m512 fold_pairs(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));
}

// scores[n][p + j] = q_n . k_j for NQ query vectors and the `valid` (1-4) key rows k[j]; the rows past `valid`
// count as zeros and are not written, so a key's score is the same bits in a full group of four or in a
// chunk's last, shorter one. The 16 dot products' vectors [n][j] (zeros past NQ) reduce as one tree (above):
// lanes 4 n + j of the last level hold q_n . k_j.
template <int NQ>
__attribute__((target("avx512f"), always_inline)) inline void score_tile16(const float* const* q,
                                                                           const float* const* k, int64_t d,
                                                                           float* const* scores, int64_t p,
                                                                           int valid) {
  __m512 acc[4][4];
  for (int n = 0; n < 4; ++n)
    for (int j = 0; j < 4; ++j) acc[n][j] = _mm512_setzero_ps();
  for (int64_t c = 0; c < d; c += 16) {
    __m512 kv[4];
    for (int j = 0; j < 4; ++j) kv[j] = j < valid ? _mm512_loadu_ps(k[j] + c) : _mm512_setzero_ps();
    for (int n = 0; n < NQ; ++n) {
      const __m512 qv = _mm512_loadu_ps(q[n] + c);
      for (int j = 0; j < 4; ++j) acc[n][j] = _mm512_fmadd_ps(qv, kv[j], acc[n][j]);
    }
  }
  // half[h][j]: lanes 0-7 vector (2h, j)'s b, 8-15 (2h + 1, j)'s; eighth[h]: lanes 0-3 (2h, j)'s sums of the
  // first four b and 4-7 of the last four, 8-15 the same of 2h + 1
  __m512 half[2][4], quarter[2][2], eighth[2];
  for (int h = 0; h < 2; ++h) {
    for (int j = 0; j < 4; ++j) half[h][j] = fold_halves(acc[2 * h][j], acc[2 * h + 1][j]);
    for (int i = 0; i < 2; ++i) quarter[h][i] = fold_pairs(half[h][2 * i], half[h][2 * i + 1]);
    eighth[h] = fold_pairs(quarter[h][0], quarter[h][1]);
  }
  const __m512 sums = _mm512_add_ps(_mm512_shuffle_f32x4(eighth[0], eighth[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_f32x4(eighth[0], eighth[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m128 four[4] = {_mm512_castps512_ps128(sums), _mm512_extractf32x4_ps(sums, 1),
                          _mm512_extractf32x4_ps(sums, 2), _mm512_extractf32x4_ps(sums, 3)};
  for (int n = 0; n < NQ; ++n) {
    if (valid == 4) {
      _mm_storeu_ps(scores[n] + p, four[n]);
    } else {
      alignas(16) float out[4];
      _mm_store_ps(out, four[n]);
      for (int j = 0; j < valid; ++j) scores[n][p + j] = out[j];
    }
  }
}

// out[n][c .. c + 16 W) = sum over the keys p of e[n][p] * v[slots[p]][c ..] (W vectors of 16 per output at
// a time)
template <int NQ, int W>
__attribute__((target("avx512f"))) inline void weigh16(const float* v, int64_t vs, const int32_t* slots,
                                                       int64_t keys, int64_t c, const float* const* e,
                                                       float* const* out) {
  __m512 acc[NQ][W];
  for (int n = 0; n < NQ; ++n)
    for (int w = 0; w < W; ++w) acc[n][w] = _mm512_setzero_ps();
  for (int64_t p = 0; p < keys; ++p) {
    __m512 vv[W];
    for (int w = 0; w < W; ++w) vv[w] = _mm512_loadu_ps(v + slots[p] * vs + c + 16 * w);
    for (int n = 0; n < NQ; ++n) {
      const __m512 en = _mm512_set1_ps(e[n][p]);
      for (int w = 0; w < W; ++w) acc[n][w] = _mm512_fmadd_ps(en, vv[w], acc[n][w]);
    }
  }
  for (int n = 0; n < NQ; ++n)
    for (int w = 0; w < W; ++w) _mm512_storeu_ps(out[n] + c + 16 * w, acc[n][w]);
}

// attend_block in 16 lanes; scores[n]: room for `keys` rounded up to 16.
template <int NQ>
__attribute__((target("avx512f"))) void attend_block16(const float* const* q, const float* k, int64_t ks,
                                                       const float* v, int64_t vs, const float* mask,
                                                       const int32_t* slots, int64_t keys, int64_t d, float scale,
                                                       float* const* scores, float* const* out, float* largest,
                                                       float* sums) {
  int64_t p = 0;
  for (; p < keys; p += 4) {
    const int valid = static_cast<int>(std::min<int64_t>(4, keys - p));
    const float* rows[4];
    for (int j = 0; j < 4; ++j) rows[j] = k + slots[p + std::min(j, valid - 1)] * ks;
    score_tile16<NQ>(q, rows, d, scores, p, valid);
  }
  const int64_t padded = (keys + 15) & ~int64_t{15};
  bool empty[NQ];
  for (int n = 0; n < NQ; ++n) {
    float* s = scores[n];
    const float top = masked_scores16(s, mask, slots, keys, padded, scale);
    empty[n] = top == -std::numeric_limits<float>::infinity();
    largest[n] = top;
    const __m512 shift = _mm512_set1_ps(empty[n] ? 0.0f : top);
    __m512 total = _mm512_setzero_ps();
    for (p = 0; p < padded; p += 16) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + p), shift));
      _mm512_storeu_ps(s + p, e);
      total = _mm512_add_ps(total, e);
    }
    sums[n] = hsum16(total);
  }
  for (int64_t c = 0; c < d; c += 64) {
    switch (std::min<int64_t>(4, (d - c) / 16)) {
      case 4: weigh16<NQ, 4>(v, vs, slots, keys, c, scores, out); break;
      case 3: weigh16<NQ, 3>(v, vs, slots, keys, c, scores, out); break;
      case 2: weigh16<NQ, 2>(v, vs, slots, keys, c, scores, out); break;
      default: weigh16<NQ, 1>(v, vs, slots, keys, c, scores, out); break;
    }
  }
  for (int n = 0; n < NQ; ++n)
    if (empty[n]) std::fill(out[n], out[n] + d, 0.0f);
}

// out [d] = (sum over chunks of part * f) / (sum over chunks of sum * f), f = exp(largest - top), in chunk
// order (index(chunk): where a chunk's part, largest and sum sit); zeros where top is -inf (no key seen).
template <typename Index>
__attribute__((target("avx2,fma"))) void combine(const float* parts, const float* largest, const float* sums,
                                                 const Index& index, int64_t chunks, float top, int64_t d,
                                                 float* out) {
  const float none = -std::numeric_limits<float>::infinity();
  if (top == none) {
    std::fill(out, out + d, 0.0f);
    return;
  }
  float total = 0.0f;
  for (int64_t c = 0; c < d; c += 8) _mm256_storeu_ps(out + c, _mm256_setzero_ps());
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t at = index(chunk);
    if (largest[at] == none) continue;
    const float f = std::exp(largest[at] - top);
    const __m256 fv = _mm256_set1_ps(f);
    const float* part = parts + at * d;
    for (int64_t c = 0; c < d; c += 8)
      _mm256_storeu_ps(out + c, _mm256_add_ps(_mm256_loadu_ps(out + c), _mm256_mul_ps(_mm256_loadu_ps(part + c), fv)));
    total += sums[at] * f;
  }
  const __m256 l = _mm256_set1_ps(total);
  for (int64_t c = 0; c < d; c += 8) _mm256_storeu_ps(out + c, _mm256_div_ps(_mm256_loadu_ps(out + c), l));
}

bool avx2_fma() {
  static const bool available = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return available;
}

bool attend_takes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask) {
  if (!avx2_fma() || q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || mask.dim() != 4) return false;
  for (const at::Tensor* t : {&q, &k, &v, &mask}) {
    if (t->scalar_type() != at::kFloat || !t->device().is_cpu() || t->stride(3) != 1) return false;
  }
  const int64_t batch = q.size(0), heads = q.size(1), rows = q.size(2), width = q.size(3);
  const int64_t kv_heads = k.size(1), keys = k.size(2);
  return rows >= 1 && rows <= ATTEND_ROWS_MAX && width % 16 == 0 && width > 0 && kv_heads > 0 &&
         heads % kv_heads == 0 && k.size(0) == batch && v.size(0) == batch && v.size(1) == kv_heads &&
         v.size(2) == keys && k.size(3) == width && v.size(3) == width && keys >= 1 &&
         (mask.size(0) == 1 || mask.size(0) == batch) && mask.size(1) == 1 && mask.size(2) == rows &&
         mask.size(3) == keys;
}

// The visible keys of every (mask batch, row): slots [mask rows, S] holds each row's visible slots in order
// (rank r at slots[row * S + r]), counts [mask rows] how many. Hidden: a mask value of -inf or the lowest float.
void visible_keys(const float* mask, int64_t mask_rows, int64_t rows, int64_t batch_stride, int64_t row_stride,
                  int64_t keys, int32_t* slots, int64_t* counts) {
  const float lowest = std::numeric_limits<float>::lowest();
  for (int64_t r = 0; r < mask_rows; ++r) {
    const float* m = mask + (r / rows) * batch_stride + (r % rows) * row_stride;
    int32_t* out = slots + r * keys;
    int64_t count = 0;
    for (int64_t p = 0; p < keys; ++p) {
      out[count] = static_cast<int32_t>(p);
      count += m[p] > lowest;  // -inf and the lowest float are hidden; NaN counts as visible (and spreads)
    }
    counts[r] = count;
  }
}

at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                  double scale, int64_t lanes) {
  if (!attend_takes(q, k, v, mask)) {  // torch's SDPA, in the same layout
    return at::scaled_dot_product_attention(q, k, v, mask, 0.0, false, scale, true).transpose(1, 2).contiguous();
  }
  if (lanes == 0) lanes = lookahead_tiled_lanes();
  TORCH_CHECK(lanes == 8 || (lanes == 16 && __builtin_cpu_supports("avx512f")), "lookahead_native::attend: this CPU "
              "does not attend in ", lanes, " lanes (8, or 16 with AVX-512F); pass lanes=0 for the process's");
  const int64_t batch = q.size(0), heads = q.size(1), rows = q.size(2), width = q.size(3);
  const int64_t kv_heads = k.size(1), keys = k.size(2);
  const int64_t group = heads / kv_heads;
  at::Tensor out = at::empty({batch, rows, heads, width}, q.options());
  const float* qp = q.const_data_ptr<float>();
  const float* kp = k.const_data_ptr<float>();
  const float* vp = v.const_data_ptr<float>();
  const float* mp = mask.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  const int64_t mask_batch = mask.size(0) == 1 ? 0 : mask.stride(0);
  const int64_t mask_rows = mask.size(0) * rows;
  std::unique_ptr<int32_t[]> slots(new int32_t[mask_rows * keys]);
  std::unique_ptr<int64_t[]> counts(new int64_t[mask_rows]);
  visible_keys(mp, mask_rows, rows, mask.stride(0), mask.stride(2), keys, slots.get(), counts.get());
  const float factor = static_cast<float>(scale);
  const int64_t per_row = (group + QB - 1) / QB;  // blocks of one row's query vectors per key/value head
  const int64_t blocks = rows * per_row;  // vector m of a key/value head: row m / group, head m % group of it
  const int64_t chunks = (keys + KEY_CHUNK - 1) / KEY_CHUNK;  // the most a row has
  const int64_t units = batch * kv_heads * blocks;  // (sequence, key/value head, block of up to QB vectors)
  const int64_t ks = k.stride(2), vs = v.stride(2);
  // One block's vectors against one chunk of their row's visible keys: parts at part + n * width, largest and
  // sums at top[n], sum[n] (largest -inf where the row has no keys in that chunk).
  const auto attend_chunk = [&](int64_t b, int64_t head, int64_t block, int64_t chunk, float* part, float* top,
                                float* sum, float* buffer) {
    const int64_t t = block / per_row, first = (block % per_row) * QB;
    const int count = static_cast<int>(std::min<int64_t>(QB, group - first));
    const int64_t mask_row = (mask.size(0) == 1 ? 0 : b * rows) + t;
    const int64_t c0 = chunk * KEY_CHUNK, c1 = std::min(counts[mask_row], c0 + KEY_CHUNK);
    if (c1 <= c0) {
      for (int n = 0; n < count; ++n) top[n] = -std::numeric_limits<float>::infinity(), sum[n] = 0.0f;
      return;
    }
    const float* qrow[QB];
    float* srow[QB];
    float* prow[QB];
    for (int n = 0; n < count; ++n) {
      const int64_t h = head * group + first + n;
      qrow[n] = qp + b * q.stride(0) + h * q.stride(1) + t * q.stride(2);
      srow[n] = buffer + n * (KEY_CHUNK + 16);
      prow[n] = part + n * width;
    }
    const float* mrow = mp + b * mask_batch + t * mask.stride(2);
    const int32_t* srank = slots.get() + mask_row * keys + c0;
    const float* kb = kp + b * k.stride(0) + head * k.stride(1);
    const float* vb = vp + b * v.stride(0) + head * v.stride(1);
    const auto run = [&](auto nq) {  // nq: the block's vector count as a type (std::integral_constant)
      constexpr int NQ = decltype(nq)::value;
      if (lanes == 16) {
        attend_block16<NQ>(qrow, kb, ks, vb, vs, mrow, srank, c1 - c0, width, factor, srow, prow, top, sum);
      } else {
        attend_block<NQ>(qrow, kb, ks, vb, vs, mrow, srank, c1 - c0, width, factor, srow, prow, top, sum);
      }
    };
    switch (count) {
      case 4: run(std::integral_constant<int, 4>{}); break;
      case 3: run(std::integral_constant<int, 3>{}); break;
      case 2: run(std::integral_constant<int, 2>{}); break;
      default: run(std::integral_constant<int, 1>{}); break;
    }
  };
  // Vector m of key/value head `pair`'s block: its chunks' parts combined in order (`combine`) into the output.
  const float none = -std::numeric_limits<float>::infinity();
  const auto finish = [&](int64_t pair, int64_t m, const float* parts, const float* largest, const float* sums,
                          const auto& at) {
    const int64_t head = pair % kv_heads, b = pair / kv_heads, t = m / group, h = head * group + m % group;
    float top = none;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) top = std::max(top, largest[at(chunk)]);
    combine(parts, largest, sums, at, chunks, top, width, op + ((b * rows + t) * heads + h) * width);
  };
  // The vectors of a block: m from block_first(block) (a row's heads), block_count(block) of them.
  const auto block_first = [&](int64_t block) { return (block / per_row) * group + (block % per_row) * QB; };
  const auto block_count = [&](int64_t block) { return std::min<int64_t>(QB, group - (block % per_row) * QB); };
  // A thread takes at least about ATTEND_PAIRS query-key pairs: fewer are done before a second thread would start.
  if (units >= SPLIT_UNITS * at::get_num_threads()) {
    // Units enough to share: a unit's chunks one after the other on one thread, combined there (no parts kept
    // for the whole call). The same chunks and the same combine as below: the same numbers.
    const int64_t grain = std::max<int64_t>(1, ATTEND_PAIRS / (QB * keys));
    at::parallel_for(0, units, grain, [&](int64_t begin, int64_t end) {
      std::vector<float> buffer(QB * (KEY_CHUNK + 16)), parts(chunks * QB * width), largest(chunks * QB),
          sums(chunks * QB);
      for (int64_t unit = begin; unit < end; ++unit) {
        const int64_t block = unit % blocks, pair = unit / blocks;
        for (int64_t chunk = 0; chunk < chunks; ++chunk) {
          attend_chunk(pair / kv_heads, pair % kv_heads, block, chunk, parts.data() + chunk * QB * width,
                       largest.data() + chunk * QB, sums.data() + chunk * QB, buffer.data());
        }
        const int64_t first = block_first(block);
        for (int64_t n = 0; n < block_count(block); ++n) {
          finish(pair, first + n, parts.data(), largest.data(), sums.data(),
                 [&](int64_t chunk) { return chunk * QB + n; });
        }
      }
    });
    return out;
  }
  // Few units (a one-row step has Hk): every chunk a work item of its own, so that both cores share them and
  // read the keys and values from memory side by side; their parts combined after, on this thread (a few
  // microseconds, less than waking a second one costs).
  std::unique_ptr<float[]> parts(new float[units * chunks * QB * width]), largest(new float[units * chunks * QB]),
      sums(new float[units * chunks * QB]);  // (every entry a vector reads is written first)
  const int64_t grain = std::max<int64_t>(1, ATTEND_PAIRS / (QB * std::min(keys, KEY_CHUNK)));
  at::parallel_for(0, units * chunks, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(QB * (KEY_CHUNK + 16));
    for (int64_t item = begin; item < end; ++item) {  // item = ((b, head) chunk) block: a chunk's blocks in a row,
      // so a thread reads the chunk's keys and values from memory once and the next blocks find them in cache
      const int64_t block = item % blocks, chunk = (item / blocks) % chunks, pair = item / (blocks * chunks);
      attend_chunk(pair / kv_heads, pair % kv_heads, block, chunk, parts.get() + item * QB * width,
                   largest.get() + item * QB, sums.get() + item * QB, buffer.data());
    }
  });
  for (int64_t pair = 0; pair < batch * kv_heads; ++pair) {
    for (int64_t block = 0; block < blocks; ++block) {
      const int64_t first = block_first(block);
      for (int64_t n = 0; n < block_count(block); ++n) {
        finish(pair, first + n, parts.get(), largest.get(), sums.get(),
               [&](int64_t chunk) { return ((pair * chunks + chunk) * blocks + block) * QB + n; });
      }
    }
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lookahead_native, m) {
  m.def("rms_norm(Tensor h, Tensor weight, float eps, Scalar exponent, int[] dims, bool keepdim, "
        "ScalarType? mean_dtype, Scalar alpha, ScalarType out_dtype) -> Tensor");
  m.def("rotate_half(Tensor q, Tensor cos, Tensor sin, int dim_a, int? start_a, int? end_a, int step_a, "
        "int dim_b, int? start_b, int? end_b, int step_b, int cat_dim, Scalar alpha) -> Tensor");
  m.def("kv_write(Tensor(a!) keys, Tensor(b!) values, Tensor k, Tensor v, Tensor past) -> (Tensor(a), Tensor(b))");
  m.def("attend(Tensor q, Tensor k, Tensor v, Tensor mask, float scale, int lanes=0) -> Tensor");
  m.impl("rms_norm", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(rms_norm));
  m.impl("attend", c10::DispatchKey::CPU, TORCH_FN(attend));
  m.impl("kv_write", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(kv_write));
  m.impl("rotate_half", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(rotate_half));
}
