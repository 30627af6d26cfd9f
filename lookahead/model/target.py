"""ONE forward of the target model over a step's rows -> the kept rows' logits, on the device.

The decode loop and the cost model (costmodel.py) both go through ``Target``,
so what the budget measures is exactly what a step runs: explicit positions,
a 4-D mask per layer kind (mask.py) and logits only for the rows that matter.
Nothing here reads back to the host, and host arrays go to the device without
waiting for it (``to_device``).

Models loaded with accelerate's ``device_map`` (several GPUs, CPU or disk
offload) run unchanged: inputs go where accelerate's top-level hook executes
(``input_device``), and when the layers span several devices the kept rows
are selected after the forward (``spans_devices``).
"""

from __future__ import annotations

import numpy as np
import torch

from .cache import new_cache
from .mask import batch_model_mask, model_mask
from .routing import Routing, route_mode
from .support import AttentionLayout, context_length


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array as a tensor on device, without a host sync (host -> device copies are staged)."""
    return torch.from_numpy(np.ascontiguousarray(array)).to(device, non_blocking=True)


def hook_execution_device(module) -> torch.device | None:
    """The execution device of accelerate's hook on module (a device_map model), or None."""
    hook = getattr(module, "_hf_hook", None)
    for part in getattr(hook, "hooks", (hook,)):  # a SequentialHook holds several
        device = getattr(part, "execution_device", None)
        if device is not None:
            return torch.device(device)
    return None


def input_device(model) -> torch.device:
    """Where the model's inputs go.

    With a device_map, accelerate's top-level hook moves inputs to its
    execution device (offloaded weights sit on "meta" until their layer
    runs); otherwise the input embedding's device.
    """
    embedding = model.get_input_embeddings()
    for module in (model, embedding):
        device = hook_execution_device(module)
        if device is not None:
            return device
    return embedding.weight.device


def device_key(where) -> tuple[str, int]:
    """A device or device_map entry as (kind, index), kind "cpu", "disk" or "accelerator".

    A device_map names an accelerator by its index (an int) or as "cuda:1";
    a machine has one kind of accelerator, so both compare equal here.
    """
    if isinstance(where, int):
        return "accelerator", where
    if where == "disk":
        return "disk", 0
    device = torch.device(where)
    return ("cpu" if device.type == "cpu" else "accelerator"), device.index or 0


def spans_devices(model, main: torch.device) -> bool:
    """Whether a device_map runs layers on a device other than main (CPU/disk offload runs on main)."""
    placement = getattr(model, "hf_device_map", None) or {}
    return bool({device_key(where) for where in placement.values()} - {("cpu", 0), ("disk", 0), device_key(main)})


class Target:
    """A stock transformers causal LM driven with custom masks and positions."""

    def __init__(self, model, layout: AttentionLayout):
        self.model = model
        self.layout = layout
        # Batch size -> how its forwards run on this CPU (threads, whose linear kernel), measured with
        # the cost curve (costmodel.py); without one a forward runs as torch is set.
        self.routings: dict[int, Routing] = {}
        self.last_route = ""  # the label of the route the latest forward ran through ("": as torch is set)
        embedding = model.get_input_embeddings().weight
        self.device = input_device(model)
        self.dtype = embedding.dtype
        self.vocab = int(embedding.shape[0])
        # The last layer's hidden states can sit on another device than the kept-row
        # indices: then the model returns every row's logits and the rows are picked here.
        self.select_after = spans_devices(model, self.device)
        self.context = context_length(model.config)  # max_position_embeddings, or None
        # A one-row step needs no mask when no layer slides: the model's own causal mask is all-visible.
        self.plain_single_row = layout.sliding_window is None or layout.kinds == frozenset({"full_attention"})

    def positions(self, positions: torch.Tensor) -> torch.Tensor:
        """Position ids as fed to the model: any past the context as the last one.

        Only speculative rows get there (the window's guesses; tree nodes stay
        inside the tokens still allowed, which never pass the context), and
        their logits never decide a token (see sequence.py). Learned position
        tables (GPT-2, OPT) would fail on them otherwise.
        """
        return positions if self.context is None else positions.clamp_max(self.context - 1)

    def routing(self, batch: int) -> Routing | None:
        """The routing measured for ``batch`` sequences, else for the least larger batch measured (a
        batch whose rows finished), else None."""
        if batch in self.routings:
            return self.routings[batch]
        larger = [b for b in self.routings if b > batch]
        return self.routings[min(larger)] if larger else None

    def route(self, batch: int, rows: int):
        """The route a forward of ``batch`` sequences over ``rows`` rows each runs through (None: torch as set)."""
        routing = self.routing(batch)
        route = routing.route_for(rows) if routing is not None else None
        self.last_route = route.label if route is not None else ""
        return route

    def observe(self, batch: int, rows: int, seconds: float) -> None:
        """A step of ``batch`` sequences over ``rows`` rows each took ``seconds``: re-checks the route."""
        routing = self.routing(batch)
        if routing is not None:
            routing.observe(rows, seconds)

    def new_cache(self):
        """An empty KV cache this target can roll back (see cache.py)."""
        return new_cache()

    def prefill(self, cache, tokens: np.ndarray) -> None:
        """Run tokens [T] through the model into the cache (their logits are not needed)."""
        if tokens.shape[0] == 0:
            return
        ids = to_device(tokens, self.device)[None]  # [1, T]
        self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)

    def forward(self, cache, tokens: np.ndarray, offsets: np.ndarray, local_mask: np.ndarray, past: int,
                keep: np.ndarray) -> torch.Tensor:
        """Logits [K, V] (on the device) of rows ``keep`` [K] of one step.

        tokens[Q] sit at positions past + offsets[Q]; local_mask[Q, Q] says
        which step rows each row sees (all of the past, minus a sliding window).
        """
        dev = self.device
        offsets_t = to_device(offsets, dev)  # [Q]
        keep_t = to_device(keep, dev)  # [K]
        mask = None  # x alone under full attention sees every cached row: a plain decode step, no mask to build
        if tokens.shape[0] > 1 or not self.plain_single_row:
            local = to_device(local_mask, dev)  # [Q, Q]
            mask = model_mask(self.layout.kinds, self.layout.sliding_window, local, offsets_t, past, self.dtype)
        rows = int(tokens.shape[0])
        with route_mode(self.route(1, rows), rows):
            out = self.model(input_ids=to_device(tokens, dev)[None],  # [1, Q]
                             position_ids=self.positions(past + offsets_t)[None],  # [1, Q]
                             attention_mask=mask, past_key_values=cache, use_cache=True,
                             logits_to_keep=0 if self.select_after else keep_t)  # 0: every row
        logits = out.logits[0]  # [K, V], or [Q, V] when select_after
        return logits.index_select(0, keep_t) if self.select_after else logits

    def forward_batch(self, cache, tokens: torch.Tensor, q_pos: torch.Tensor, visible: torch.Tensor,
                      k_pos: torch.Tensor) -> torch.Tensor:
        """Logits [A, Q, V] (on the device) of a batched step.

        tokens [A, Q] sit at positions q_pos [A, Q]; visible [A, Q, P+Q] says which cache
        slots and step rows each row sees (holes and padding hidden); k_pos [A, P+Q] is the
        position of every key, per row (for sliding windows).
        """
        mask = batch_model_mask(self.layout.kinds, self.layout.sliding_window, visible, q_pos, k_pos, self.dtype)
        batch, rows = tokens.shape
        with route_mode(self.route(batch, rows), int(tokens.numel())):
            out = self.model(input_ids=tokens, position_ids=self.positions(q_pos), attention_mask=mask,
                             past_key_values=cache, use_cache=True)
        return out.logits  # [A, Q, V]
