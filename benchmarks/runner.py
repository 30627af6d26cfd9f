"""Run decoding methods side by side on the same prompts, interleaved per prompt.

Methods (each a ``Method``: a name and ``run(ids [1, T], max_new_tokens) -> Run``):

    greedy         transformers ``model.generate(do_sample=False)`` (the reference)
    prompt-lookup  transformers ``prompt_lookup_num_tokens=10``
    assisted       transformers assisted generation with a draft model (optional)
    lookahead      ``LookaheadGenerator`` with the default config
    <name>         ``LookaheadGenerator`` with an extra config ``name:window=5,ngram=4``

For every prompt all methods run back to back (greedy first), so that drift of
the machine (another process taking a core) hits all of them alike. Every
method is warmed up once before anything is timed.

Per prompt and method one record: wall time, tokens/s, speedup against greedy,
target forward passes (prefill included, counted by a forward pre-hook on the
target model), mean tokens accepted per decode forward, whether the tokens
equal greedy's, and the process's peak RSS so far. In float32 every lookahead
method must match greedy exactly: ``check_exact`` raises ``ExactMatchError``.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

from lookahead import LookaheadConfig, LookaheadGenerator

PROMPT_LOOKUP_TOKENS = 10


class ExactMatchError(AssertionError):
    """A method that must reproduce greedy decoding produced different tokens."""


@dataclass(frozen=True)
class BenchPrompt:
    """One prompt, already tokenized. ``turn`` is 2 for MT-bench's second turn."""

    dataset: str
    id: str
    input_ids: list[int]
    turn: int = 1


@dataclass
class Run:
    """What one method did on one prompt."""

    tokens: list[int]  # new tokens only
    wall_time_s: float
    forwards: int  # target forward passes, prefill included
    accepted: list[int] = field(default_factory=list)  # tokens per decode forward (lookahead only)


@dataclass
class Method:
    """A named way to decode. ``exact``: must equal greedy token for token (float32)."""

    name: str
    generate: Callable[[torch.Tensor, int], torch.Tensor]  # ids [1, T], M -> [1, T + new]
    exact: bool = False
    generator: LookaheadGenerator | None = None  # set for lookahead methods (per-step stats)
    config: dict | None = None


# ---------------------------------------------------------------- methods

def _hf_generate(model, **extra) -> Callable[[torch.Tensor, int], torch.Tensor]:
    def run(ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                              do_sample=False, **extra)
    return run


def greedy_method(model) -> Method:
    return Method("greedy", _hf_generate(model))


def prompt_lookup_method(model) -> Method:
    return Method("prompt-lookup", _hf_generate(model, prompt_lookup_num_tokens=PROMPT_LOOKUP_TOKENS))


def assisted_method(model, draft) -> Method:
    return Method("assisted", _hf_generate(model, assistant_model=draft))


def lookahead_method(model, tokenizer, config: LookaheadConfig | None = None, name: str = "lookahead") -> Method:
    gen = LookaheadGenerator(model, tokenizer, config or LookaheadConfig())
    import dataclasses
    return Method(name, lambda ids, m: gen.generate(ids, max_new_tokens=m), exact=True, generator=gen,
                  config=dataclasses.asdict(gen.config))


# Named configs for `lookahead bench --preset`: LADE's published GPU setting run by our
# engine, and the ablations (each candidate source alone; all sources with a fixed budget).
PRESETS = {
    "lade-gpu": "window=15,ngram=5,candidates=15,max_tree_nodes=60,budget=fixed,recycle=false,context_match=false",
    "context-only": "ngram_pool=false,recycle=false",
    "pool-only": "context_match=false,recycle=false",
    "recycle-only": "context_match=false,ngram_pool=false",
    "fixed-budget": "budget=fixed",
}


def preset_specs(names: Iterable[str]) -> list[str]:
    """``--config`` specs of the named presets ("all" = every preset), in PRESETS order."""
    names = set(names)
    unknown = names - set(PRESETS) - {"all"}
    if unknown:
        raise ValueError(f"unknown preset {sorted(unknown)[0]!r}: choose from {', '.join(PRESETS)} or all")
    return [f"{name}:{spec}" for name, spec in PRESETS.items() if name in names or "all" in names]


def parse_config_spec(spec: str, base: LookaheadConfig | None = None) -> tuple[str, LookaheadConfig]:
    """``"wide:window=5,ngram=4,candidates=8"`` -> ("wide", LookaheadConfig(window=5, ...)).

    The name is optional (``"window=5"`` is named ``lookahead[window=5]``);
    unnamed fields keep ``base``'s values. ValueError names the bad part.
    """
    import dataclasses
    name, _, body = spec.rpartition(":") if ":" in spec else ("", "", spec)
    name = name.strip() or f"lookahead[{body.strip()}]"
    fields = {f.name: f for f in dataclasses.fields(LookaheadConfig)}
    values = dataclasses.asdict(base or LookaheadConfig())
    for part in filter(None, (p.strip() for p in body.split(","))):
        key, eq, raw = part.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in fields:
            raise ValueError(f"bad config {spec!r}: {part!r} is not FIELD=VALUE with FIELD one of "
                             f"{', '.join(fields)}")
        raw = raw.strip()
        if isinstance(values[key], bool):
            if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(f"bad config {spec!r}: {key} must be true or false, got {raw!r}")
            values[key] = raw.lower() in ("true", "1", "yes")
        elif isinstance(values[key], str):
            values[key] = raw
        else:
            try:
                values[key] = int(raw)
            except ValueError:
                raise ValueError(f"bad config {spec!r}: {key} must be an integer, got {raw!r}") from None
    return name, LookaheadConfig(**values)


def default_methods(model, tokenizer, config: LookaheadConfig | None = None, extra_configs: Iterable[str] = (),
                    draft=None) -> list[Method]:
    """greedy, prompt-lookup, [assisted], lookahead, then one lookahead method per extra config."""
    methods = [greedy_method(model), prompt_lookup_method(model)]
    if draft is not None:
        methods.append(assisted_method(model, draft))
    methods.append(lookahead_method(model, tokenizer, config))
    for spec in extra_configs:
        name, cfg = parse_config_spec(spec, config)
        if name in {m.name for m in methods}:
            raise ValueError(f"duplicate method name {name!r} in --config {spec!r}")
        methods.append(lookahead_method(model, tokenizer, cfg, name))
    return methods


# ---------------------------------------------------------------- running

class ForwardCounter:
    """Counts forward calls of a module (a pre-hook; removed on exit)."""

    def __init__(self, module: torch.nn.Module):
        self.module, self.count, self.handle = module, 0, None

    def __enter__(self) -> "ForwardCounter":
        self.handle = self.module.register_forward_pre_hook(self._hook)
        return self

    def _hook(self, *_args) -> None:
        self.count += 1

    def __exit__(self, *_exc) -> None:
        self.handle.remove()


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@torch.inference_mode()
def run_method(method: Method, model, ids: torch.Tensor, max_new_tokens: int) -> Run:
    """Time one generate call; count target forwards."""
    with ForwardCounter(model) as counter:
        start = time.perf_counter()
        out = method.generate(ids, max_new_tokens)
        wall = time.perf_counter() - start
    tokens = out[0, ids.shape[1]:].tolist()
    stats = method.generator.last_stats if method.generator is not None else None
    return Run(tokens, wall, counter.count, list(stats.accepted) if stats is not None else [])


def _accepted_per_step(run: Run) -> float:
    """Tokens per decode forward; the prefill forward yields the first token."""
    if run.accepted:
        return sum(run.accepted) / len(run.accepted)
    decode = run.forwards - 1
    return (len(run.tokens) - 1) / decode if decode > 0 else float(len(run.tokens) > 0)


def warm_up(methods: list[Method], model, prompt: BenchPrompt, max_new_tokens: int = 8) -> None:
    """Run every method once, untimed (kernels, allocator, Numba)."""
    ids = torch.tensor([prompt.input_ids])
    for method in methods:
        run_method(method, model, ids, max_new_tokens)


def run_benchmark(model, methods: list[Method], prompts: list[BenchPrompt], max_new_tokens: int,
                  warmup: bool = True, progress: Callable[[str], None] | None = None) -> list[dict]:
    """One record per (prompt, method), methods interleaved per prompt; greedy must come first."""
    if not methods or methods[0].name != "greedy":
        raise ValueError("the first method must be 'greedy' (the reference)")
    if warmup and prompts:
        warm_up(methods, model, prompts[0])
    records = []
    for prompt in prompts:
        ids = torch.tensor([prompt.input_ids])  # [1, T]
        reference: Run | None = None
        for method in methods:
            run = run_method(method, model, ids, max_new_tokens)
            reference = reference or run
            records.append(_record(prompt, method, run, reference))
            if progress is not None:
                progress(f"{prompt.dataset}/{prompt.id} {method.name}")
    return records


def _record(prompt: BenchPrompt, method: Method, run: Run, reference: Run) -> dict:
    new = len(run.tokens)
    return {
        "dataset": prompt.dataset, "prompt_id": prompt.id, "turn": prompt.turn, "method": method.name,
        "prompt_tokens": len(prompt.input_ids), "new_tokens": new, "wall_time_s": run.wall_time_s,
        "tokens_per_s": new / run.wall_time_s if run.wall_time_s > 0 else 0.0,
        "speedup": reference.wall_time_s / run.wall_time_s if run.wall_time_s > 0 else 0.0,
        "forwards": run.forwards, "accepted_per_step": _accepted_per_step(run), "accepted": run.accepted,
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
def prepare_prompts(dataset: str, prompts: list, model, tokenizer, max_new_tokens: int,
                    turn2: bool = True) -> list[BenchPrompt]:
    """Tokenize data-set prompts; multi-turn ones (MT-bench) become turn 2.

    Turn 2 follows the model's own greedy answer to turn 1, so that every
    method sees the same turn-2 prompt. Chat prompts go through the chat
    template, completion prompts (HumanEval) are raw text.
    """
    from benchmarks.datasets import followup_messages, render_prompt

    out = []
    for prompt in prompts:
        chat = prompt.messages is not None
        ids = render_prompt(prompt, tokenizer, chat)
        turn = 1
        if turn2 and prompt.turns and len(prompt.turns) > 1:
            t = torch.tensor([ids])
            answer_ids = model.generate(t, attention_mask=torch.ones_like(t), max_new_tokens=max_new_tokens,
                                        do_sample=False)[0, t.shape[1]:]
            answer = tokenizer.decode(answer_ids, skip_special_tokens=True)
            ids = render_prompt(prompt, tokenizer, chat, followup_messages(prompt, [answer]))
            turn = 2
        out.append(BenchPrompt(dataset, prompt.id, list(ids), turn))
    return out
