"""ONE forward of the target model over a step's rows -> the kept rows' logits, on the device.

The decode loop and the cost model (cost/measure.py) both go through ``Target``,
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

from contextlib import nullcontext
from typing import TYPE_CHECKING

import numpy as np
import torch

from .attention import GroupedAttention
from .cache import SlotCache, arena_of, cache_keyword, new_cache
from .fewrows import FEW_ROWS_MAX, FewRowLinear
from .graphs import StepGraphs
from .mask import PastSlots, step_mask
from .prefill import PrefillChoice
from .quantized import TILES_ROWS_MIN, embedding_facts, kernel_only, quantized_linears
from .routing import Route, Routing
from .stepways import EagerStep, GraphedStep, ReplayedStep, StepCall, StepWay
from .support import AttentionLayout, context_length
from .switches import ForwardSwitches
from .traced import TracedForward, TraceKey, trace_linear, traceable

if TYPE_CHECKING:
    from transformers import Cache, PreTrainedModel


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array as a tensor on device, without a host sync (host -> device copies are staged)."""
    return torch.from_numpy(np.ascontiguousarray(array)).to(device, non_blocking=True)


NUMPY_ARGMAX = (torch.float32, torch.float64)  # dtypes whose CPU argmax numpy takes


def row_argmax(scores: torch.Tensor) -> torch.Tensor:
    """scores [R, V].argmax(-1) [R] (int64), on the scores' device: how a step's logits are read (the verifier's
    greedy choice, and the cost measurement's timed steps, so that they cost what the decode loop's do).

    On the CPU numpy's argmax reads a row several times faster than torch's
    (a vocabulary row, read on every verified row); both return the first maximal index, NaN
    counting as the maximum, so the result is the same. [[1 3 3] [nan 0 5]] -> [1 0].
    """
    if scores.device.type == "cpu" and scores.dtype in NUMPY_ARGMAX and not scores.requires_grad:
        return torch.from_numpy(scores.numpy().argmax(-1).astype(np.int64, copy=False))
    return scores.argmax(-1)


def hook_execution_device(module: torch.nn.Module) -> torch.device | None:
    """The execution device of accelerate's hook on module (a device_map model), or None."""
    hook = getattr(module, "_hf_hook", None)
    for part in getattr(hook, "hooks", (hook,)):  # a SequentialHook holds several
        device = getattr(part, "execution_device", None)
        if device is not None:
            return torch.device(device)
    return None


def input_device(model: PreTrainedModel) -> torch.device:
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
    return embedding_facts(model)[0]


def device_key(where: int | str | torch.device) -> tuple[str, int]:
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


def spans_devices(model: torch.nn.Module, main: torch.device) -> bool:
    """Whether a device_map runs layers on a device other than main (CPU/disk offload runs on main)."""
    placement = getattr(model, "hf_device_map", None) or {}
    return bool({device_key(where) for where in placement.values()} - {("cpu", 0), ("disk", 0), device_key(main)})


class Target:
    """A stock transformers causal LM driven with custom masks and positions."""

    def __init__(self, model: PreTrainedModel, layout: AttentionLayout, switches: ForwardSwitches | None = None):
        """``switches`` (switches.py; default: ForwardSwitches()): ``graphs``, run one sequence's steps as CUDA
        graphs (graphs.py) where the model is on a CUDA device, every layer attends fully and the layers sit
        on one device; ``traced``, on the CPU, replay steps from checked TorchScript traces (traced.py) where
        every layer attends fully; ``native``, their linear layers through the C++ op (native/) where it can
        be built, and the kernel route's float32 products, eager or traced, through its tiled kernel
        (fewrows.py); ``attention``, with that op's library loaded, a float32 step's grouped-query attention
        through its kernel (attention.py); ``few_row_matmul``, prompts prefill through that op's tiled kernel
        where it measures faster than torch's (prefill.py)."""
        switches = switches or ForwardSwitches()
        graphs, traced, native = switches.graphs, switches.traced, switches.native
        self.model = model
        self.layout = layout
        self.cache_keyword = cache_keyword(model)  # how the forward takes the KV cache (transformers' version)
        # Batch size -> how its forwards run on this CPU (threads, whose linear kernel), measured with
        # the cost curve (cost/measure.py); without one a forward runs as torch is set.
        self.routings: dict[int, Routing] = {}
        self.linears = FewRowLinear(model, native)  # its linear layers, for the routes that reroute them
        # whose kernel prefills prompts: measured on the first ones, where the tiled kernel takes float32 weights
        self.prefills = PrefillChoice(self.linears if switches.few_row_matmul and self.linears.tiled is not None
                                      and input_device(model).type == "cpu" else None)
        text = model.config.get_text_config(decoder=True)
        self.layers = getattr(text, "num_hidden_layers", None)  # decoder layers: the KV cache's arena (cache.py)
        # grouped heads under a mask without copies (attention.py), through the C++ op's kernel where it is loaded
        self.attention = GroupedAttention(model, native and switches.attention)
        self.last_route = ""  # the label of the route the latest forward ran through ("": as torch is set)
        # seconds of the latest step spent compiling its forward (making or checking a trace, capturing a CUDA
        # graph), not the forward's own cost
        self.compile_seconds = 0.0
        self.trying = False  # the latest step ran a route its routing was trying (routing.py), not the chosen one
        self.device = input_device(model)
        self.blocks = quantized_linears(model)  # its layers of GGUF blocks: a step's rows through their kernel
        _, self.dtype, self.vocab = embedding_facts(model)  # the embedding's output dtype and rows [V]
        # The last layer's hidden states can sit on another device than the kept-row
        # indices: then the model returns every row's logits and the rows are picked here.
        self.select_after = spans_devices(model, self.device)
        self.context = context_length(model.config)  # max_position_embeddings, or None
        # A one-row step needs no mask when no layer slides: the model's own causal mask is all-visible.
        self.plain_single_row = layout.sliding_window is None or layout.kinds == frozenset({"full_attention"})
        self.graphs: StepGraphs | None = None
        if graphs and self.device.type == "cuda" and self.plain_single_row and not self.select_after:
            self.graphs = StepGraphs(model, self.cache_keyword, self.attention, self.dtype, capture=True,
                                     positions=self.positions)
        self.traced: TracedForward | None = None
        if traced and self.device.type == "cpu" and layout.kinds == frozenset({"full_attention"}) \
                and not self.select_after and traceable(model):
            self.traced = TracedForward(model, self.cache_keyword, self.attention, self.linears, native)
        self.ways: tuple[StepWay, ...] = (GraphedStep(self), ReplayedStep(self), EagerStep(self))  # (stepways.py)

    def long_lived(self) -> None:
        """This target steps for a long-lived process (a server): with a traced forward, each step kind is
        traced on sight, its cost paid once for every request to come (traced.py's ``patience`` 0)."""
        if self.traced is not None:
            self.traced.patience = 0.0

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
        batch whose rows finished), else for the largest smaller one (a batch size whose curve an open
        batch has not measured yet, cost/policy.py), else None."""
        if batch in self.routings:
            return self.routings[batch]
        larger = [b for b in self.routings if b > batch]
        if larger:
            return self.routings[min(larger)]
        return self.routings[max(self.routings)] if self.routings else None

    def route(self, batch: int, rows: int) -> Route | None:
        """The route a forward of ``batch`` sequences over ``rows`` rows each runs through (None: torch as set)."""
        routing = self.routing(batch)
        route = routing.route_for(rows) if routing is not None else None
        self.last_route = route.label if route is not None else ""
        self.trying = routing is not None and routing.trying
        return route

    def observe(self, batch: int, rows: int, seconds: float) -> None:
        """A step of ``batch`` sequences over ``rows`` rows each took ``seconds``: re-checks the route."""
        routing = self.routing(batch)
        if routing is not None:
            routing.observe(rows, seconds)

    def new_cache(self) -> SlotCache:
        """An empty KV cache this target can roll back (see cache.py)."""
        return new_cache(self.layers)

    def traced_step(self, call: StepCall, replay_only: bool) -> torch.Tensor | None:
        """Logits [A, K, V] of the step replayed from its key's trace (traced.py's ``step``; made or checked
        there unless ``replay_only``), or None: the step runs eagerly. Notes what making or checking a trace
        took (``compile_seconds``) and the route."""
        assert self.traced is not None and call.key is not None and call.arena is not None, "a traced step"
        assert call.q_pos is not None and call.keep_t is not None, "a prepared step"
        logits = self.traced.step(call.key, call.linear, call.arena, to_device(call.tokens, self.device),
                                  self.positions(call.q_pos), call.traced_mask, call.keep_t, call.past, replay_only,
                                  call.horizon)
        self.compile_seconds = self.traced.compile_seconds
        if logits is not None:
            self.last_route = f"{self.last_route} traced".strip()
        return logits

    def prefill(self, cache: Cache, ids: np.ndarray, mask: np.ndarray | None = None,
                positions: np.ndarray | None = None, chunk: int = 0) -> None:
        """Run prompt tokens ids [A, T] through the model into the cache (their logits are not needed);
        with left padding, its attention ``mask`` [A, T] and each token's ``positions`` [A, T]. ``chunk`` > 0 (one
        unpadded prompt): forwards of at most that many columns, one after the other, where the caller knows they
        give a whole prefill's bits (model/prefixes.py's ``reuse_is_exact``)."""
        if ids.shape[1] == 0:
            return
        if chunk > 0 and mask is None and ids.shape[1] > chunk:
            for start in range(0, ids.shape[1], chunk):
                self.prefill(cache, ids[:, start:start + chunk])
            return
        dev = self.device
        padded = {}
        if mask is not None:
            assert positions is not None, "a padded prompt comes with its positions"
            padded = dict(attention_mask=to_device(mask, dev), position_ids=to_device(positions, dev))
        with self.prefills.running(ids.shape[0] * ids.shape[1]):
            self.model(input_ids=to_device(ids, dev), use_cache=True, logits_to_keep=1,
                       **{self.cache_keyword: cache}, **padded)

    def step(self, cache: Cache, tokens: np.ndarray, positions: np.ndarray, local: np.ndarray, keep: np.ndarray,
             past: int, slots: PastSlots | None = None, horizon: int = 0) -> torch.Tensor:
        """Logits [A, K, V] (on the device) of rows ``keep`` [K] of one step of A sequences.

        tokens [A, Q] sit at positions [A, Q]; local [A, Q, Q] says which step rows each row sees;
        the cache's ``past`` slots are all visible (``slots`` None: one sequence) or as ``slots``
        says (mask.py). The first of the target's ways (stepways.py: graphed, replayed, eager) that runs
        the step gives its logits; every row goes through the layers' few-row kernels, however many
        (``kernel_only``). ``horizon``: the most steps the caller may still run, this one included (0: not
        known), which tells the traced forward whether a trace made now can pay for itself (traced.py's ``due``).
        """
        self.compile_seconds, self.trying = 0.0, False
        call = StepCall(cache, tokens, positions, local, keep, past, slots, horizon)
        with kernel_only(self.blocks) if self.blocks and tokens.shape[1] >= TILES_ROWS_MIN else nullcontext():
            for way in self.ways:
                logits = way.run(call)
                if logits is not None:
                    return logits  # [A, K, V]
        raise AssertionError("the eager way runs every step")

    def prepare(self, call: StepCall) -> None:
        """What the eager and replayed ways read, derived once: positions and kept rows on the device, the
        step's mask, its route and linear kernel, and the trace key where the target traces."""
        if call.prepared:
            return
        dev = self.device
        count, rows = call.tokens.shape
        call.q_pos = to_device(call.positions, dev)  # [A, Q]
        call.keep_t = to_device(call.keep, dev)  # [K]
        # (x alone under full attention sees every cached row: a plain decode step needs no mask, but a traced
        # model's one-row steps take one too, so that one trace serves every step, traced.py; and so does a
        # step through lookahead's attention op, so that a one-row step attends as a multi-row one does: a
        # row's bits then do not depend on the step's row count)
        if rows > 1 or call.slots is not None or not self.plain_single_row or self.traced is not None \
                or self.attention.native:
            call.mask = step_mask(self.layout.kinds, self.layout.sliding_window, to_device(call.local, dev),
                                  call.q_pos, call.past, call.slots, self.dtype)
        call.route = self.route(count, rows)
        call.linear = call.route.linear if call.route is not None and count * rows <= FEW_ROWS_MAX else None
        if self.traced is not None and (call.mask is None or call.traced_mask is not None):
            call.arena = arena_of(call.cache)
            if call.arena is not None:
                call.key = TraceKey(trace_linear(call.linear), call.mask is not None)
        call.prepared = True

    def forward(self, call: StepCall) -> torch.Tensor:
        """Logits [A, K, V] of the kept rows from the model's own forward (the eager way's)."""
        assert call.q_pos is not None and call.keep_t is not None, "a prepared step"
        out = self.model(input_ids=to_device(call.tokens, self.device), position_ids=self.positions(call.q_pos),
                         attention_mask=call.mask, use_cache=True, **{self.cache_keyword: call.cache},
                         logits_to_keep=0 if self.select_after else call.keep_t)  # 0: every row
        return out.logits.index_select(1, call.keep_t) if self.select_after else out.logits  # [A, K, V]
