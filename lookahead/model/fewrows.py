"""Few-row linear layers on the CPU: lookahead's own kernel, or y = (W x^T)^T instead of x W^T.

A decode step feeds 1 row; a speculative step feeds a few more. On the CPU
torch's ``F.linear`` hands a one-row product to a matrix-vector kernel and a
product over 2 to 7 rows to a general matrix-matrix kernel; on some CPUs
neither streams the weights at the memory's speed, on others they do. So
this is one route among others (model/routing.py): the cost measurement times a
forward through it and through torch's own on this machine, and each row
count runs through whichever was faster (benchmarks/RESULTS.md has what
machines measured).

Inside ``FewRowLinear`` a forward over 1..KERNEL_ROWS_MAX rows in float32
or float64 runs its linear layers through ``kernels.linear.rows_linear``
(one pass over the weights, every thread); other float dtypes (bfloat16,
float16, which numba does not compute in) run 2..MM_ROWS_MAX rows as
W @ x^T; anything else is torch's own.

The rerouting is a ``TorchFunctionMode`` entered around one forward call of
the model: the model, its modules and transformers are not touched, and
nothing changes outside the call. It only ever applies to CPU tensors. The
products differ from torch's only in the order floating-point sums are
taken, as any two matrix kernels do: the verified token is each row's
argmax, as before.
"""

from __future__ import annotations

import numba
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..kernels.linear import rows_linear

PLAIN = (torch.Tensor, torch.nn.Parameter)  # the tensor types rerouted
KERNEL_DTYPES = (torch.float32, torch.float64)  # what kernels/linear.py computes in
KERNEL_ROWS_MAX = 64  # own kernel: 1 .. KERNEL_ROWS_MAX rows (the cost measurement decides where it wins)
MM_ROWS_MAX = 7  # other dtypes, W @ x^T: 2 .. MM_ROWS_MAX rows (from 8 rows torch's kernel holds)
FEW_ROWS_MAX = KERNEL_ROWS_MAX  # the most rows a forward is ever rerouted for


def start_numba_threads() -> None:
    """Start numba's thread pool, keeping torch's thread count as the user set it.

    numba starts its pool on first use; its OpenMP layer shares torch's OpenMP
    runtime and sets that runtime's thread count to numba's own on the way
    (OMP_NUM_THREADS=1 or torch.set_num_threads(1) would become 2 here). Idempotent and
    cheap once started.
    """
    threads = torch.get_num_threads()
    numba.get_num_threads()  # starts the pool
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


class FewRowLinear(TorchFunctionMode):
    """Inside this mode, ``F.linear`` over few rows of a CPU tensor runs through ``few_row_linear``
    (``kernel`` False: only its W @ x^T part, for 2..MM_ROWS_MAX rows of any float dtype).

    numba runs on as many threads as torch is set to (never more than its pool has) while inside,
    and its own count is put back on exit.
    """

    def __init__(self, kernel: bool = True):
        super().__init__()
        self.kernel = kernel

    def __enter__(self):
        start_numba_threads()
        self._threads = numba.get_num_threads()
        numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))
        return super().__enter__()

    def __exit__(self, *exc):
        numba.set_num_threads(self._threads)
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            routed = few_row_linear(*args, **kwargs, kernel=self.kernel)
            if routed is not None:
                return routed
        return func(*args, **kwargs)


def few_row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   kernel: bool = True) -> torch.Tensor | None:
    """x [..., I] W[O, I]^T (+ bias [O]) through lookahead's kernel (``kernel``: 1..KERNEL_ROWS_MAX
    rows, float32 or float64, contiguous W) or as (W x^T)^T (2..MM_ROWS_MAX rows: other dtypes, or
    every float dtype without ``kernel``), for CPU tensors in W's dtype outside autograd; None
    otherwise (the caller runs the stock F.linear)."""
    if type(x) is not torch.Tensor or type(weight) not in PLAIN or (bias is not None and type(bias) not in PLAIN):
        return None  # a tensor subclass (quantized weights, ...) keeps its own linear
    if x.device.type != "cpu" or weight.dim() != 2 or x.dtype != weight.dtype or x.shape[-1] != weight.shape[1]:
        return None
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return None  # a product autograd must see
    rows = x.numel() // max(x.shape[-1], 1)
    flat = x.reshape(rows, x.shape[-1])  # [R, I]
    if kernel and x.dtype in KERNEL_DTYPES and 1 <= rows <= KERNEL_ROWS_MAX and weight.is_contiguous():
        out = torch.from_numpy(rows_linear(weight.detach().numpy(), flat.contiguous().numpy()))  # [R, O]
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], weight.shape[0])
    if (kernel and x.dtype in KERNEL_DTYPES) or not x.dtype.is_floating_point or not 2 <= rows <= MM_ROWS_MAX:
        return None
    out = torch.mm(weight, flat.t()) if bias is None else torch.addmm(bias[:, None], weight, flat.t())  # [O, R]
    return out.t().reshape(*x.shape[:-1], weight.shape[0])

