"""How tokens are chosen in one generate call (the scores at every tree row: lookahead/call/processing.py).

``resolve_decoding`` reads the call's arguments over the model's own
``generation_config`` the way ``model.generate`` does (transformers'
GenerationMixin resolves the config and builds its LogitsProcessorList:
repetition penalty, user processors, then temperature / top-k / top-p /
min-p warpers when sampling; and its StoppingCriteriaList: length, max_time,
stop strings, EOS, user criteria), so the same arguments mean the same
distribution and the same stop in both. ``prepared_decoding`` takes a config
and lists transformers has already prepared (the custom_generate path,
lookahead/hf.py) and uses them as they are.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers.generation import GenerationConfig, GenerationMode, StoppingCriteriaList
from transformers.generation import logits_process as lp

from .inputs import GenerateInputError, budget, eos_ids
from .stopping import split_criteria

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# Processors whose output row depends on the scores row alone (not on input_ids).
ROW_WISE = (lp.TemperatureLogitsWarper, lp.TopKLogitsWarper, lp.TopPLogitsWarper, lp.MinPLogitsWarper,
            lp.TypicalLogitsWarper, lp.EpsilonLogitsWarper, lp.EtaLogitsWarper, lp.LogitNormalization,
            lp.SuppressTokensLogitsProcessor, lp.InfNanRemoveLogitsProcessor)
# Ranges of the sampling arguments: (low, high, low itself allowed).
RANGES = {"temperature": (0.0, float("inf"), True), "top_k": (0, float("inf"), True),
          "top_p": (0.0, 1.0, False), "min_p": (0.0, 1.0, True), "repetition_penalty": (0.0, float("inf"), False)}


@dataclass(frozen=True)
class Decoding:
    """The resolved settings of one generate call: how tokens are chosen, where decoding stops,
    what is returned."""

    do_sample: bool
    temperature: float | None  # None when greedy
    processors: lp.LogitsProcessorList  # applied at every verified row, in order
    max_new_tokens: int
    eos: np.ndarray  # [E] end-of-sequence ids
    generator: torch.Generator | None  # random source when sampling (None: torch's default)
    criteria: tuple = ()  # stopping criteria asked after every new token (call/stopping.py), EOS / length aside
    return_dict: bool = False  # return a LookaheadOutput (sequences + stats) instead of the ids
    pad_token_id: int | None = None  # fills finished rows of a batch (the EOS id when the model has none)
    logprobs: int | None = None  # None: none; k >= 0: each new token's logprob and the k likeliest (call/logprobs.py)

    @property
    def segments(self) -> list[tuple[bool, list]]:
        """The processors in runs of (row-wise?, [processors]), in order."""
        runs: list[tuple[bool, list]] = []
        for proc in self.processors:
            wise = isinstance(proc, ROW_WISE) or getattr(proc, "row_wise", False) is True  # (a processor may say so)
            if runs and runs[-1][0] == wise:
                runs[-1][1].append(proc)
            else:
                runs.append((wise, [proc]))
        return runs


def _number(name: str, value: object) -> int | float | None:
    """A plain Python number from value (numpy scalars welcome), or GenerateInputError."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise GenerateInputError(f"{name} must be a number, got {value!r}")
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _checked(sampling: dict, do_sample: object, max_time: object, stop_strings: object,
             return_dict_in_generate: object) -> dict:
    """The generation_config overrides among the call's arguments, each checked (None = not given)."""
    kwargs: dict[str, Any] = {name: _number(name, value) for name, value in sampling.items() if value is not None}
    for name, (low, high, closed) in RANGES.items():
        value = kwargs.get(name)
        if value is not None and not (low <= value <= high and (value > low or closed)):
            bound = f"in [{low}, {high}]" if closed else f"in ({low}, {high}]"
            raise GenerateInputError(f"{name} must be {bound}, got {value}")
    if isinstance(kwargs.get("top_k"), float):
        raise GenerateInputError(f"top_k must be an integer (0 = off), got {kwargs['top_k']}")
    for name, value in (("do_sample", do_sample), ("return_dict_in_generate", return_dict_in_generate)):
        if value is not None:
            if not isinstance(value, (bool, np.bool_)):
                raise GenerateInputError(f"{name} must be True or False, got {value!r}")
            kwargs[name] = bool(value)
    if max_time is not None:
        seconds = _number("max_time", max_time)
        assert seconds is not None  # (a number: only None gives None)
        if seconds < 0:
            raise GenerateInputError(f"max_time must be >= 0 seconds, got {seconds}")
        kwargs["max_time"] = float(seconds)
    if stop_strings is not None:
        kwargs["stop_strings"] = stop_string_list(stop_strings)
    return kwargs


def stop_string_list(stop_strings: object) -> list[str]:
    """stop_strings (a string or a list of strings, none empty) as a list, or GenerateInputError."""
    strings = [stop_strings] if isinstance(stop_strings, str) else stop_strings
    if not isinstance(strings, (list, tuple)) or not strings or not all(isinstance(s, str) and s for s in strings):
        raise GenerateInputError(f"stop_strings must be a non-empty string or a list of them, got {stop_strings!r}")
    return list(strings)


def _user_list(name: str, items: Any, kind: type, what: str):
    """The user's processors / criteria as a ``kind`` list (LogitsProcessorList, StoppingCriteriaList)."""
    if items is None:
        return None
    if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__") or not all(callable(p) for p in items):
        raise GenerateInputError(f"{name} must be a list of {what}")
    return kind(items)


def _check_generator(generator: object, device: torch.device | str) -> None:
    """A torch.Generator on the device type of the model's inputs, or None."""
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise GenerateInputError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if torch.device(generator.device).type != torch.device(device).type:
        raise GenerateInputError(f"generator is on {generator.device} but the model's inputs are on {device}; "
                                 f"create it with torch.Generator(device={str(device)!r})")


def resolve_decoding(model: PreTrainedModel, prompt_len: int, device: torch.device, *,
                     max_new_tokens: int | None = None, do_sample: bool | None = None, eos_token_id: Any = None,
                     logits_processor: lp.LogitsProcessorList | None = None,
                     stopping_criteria: StoppingCriteriaList | None = None, stop_strings: str | list[str] | None = None,
                     max_time: float | None = None, tokenizer: PreTrainedTokenizerBase | None = None,
                     return_dict_in_generate: bool | None = None, generator: torch.Generator | None = None,
                     generation_config: GenerationConfig | None = None, **sampling: float | None) -> Decoding:
    """The call's arguments over the model's generation_config, as model.generate reads them.

    ``sampling`` holds temperature, top_k, top_p, min_p, repetition_penalty
    (None = the generation_config's value). do_sample=False, or temperature
    0, decodes greedily (processors such as a repetition penalty still apply).
    The processors and stopping criteria are built by transformers itself
    (``_get_logits_processor``, ``_get_stopping_criteria``) from the resolved
    config, the user's lists merged in, then used as ``prepared_decoding`` uses them.
    """
    kwargs = _checked(sampling, do_sample, max_time, stop_strings, return_dict_in_generate)
    logits_processor = _user_list("logits_processor", logits_processor, lp.LogitsProcessorList,
                                  "transformers LogitsProcessor objects")
    stopping_criteria = _user_list("stopping_criteria", stopping_criteria, StoppingCriteriaList,
                                   "transformers StoppingCriteria objects")
    _check_generator(generator, device)
    mixin: Any = model  # its GenerationMixin helpers, whose annotations are narrower than model.generate's calls
    try:
        config, _ = mixin._prepare_generation_config(generation_config, **kwargs)  # noqa: SLF001
    except (TypeError, ValueError) as exc:
        raise GenerateInputError(f"invalid generation settings: {exc}") from None
    limit = budget(max_new_tokens, config.max_new_tokens)
    eos = eos_ids(eos_token_id, config)
    config.eos_token_id = eos.tolist() or None
    config.max_new_tokens, config.max_length = limit, prompt_len + limit  # as model.generate sets max_length
    if config.do_sample and config.temperature is not None and config.temperature == 0:
        config.do_sample = False  # temperature 0 is greedy, as users expect
    if config.stop_strings is not None and tokenizer is None:
        raise GenerateInputError("stop_strings need the tokenizer: build LookaheadGenerator(model, tokenizer) "
                                 "or pass tokenizer= to generate")
    try:
        mixin._prepare_special_tokens(config, True, device=device)  # noqa: SLF001
        processors = mixin._get_logits_processor(  # noqa: SLF001
            generation_config=config, input_ids_seq_length=prompt_len, logits_processor=logits_processor,
            device=device, model_kwargs=None)
        criteria = mixin._get_stopping_criteria(  # noqa: SLF001
            generation_config=config, stopping_criteria=stopping_criteria or StoppingCriteriaList(),
            tokenizer=tokenizer)
    except (TypeError, ValueError) as exc:
        raise GenerateInputError(f"invalid generation settings: {exc}") from None
    return prepared_decoding(config, processors, criteria, prompt_len, generator)


def check_supported(config: GenerationConfig) -> None:
    """Refuse generation settings lookahead cannot honour (beam search, per-step outputs)."""
    mode = config.get_generation_mode()
    if mode not in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE):
        raise GenerateInputError(
            f"these generation settings ask for {mode.value.replace('_', ' ')} (num_beams={config.num_beams}); "
            f"lookahead decodes greedily or by sampling: set num_beams=1 and drop penalty_alpha, dola_layers, "
            f"constraints, prompt_lookup_num_tokens and assistant settings")
    if (config.num_return_sequences or 1) > 1:
        raise GenerateInputError(f"num_return_sequences={config.num_return_sequences}: lookahead returns one "
                                 f"sequence per call for now; call generate once per sample")
    if config.return_dict_in_generate:
        asked = [name for name in ("output_scores", "output_logits", "output_attentions", "output_hidden_states")
                 if getattr(config, name, False)]
        if asked:
            raise GenerateInputError(f"{', '.join(asked)}: lookahead returns the sequences and its stats only; "
                                     f"drop {' and '.join(asked)} (or return_dict_in_generate)")


def prepared_decoding(config: GenerationConfig, processors: lp.LogitsProcessorList | None,
                      criteria: StoppingCriteriaList | None, prompt_len: int,
                      generator: torch.Generator | None = None) -> Decoding:
    """A Decoding from a resolved generation_config and the processor / criteria lists built from it.

    The lists are used as they are (model.generate hands a custom_generate
    callable exactly these, already complete): nothing is added to them, so
    nothing is applied twice. The length limit and EOS ids are read from the
    criteria (call/stopping.py), like every other reason to stop.
    """
    check_supported(config)
    limit, eos, rest = split_criteria(criteria, prompt_len)
    if limit is None:
        limit = budget(None, config.max_new_tokens)
    do_sample = bool(config.do_sample)
    temperature = float(config.temperature if config.temperature is not None else 1.0) if do_sample else None
    processors = lp.LogitsProcessorList(processors if processors is not None else [])
    pad = config.pad_token_id if config.pad_token_id is not None else (int(eos[0]) if eos.size else None)
    if isinstance(pad, (list, tuple)):
        pad = pad[0]
    return Decoding(do_sample, temperature, processors, limit, eos, generator, rest,
                    bool(config.return_dict_in_generate), None if pad is None else int(pad))
