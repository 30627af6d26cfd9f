"""Few-row linear layers on the CPU: lookahead's own kernel, or y = (W x^T)^T instead of x W^T.

A decode step feeds 1 row; a speculative step feeds a few more. On the CPU
torch's ``F.linear`` hands a one-row product to a matrix-vector kernel and a
product over 2 to 7 rows to a general matrix-matrix kernel; on 2 cores
(MKL, float32) neither streams the weights at the memory's speed, and the
second costs up to twice the first. Whole forwards, 256 tokens of context
(SmolLM2-135M; Qwen2.5-Coder-1.5B):

    rows                      1       2       3       4       8      16      32      64
    torch's F.linear        57 ms  101 ms  125 ms   94 ms  103 ms  109     141     220   SmolLM2
    W @ x^T                 65      64      66      64     112     123
    kernels/linear.py       30      37      40      39      51      74     104     173
    torch's F.linear       370 ms  797 ms 1137 ms  748 ms  786 ms  899    1223    1884   Qwen
    W @ x^T                385     439     731     658     899    1009
    kernels/linear.py      149     227     261     262     312     442     728    1289

So a forward over 1..KERNEL_ROWS_MAX rows in float32 or float64 runs its
linear layers through ``kernels.linear.rows_linear`` (one pass over the
weights, every core); other float dtypes (bfloat16, float16, which numba
does not compute in) run 2..MM_ROWS_MAX rows as W @ x^T; anything else is
torch's own.

The rerouting is a ``TorchFunctionMode`` entered around one forward call of
the model: the model, its modules and transformers are not touched, and
nothing changes outside the call. It only ever applies to CPU tensors; on a
GPU (where few rows cost what one costs anyway) no mode is entered. The
products differ from torch's only in the order floating-point sums are
taken, as any two matrix kernels do: the verified token is each row's
argmax, as before.
"""

from __future__ import annotations

from contextlib import nullcontext

import numba
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .kernels.linear import rows_linear

PLAIN = (torch.Tensor, torch.nn.Parameter)  # the tensor types rerouted
KERNEL_DTYPES = (torch.float32, torch.float64)  # what kernels/linear.py computes in
KERNEL_ROWS_MAX = 64  # own kernel: 1 .. KERNEL_ROWS_MAX rows (measured: still ahead at 64 rows, 96 on SmolLM2)
MM_ROWS_MAX = 7  # other dtypes, W @ x^T: 2 .. MM_ROWS_MAX rows (from 8 rows torch's kernel holds)
FEW_ROWS_MAX = KERNEL_ROWS_MAX  # the most rows a forward is ever rerouted for
ROUTING = f"rows_linear 3 (narrow / wide) 1-{KERNEL_ROWS_MAX}, mm 2-{MM_ROWS_MAX}"  # in cost curves' fingerprints: a change re-measures


class FewRowLinear(TorchFunctionMode):
    """Inside this mode, ``F.linear`` over few rows of a CPU tensor runs through ``few_row_linear``.

    numba's threads are capped at torch's (``torch.set_num_threads`` is respected) while inside.
    """

    def __enter__(self):
        self._threads = numba.get_num_threads()
        numba.set_num_threads(max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)))
        return super().__enter__()

    def __exit__(self, *exc):
        numba.set_num_threads(self._threads)
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            routed = few_row_linear(*args, **kwargs)
            if routed is not None:
                return routed
        return func(*args, **kwargs)


def few_row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor | None:
    """x [..., I] W[O, I]^T (+ bias [O]) through lookahead's kernel (1..KERNEL_ROWS_MAX rows, float32
    or float64, contiguous W) or as (W x^T)^T (2..MM_ROWS_MAX rows, other dtypes), for CPU tensors
    in W's dtype outside autograd; None otherwise (the caller runs the stock F.linear)."""
    if type(x) is not torch.Tensor or type(weight) not in PLAIN or (bias is not None and type(bias) not in PLAIN):
        return None  # a tensor subclass (quantized weights, ...) keeps its own linear
    if x.device.type != "cpu" or weight.dim() != 2 or x.dtype != weight.dtype or x.shape[-1] != weight.shape[1]:
        return None
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return None  # a product autograd must see
    rows = x.numel() // max(x.shape[-1], 1)
    flat = x.reshape(rows, x.shape[-1])  # [R, I]
    if x.dtype in KERNEL_DTYPES and 1 <= rows <= KERNEL_ROWS_MAX and weight.is_contiguous():
        out = torch.from_numpy(rows_linear(weight.detach().numpy(), flat.contiguous().numpy()))  # [R, O]
        if bias is not None:
            out += bias
        return out.reshape(*x.shape[:-1], weight.shape[0])
    if x.dtype in KERNEL_DTYPES or not 2 <= rows <= MM_ROWS_MAX:
        return None
    out = torch.mm(weight, flat.t()) if bias is None else torch.addmm(bias[:, None], weight, flat.t())  # [O, R]
    return out.t().reshape(*x.shape[:-1], weight.shape[0])


def few_rows(device: torch.device, rows: int, enabled: bool):
    """The context a forward over ``rows`` token rows on ``device`` runs in: FewRowLinear for
    1..FEW_ROWS_MAX rows on the CPU when ``enabled``, else nothing."""
    if enabled and device.type == "cpu" and 1 <= rows <= FEW_ROWS_MAX:
        return FewRowLinear()
    return nullcontext()
