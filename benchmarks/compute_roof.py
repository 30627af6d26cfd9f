"""The second limit of a step (``lookahead roofline``): the arithmetic of its linear layers.

A decode step over q rows reads every weight once (the memory roofline, roofline.py) and
multiplies each weight by q rows: 2 q M float operations, M the multiply-adds one row costs in
the model's linear layers (``linear_macs``). Over a few rows the weights' bytes bound the step;
past the *ridge* the arithmetic does, and every further row costs its share of it:

    roof(q)  = max(roofline, 2 q M / F)        ridge = roofline F / (2 M) rows

where F, the compute roof, is what this machine's fastest matrix product of those layers does
(``compute_throughput``: every route a step can take here, over ``PEAK_ROWS`` rows of random
input, where the products are bound by the arithmetic; the best route's rate). F is measured,
not read from a data sheet, so it is a lower bound of the cores' peak: what the kernels at hand
reach. Worked example: SmolLM2-135M has M = 134,479,872 (its output head included); at a
roofline of 10.4 ms and F = 421 GFLOP/s the ridge lies at 16.3 rows, and a 32-row step can take
no less than 2 x 32 x M / F = 20.4 ms.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from lookahead.model.quantized import QuantizedLinear

PEAK_ROWS = 256  # rows of the compute probe's products: on a CPU far past the ridge, and the most rows a step's
# linears are routed for (model/fewrows.py FEW_ROWS_MAX), so every route runs its own kernel there
PEAK_REPEATS = 5  # timed passes over the layers per route (the median counts), after one untimed


def linear_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's linear layers in module order: ``nn.Linear`` with a 2-D weight, and ``QuantizedLinear``
    (a GGUF's block formats, model/quantized.py)."""
    return [m for m in model.modules() if (isinstance(m, torch.nn.Linear) and m.weight.dim() == 2)
            or isinstance(m, QuantizedLinear)]


def layer_shape(layer: torch.nn.Module) -> tuple[int, int]:
    """(outputs, inputs) of a layer of ``linear_layers``."""
    if isinstance(layer, QuantizedLinear):
        return layer.out_features, layer.in_features
    return int(layer.weight.shape[0]), int(layer.weight.shape[1])


def linear_macs(model: torch.nn.Module) -> int:
    """Multiply-adds one row costs in the model's linear layers (their weights' elements; the
    output head counts: a step computes the logits of the rows it keeps). A weight shared by two
    layers counts twice: each multiplies the row."""
    return sum(outputs * inputs for outputs, inputs in map(layer_shape, linear_layers(model)))


def compute_seconds(macs: int, rows: int, flops: float) -> float:
    """Seconds of 2 * rows * macs float operations at ``flops`` per second."""
    return 2.0 * rows * macs / flops


def roof_seconds(roofline_s: float, macs: int, rows: int, flops: float) -> float:
    """No step over ``rows`` rows is faster: the larger of the memory roofline and the linears' arithmetic."""
    return max(roofline_s, compute_seconds(macs, rows, flops))


def ridge_rows(roofline_s: float, macs: int, flops: float) -> float:
    """The row count where the linears' arithmetic at ``flops`` takes as long as the memory roofline."""
    return roofline_s * flops / (2.0 * macs)


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (nothing to wait for on the CPU); roofline.py's probes use it too."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compute_throughput(model: torch.nn.Module, linears: object, routes: dict[str, object], rows: int = PEAK_ROWS,
                       repeats: int = PEAK_REPEATS, seed: int = 0) -> dict[str, float]:
    """Route label -> float operations per second of the model's linear layers (``linear_macs``) over
    ``rows`` rows of random input through that route (label -> model/routing.py Route, or None: torch as
    set; run through ``route_mode``, ``linears`` the target's FewRowLinear). The caller names the routes
    worth timing (roofline.py ``peak_routes``: those that run their own way at that row count, on all of
    torch's threads). Each route: one untimed pass over every layer, then ``repeats`` timed passes, the
    median's rate."""
    from lookahead.model.quantized import kernel_only
    from lookahead.model.routing import route_mode

    layers = linear_layers(model)
    if not layers:
        return {}
    macs = linear_macs(model)
    quantized = isinstance(layers[0], QuantizedLinear)  # (blocks: their own kernel, whatever the route)
    device, dtype = (layers[0].stored.device, torch.float32) if quantized else (layers[0].weight.device,
                                                                                 layers[0].weight.dtype)
    generator = torch.Generator().manual_seed(seed)
    inputs = {size: torch.randn(rows, size, generator=generator).to(device, dtype)  # [q, I]
              for size in sorted({layer_shape(m)[1] for m in layers})}
    rates = {}
    for label, route in routes.items():
        # (GGUF blocks through their step kernel, in the products load_model chose, as a decode step runs them;
        # a prefill's tiles are another path)
        with torch.inference_mode(), route_mode(route, rows, linears), \
                kernel_only([m for m in layers if isinstance(m, QuantizedLinear)]):  # type: ignore[arg-type]
            times = []
            for index in range(repeats + 1):
                sync(device)
                began = time.perf_counter()
                for layer in layers:
                    x = inputs[layer_shape(layer)[1]]
                    layer(x) if isinstance(layer, QuantizedLinear) else F.linear(x, layer.weight)  # (routed)
                sync(device)
                if index:
                    times.append(time.perf_counter() - began)
        rates[label] = 2.0 * rows * macs / statistics.median(times)
    return rates
