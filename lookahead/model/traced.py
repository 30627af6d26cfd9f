"""A step's forward replayed from a TorchScript trace: the model's ops without the Python around them.

On the CPU a forward of a small model over a few rows spends as much time in
Python as in its ops: transformers' modules, their keyword handling and
torch's per-op dispatch from Python run some 5,000 times a step (``lookahead
roofline`` times a step's ops and the time they leave to Python).
``torch.jit.trace`` records the ops of one forward once; replaying the record
runs the same ops in the same order from C++, so its logits and its cache
writes are the eager forward's to the bit.

A trace records sizes read from tensors as sizes, not as constants, so one
trace serves every step length and every past: the forward's inputs are
tensors whose sizes say them (``TraceLayer``):

- the step's tokens and positions [A, Q], the kept rows [K] and its 4-D mask
  [A, 1, Q, P + Q] (mask.py; absent for a plain one-row step where no trace is
  made);
- the KV buffer [2, L, A, H, C, D] of the cache's arena (cache.py): each
  layer's new rows are written at slots P .. P + Q - 1 and it attends over
  slots 0 .. P + Q - 1, as ``SlotLayer`` does;
- ``past``: a tensor of P elements, all one stored value (a size, read by
  the layers).

What a trace cannot follow is Python that branches on a size or a value.
So a trace is made per ``TraceKey`` (the linear route's kind and whether a
mask comes, each of which changes which ops a forward runs), and checked
when made: the eager forward and the trace run the step at hand and the
same step one row and one slot shorter, on copies of the cache, and must
agree to the bit, logits and keys alike. A trace that fails that (or
cannot be made) is never used for its key; those steps run eagerly. The
number of sequences and the number of rows are sizes like the others, so
one trace serves every batch and step length, once it agreed with the eager
forward on a step of that ``Shape`` (a batch size, and one row or several:
where transformers' code would branch on a single row), or for several
sequences on steps of two other batch sizes of several (``serves``); a shape
it does not serve yet is checked on its first step (the eager forward on a
copy of the cache, the trace replayed in place, compared to the bit), and a
shape where it disagrees runs eagerly. Target gives a traced model's one-row
steps a mask too, so that one trace serves every step of a process (a trace
costs about a second to make; an unmasked one-row step is no faster replayed).

Linear layers routed to lookahead's kernel (fewrows.py) are recorded as an op
told the route at run time, so the trace calls the kernel too: the C++ op
``lookahead_native::linear`` (native/, built once per machine), which calls
the kernel without the interpreter, or where that cannot be built (or
``native`` is off) fewrows.py's ``lookahead::linear``, whose kernel runs in
Python (the interpreter's call on every linear of every step: `lookahead
bench` with and without --native-linear measures it). Where the C++ library
is loaded and ``native`` is on (its linear op serves, or a GGUF model's layers
of blocks multiply through its ops: quantized.py), a new trace's graph is also
rewritten (fusion.py): each RMS norm and each rotary
half-turn of the queries and keys becomes one op that computes the chain's
result to the bit, and each layer's cache update is one op too (``kv_write``),
which takes SmolLM2's graph from some 3,300 nodes to 1,900; the rewritten
trace is checked as any trace is, and where it disagrees (or fails) the trace
as recorded serves. Hooks on the model's modules would not
run when a trace is replayed, so a step runs eagerly while any forward hook is set (``hooked``);
a model with accelerate's hooks (offload, device maps) is never traced
(``traceable``).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from ..native.build import fused_ops
from .cache import Arena
from .fewrows import ROUTE_CODES, TILED_CODE, FewRowLinear, linear_op
from .fusion import Fused, fused

# When a kind is traced: once its eager steps have taken as long as making and checking a trace takes (as
# renting skis until the rent paid reaches the price: a bounded multiple of the better choice's cost, and
# kinds a process seldom runs are never traced). A trace's cost is the last one measured; before any,
# this many of the kind's mean eager step (a guess at the ratio of making and checking a trace to one
# eager step; the first trace made replaces it with the measured ``trace_seconds``).
TRACE_STEPS_GUESS = 25
# ... waiting for twice that: a one-off call of a few dozen tokens then does not pay for a trace it would
# not use long; a server or a session of calls traces within its first calls. Where the caller says how many
# steps it may still run (``horizon``), the steps to come count as if run already: a call that may run long
# enough traces at its second step instead of after its price in eager steps (a one-off `lookahead
# generate` of 128 tokens). (A smaller guess or patience makes short decodes, such as the test suite's,
# pay for traces they do not use long.)
TRACE_PATIENCE = 2.0
# Why the onednn route's steps run eagerly: a trace would hold its packed weights as constants, and torch's
# tracer refuses oneDNN's opaque tensors there ("Unsupported value kind: Tensor", torch 2.13).
ONEDNN_UNTRACED = "the onednn route is not traced: torch's tracer cannot hold oneDNN's packed weights as constants"

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from .attention import GroupedAttention


@dataclass(frozen=True)
class TraceKey:
    """What decides which ops a forward runs, beyond the sizes a trace follows: the linear route's part
    (``trace_linear``: ``"any"`` or ``"onednn"``) and whether a mask comes. (The number of sequences
    and the row count are sizes too: a trace serves every ``Shape`` it has been checked at,
    ``TracedForward.checked``.)"""

    linear: str
    masked: bool  # the step comes with a 4-D mask (Target gives every step one where it traces)


Shape = tuple[int, str]  # a step's number of sequences and its row count's class (``row_class``)


def shape_of(tokens: torch.Tensor) -> Shape:
    """The shape of a step with tokens [A, Q] that a trace is checked at: (A, row_class(Q))."""
    return tokens.shape[0], row_class(tokens.shape[1])


def row_class(rows: int) -> str:
    """The row counts a trace is checked at apart: 1 -> "1", more -> "2+" (the linear layers' route
    follows the row count at run time, inside the linear op)."""
    return "1" if rows == 1 else "2+"


def trace_linear(route: str | None) -> str:
    """The TraceKey's linear part of a forward through ``route`` (a Route's linear; None: torch as set):
    "onednn" (never traced: ONEDNN_UNTRACED) or "any" (every other route, told at run time)."""
    return "onednn" if route == "onednn" else "any"


class TraceLayer(DynamicLayer):
    """One layer's keys and values in its slices of the KV buffer [A, H, C, D]: the step's rows go to
    slots P .. P + Q - 1, with P read as the size of ``past`` (so a trace keeps it a size)."""

    keys: torch.Tensor  # [A, H, C, D]
    values: torch.Tensor

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, past: torch.Tensor, write: Any = None):
        super().__init__()
        self.keys, self.values, self.past = keys, values, past
        self.write = write  # native/fused.cpp's kv_write (one node in a trace), or None: the same in Python
        self.is_initialized = True
        self.device = keys.device

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if self.write is not None:
            return self.write(self.keys, self.values, key_states, value_states, self.past)
        past, rows = self.past.size(0), key_states.size(2)
        self.keys.narrow(2, past, rows).copy_(key_states)
        self.values.narrow(2, past, rows).copy_(value_states)
        return self.keys.narrow(2, 0, past + rows), self.values.narrow(2, 0, past + rows)  # [A, H, P + Q, D]

    def get_seq_length(self) -> int:
        return 0  # (not used: positions and the mask come given)


class TraceCache(DynamicCache):
    """The cache a traced forward writes: every layer a ``TraceLayer`` over the buffer [2, L, A, H, C, D]."""

    def __init__(self, buffer: torch.Tensor, past: torch.Tensor, write: Any = None):
        keys, values = buffer.unbind(0)  # [L, A, H, C, D] each: two nodes of a trace, not one per layer and buffer
        Cache.__init__(self, layers=[TraceLayer(k, v, past, write) for k, v in zip(keys.unbind(0), values.unbind(0))])


class TracedForward:
    """The traced forwards of one model, one per ``TraceKey``, made when the key's eager steps have cost
    what a trace costs (``due``) and checked then."""

    def __init__(self, model: PreTrainedModel, cache_keyword: str, attention: GroupedAttention,
                 linears: FewRowLinear, native: bool):
        self.model = model
        self.linears = linears  # its routed linear layers, recorded as ``op``
        # The linear op the traces record: the C++ op where the linears loaded it (native/build.py), else
        # fewrows.linear_op; native_failure: why the C++ op could not be had, where it was asked for.
        self.op: Any = linears.native_op if linears.native_op is not None else linear_op
        self.native_failure = linears.native_failure
        # route code -> trace input (the kernel route's float32 products through the tiled kernel where the
        # linears have it, as their eager forward computes them)
        self.codes = {code: torch.tensor(code) for code in (*ROUTE_CODES.values(), TILED_CODE)}
        self.cache_keyword = cache_keyword
        self.attention = attention
        self.traces: dict[TraceKey, Any] = {}  # key -> its torch.jit trace
        self.failures: dict[TraceKey, str] = {}  # key -> why its steps run eagerly
        self.checked: dict[TraceKey, set[Shape]] = {}  # key -> the shapes (``shape_of``) its trace agreed at
        self.refused: set[tuple[TraceKey, Shape]] = set()  # (key, shape) where its trace did not agree
        self.eager: dict[TraceKey, tuple[int, float]] = {}  # key -> (its eager steps, their seconds) so far
        self.trace_seconds: float | None = None  # what the latest trace took to make and check
        # Rewrite each trace's RMS norms and rotary half-turns as one C++ op each (fusion.py) where the C++ ops
        # are asked for (``native``) and their library is loaded: by the linears (native_op), or by a GGUF
        # model's layers of blocks, whose products are that library's own ops; fusions: key -> the rewrite
        # its trace runs.
        self.fuse = native and fused_ops()
        self.fusions: dict[TraceKey, Fused] = {}
        self.kv_write = torch.ops.lookahead_native.kv_write if self.fuse else None  # TraceLayer's cache update
        self.compile_seconds = 0.0  # seconds the latest step spent making or checking a trace (not its forward's cost)
        self.patience = TRACE_PATIENCE  # trace a kind once its eager steps took this many times a trace's cost
        # where the model's first parameter is held (``_weights``): its module and name there
        first = next((name for name, _ in model.named_parameters()), None)
        self.first: tuple[torch.nn.Module, str] | None = None if first is None else \
            (model.get_submodule(first.rpartition(".")[0]), first.rpartition(".")[2])
        self.weights = self._weights()  # what the traces were made over
        # every module's forward hooks and pre-hooks: the dicts ``register_forward_hook`` and the like add to
        # (each made once with its module and changed in place)
        self.hook_dicts = [d for m in model.modules() for d in (m._forward_hooks, m._forward_pre_hooks)]

    def _weights(self) -> tuple:
        """Where the model's first weight lives: moving or casting the model (which a trace, holding its
        tensors as constants, would not follow) changes this. (Linear layers swapped for the kernel's routed
        weights, fewrows.py, share storage with theirs.) Read where it is held, found once (finding it on
        every call would walk the modules every step): ``Module.to`` and the casts give it new data in place,
        ``load_state_dict(assign=True)`` a new parameter there."""
        if self.first is None:
            return ()
        module, name = self.first
        weight = module._parameters[name]
        return (weight.data_ptr(), weight.dtype, weight.device) if weight is not None else ()

    def serves(self, key: TraceKey, shape: Shape) -> bool:
        """Whether ``key``'s trace serves steps of ``shape`` with no check (a step of that shape replays it
        with nothing to make or check: the caller then sets only the route's threads and calls
        ``step(replay_only=True)``, which finds moved weights and returns None): it agreed at that shape, or (several
        sequences) at two other batch sizes of several with the same row class and was refused at none. A
        batch size that transformers' Python turned into a constant of the trace (an ``int()`` of a size)
        shows at every batch size but the one it was made at, so two sizes that agree rule it out; only a
        branch on particular sizes above one would not show, which no tested model has.

        Checked at (2, "2+") and (3, "2+"): (4, "2+") and (8, "2+") served; (4, "1") not (another row
        class), nor (1, "2+") (one sequence is a class of its own)."""
        checked = self.checked.get(key)
        if checked is None:
            return False
        if shape in checked:
            return True
        count, rows = shape
        if count < 2 or len({a for a, r in checked if r == rows and a >= 2}) < 2 \
                or any(k == key and a >= 2 and r == rows for k, (a, r) in self.refused):
            return False
        checked.add(shape)  # (found at once from now on)
        return True

    def step(self, key: TraceKey, route: str | None, arena: Arena, tokens: torch.Tensor, positions: torch.Tensor,
             mask: torch.Tensor | None, keep: torch.Tensor, past: int,
             replay_only: bool = False, horizon: int = 0) -> torch.Tensor | None:
        """Logits [A, K, V] of rows ``keep`` [K] of the step (tokens and positions [A, Q], ``mask``
        [A, 1, Q, P + Q] or None for one plain row), written into ``arena`` after its ``past`` filled
        slots, its linear layers through ``route`` (a Route's linear, None: torch's); None where no checked
        trace serves ``key`` (then the caller runs the step eagerly, the arena untouched). A trace is made
        or checked here only inside the route's whole ``route_mode`` (the weights routed: an oneDNN trace
        records the packed weights); ``replay_only``: the caller set its threads alone, so a step that
        ``key``'s trace does not ``serve`` returns None. ``horizon``: the most steps the caller may still run,
        this one included (0: not known; ``due``)."""
        weights = self._weights()
        if weights != self.weights:
            for made in (self.traces, self.failures, self.checked, self.refused, self.eager, self.fusions):
                made.clear()
            self.weights = weights
        self.compile_seconds = 0.0
        shape = shape_of(tokens)
        if key in self.failures or (key, shape) in self.refused or self.hooked() \
                or any(layer.length != past for layer in arena.members):
            return None
        trace = self.traces.get(key)
        if replay_only and (trace is None or not self.serves(key, shape)):
            return None
        if trace is None and not self.due(key, horizon):
            return None
        rows = tokens.shape[1]
        arena.reserve(past + rows)
        buffer = arena.buffer
        assert buffer is not None, "an arena that holds its layers has a buffer"
        code = self.codes[TILED_CODE if route == "kernel" and self.linears.tiled is not None
                          else ROUTE_CODES.get(route or "torch", 0)]
        inputs = (tokens, positions, keep, self._past(past, buffer), buffer, code) \
            + ((mask,) if mask is not None else ())
        if trace is not None and not self.serves(key, shape):
            began = time.perf_counter()
            checked, forward = self._checked_at(key, trace, inputs)  # the step itself, checked as it runs
            self.compile_seconds = time.perf_counter() - began - forward
            if checked is None:
                return None
            logits = checked
        else:
            if trace is None:
                began = time.perf_counter()
                trace = self._new_trace(key, inputs)
                self.compile_seconds = time.perf_counter() - began
                if trace is None:
                    return None
            logits = replay(trace, inputs)
        end = past + rows
        for layer in arena.members:
            layer.length = end
        arena.filled = max(arena.filled, end)
        return logits

    def hooked(self) -> bool:
        """Whether a forward hook is set on the model or any module of it, or on every module: a replayed
        trace would skip it (a hook may change what a layer computes), so such steps run eagerly."""
        if torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks:
            return True
        return any(self.hook_dicts)  # (a dict's truth is read in C: one pass over prebuilt dicts a step, not
        # a generator over every module's attributes)

    def due(self, key: TraceKey, horizon: int = 0) -> bool:
        """Whether to trace ``key`` now: some kind was traced already (this process steps long enough), or
        the eager steps so far, and the ``horizon`` steps the caller may still run at their mean, take as long
        as a trace costs (times ``patience``). (Counted over every kind: the budget, seeing one kind's steps
        get cheaper, may keep choosing it, and the others would never earn a trace of their own.)

        Worked example (patience 2, no trace made yet, so a trace is priced at TRACE_STEPS_GUESS = 25 mean
        eager steps): after one eager step, a call with 127 steps still possible traces now (1 + 127 >= 50
        steps' worth); one with 11 never does (1 + 11 < 50); with no horizon, the step after the
        50th eager one traces."""
        if self.traces:
            return True
        steps = sum(n for n, _ in self.eager.values())
        seconds = sum(t for _, t in self.eager.values())
        cost = self.trace_seconds if self.trace_seconds is not None \
            else TRACE_STEPS_GUESS * seconds / steps if steps else 0.0
        ahead = seconds / steps * horizon if steps else 0.0  # the steps to come, at the eager mean so far
        return seconds + ahead >= self.patience * cost and (steps > 0 or self.patience == 0)

    def ran_eagerly(self, key: TraceKey, seconds: float) -> None:
        """A step of ``key`` ran eagerly (no trace yet) and took ``seconds``."""
        steps, total = self.eager.get(key, (0, 0.0))
        self.eager[key] = (steps + 1, total + seconds)

    @staticmethod
    def _past(past: int, buffer: torch.Tensor) -> torch.Tensor:
        """A tensor of ``past`` elements (one value stored): the layers read P as its size."""
        return buffer.new_zeros(1).expand(past)

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, keep: torch.Tensor, past: torch.Tensor,
                 buffer: torch.Tensor, route: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The forward a trace records: logits [A, K, V] of rows ``keep``; ``route`` (a 0-d int64 tensor,
        fewrows.ROUTE_CODES) is read by the linear layers while the forward is recorded."""
        with self.attention.switched():
            out = self.model(input_ids=tokens, position_ids=positions, attention_mask=mask, use_cache=True,
                             logits_to_keep=keep, **{self.cache_keyword: TraceCache(buffer, past, self.kv_write)})
        return out.logits

    def _records_linears(self, key: TraceKey, trace: Any) -> bool:
        """Whether ``trace`` calls the linear op for every routed linear layer (a kernel called from Python
        without it would have been recorded as its output, a constant)."""
        graph = str(trace.graph)
        return key.linear != "any" or graph.count("lookahead::linear") + graph.count("lookahead_native::linear") \
            >= len(self.linears.layers)

    @contextmanager
    def _recording(self, key: TraceKey, route: torch.Tensor) -> Iterator[None]:
        """The body traces or checks ``key``'s forward: no gradients (a trace holds the weights as
        constants, which must not require grad), the linear layers routed to the linear op (``op``)
        told ``route`` (a 0-d int64 tensor) where the key takes any route, tracing's warnings about
        Python values in transformers' code silenced."""
        parameters = list(self.model.parameters())
        grads = [p.requires_grad for p in parameters]
        recording = self.linears.recording
        try:
            for p in parameters:
                p.requires_grad_(False)
            with warnings.catch_warnings(), torch.no_grad(), \
                    (self.linears.routed() if key.linear == "any" else nullcontext()):
                recording.route = route if key.linear == "any" else None
                recording.op = self.op
                warnings.simplefilter("ignore")
                yield
        finally:
            recording.route = None
            for p, grad in zip(parameters, grads):
                p.requires_grad_(grad)

    def _new_trace(self, key: TraceKey, inputs: tuple) -> Any:
        """The trace for ``key`` made from the step ``inputs`` and checked (``agrees``); None (and the key's
        failure noted) where it cannot be made or does not agree with the eager forward."""
        if key.linear == "onednn":
            self.failures[key] = ONEDNN_UNTRACED
            return None
        began = time.perf_counter()
        try:
            with self._recording(key, inputs[5]):
                trace = torch.jit.trace(self._forward, inputs, check_trace=False)
                agree = self._records_linears(key, trace)
                rewritten = fused(trace) if agree and self.fuse else None
                if rewritten is not None and self._rewrite_agrees(rewritten.function, inputs):
                    trace = rewritten.function
                    self.fusions[key] = rewritten
                else:
                    agree = agree and self._agrees_twice(trace, inputs)
        except Exception as error:  # noqa: BLE001  (whatever tracing raises: that key runs eagerly)
            self.failures[key] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            return None
        self.trace_seconds = time.perf_counter() - began
        if not agree:
            self.failures[key] = "the trace's logits or keys differ from the eager forward's"
            return None
        self.traces[key] = trace
        self.checked[key] = {shape_of(inputs[0])}
        return trace

    def _agrees_twice(self, trace: Any, inputs: tuple) -> bool:
        """Whether ``trace`` agrees with the eager forward on the step ``inputs`` and on a shorter one
        (``varied``): a trace that follows sizes and holds no value of the step it was made from does."""
        return agrees(self._forward, trace, inputs) and agrees(self._forward, trace, varied(inputs))

    def _rewrite_agrees(self, function: Any, inputs: tuple) -> bool:
        """``_agrees_twice`` for a rewritten trace, False where it raises (the trace as recorded is then
        checked, and serves where it agrees)."""
        try:
            return self._agrees_twice(function, inputs)
        except Exception:  # noqa: BLE001  (whatever the rewritten graph raises: the recorded one is tried)
            return False

    def _checked_at(self, key: TraceKey, trace: Any, inputs: tuple) -> tuple[torch.Tensor | None, float]:
        """The step ``inputs``, of a shape (batch size and row class) ``key``'s trace was not checked at
        yet, replayed in place where it agrees with the eager forward (run on a copy of the cache), and the
        seconds of that replay (the step's own forward; the rest was the check's). (None, 0.0) where it
        does not agree or cannot run: the cache then holds what the eager forward wrote, and the step runs
        eagerly (writing the same again). The answer is kept for that shape."""
        shape = shape_of(inputs[0])
        try:
            with self._recording(key, inputs[5]):
                logits, forward = agreed(self._forward, trace, inputs, in_place=True)
        except Exception:  # noqa: BLE001  (a trace that cannot run this shape: it runs eagerly)
            logits, forward = None, 0.0
        if logits is not None:
            self.checked[key].add(shape)
        else:
            self.refused.add((key, shape))
        return logits, forward


def traceable(model: torch.nn.Module) -> bool:
    """Whether a trace can stand for ``model``'s forward: no accelerate hooks (offloaded or dispatched
    layers, whose weights move during a forward) and every parameter a plain tensor (not a quantized
    subclass with a forward of its own)."""
    return all(getattr(m, "_hf_hook", None) is None for m in model.modules()) \
        and all(type(p) in (torch.Tensor, torch.nn.Parameter) for p in model.parameters())


def replay(trace: Any, inputs: tuple) -> torch.Tensor:
    """``trace`` run on ``inputs`` by TorchScript's plain interpreter: its optimising executor would
    re-specialise the graph for every new step length and past (recompiling as a decode goes) and may
    fuse ops into kernels of its own, which would no longer add up as the eager forward does."""
    with torch.jit.optimized_execution(False):
        return trace(*inputs)


def varied(inputs: tuple) -> tuple:
    """Another step for the same trace to run: other tokens (each id halved), one past slot fewer and,
    with several rows, the last row dropped (a row's ancestors come before it, so the first Q - 1 rows
    are a step of their own; the kept rows limited to those). A trace that follows sizes and holds no
    value of the step it was made from runs it as the eager forward does."""
    tokens, positions, keep, past, buffer, route = inputs[:6]
    rows = tokens.shape[1]
    shorter = past[1:] if past.shape[0] > 0 else past
    drop = 1 if past.shape[0] > 0 else 0  # (mask columns: the first past slot's)
    if len(inputs) < 7:
        return tokens // 2, positions - drop, keep, shorter, buffer, route
    mask = inputs[6]  # [A, 1, Q, P + Q]
    if rows < 2:
        return tokens // 2, positions - drop, keep, shorter, buffer, route, mask[..., drop:].contiguous()
    kept = keep[keep < rows - 1]
    kept = kept if kept.numel() else keep[:1].clamp_max(rows - 2)
    return (tokens[:, :-1] // 2, positions[:, :-1] - drop, kept, shorter, buffer, route,
            mask[:, :, :-1, drop:-1].contiguous())


def agrees(eager: Any, trace: Any, inputs: tuple) -> bool:
    """Whether ``trace`` and ``eager`` give the same logits to the bit and write the same keys and values,
    each run on its own copy of the buffer (inputs[4])."""
    return agreed(eager, trace, inputs)[0] is not None


def agreed(eager: Any, trace: Any, inputs: tuple, in_place: bool = False) -> tuple[torch.Tensor | None, float]:
    """(The trace's logits of the step ``inputs`` where they and the keys and values it writes are the eager
    forward's to the bit, else None; the seconds the trace's replay took). The eager forward runs on a copy
    of the buffer (inputs[4]); the trace on another copy, or with ``in_place`` on the buffer itself: a step
    checked as it runs, with one copy and one replay (where they disagree the buffer is given the eager
    forward's writes, so it holds what an eager step would have left)."""
    buffer = inputs[4]
    mine = buffer.clone()
    expected = eager(*inputs[:4], mine, *inputs[5:])
    theirs = buffer if in_place else buffer.clone()
    began = time.perf_counter()
    try:
        got = replay(trace, inputs[:4] + (theirs,) + inputs[5:])
    except Exception:
        if in_place:  # (a replay that failed part-way: the buffer as the eager forward left it)
            buffer.copy_(mine)
        raise
    seconds = time.perf_counter() - began
    if same(expected, got) and same(mine, theirs):
        return got, seconds
    if in_place:
        buffer.copy_(mine)
    return None, seconds


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to the bit: floats compared as integers of their width, so a NaN equals a NaN of the same bits
    (a buffer's slots past those written are uninitialised memory, which may hold NaNs, copied alike into
    both copies). One pass, no temporaries (``isclose`` would allocate and compare a float buffer)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """A float tensor's elements as signed integers of the same width (a view); any other tensor as it is."""
    if not tensor.is_floating_point():
        return tensor
    width = tensor.element_size()
    return tensor.view(torch.int64 if width == 8 else torch.int32 if width == 4 else torch.int16 if width == 2
                       else torch.int8)
