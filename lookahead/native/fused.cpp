// lookahead_native::rms_norm, ::rotate_half and ::kv_write: chains of a decoder layer's small ops as one op each.
//
// A traced step (lookahead/model/traced.py) replays some 1,900 tensor ops a forward for SmolLM2-135M, and
// each costs the interpreter and torch's dispatcher a few microseconds however little it computes. Most of
// them sit in two chains every Llama-style layer runs: the RMS norm (pow, mean, add, rsqrt, mul, to, mul)
// and the rotary embedding's half rotation of the queries and keys (mul, size, floor_divide, slice, slice,
// neg, cat, mul, add). lookahead/model/fusion.py rewrites a trace's graph to call these ops in their place.
//
// Each op gives the chain's result to the bit: the mean is torch's own (at::mean, its summation order),
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
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>

namespace {

bool last_dim(int64_t dim, int64_t rank) { return dim == -1 || dim == rank - 1; }

// weight * (h * rsqrt(mean(h^exponent, dims, keepdim, mean_dtype) + eps)) cast to out_dtype before the last
// product, as transformers' LlamaRMSNorm computes it (h already in float32 there).
at::Tensor rms_norm(const at::Tensor& h, const at::Tensor& weight, double eps, const at::Scalar& exponent,
                    at::IntArrayRef dims, bool keepdim, std::optional<at::ScalarType> mean_dtype,
                    const at::Scalar& alpha, at::ScalarType out_dtype) {
  const at::Tensor variance = at::mean(at::pow(h, exponent), dims, keepdim, mean_dtype);  // torch's own sums
  const bool fast = h.scalar_type() == at::kFloat && h.dim() >= 1 && weight.scalar_type() == at::kFloat &&
                    weight.dim() == 1 && weight.size(0) == h.size(-1) && exponent.toDouble() == 2.0 &&
                    dims.size() == 1 && last_dim(dims[0], h.dim()) && keepdim && !mean_dtype.has_value() &&
                    alpha.toDouble() == 1.0 && out_dtype == at::kFloat &&
                    h.device().is_cpu() && weight.device().is_cpu() && variance.scalar_type() == at::kFloat;
  if (!fast) {  // the recorded chain, op by op
    const at::Tensor scaled = at::mul(h, at::rsqrt(at::add(variance, eps, alpha)));
    return at::mul(weight, scaled.to(out_dtype));
  }
  const int64_t d = h.size(-1);
  const int64_t rows = d > 0 ? h.numel() / d : 0;
  const at::Tensor x = h.contiguous();
  const at::Tensor v = variance.contiguous();
  const at::Tensor w = weight.contiguous();
  at::Tensor out = at::empty_like(x, at::MemoryFormat::Contiguous);
  const float* xp = x.const_data_ptr<float>();
  const float* vp = v.const_data_ptr<float>();
  const float* wp = w.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  const float e = static_cast<float>(eps);  // (torch casts a double operand to the float32 tensor's type)
  for (int64_t r = 0; r < rows; ++r) {
    const float s = 1.0f / std::sqrt(vp[r] + e);  // torch's rsqrt: one over the rounded square root
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
std::tuple<at::Tensor, at::Tensor> kv_write(const at::Tensor& keys, const at::Tensor& values, const at::Tensor& k,
                                            const at::Tensor& v, const at::Tensor& past_) {
  const int64_t past = past_.size(0), rows = k.size(2);
  keys.narrow(2, past, rows).copy_(k);
  values.narrow(2, past, rows).copy_(v);
  return {keys.narrow(2, 0, past + rows), values.narrow(2, 0, past + rows)};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(lookahead_native, m) {
  m.def("rms_norm(Tensor h, Tensor weight, float eps, Scalar exponent, int[] dims, bool keepdim, "
        "ScalarType? mean_dtype, Scalar alpha, ScalarType out_dtype) -> Tensor");
  m.def("rotate_half(Tensor q, Tensor cos, Tensor sin, int dim_a, int? start_a, int? end_a, int step_a, "
        "int dim_b, int? start_b, int? end_b, int step_b, int cat_dim, Scalar alpha) -> Tensor");
  m.def("kv_write(Tensor(a!) keys, Tensor(b!) values, Tensor k, Tensor v, Tensor past) -> (Tensor(a), Tensor(b))");
  m.impl("rms_norm", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(rms_norm));
  m.impl("kv_write", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(kv_write));
  m.impl("rotate_half", c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(rotate_half));
}
