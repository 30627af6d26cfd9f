"""How tokens are chosen in one generate call, and the target's processed scores at every tree row.

``resolve_decoding`` reads the call's arguments over the model's own
``generation_config`` the way ``model.generate`` does (transformers'
GenerationMixin resolves the config and builds its LogitsProcessorList:
repetition penalty, user processors, then temperature / top-k / top-p /
min-p warpers when sampling), so the same arguments mean the same
distribution in both.

``process_rows`` applies that list at every verified row of a step with
the row's OWN prefix: the prompt, the output so far, then the tree tokens
from x down to that row. Processors that only look at the scores row
(temperature, top-k, top-p, ...) run once over all rows; the others run once
per tree depth, over the rows of that depth, with input ids
[sequence | path to the row].
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
import torch
from transformers.generation import logits_process as lp

from .inputs import GenerateInputError, budget, eos_ids
from .target import to_device

# Processors whose output row depends on the scores row alone (not on input_ids).
ROW_WISE = (lp.TemperatureLogitsWarper, lp.TopKLogitsWarper, lp.TopPLogitsWarper, lp.MinPLogitsWarper,
            lp.TypicalLogitsWarper, lp.EpsilonLogitsWarper, lp.EtaLogitsWarper, lp.LogitNormalization,
            lp.SuppressTokensLogitsProcessor, lp.InfNanRemoveLogitsProcessor)
# Ranges of the sampling arguments: (low, high, low itself allowed).
RANGES = {"temperature": (0.0, float("inf"), True), "top_k": (0, float("inf"), True),
          "top_p": (0.0, 1.0, False), "min_p": (0.0, 1.0, True), "repetition_penalty": (0.0, float("inf"), False)}


@dataclass(frozen=True)
class Decoding:
    """The resolved choice rule of one generate call."""

    do_sample: bool
    temperature: float | None  # None when greedy
    processors: lp.LogitsProcessorList  # applied at every verified row, in order
    max_new_tokens: int
    eos: np.ndarray  # [E] end-of-sequence ids
    generator: torch.Generator | None  # random source when sampling (None: torch's default)

    @property
    def segments(self) -> list[tuple[bool, list]]:
        """The processors in runs of (row-wise?, [processors]), in order."""
        runs: list[tuple[bool, list]] = []
        for proc in self.processors:
            wise = isinstance(proc, ROW_WISE)
            if runs and runs[-1][0] == wise:
                runs[-1][1].append(proc)
            else:
                runs.append((wise, [proc]))
        return runs


def _number(name: str, value):
    """A plain Python number from value (numpy scalars welcome), or GenerateInputError."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise GenerateInputError(f"{name} must be a number, got {value!r}")
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def resolve_decoding(model, prompt_len: int, device: torch.device, *, max_new_tokens=None, do_sample=None,
                     eos_token_id=None, logits_processor=None, generator=None, generation_config=None,
                     **sampling) -> Decoding:
    """The call's arguments over the model's generation_config, as model.generate reads them.

    ``sampling`` holds temperature, top_k, top_p, min_p, repetition_penalty
    (None = the generation_config's value). do_sample=False, or temperature
    0, decodes greedily (processors such as a repetition penalty still apply).
    """
    kwargs = {name: _number(name, value) for name, value in sampling.items() if value is not None}
    for name, (low, high, closed) in RANGES.items():
        value = kwargs.get(name)
        if value is not None and not (low <= value <= high and (value > low or closed)):
            bound = f"in [{low}, {high}]" if closed else f"in ({low}, {high}]"
            raise GenerateInputError(f"{name} must be {bound}, got {value}")
    if isinstance(kwargs.get("top_k"), float):
        raise GenerateInputError(f"top_k must be an integer (0 = off), got {kwargs['top_k']}")
    if do_sample is not None:
        if not isinstance(do_sample, (bool, np.bool_)):
            raise GenerateInputError(f"do_sample must be True or False, got {do_sample!r}")
        kwargs["do_sample"] = bool(do_sample)
    if logits_processor is not None:
        if not all(callable(p) for p in logits_processor):
            raise GenerateInputError("logits_processor must be a list of transformers LogitsProcessor objects")
        logits_processor = lp.LogitsProcessorList(logits_processor)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise GenerateInputError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if generator is not None and torch.device(generator.device).type != torch.device(device).type:
        raise GenerateInputError(f"generator is on {generator.device} but the model's inputs are on {device}; "
                                 f"create it with torch.Generator(device={str(device)!r})")
    try:
        config, _ = model._prepare_generation_config(generation_config, **kwargs)  # noqa: SLF001
    except (TypeError, ValueError) as exc:
        raise GenerateInputError(f"invalid generation settings: {exc}") from None
    limit = budget(max_new_tokens, config.max_new_tokens)
    eos = eos_ids(eos_token_id, config)
    config.eos_token_id = eos.tolist() or None
    if config.do_sample and config.temperature is not None and config.temperature == 0:
        config.do_sample = False  # temperature 0 is greedy, as users expect
    try:
        model._prepare_special_tokens(config, True, device=device)  # noqa: SLF001
        processors = model._get_logits_processor(  # noqa: SLF001
            generation_config=config, input_ids_seq_length=prompt_len, logits_processor=logits_processor,
            device=device, model_kwargs=None)
    except (TypeError, ValueError) as exc:
        raise GenerateInputError(f"invalid generation settings: {exc}") from None
    temperature = float(config.temperature if config.temperature is not None else 1.0) if config.do_sample else None
    return Decoding(bool(config.do_sample), temperature, processors, limit, eos, generator)


def process_rows(decoding: Decoding, scores: torch.Tensor, seq: np.ndarray, stop: int, paths: np.ndarray,
                 depths: np.ndarray) -> torch.Tensor:
    """Processed scores [R, V] of rows whose prefix is seq[:stop] + paths[r, :depths[r]].

    scores [R, V] are the raw logits of the rows (float32 or the model's
    dtype); paths [R, D] the tree tokens from x down to each row (row 0 is x
    itself: depth 0).
    """
    if not decoding.processors:
        return scores
    scores = scores.float()
    prefix = None
    for wise, procs in decoding.segments:
        if wise:
            for proc in procs:
                scores = proc(None, scores)
            continue
        if prefix is None:
            prefix = to_device(seq[:stop].copy(), scores.device)  # [T]
            paths_t = to_device(paths, scores.device)  # [R, D]
            groups = [(d, np.flatnonzero(depths == d)) for d in np.unique(depths)]
        out = scores.clone()
        for depth, rows in groups:
            index = to_device(rows, scores.device)
            ids = torch.cat([prefix.expand(rows.shape[0], -1), paths_t[index, :depth]], dim=1)  # [n, T + d]
            part = scores[index]  # [n, V]
            for proc in procs:
                part = proc(ids, part)
            out[index] = part
        scores = out
    return scores
