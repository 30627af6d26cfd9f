"""Few-row linear layers on the CPU: y = (W x^T)^T instead of x W^T.

A decode step feeds 1 row; a speculative step feeds a few more. On the CPU
torch's ``F.linear`` hands a one-row product to a matrix-vector kernel that
streams the weights once, but a product over 2 to 7 rows to a general
matrix-matrix kernel that, for so few rows, costs up to twice as much (MKL,
2 cores, float32: SmolLM2-135M 54 ms for 1 row, 89 ms for 2, 110 ms for 3,
83 ms for 4; Qwen2.5-Coder-1.5B 0.39 s, 0.81 s, 1.18 s, 0.76 s). The same
product written as W @ x^T puts the few rows on the other side of the
kernel, which then runs at about the one-row cost (SmolLM2: 58, 56, 57 ms
for 2, 3, 4 rows; Qwen 0.42 s, 0.66 s, 0.62 s). From about 8 rows the stock
kernel is as fast or faster, so only 2..FEW_ROWS_MAX rows are rerouted.

The rerouting is a ``TorchFunctionMode`` entered around one forward call of
the model: the model, its modules and transformers are not touched, and
nothing changes outside the call. It only ever applies to CPU tensors; on a
GPU (where few rows cost what one costs anyway) no mode is entered. The two
products differ only in the order floating-point sums are taken, as any two
matrix kernels do: the verified token is each row's argmax, as before.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

PLAIN = (torch.Tensor, torch.nn.Parameter)  # the tensor types rerouted
FEW_ROWS_MAX = 7  # rerouted: 2 .. FEW_ROWS_MAX rows (measured above: from 8 rows the stock kernel holds)


class FewRowLinear(TorchFunctionMode):
    """Inside this mode, ``F.linear`` over 2..FEW_ROWS_MAX rows of a CPU tensor runs as W @ x^T."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            routed = few_row_linear(*args, **kwargs)
            if routed is not None:
                return routed
        return func(*args, **kwargs)


def few_row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor | None:
    """x [..., I] W[O, I]^T (+ bias [O]) as (W x^T)^T when x holds 2..FEW_ROWS_MAX rows on the CPU
    in W's dtype; None otherwise (the caller runs the stock F.linear)."""
    if type(x) is not torch.Tensor or type(weight) not in PLAIN or (bias is not None and type(bias) not in PLAIN):
        return None  # a tensor subclass (quantized weights, ...) keeps its own linear
    if x.device.type != "cpu" or weight.dim() != 2 or x.dtype != weight.dtype or x.shape[-1] != weight.shape[1]:
        return None
    rows = x.numel() // max(x.shape[-1], 1)
    if not 2 <= rows <= FEW_ROWS_MAX:
        return None
    flat = x.reshape(rows, x.shape[-1])  # [R, I]
    out = torch.mm(weight, flat.t()) if bias is None else torch.addmm(bias[:, None], weight, flat.t())  # [O, R]
    return out.t().reshape(*x.shape[:-1], weight.shape[0])


def few_rows(device: torch.device, rows: int, enabled: bool):
    """The context a forward over ``rows`` token rows on ``device`` runs in: FewRowLinear for
    2..FEW_ROWS_MAX rows on the CPU when ``enabled``, else nothing."""
    if enabled and device.type == "cpu" and 2 <= rows <= FEW_ROWS_MAX:
        return FewRowLinear()
    return nullcontext()
