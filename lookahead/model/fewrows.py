"""Few-row linear layers on the CPU: lookahead's own kernel, or y = (W x^T)^T instead of x W^T.

A decode step feeds 1 row; a speculative step feeds a few more. On the CPU
torch's ``F.linear`` hands a one-row product to a matrix-vector kernel and a
product over 2 or more rows to a general matrix-matrix kernel; on some CPUs
neither streams the weights at the memory's speed, on others they do. So
this is one route among others (model/routing.py): the cost measurement times a
forward through it and through torch's own on this machine, and each row
count runs through whichever was faster (`lookahead roofline` times every
route per row count; results/RESULTS.md has what machines measured).

Inside ``FewRowLinear`` a forward over TILED_ROWS_MIN rows or more
in float32 runs its linear layers through the tiled kernel of lookahead's
C++ op (native/linear.cpp: tiles of weight rows by input rows, on torch's
threads, in 8 lanes with AVX2 and FMA, or in 16 where the CPU runs AVX-512F:
``native.build.tiled_width``), where that
op can be built and the CPU has AVX2 and FMA;
otherwise, and over one row or in float64, through
``kernels.linear.rows_linear`` (numba: one pass over the weights, every
thread); other float dtypes (bfloat16,
float16, which neither computes in) run 1..MM_ROWS_MAX rows as W @ x^T;
anything else is torch's own.

A third route is torch's own oneDNN (``onednn``): every weight packed once
into oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``,
a copy as large as the linear layers' weights, made on the route's first
use) and multiplied by its register-blocked kernel
(``torch.ops.mkldnn._linear_pointwise``). Where it wins over lookahead's
kernel depends on the CPU and the row count, as for every route: the cost
measurement decides per row count (`lookahead roofline` shows each route's
step); float32 only, and only where ``LookaheadConfig.onednn_linear``
offers it to the measurement.

The rerouting touches the linear layers alone: while ``FewRowLinear`` is
entered, each ``nn.Linear`` of the model holds a ``RoutedWeight`` (the same
storage, a tensor subclass) in place of its weight, so ``F.linear`` over that
weight, and nothing else, runs through ``few_row_linear``; every other op of
the forward is dispatched as torch dispatches it, with no Python in between.
The weights are put back when the block exits, and nothing changes outside it.
(The swap is seen by every thread: another thread running the same model
meanwhile runs its linears through the same kernel, the same products up to
summation order; the decode loop owns its model while it steps.) It only
ever applies to CPU tensors.
The products differ from torch's only in the order floating-point sums are
taken, as any two matrix kernels do: the verified token is each row's
argmax either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numba
import numpy as np
import torch
import torch.nn.functional as F

from ..kernels.linear import rows_linear
from ..kernels.threads import start_numba_threads
from ..native.build import load_linear, tiled_kernel

PLAIN = (torch.Tensor, torch.nn.Parameter)  # the tensor types rerouted
KERNEL_DTYPES = (torch.float32, torch.float64)  # what kernels/linear.py computes in
ONEDNN_DTYPES = (torch.float32,)  # what the onednn route packs
KERNEL_ROWS_MAX = 64  # own kernel: 1 .. KERNEL_ROWS_MAX rows (the cost measurement decides where it wins)
# W @ x^T (the "mm" route, and the kernel route's for other dtypes): 1 .. MM_ROWS_MAX rows, a single row computed
# as two (itself twice): torch sends one column to a matrix-vector kernel, which on some CPUs is slower than
# its matrix kernel over the row twice. The cost measurement decides per row count where it wins
# (`lookahead roofline` times the mm route beside the others).
MM_ROWS_MAX = 64
# The most rows a step's forward is rerouted for (past it, as torch is set): the tiled kernel (float32, where
# loaded) takes any number of rows, so a batch's step (several sequences' rows together) stays on the routed
# kernels rather than dropping to torch's at numba's KERNEL_ROWS_MAX (`lookahead roofline --rows 32 --rows 64
# --rows 128` times the routes there). (Prompts prefill through it where it measures faster: prefill.py.)
FEW_ROWS_MAX = 256
OP = "lookahead::linear"  # a linear layer as a torch op that follows a route given at run time (traced.py)
ROUTE_CODES = {"torch": 0, "kernel": 1, "mm": 2}  # the routes OP takes, by the code it is given
KERNEL_CODE = ROUTE_CODES["kernel"]
TILED_CODE = 3  # the kernel route, its float32 products through the tiled kernel (a FewRowLinear with ``tiled``)
# ... from this many rows: over one row both stream the weights at about the memory's speed and the tiled
# kernel gains nothing (`lookahead roofline` compares a step's routes against the memory roofline)
TILED_ROWS_MIN = 2


def kernel_product(w: np.ndarray, x: torch.Tensor, rows: int, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., I] (``rows`` rows in all, CPU, w's dtype) @ w [O, I]^T (+ bias [O]) through ``rows_linear``
    -> [..., O]: the one call of the kernel every route's path makes."""
    out = torch.from_numpy(rows_linear(w, x.reshape(rows, x.shape[-1]).contiguous().numpy()))  # [R, O]
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], w.shape[0])


def tiled_takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the tiled kernel computes x [..., I] W [O, I]^T: float32 CPU tensors, W contiguous,
    TILED_ROWS_MIN rows or more (where it is loaded: ``FewRowLinear.tiled``)."""
    inputs = x.shape[-1]
    return x.dtype == torch.float32 and weight.dtype == torch.float32 and x.is_cpu and weight.is_contiguous() \
        and weight.dim() == 2 and weight.shape[1] == inputs \
        and TILED_ROWS_MIN <= x.numel() // max(inputs, 1)


def _linear_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, route: torch.Tensor) -> torch.Tensor:
    """x [..., I] W [O, I]^T (+ bias) as a forward through the route coded by ``route`` (a 0-d int64 tensor,
    ROUTE_CODES, or TILED_CODE) computes it: ``few_row_linear``'s kernel or W @ x^T where it applies, else
    F.linear.
    The CPU kernel of OP: a traced forward records it once and replays it under any of those routes."""
    code = int(route)
    if code == TILED_CODE:
        if tiled_takes(x, weight):
            return torch.ops.lookahead_native.tiled(x, weight, bias)
        code = KERNEL_CODE
    if code == KERNEL_CODE and x.dtype == weight.dtype and x.dtype in KERNEL_DTYPES and weight.is_contiguous():
        rows = x.numel() // x.shape[-1]
        if 1 <= rows <= KERNEL_ROWS_MAX:  # (RoutedWeight's hot path, as lean: every step runs it per layer)
            return kernel_product(weight.numpy(), x, rows, bias)
    if code:
        routed = few_row_linear(x, weight, bias, kernel=code == KERNEL_CODE)
        if routed is not None:
            return routed
    return F.linear(x, weight, bias)


def _register_op() -> Callable[..., torch.Tensor]:
    """torch.ops.lookahead.linear (defined once per process: torch's operator registry is the process's)."""
    if not hasattr(torch.ops.lookahead, "linear"):
        torch.library.define(OP, "(Tensor x, Tensor weight, Tensor? bias, Tensor route) -> Tensor")
        torch.library.impl(OP, "cpu", _linear_op)
    return torch.ops.lookahead.linear


linear_op = _register_op()


class Recording:
    """What a ``FewRowLinear``'s routed weights do while a forward is recorded (traced.py): with ``route``
    set (a 0-d int64 tensor), every F.linear over them runs as ``op`` under that route: ``linear_op``, or
    the same op in C++ (native/linear.cpp), which a trace then replays without calling into Python."""

    def __init__(self) -> None:
        self.route: torch.Tensor | None = None
        self.op: Callable[..., torch.Tensor] = linear_op


class RoutedWeight(torch.Tensor):
    """A linear layer's weight (the same storage) whose ``F.linear`` runs through ``few_row_linear``
    (``kernel``: see there); any other op on it runs as on the weight itself and returns plain tensors."""

    plain: torch.Tensor  # the weight as torch.Tensor, detached
    array: np.ndarray | None  # ... and as a numpy array (made once: the kernel reads it every step), if the kernel can
    kernel: bool
    tiled: Callable[..., torch.Tensor] | None  # the tiled kernel's op, where it computes this weight's products
    packed: torch.Tensor | None  # ... and packed for oneDNN (the onednn route), else None
    recording: Recording | None  # its FewRowLinear's recording (traced.py), if any

    @staticmethod
    def __new__(cls: type[RoutedWeight], weight: torch.Tensor, kernel: bool,
                packed: torch.Tensor | None = None, recording: Recording | None = None,
                tiled: Callable[..., torch.Tensor] | None = None) -> RoutedWeight:
        plain = weight.detach()
        routed = torch.Tensor._make_subclass(cls, plain, False)
        routed.plain, routed.kernel, routed.packed, routed.recording = plain, kernel, packed, recording
        routed.tiled = tiled if kernel and plain.dtype == torch.float32 and plain.is_contiguous() else None
        routed.array = plain.numpy() if plain.is_contiguous() and plain.dtype in KERNEL_DTYPES else None
        return routed

    @classmethod
    def __torch_function__(cls, func: Callable[..., Any], types: tuple[type, ...], args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        if func is F.linear and not kwargs and 2 <= len(args) <= 3:  # how nn.Linear calls it: the hot path
            x, weight = args[0], args[1]
            bias = args[2] if len(args) == 3 else None
            recording = weight.recording if type(weight) is RoutedWeight else None
            if recording is not None and recording.route is not None and type(x) is torch.Tensor:
                return recording.op(x, weight.plain, bias, recording.route)  # (recorded by a trace: traced.py)
            # (the weight's own attributes are read from .array and .plain: a tensor property read
            # on the subclass would go through this function again)
            packed = weight.packed if type(weight) is RoutedWeight else None
            if packed is not None and type(x) is torch.Tensor and x.is_cpu and x.dtype == packed.dtype \
                    and not x.requires_grad and (bias is None or not bias.requires_grad) \
                    and x.shape[-1] == weight.plain.shape[1]:
                out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed, bias, "none", [], "")
                return out.view(*x.shape[:-1], out.shape[-1])  # [..., O]
            array = weight.array if type(weight) is RoutedWeight and weight.kernel else None
            if array is not None and type(x) is torch.Tensor and x.is_cpu and x.dtype == weight.plain.dtype \
                    and not x.requires_grad and (bias is None or not bias.requires_grad):
                inputs = array.shape[1]
                rows = x.numel() // inputs if x.shape[-1] == inputs else 0
                if weight.tiled is not None and TILED_ROWS_MIN <= rows:
                    return weight.tiled(x, weight.plain, bias)  # [..., O] (float32: ``tiled`` is set for no other)
                if 1 <= rows <= KERNEL_ROWS_MAX:
                    return kernel_product(array, x, rows, bias)  # [..., O]
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight, bias = (tuple(args) + (None, None, None))[:3]
            x, weight, bias = kwargs.get("input", x), kwargs.get("weight", weight), kwargs.get("bias", bias)
            if isinstance(weight, RoutedWeight):
                routed = few_row_linear(x, weight.plain, bias, weight.kernel, weight.array, weight.tiled)
                if routed is not None:
                    return routed
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


def routable_linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The model's ``nn.Linear`` layers whose weight is a plain CPU tensor held by the layer itself
    (not offloaded by accelerate's hooks, not quantized)."""
    return [m for m in model.modules()
            if isinstance(m, torch.nn.Linear) and getattr(m, "_hf_hook", None) is None
            and type(m._parameters.get("weight")) in PLAIN and m.weight.device.type == "cpu"
            and m.weight.dim() == 2]


class FewRowLinear:
    """A model's linear layers, rerouted to ``few_row_linear`` while ``routed(kernel)`` is entered
    (``kernel`` False: only its W @ x^T part, for 1..MM_ROWS_MAX rows of any float dtype).

    Built once per model (it finds the layers and wraps their weights); entering it swaps each
    layer's weight for its ``RoutedWeight`` and puts the weight back on exit. numba runs on as many
    threads as torch is set to (never more than its pool has) while inside, and its own count is put
    back on exit. With ``native``, lookahead's C++ op is loaded (on a machine's first use, built) once
    here, where the model has layers to route: ``native_op`` is its linear op, which traces record
    (traced.py), or None, with ``native_failure`` saying why; ``tiled`` is its tiled kernel's op where
    float32 weights can take it (this CPU has AVX2 and FMA), else None (numba's kernel).
    """

    def __init__(self, model: torch.nn.Module, native: bool = True):
        self.model = model
        self.recording = Recording()  # set while a forward is traced (traced.py)
        self.depth = 0  # routed() contexts entered
        layers = routable_linears(model)
        self.native_op, self.native_failure = load_linear() if native and layers else (None, "")
        self.tiled: Callable[..., torch.Tensor] | None = None
        if self.native_op is not None and any(layer.weight.dtype == torch.float32 for layer in layers):
            self.tiled, _ = tiled_kernel()
        self._wrap()

    def _wrap(self) -> None:
        """Find the layers and wrap their weights as they are now (packed for oneDNN on first use)."""
        self.layers = routable_linears(self.model)
        self.weights: list[torch.Tensor] = [layer.weight for layer in self.layers]  # (each a Parameter)
        self.wrapped = {kind: [RoutedWeight(w, kind == "kernel", recording=self.recording, tiled=self.tiled)
                               for w in self.weights] for kind in ("kernel", "mm")}

    def _packed(self) -> list[RoutedWeight]:
        """The weights packed for oneDNN (made once: a copy of every linear layer's weight); a weight it
        cannot take (not float32) is routed as by the "mm" route."""
        if "onednn" not in self.wrapped:
            self.wrapped["onednn"] = [RoutedWeight(w, False, pack_for_onednn(w)) for w in self.weights]
        return self.wrapped["onednn"]

    @contextmanager
    def routed(self, kernel: bool = True, onednn: bool = False) -> Iterator[None]:
        """The body's forwards run the layers' linears through few_row_linear (``onednn``: through
        oneDNN's packed kernel, where a weight could be packed). Re-entrant: inside another ``routed``
        of this object, the body's route replaces the outer one's, which is put back on exit."""
        outer = [layer._parameters["weight"] for layer in self.layers] if self.depth else None
        if outer is None and any(layer._parameters["weight"] is not w for layer, w in zip(self.layers, self.weights)):
            self._wrap()  # the model's weights were replaced (moved, cast, reloaded) since they were wrapped
        chosen = self._packed() if onednn else self.wrapped["kernel" if kernel else "mm"]
        with self.threads():
            for layer, routed in zip(self.layers, chosen):
                layer._parameters["weight"] = routed  # type: ignore[assignment]  # (a Tensor standing in for the Parameter)
            self.depth += 1
            try:
                yield
            finally:
                self.depth -= 1
                for layer, weight in zip(self.layers, outer if outer is not None else self.weights):
                    layer._parameters["weight"] = weight  # type: ignore[assignment]

    @contextmanager
    def threads(self) -> Iterator[None]:
        """numba runs the body's kernels on as many threads as torch is set to (at most its pool's), its own
        count put back on exit: what ``routed`` sets besides the weights, and all a replayed trace needs
        (its linear op is told the route as an input, traced.py)."""
        start_numba_threads()
        threads = numba.get_num_threads()
        numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))
        try:
            yield
        finally:
            numba.set_num_threads(threads)


def onednn_available() -> bool:
    """Whether this torch build has oneDNN's packed linear (``torch.ops.mkldnn``) usable on this CPU."""
    try:
        return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise") \
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    except (AttributeError, RuntimeError):
        return False


def pack_for_onednn(weight: torch.Tensor) -> torch.Tensor | None:
    """weight [O, I] packed in oneDNN's blocked layout for ``torch.ops.mkldnn._linear_pointwise`` (a copy);
    None where it cannot be (not a float32 CPU tensor, or this build has no oneDNN)."""
    if weight.dtype not in ONEDNN_DTYPES or weight.device.type != "cpu" or weight.dim() != 2 or not onednn_available():
        return None
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


def few_row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   kernel: bool = True, array: np.ndarray | None = None,
                   tiled: Callable[..., torch.Tensor] | None = None) -> torch.Tensor | None:
    """x [..., I] W[O, I]^T (+ bias [O]) through lookahead's kernel (``kernel``: 1..KERNEL_ROWS_MAX
    rows, float32 or float64, contiguous W) or as (W x^T)^T (1..MM_ROWS_MAX rows: other dtypes, or
    every float dtype without ``kernel``), for CPU tensors in W's dtype outside autograd; None
    otherwise (the caller runs the stock F.linear). ``array``: W as a numpy array, if the caller holds one;
    ``tiled``: the tiled kernel's op, which then computes float32 products in the kernel's place."""
    if type(x) is not torch.Tensor or type(weight) not in PLAIN or (bias is not None and type(bias) not in PLAIN):
        return None  # a tensor subclass (quantized weights, ...) keeps its own linear
    if x.device.type != "cpu" or weight.dim() != 2 or x.dtype != weight.dtype or x.shape[-1] != weight.shape[1]:
        return None
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return None  # a product autograd must see
    rows = x.numel() // max(x.shape[-1], 1)
    if kernel and tiled is not None and tiled_takes(x, weight):
        return tiled(x, weight, bias)
    if kernel and x.dtype in KERNEL_DTYPES and 1 <= rows <= KERNEL_ROWS_MAX and weight.is_contiguous():
        return kernel_product(array if array is not None else weight.detach().numpy(), x, rows, bias)
    if (kernel and x.dtype in KERNEL_DTYPES) or not x.dtype.is_floating_point or not 1 <= rows <= MM_ROWS_MAX:
        return None
    flat = x.reshape(rows, x.shape[-1])  # [R, I]
    if rows == 1:
        flat = flat.repeat(2, 1)  # [2, I]: the row twice (see MM_ROWS_MAX), the second column dropped below
    out = torch.mm(weight, flat.t()) if bias is None else torch.addmm(bias[:, None], weight, flat.t())  # [O, R]
    return out[:, :rows].t().reshape(*x.shape[:-1], weight.shape[0])

