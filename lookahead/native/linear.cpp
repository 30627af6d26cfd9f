// lookahead_native::linear: a linear layer as a torch op that follows a route given at run time, in C++.
//
// The same op as lookahead/model/fewrows.py's `lookahead::linear` (same schema, same routes, the same
// products to the bit), without Python: a TorchScript trace (lookahead/model/traced.py) that records it
// replays a forward's linear layers with no call back into the interpreter. Its kernel route calls
// lookahead's numba kernel through the C entry points lookahead/native/entry.py compiles
// (`numba.cfunc`) and hands over once by address (`set_kernels`); its tiled route runs the tiled kernel
// below, which the eager forward calls as `lookahead_native::tiled` (lookahead/model/fewrows.py).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

namespace {

// ---- The tiled kernel: out [R, O] = x [R, I] @ w [O, I]^T in float32, 8 lanes (AVX2, FMA) or 16 (AVX-512F) ----
//
// Every product out[r, o] is summed the same way, whatever the row count and wherever (r, o) falls in
// a tile: L lanes (L = 8 or 16, the width this process runs: tiled_lanes), lane j summing w[o, i] x[r, i]
// over i = j mod L in order of i (fused multiply-adds), the lanes then added as hsum does (16 lanes: the
// upper eight onto the lower eight first), then the I mod L tail in order. So a row's products do not
// depend on the step's other rows, and the tile shape can follow the row count. A tile of OT weight rows
// by RT input rows keeps OT * RT sums in registers, so a weight vector loaded once serves RT input rows;
// the tile's weight rows are read from memory once (for more than RT input rows, again from cache), and
// the next tile's are prefetched into L2 meanwhile, spread over all of the tile's passes: prefetched in its
// first pass alone, the next tile's lines would all be asked for while the memory then idled through the
// passes that read from cache (slower over rows that take several passes: `lookahead roofline --rows 8
// --rows 16 --rows 24` times the tiled route there). The tiles of weight rows are split between torch's threads (at::parallel_for).
//
// Worked example: w = [[1 2] [0 1] [1 0]], x = [[1 1] [2 0]] -> [[3 1 1] [2 0 2]] (I = 2: all tail).

// Rows of x a product takes at once: a prompt's hundreds of rows in blocks, each block's rows (0.3-0.8 MB
// at 576-1536 inputs) read again from L2 for every tile of weight rows, the weights streamed once a block.
constexpr int64_t BLOCK_ROWS = 128;
constexpr int TILE_ROWS = 4;  // RT, for four input rows or more (8 lanes), seven or more (16 lanes)

__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {  // ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 0x55)));
}

__attribute__((target("avx512f"))) inline float hsum16(__m512 v) {  // hsum(v0..7 + v8..15)
  const __m256 low = _mm512_castps512_ps256(v);
  const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  const __m256 eight = _mm256_add_ps(low, high);
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_shuffle_ps(two, two, 0x55)));
}

// A pass's prefetch of the next tile: line `pass` of every `passes` lines of each of its OT weight rows
// (into L1 where the tile has one pass, which `lookahead roofline --rows 2 --rows 3` measured faster;
// else into L2).
template <int OT>
inline void prefetch_next(const float* const* wrow, int64_t ahead, int64_t start, int64_t pass, int64_t passes) {
  for (int o = 0; o < OT; ++o) {
    const char* line = reinterpret_cast<const char*>(wrow[o] + ahead + start + 16 * pass);
    if (passes == 1) {
      _mm_prefetch(line, _MM_HINT_T0);
    } else {
      _mm_prefetch(line, _MM_HINT_T1);
    }
  }
}

// out[r0 .. r0 + RT, o0 .. o0 + OT], the tile's pass `pass` of `passes` over its weight rows; the weight
// rows `ahead` floats on (the next tile's; 0: none) are prefetched, a 64-byte line per `passes` lines
// read, so that every pass, not the first alone, streams a share of the next tile from memory.
// Tile8 and Tile16 are the same loop in 8 and 16 lanes.
template <int OT, int RT>
struct Tile8 {
  __attribute__((target("avx2,fma"))) static void run(const float* w, const float* x, float* out, int64_t inputs,
                                                      int64_t outputs, int64_t o0, int64_t r0, int64_t ahead,
                                                      int64_t pass, int64_t passes) {
    __m256 acc[OT][RT];
    const float* wrow[OT];
    const float* xrow[RT];
    for (int o = 0; o < OT; ++o) {
      wrow[o] = w + (o0 + o) * inputs;
      for (int r = 0; r < RT; ++r) acc[o][r] = _mm256_setzero_ps();
    }
    for (int r = 0; r < RT; ++r) xrow[r] = x + (r0 + r) * inputs;
    const int64_t vectors = inputs & ~int64_t{7};
    const int64_t chunk = 16 * passes;  // floats: `passes` lines of each weight row
    for (int64_t start = 0; start < vectors; start += chunk) {
      if (ahead != 0) prefetch_next<OT>(wrow, ahead, start, pass, passes);
      const int64_t stop = start + chunk < vectors ? start + chunk : vectors;
      for (int64_t i = start; i < stop; i += 8) {
        __m256 wv[OT];
        for (int o = 0; o < OT; ++o) wv[o] = _mm256_loadu_ps(wrow[o] + i);
        for (int r = 0; r < RT; ++r) {
          const __m256 xv = _mm256_loadu_ps(xrow[r] + i);
          for (int o = 0; o < OT; ++o) acc[o][r] = _mm256_fmadd_ps(wv[o], xv, acc[o][r]);
        }
      }
    }
    for (int o = 0; o < OT; ++o) {
      for (int r = 0; r < RT; ++r) {
        float sum = hsum(acc[o][r]);
        for (int64_t i = vectors; i < inputs; ++i) sum = std::fma(wrow[o][i], xrow[r][i], sum);
        out[(r0 + r) * outputs + o0 + o] = sum;
      }
    }
  }
};

// In 16 lanes each input vector is loaded once and held in a register for the tile's OT products (an empty
// asm makes it a register value): left to itself the compiler folds the load into every fused
// multiply-add, so two weight rows read each input vector twice and the loads, not the arithmetic, bound
// the loop; held, each input vector is loaded once a tile (`lookahead roofline --rows 8` times the 16-lane
// tiled route; results/RESULTS.md keeps what it measured). The same hold in 8 lanes measured level, so
// Tile8 is left as it was.
template <int OT, int RT>
struct Tile16 {
  __attribute__((target("avx512f"))) static void run(const float* w, const float* x, float* out, int64_t inputs,
                                                    int64_t outputs, int64_t o0, int64_t r0, int64_t ahead,
                                                    int64_t pass, int64_t passes) {
    __m512 acc[OT][RT];
    const float* wrow[OT];
    const float* xrow[RT];
    for (int o = 0; o < OT; ++o) {
      wrow[o] = w + (o0 + o) * inputs;
      for (int r = 0; r < RT; ++r) acc[o][r] = _mm512_setzero_ps();
    }
    for (int r = 0; r < RT; ++r) xrow[r] = x + (r0 + r) * inputs;
    const int64_t vectors = inputs & ~int64_t{15};
    const int64_t chunk = 16 * passes;  // floats: `passes` lines of each weight row
    for (int64_t start = 0; start < vectors; start += chunk) {
      if (ahead != 0) prefetch_next<OT>(wrow, ahead, start, pass, passes);
      const int64_t stop = start + chunk < vectors ? start + chunk : vectors;
      for (int64_t i = start; i < stop; i += 16) {
        __m512 wv[OT];
        for (int o = 0; o < OT; ++o) wv[o] = _mm512_loadu_ps(wrow[o] + i);
        for (int r = 0; r < RT; ++r) {
          __m512 xv = _mm512_loadu_ps(xrow[r] + i);
          asm("" : "+v"(xv));  // (held in a register for the OT products: see above)
          for (int o = 0; o < OT; ++o) acc[o][r] = _mm512_fmadd_ps(wv[o], xv, acc[o][r]);
        }
      }
    }
    for (int o = 0; o < OT; ++o) {
      for (int r = 0; r < RT; ++r) {
        float sum = hsum16(acc[o][r]);
        for (int64_t i = vectors; i < inputs; ++i) sum = std::fma(wrow[o][i], xrow[r][i], sum);
        out[(r0 + r) * outputs + o0 + o] = sum;
      }
    }
  }
};

// Every input row against weight rows o0 .. o0 + OT: up to TR rows in one pass (Tile<OT, rows>), more in
// passes of TR (the weight rows streamed from memory in the first, from cache after), all of them
// prefetching the rows `ahead` floats on.
template <template <int, int> class Tile, int OT, int TR>
void tile_column(const float* w, const float* x, float* out, int64_t rows, int64_t inputs, int64_t outputs,
                 int64_t o0, int64_t ahead) {
  const int64_t passes = (rows + TR - 1) / TR;
  int64_t r0 = 0, pass = 0;
  for (; r0 + TR <= rows; r0 += TR, ++pass) Tile<OT, TR>::run(w, x, out, inputs, outputs, o0, r0, ahead, pass, passes);
  switch (rows - r0) {  // (cases at or past TR are never reached: no instance of them is made)
    case 8: if constexpr (TR > 8) Tile<OT, 8>::run(w, x, out, inputs, outputs, o0, r0, ahead, pass, passes); break;
    case 7: if constexpr (TR > 7) Tile<OT, 7>::run(w, x, out, inputs, outputs, o0, r0, ahead, pass, passes); break;
    case 6: if constexpr (TR > 6) Tile<OT, 6>::run(w, x, out, inputs, outputs, o0, r0, ahead, pass, passes); break;
    case 5: if constexpr (TR > 5) Tile<OT, 5>::run(w, x, out, inputs, outputs, o0, r0, ahead, pass, passes); break;
    case 4: if constexpr (TR > 4) Tile<OT, 4>::run(w, x, out, inputs, outputs, o0, r0, ahead, pass, passes); break;
    case 3: Tile<OT, 3>::run(w, x, out, inputs, outputs, o0, r0, ahead, pass, passes); break;
    case 2: Tile<OT, 2>::run(w, x, out, inputs, outputs, o0, r0, ahead, pass, passes); break;
    case 1: Tile<OT, 1>::run(w, x, out, inputs, outputs, o0, r0, ahead, pass, passes); break;
    default: break;
  }
}

// The product with tiles of OT weight rows, each thread prefetching its next tile.
template <template <int, int> class Tile, int OT, int TR>
void tiled_columns(const float* w, const float* x, float* out, int64_t rows, int64_t inputs, int64_t outputs) {
  const int64_t tiles = (outputs + OT - 1) / OT;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t o0 = t * OT;
      if (o0 + OT <= outputs) {
        const int64_t ahead = t + 1 < end && o0 + 2 * OT <= outputs ? OT * inputs : 0;
        tile_column<Tile, OT, TR>(w, x, out, rows, inputs, outputs, o0, ahead);
      } else {
        for (int64_t o = o0; o < outputs; ++o) tile_column<Tile, 1, TR>(w, x, out, rows, inputs, outputs, o, 0);
      }
    }
  });
}

// 8 lanes: tiles of 6 weight rows for one or two input rows, 4 for three, 3 for four or more (at most 12
// of the 16 registers hold sums). 16 lanes (32 registers): one weight row (a single stream a thread, as
// numba's kernel) by all of up to five input rows in one pass, two weight rows by all of six to nine
// (up to 18 sums, one pass), 6 weight rows by 4 input rows from ten rows (24 sums). Every shape computes
// the same sums in the same order (above), so the boundaries between shapes are a matter of speed alone:
// each stands where the faster shape changed over the row counts `lookahead roofline --rows 1 --rows 4
// --rows 5 --rows 6 --rows 8 --rows 9 --rows 10 --rows 16` times (results/RESULTS.md keeps the timings).
void tiled_product(const float* w, const float* x, float* out, int64_t rows, int64_t inputs, int64_t outputs,
                   int64_t lanes) {
  if (lanes == 16) {
    if (rows <= 5) {
      tiled_columns<Tile16, 1, 6>(w, x, out, rows, inputs, outputs);
    } else if (rows <= 9) {
      tiled_columns<Tile16, 2, 9>(w, x, out, rows, inputs, outputs);
    } else {
      tiled_columns<Tile16, 6, TILE_ROWS>(w, x, out, rows, inputs, outputs);
    }
  } else if (rows <= 2) {
    tiled_columns<Tile8, 6, TILE_ROWS>(w, x, out, rows, inputs, outputs);
  } else if (rows == 3) {
    tiled_columns<Tile8, 4, TILE_ROWS>(w, x, out, rows, inputs, outputs);
  } else {
    tiled_columns<Tile8, 3, TILE_ROWS>(w, x, out, rows, inputs, outputs);
  }
}

// The widths this CPU runs the tiled kernel in: 8 lanes with AVX2 and FMA, 16 too with AVX-512F.
std::vector<int64_t> tiled_widths() {
  std::vector<int64_t> widths;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    widths.push_back(8);
    if (__builtin_cpu_supports("avx512f")) widths.push_back(16);
  }
  return widths;
}

bool tiled_available() {  // this CPU runs AVX2 and FMA instructions
  static const bool available = !tiled_widths().empty();
  return available;
}

// The median seconds of `repeats` products over `rows` input rows at each width, the widths interleaved.
std::vector<double> time_widths(const std::vector<int64_t>& widths, const float* w, const float* x, float* out,
                                int64_t rows, int64_t inputs, int64_t outputs, int repeats) {
  std::vector<std::vector<double>> seconds(widths.size());
  for (int repeat = 0; repeat < repeats; ++repeat) {
    for (size_t k = 0; k < widths.size(); ++k) {
      const auto start = std::chrono::steady_clock::now();
      tiled_product(w, x, out, rows, inputs, outputs, widths[k]);
      seconds[k].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  std::vector<double> medians;
  for (auto& s : seconds) {
    std::sort(s.begin(), s.end());
    medians.push_back(s[s.size() / 2]);
  }
  return medians;
}

// The width this process runs the tiled kernel in (0: none): the widest this CPU runs, 16 lanes with AVX-512F, else
// 8. Fixed by the CPU alone, never by a timing: the two widths sum in another order, so a width chosen by the
// faster of two close timings changed a model's greedy text from one process to the next on the same machine
// (int8 products round the attention's last bits into other 8-bit inputs).
int64_t tiled_lanes() {
  static const int64_t lanes = [] {
    const std::vector<int64_t> widths = tiled_widths();
    return widths.empty() ? int64_t{0} : widths.back();
  }();
  return lanes;
}

// What each width takes here, for reports (lookahead roofline): [ms at 8 lanes, ms at 16 lanes], the sums over
// products of 4 and 12 input rows with 64 MB of weights (more than the caches hold: streamed from memory, as a
// forward's are), the widths interleaved, 5 times each, the medians; measured once a process, on first call;
// empty where one width alone runs. It does not choose the width (tiled_lanes).
std::vector<double> tiled_width_timings() {
  static const std::vector<double> timings = [] {
    std::vector<double> result;
    const std::vector<int64_t> widths = tiled_widths();
    if (widths.size() < 2) return result;
    const int64_t inputs = 1024, outputs = 16384, repeats = 5;
    // (torch's allocations, 64-byte aligned as a model's weights are: a 16-lane load never splits a line)
    const at::Tensor w = at::arange(inputs * outputs, at::kFloat).remainder_(7).mul_(0.125).sub_(0.375);
    const at::Tensor x = at::arange(12 * inputs, at::kFloat).remainder_(5).mul_(0.25).sub_(0.5);
    at::Tensor out = at::empty({12 * outputs}, at::kFloat);
    time_widths(widths, w.const_data_ptr<float>(), x.const_data_ptr<float>(), out.mutable_data_ptr<float>(), 12,
                inputs, outputs, 1);  // (a first pass of each: threads woken, pages touched)
    std::vector<double> total(widths.size(), 0.0);
    for (const int64_t rows : {4, 12}) {
      const std::vector<double> medians =
          time_widths(widths, w.const_data_ptr<float>(), x.const_data_ptr<float>(),
                      out.mutable_data_ptr<float>(), rows, inputs, outputs, repeats);
      for (size_t k = 0; k < widths.size(); ++k) total[k] += medians[k];
    }
    for (const double seconds : total) result.push_back(1e3 * seconds);
    return result;
  }();
  return timings;
}

bool tiled_takes(const at::Tensor& x, const at::Tensor& weight) {
  return tiled_available() && x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat &&
         weight.dim() == 2 && weight.is_contiguous() && x.size(-1) == weight.size(1) && x.device().is_cpu() &&
         weight.device().is_cpu();
}

at::Tensor with_rows_of(const at::Tensor& out, const at::Tensor& x) {  // out [R, O] -> [..., O] as x [..., I]
  auto shape = x.sizes().vec();
  shape.back() = out.size(1);
  return out.view(shape);
}

// x [..., I] @ weight [O, I]^T (+ bias [O]) -> [..., O] through the tiled kernel, in `lanes` lanes (0: the
// process's, tiled_lanes; 8 or 16 where this CPU runs them, tiled_widths: what the tests compare).
at::Tensor tiled(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                 int64_t lanes) {
  TORCH_CHECK(tiled_takes(x, weight),
              "lookahead_native::tiled takes float32 CPU tensors x [..., I] and a contiguous weight [O, I] on a "
              "CPU with AVX2 and FMA (tiled_available)");
  if (lanes == 0) lanes = tiled_lanes();
  const std::vector<int64_t> widths = tiled_widths();
  TORCH_CHECK(std::find(widths.begin(), widths.end(), lanes) != widths.end(), "lookahead_native::tiled: this CPU "
              "does not run the tiled kernel in ", lanes, " lanes (tiled_widths); pass lanes=0 for the process's");
  const int64_t inputs = x.size(-1);
  const int64_t rows = inputs > 0 ? x.numel() / inputs : 0;
  const at::Tensor flat = x.reshape({rows, inputs}).contiguous();  // [R, I]
  at::Tensor out = at::empty({rows, weight.size(0)}, x.options());  // [R, O]
  const int64_t outputs = weight.size(0);
  for (int64_t r0 = 0; r0 < rows; r0 += BLOCK_ROWS) {  // (each row's products are its own: blocks change nothing)
    tiled_product(weight.const_data_ptr<float>(), flat.const_data_ptr<float>() + r0 * inputs,
                  out.mutable_data_ptr<float>() + r0 * outputs, std::min(BLOCK_ROWS, rows - r0), inputs, outputs, lanes);
  }
  if (bias.has_value() && bias->defined()) out.add_(*bias);
  return with_rows_of(out, x);
}

// out [R, O] = x [R, I] @ w [O, I]^T, all C-contiguous, of the entry point's dtype.
using Kernel = void (*)(const void* w, const void* x, void* out, int64_t rows, int64_t inputs, int64_t outputs);

Kernel kernels[2] = {nullptr, nullptr};  // float32, float64: set once per process by set_kernels

constexpr int64_t TORCH_CODE = 0;  // fewrows.ROUTE_CODES
constexpr int64_t KERNEL_CODE = 1;
constexpr int64_t TILED_CODE = 3;
constexpr int64_t TILED_ROWS_MIN = 2;  // fewrows.TILED_ROWS_MIN: one row stays on numba's kernel
constexpr int64_t KERNEL_ROWS_MAX = 64;  // fewrows.KERNEL_ROWS_MAX
constexpr int64_t MM_ROWS_MAX = 64;  // fewrows.MM_ROWS_MAX

void set_kernels(int64_t float32_kernel, int64_t float64_kernel) {
  kernels[0] = reinterpret_cast<Kernel>(float32_kernel);
  kernels[1] = reinterpret_cast<Kernel>(float64_kernel);
}

Kernel kernel_for(at::ScalarType dtype) {
  if (dtype == at::kFloat) return kernels[0];
  if (dtype == at::kDouble) return kernels[1];
  return nullptr;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                  const at::Tensor& route) {
  // (the route is a 0-d int64 CPU tensor: read in place, without a dispatched item() per layer)
  int64_t code = route.scalar_type() == at::kLong && route.numel() == 1 && route.device().is_cpu()
                     ? *route.const_data_ptr<int64_t>()
                     : route.item<int64_t>();
  const int64_t inputs = x.size(-1);
  const int64_t rows = inputs > 0 ? x.numel() / inputs : 0;
  if (code == TILED_CODE) {  // the kernel route with the tiled kernel, where it takes the product
    if (tiled_takes(x, weight) && rows >= TILED_ROWS_MIN) return tiled(x, weight, bias, 0);
    code = KERNEL_CODE;
  }
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
  // W @ x^T for 1..MM_ROWS_MAX rows (one row as itself twice, fewrows.MM_ROWS_MAX): the "mm" route, and the
  // kernel route's for dtypes the kernel does not take
  if (code != TORCH_CODE && same_dtype && !(code == KERNEL_CODE && kernel_dtype) && x.is_floating_point() &&
      rows >= 1 && rows <= MM_ROWS_MAX) {
    at::Tensor flat = x.reshape({rows, inputs});  // [R, I]
    if (rows == 1) flat = flat.repeat({2, 1});  // [2, I]
    const at::Tensor out = bias.has_value() && bias->defined()
                               ? at::addmm(bias->unsqueeze(1), weight, flat.t())
                               : at::mm(weight, flat.t());  // [O, R]
    return with_rows_of(out.narrow(1, 0, rows).t().reshape({rows, weight.size(0)}), x);
  }
  return at::linear(x, weight, bias);
}

}  // namespace

// tiled_lanes for fused.cpp's attention, which runs in the same width (8 or 16; 0: no AVX2 and FMA)
int64_t lookahead_tiled_lanes() { return tiled_lanes(); }

TORCH_LIBRARY(lookahead_native, m) {
  m.def("set_kernels(int float32_kernel, int float64_kernel) -> ()", &set_kernels);
  m.def("linear(Tensor x, Tensor weight, Tensor? bias, Tensor route) -> Tensor");
  m.def("tiled(Tensor x, Tensor weight, Tensor? bias, int lanes=0) -> Tensor");
  m.def("tiled_available() -> bool", &tiled_available);
  m.def("tiled_widths() -> int[]", &tiled_widths);
  m.def("tiled_lanes() -> int", &tiled_lanes);
  m.def("tiled_width_timings() -> float[]", &tiled_width_timings);
  m.impl("linear", c10::DispatchKey::CPU, TORCH_FN(linear));
  m.impl("tiled", c10::DispatchKey::CPU, TORCH_FN(tiled));
}
