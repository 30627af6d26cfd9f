"""Run decoding methods side by side on the same prompts, interleaved per prompt.

Methods (each a ``Method``: a name and ``run(ids [1, T], max_new_tokens) -> Run``):

    greedy         transformers ``model.generate(do_sample=False)`` (the reference)
    sampling       transformers ``model.generate(do_sample=True, ...)`` (the reference in sample mode)
    prompt-lookup  transformers ``prompt_lookup_num_tokens=10``
    assisted       transformers assisted generation with a draft model (optional)
    lookahead      ``LookaheadGenerator`` with the default config
    lookahead-plain  the same ``LookaheadGenerator`` routes with speculation off (``plain_config``:
                   candidates 0, the window x alone): one token a forward through lookahead's
                   own kernels and cache, so lookahead-plain vs greedy is the kernels' gain and
                   lookahead vs lookahead-plain speculation's (benchmarks/report.py ``gain_table``)
    <name>         ``LookaheadGenerator`` with an extra config ``name:window=5,ngram=4``

Every method of one benchmark decodes the same way: greedy, or sampling with
the same ``Sampling`` settings. For every prompt all methods run back to back
(the reference first), so that drift of the machine (another process taking a
core) hits all of them alike, each after ``torch.manual_seed(seed + prompt
index)``. Every method is warmed up once before anything is timed (a lookahead method's generator makes
its step's trace then).

Per prompt and method one record: wall time, tokens/s, speedup against the
reference, target forward passes (prefill included, counted by a forward
pre-hook on the target model), mean tokens accepted per decode forward, whether
the tokens equal the reference's, the mode and seed, and the process's peak RSS
so far. Greedy: the speedup is the wall-time ratio, and in float32 every
lookahead method must match greedy exactly (``check_exact`` raises
``ExactMatchError``). Sampling: outputs differ, so the speedup is the ratio of
new tokens per second and nothing must match.
"""

from __future__ import annotations

import math
import resource
import time
from contextlib import nullcontext
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

import torch

from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.benchmarks.configs import parse_config_spec

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from lookahead.benchmarks.parsers import Prompt

PROMPT_LOOKUP_TOKENS = 10
PLAIN = "lookahead-plain"  # the method that decodes through lookahead's routes without speculating
NEVER_EOS = 2 ** 31 - 1  # an end-of-sequence id no tokenizer has: EOS ignored
REFERENCES = ("greedy", "sampling")  # the first method of a benchmark, by mode


class ExactMatchError(AssertionError):
    """A method that must reproduce greedy decoding produced different tokens."""


@dataclass(frozen=True)
class BenchPrompt:
    """One prompt, already tokenized. ``turn`` is 2 for MT-bench's second turn."""

    dataset: str
    id: str
    input_ids: list[int]
    turn: int = 1


@dataclass(frozen=True)
class Sampling:
    """Sampling settings shared by every method of a sample-mode benchmark.

    None = the model's generation_config value, exactly as model.generate reads it.
    ValueError names the bad field.
    """

    temperature: float = 0.7
    top_k: int | None = None
    top_p: float | None = None
    ignore_eos: bool = False  # decode exactly max_new_tokens (equal lengths make tokens/s comparable)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    def kwargs(self) -> dict:
        """generate() keyword arguments; None fields are left out (a None would override the model's value)."""
        given = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}
        eos = {"eos_token_id": [NEVER_EOS]} if self.ignore_eos else {}
        return {"do_sample": True, **{k: v for k, v in given.items() if v is not None}, **eos}


def decode_kwargs(sampling: Sampling | None) -> dict:
    """generate() keyword arguments of a mode: explicit greedy (the model's default may be sampling)."""
    return sampling.kwargs() if sampling is not None else {"do_sample": False}


def mode_label(sampling: Sampling | None, model: PreTrainedModel) -> str:
    """"greedy", or "sampling T=0.7 top_k=50 top_p=1.0" with the values model.generate will use."""
    if sampling is None:
        return "greedy"
    # the model's generation_config over transformers' defaults, then the given values: what generate reads
    mixin: Any = model  # (GenerationMixin's helpers are typed narrower than these calls)
    config, _ = mixin._prepare_generation_config(None, **sampling.kwargs())  # noqa: SLF001
    label = f"sampling T={config.temperature:g} top_k={config.top_k} top_p={config.top_p:g}"
    return label + (", EOS ignored" if sampling.ignore_eos else "")


@dataclass
class Run:
    """What one method did on one prompt."""

    tokens: list[int]  # new tokens only
    wall_time_s: float
    forwards: int  # target forward passes, prefill included
    accepted: list[int] = field(default_factory=list)  # tokens per decode forward (lookahead only)
    routes: dict[str, int] = field(default_factory=dict)  # decode forwards per route (lookahead on a CPU)
    host_s: list[float] = field(default_factory=list)  # each decode step's host time (lookahead only) ...
    forward_s: list[float] = field(default_factory=list)  # ... and its forward with the read-back


@dataclass
class Method:
    """A named way to decode. ``exact``: must equal greedy token for token (float32)."""

    name: str
    generate: Callable[[torch.Tensor, int], torch.Tensor]  # ids [1, T], M -> [1, T + new]
    exact: bool = False
    generator: LookaheadGenerator | None = None  # set for lookahead methods (per-step stats)
    config: dict | None = None
    sampling: Sampling | None = None  # None = greedy


# ---------------------------------------------------------------- methods

def _hf_generate(model: PreTrainedModel, sampling: Sampling | None,
                 **extra: Any) -> Callable[[torch.Tensor, int], torch.Tensor]:
    mixin: Any = model  # (model.generate is typed narrower than these calls)

    def run(ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        return mixin.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                              **decode_kwargs(sampling), **extra)
    return run


def reference_method(model: PreTrainedModel, sampling: Sampling | None = None) -> Method:
    """transformers greedy ("greedy"), or transformers sampling ("sampling") with these settings."""
    return Method(REFERENCES[sampling is not None], _hf_generate(model, sampling), sampling=sampling)


def prompt_lookup_method(model: PreTrainedModel, sampling: Sampling | None = None) -> Method:
    """transformers' prompt lookup decoding (PROMPT_LOOKUP_TOKENS a step)."""
    return Method("prompt-lookup", _hf_generate(model, sampling, prompt_lookup_num_tokens=PROMPT_LOOKUP_TOKENS),
                  sampling=sampling)


def assisted_method(model: PreTrainedModel, draft: PreTrainedModel, sampling: Sampling | None = None) -> Method:
    """transformers' assisted generation with ``draft``."""
    return Method("assisted", _hf_generate(model, sampling, assistant_model=draft), sampling=sampling)


def lookahead_method(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None,
                     config: LookaheadConfig | None = None, name: str = "lookahead",
                     sampling: Sampling | None = None, draft: PreTrainedModel | None = None) -> Method:
    """Exact (must equal greedy) when greedy; sampled outputs only share the distribution."""
    gen = LookaheadGenerator(model, tokenizer, config or LookaheadConfig(), draft)
    kwargs = decode_kwargs(sampling)

    def run(ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        return cast(torch.Tensor, gen.generate(ids, max_new_tokens=max_new_tokens, **kwargs))  # (no return_dict)

    return Method(name, run, exact=sampling is None, generator=gen, config=asdict(gen.run_config),
                  sampling=sampling)


def plain_config(config: LookaheadConfig) -> LookaheadConfig:
    """``config`` with speculation off and everything else kept: no candidates from any source and
    the window x alone (not opened by auto_window), so every step verifies exactly one token through
    the same routes (few-row kernels, KV cache, host loop) the lookahead method's steps take."""
    return replace(config, candidates=0, window=1, auto_window=False)


# Named configs for `lookahead bench --preset`: LADE's published GPU setting run by our
# engine, the ablations (each candidate source alone; all sources with a fixed budget), and
# the two halves of the gain on the CPU: our kernels without speculation (lookahead-plain, which
# every bench now runs, is the same with the window kept x alone), speculation through torch's
# own kernels.
PRESETS = {
    "lade-gpu": ("window=15,ngram=5,pool_ngram=5,candidates=15,max_tree_nodes=60,budget=fixed,recycle=false,"
                 "context_match=false"),
    "context-only": "ngram_pool=false,recycle=false",
    "pool-only": "context_match=false,recycle=false",
    "recycle-only": "context_match=false,ngram_pool=false",
    "fixed-budget": "budget=fixed",
    "no-speculation": "candidates=0",
    "stock-kernels": "few_row_matmul=false,onednn_linear=true",
}


def preset_specs(names: Iterable[str]) -> list[str]:
    """``--config`` specs of the named presets ("all" = every preset), in PRESETS order."""
    names = set(names)
    unknown = names - set(PRESETS) - {"all"}
    if unknown:
        raise ValueError(f"unknown preset {sorted(unknown)[0]!r}: choose from {', '.join(PRESETS)} or all")
    return [f"{name}:{spec}" for name, spec in PRESETS.items() if name in names or "all" in names]


def default_methods(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None,
                    config: LookaheadConfig | None = None, extra_configs: Iterable[str] = (),
                    draft: PreTrainedModel | None = None, sampling: Sampling | None = None) -> list[Method]:
    """greedy (or sampling), prompt-lookup, [assisted], lookahead, lookahead-plain, [lookahead+draft,
    draft-only], then one lookahead method per extra config.

    lookahead-plain is ``config`` through ``plain_config``: what lookahead's kernels give without
    speculation (benchmarks/report.py separates the two gains with it).

    sampling None: every method decodes greedily; else every method samples with these settings.
    With a draft model: transformers assisted generation with it, lookahead with it as one more
    source, and lookahead with it as the only source.
    """
    methods = [reference_method(model, sampling), prompt_lookup_method(model, sampling)]
    if draft is not None:
        methods.append(assisted_method(model, draft, sampling))
    config = config or LookaheadConfig()
    methods.append(lookahead_method(model, tokenizer, config, sampling=sampling))
    methods.append(lookahead_method(model, tokenizer, plain_config(config), PLAIN, sampling))
    if draft is not None:
        methods.append(lookahead_method(model, tokenizer, config, "lookahead+draft", sampling, draft))
        alone = replace(config, context_match=False, ngram_pool=False, recycle=False)
        methods.append(lookahead_method(model, tokenizer, alone, "draft-only", sampling, draft))
    for spec in extra_configs:
        name, cfg = parse_config_spec(spec, config)
        if name in {m.name for m in methods}:
            raise ValueError(f"duplicate method name {name!r} in --config {spec!r}")
        methods.append(lookahead_method(model, tokenizer, cfg, name, sampling))
    return methods


# ---------------------------------------------------------------- running

class ForwardCounter:
    """Counts forward calls of a module (a pre-hook; removed on exit)."""

    def __init__(self, module: torch.nn.Module):
        self.module, self.count = module, 0
        self.handle: torch.utils.hooks.RemovableHandle | None = None

    def __enter__(self) -> ForwardCounter:
        self.handle = self.module.register_forward_pre_hook(self._hook)
        return self

    def _hook(self, *_args: object) -> None:
        self.count += 1

    def __exit__(self, *_exc: object) -> None:
        if self.handle is not None:
            self.handle.remove()


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@torch.inference_mode()
def run_method(method: Method, model: PreTrainedModel, ids: torch.Tensor, max_new_tokens: int) -> Run:
    """Time one generate call; count target forwards: a pre-hook counts transformers' own; a lookahead
    method's are its prefill and its decode steps (its stats: a hook on the model would keep its steps
    from running as a replayed trace, model/traced.py)."""
    generator = method.generator
    with ForwardCounter(model) if generator is None else nullcontext() as counter:
        start = time.perf_counter()
        out = method.generate(ids, max_new_tokens)
        wall = time.perf_counter() - start
    tokens = out[0, ids.shape[1]:].tolist()
    stats = generator.last_stats if generator is not None else None
    if stats is None:
        return Run(tokens, wall, counter.count if counter is not None else 0)
    forwards = int(ids.shape[1] > 1) + stats.steps  # (the prompt's last token is the first step's input)
    return Run(tokens, wall, forwards, list(stats.accepted), dict(Counter(r for r in stats.routes if r)),
               list(stats.host_seconds), list(stats.forward_seconds))


def _accepted_per_step(run: Run) -> float:
    """Tokens per decode forward; the prefill forward yields the first token."""
    if run.accepted:
        return sum(run.accepted) / len(run.accepted)
    decode = run.forwards - 1
    return (len(run.tokens) - 1) / decode if decode > 0 else float(len(run.tokens) > 0)


def warm_up(methods: list[Method], model: PreTrainedModel, prompt: BenchPrompt, max_new_tokens: int = 8,
            seed: int = 0) -> None:
    """Run every method once, untimed (kernels, allocator, Numba), a lookahead method's generator making its
    step's trace on its first step (a one-time cost of 1-3 s per process, as the kernels' compiling is:
    left to the heuristic, the first timed prompt would pay it; docs/configuration.md, ``traced_forward``)."""
    ids = torch.tensor([prompt.input_ids])
    for method in methods:
        torch.manual_seed(seed)
        traced = method.generator.target.traced if method.generator is not None else None
        patience = traced.patience if traced is not None else None
        if traced is not None:
            traced.patience = 0.0  # trace on sight
        try:
            run_method(method, model, ids, max_new_tokens)
        finally:
            if traced is not None:
                traced.patience = patience


def _check_methods(methods: list[Method]) -> None:
    """The reference first; every method in the reference's mode."""
    if not methods or methods[0].name not in REFERENCES:
        raise ValueError("the first method must be the reference: 'greedy' (or 'sampling' in sample mode)")
    if methods[0].name != REFERENCES[methods[0].sampling is not None]:
        raise ValueError(f"the reference {methods[0].name!r} does not decode in its own mode")
    mixed = [m.name for m in methods if m.sampling != methods[0].sampling]
    if mixed:
        raise ValueError(f"method(s) {', '.join(mixed)} decode differently from the reference {methods[0].name!r}")


def run_benchmark(model: PreTrainedModel, methods: list[Method], prompts: list[BenchPrompt], max_new_tokens: int,
                  warmup: bool = True, progress: Callable[[str], None] | None = None, seed: int = 0) -> list[dict]:
    """One record per (prompt, method), methods interleaved per prompt; the reference must come first.

    Before every run on prompt i: torch.manual_seed(seed + i), so all methods draw from the same seed.
    """
    _check_methods(methods)
    mode = mode_label(methods[0].sampling, model)
    if warmup and prompts:
        warm_up(methods, model, prompts[0], seed=seed)
    records = []
    for index, prompt in enumerate(prompts):
        ids = torch.tensor([prompt.input_ids])  # [1, T]
        reference: Run | None = None
        for method in methods:
            torch.manual_seed((seed + index) % 2**64)  # (a seed near 2**64 - 1 wraps around)
            run = run_method(method, model, ids, max_new_tokens)
            reference = reference or run
            records.append(_record(prompt, method, run, reference, mode, seed + index))
            if progress is not None:
                progress(f"{prompt.dataset}/{prompt.id} {method.name}")
    return records


def _tokens_per_s(run: Run) -> float:
    return len(run.tokens) / run.wall_time_s if run.wall_time_s > 0 else 0.0


def _speedup(run: Run, reference: Run, by_rate: bool) -> float:
    """Against the reference on the same prompt: new tokens/s ratio when sampling (token counts differ),
    wall-time ratio when greedy (the same when the token counts match). 0.0 when undefined."""
    if by_rate:
        rate = _tokens_per_s(reference)
        return _tokens_per_s(run) / rate if rate > 0 else 0.0
    return reference.wall_time_s / run.wall_time_s if run.wall_time_s > 0 else 0.0


def _record(prompt: BenchPrompt, method: Method, run: Run, reference: Run, mode: str, seed: int) -> dict:
    return {
        "dataset": prompt.dataset, "prompt_id": prompt.id, "turn": prompt.turn, "method": method.name,
        "mode": mode, "seed": seed,
        "prompt_tokens": len(prompt.input_ids), "new_tokens": len(run.tokens), "wall_time_s": run.wall_time_s,
        "tokens_per_s": _tokens_per_s(run), "speedup": _speedup(run, reference, method.sampling is not None),
        "forwards": run.forwards, "accepted_per_step": _accepted_per_step(run), "accepted": run.accepted,
        "routes": run.routes, "host_s": run.host_s, "forward_s": run.forward_s,
        "exact_match": run.tokens == reference.tokens, "must_match": method.exact,
        "peak_rss_mb": peak_rss_mb(), "tokens": run.tokens,
    }


def check_exact(records: list[dict]) -> None:
    """Raise ExactMatchError listing every record of a must-match method that differs from greedy."""
    bad = [r for r in records if r["must_match"] and not r["exact_match"]]
    if bad:
        where = ", ".join(f"{r['method']} on {r['dataset']}/{r['prompt_id']}" for r in bad[:10])
        raise ExactMatchError(f"{len(bad)} run(s) differ from greedy decoding (must be identical in float32): "
                              f"{where}{' ...' if len(bad) > 10 else ''}")


# ---------------------------------------------------------------- prompts

@torch.inference_mode()
def prepare_prompts(dataset: str, prompts: list[Prompt], model: PreTrainedModel,
                    tokenizer: PreTrainedTokenizerBase, max_new_tokens: int,
                    turn2: bool = True) -> list[BenchPrompt]:
    """Tokenize data-set prompts; multi-turn ones (MT-bench) become turn 2.

    Turn 2 follows the model's own greedy answer to turn 1, so that every
    method sees the same turn-2 prompt. Chat prompts go through the chat
    template, completion prompts (HumanEval) are raw text.
    """
    from lookahead.benchmarks.parsers import followup_messages, render_prompt

    out = []
    for prompt in prompts:
        chat = prompt.messages is not None
        ids = render_prompt(prompt, tokenizer, chat)
        turn = 1
        if turn2 and prompt.turns and len(prompt.turns) > 1:
            t = torch.tensor([ids])
            answer_ids = cast(Any, model).generate(t, attention_mask=torch.ones_like(t), max_new_tokens=max_new_tokens,
                                        do_sample=False)[0, t.shape[1]:]
            answer = tokenizer.decode(answer_ids, skip_special_tokens=True)
            ids = render_prompt(prompt, tokenizer, chat, followup_messages(prompt, [answer]))
            turn = 2
        out.append(BenchPrompt(dataset, prompt.id, list(ids), turn))
    return out
