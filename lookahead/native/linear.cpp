// lookahead_native::linear: a linear layer as a torch op that follows a route given at run time, in C++.
//
// The same op as lookahead/model/fewrows.py's `lookahead::linear` (same schema, same routes, the same
// products to the bit), without Python: a TorchScript trace (lookahead/model/traced.py) that records it
// replays a forward's linear layers with no call back into the interpreter. Its kernel route calls
// lookahead's numba kernel through the C entry points lookahead/native/entry.py compiles
// (`numba.cfunc`) and hands over once by address (`set_kernels`).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

namespace {

// out [R, O] = x [R, I] @ w [O, I]^T, all C-contiguous, of the entry point's dtype.
using Kernel = void (*)(const void* w, const void* x, void* out, int64_t rows, int64_t inputs, int64_t outputs);

Kernel kernels[2] = {nullptr, nullptr};  // float32, float64: set once per process by set_kernels

constexpr int64_t TORCH_CODE = 0;  // fewrows.ROUTE_CODES
constexpr int64_t KERNEL_CODE = 1;
constexpr int64_t KERNEL_ROWS_MAX = 64;  // fewrows.KERNEL_ROWS_MAX
constexpr int64_t MM_ROWS_MAX = 7;  // fewrows.MM_ROWS_MAX

void set_kernels(int64_t float32_kernel, int64_t float64_kernel) {
  kernels[0] = reinterpret_cast<Kernel>(float32_kernel);
  kernels[1] = reinterpret_cast<Kernel>(float64_kernel);
}

Kernel kernel_for(at::ScalarType dtype) {
  if (dtype == at::kFloat) return kernels[0];
  if (dtype == at::kDouble) return kernels[1];
  return nullptr;
}

at::Tensor with_rows_of(const at::Tensor& out, const at::Tensor& x) {  // out [R, O] -> [..., O] as x [..., I]
  auto shape = x.sizes().vec();
  shape.back() = out.size(1);
  return out.view(shape);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                  const at::Tensor& route) {
  const int64_t code = route.item<int64_t>();
  const int64_t inputs = x.size(-1);
  const int64_t rows = inputs > 0 ? x.numel() / inputs : 0;
  const bool same_dtype = x.scalar_type() == weight.scalar_type() && weight.dim() == 2 && weight.size(1) == inputs;
  const bool kernel_dtype = x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble;
  if (code == KERNEL_CODE && same_dtype && kernel_dtype && weight.is_contiguous() && rows >= 1 &&
      rows <= KERNEL_ROWS_MAX) {
    const Kernel kernel = kernel_for(x.scalar_type());
    TORCH_CHECK(kernel != nullptr, "lookahead_native::linear: the kernels were not set (set_kernels)");
    const at::Tensor flat = x.reshape({rows, inputs}).contiguous();  // [R, I]
    at::Tensor out = at::empty({rows, weight.size(0)}, x.options());  // [R, O]
    kernel(weight.const_data_ptr(), flat.const_data_ptr(), out.mutable_data_ptr(), rows, inputs, weight.size(0));
    if (bias.has_value() && bias->defined()) out.add_(*bias);
    return with_rows_of(out, x);
  }
  // W @ x^T for 2..MM_ROWS_MAX rows: the "mm" route, and the kernel route's for dtypes the kernel does not take
  if (code != TORCH_CODE && same_dtype && !(code == KERNEL_CODE && kernel_dtype) && x.is_floating_point() &&
      rows >= 2 && rows <= MM_ROWS_MAX) {
    const at::Tensor flat = x.reshape({rows, inputs});  // [R, I]
    const at::Tensor out = bias.has_value() && bias->defined()
                               ? at::addmm(bias->unsqueeze(1), weight, flat.t())
                               : at::mm(weight, flat.t());  // [O, R]
    return with_rows_of(out.t().reshape({rows, weight.size(0)}), x);
  }
  return at::linear(x, weight, bias);
}

}  // namespace

TORCH_LIBRARY(lookahead_native, m) {
  m.def("set_kernels(int float32_kernel, int float64_kernel) -> ()", &set_kernels);
  m.def("linear(Tensor x, Tensor weight, Tensor? bias, Tensor route) -> Tensor");
  m.impl("linear", c10::DispatchKey::CPU, TORCH_FN(linear));
}
