"""The keywords of a generate call lookahead does not take: each refused by name with what it takes
instead, in the same words whether ``LookaheadGenerator.generate`` got them or transformers handed
them to ``custom_generate`` (hf.py); those that change nothing here pass."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from transformers import GenerationConfig

from ..errors import GenerateInputError
from .decoding import check_supported


def default_positions(positions: Any, length: int) -> bool:
    """Whether position_ids [1, T] are 0..T-1 (what model.generate derives for an unpadded prompt)."""
    if not isinstance(positions, torch.Tensor):
        return False
    expected = torch.arange(length, device=positions.device)
    return positions.shape[-1] == length and bool((positions.reshape(-1, length) == expected).all())


def _neutral(name: str, value: Any, length: int) -> bool:
    """A keyword that changes nothing lookahead does: how transformers would run its own forwards
    (use_cache, logits_to_keep), default positions, or a mode setting left at its off value."""
    if name in ("use_cache", "logits_to_keep") or value is None:
        return True
    if name == "position_ids":
        return default_positions(value, length)
    off = {"num_beams": 1, "num_beam_groups": 1, "num_return_sequences": 1, "output_scores": False,
           "output_logits": False, "output_attentions": False, "output_hidden_states": False, "synced_gpus": False}
    return name in off and not isinstance(value, torch.Tensor) and value == off[name]


def _instead(name: str, value: Any, call: str, known: list[str] | None) -> str:
    """Why lookahead refuses keyword ``name`` and what it supports instead (one clause, no ';')."""
    shown = f"{name}={value!r}" if isinstance(value, (bool, int, float, str)) else name
    if name in ("past_key_values", "cache"):
        return ("past_key_values / cache: lookahead keeps its own KV cache and can neither continue from nor "
                "fill yours, drop it (the whole prompt is prefilled)")
    if name == "position_ids":
        return "position_ids other than 0..T-1: lookahead places the prompt at positions 0..T-1, drop position_ids"
    if name in ("assistant_model", "assistant_tokenizer"):
        return (f"{name}: lookahead drafts in its own tree, pass the draft model to LookaheadGenerator(model, "
                f"tokenizer, config, draft_model, draft_tokenizer=...) instead")
    if name == "prefix_allowed_tokens_fn":
        return ("prefix_allowed_tokens_fn: pass logits_processor=LogitsProcessorList("
                "[PrefixConstrainedLogitsProcessor(fn, num_beams=1)]) instead")
    if name in ("negative_prompt_ids", "negative_prompt_attention_mask", "guidance_scale"):
        return f"{shown}: lookahead decodes without classifier-free guidance, drop it"
    if name in ("inputs", "inputs_embeds"):
        return f"{name}: lookahead takes token ids, pass input_ids (e.g. tokenizer(text, return_tensors='pt'))"
    if name == "max_length":
        return (f"{shown}: pass max_new_tokens (new tokens after the prompt, prompt length not counted) "
                f"instead")
    if name.startswith("output_") and name in GenerationConfig().__dict__:
        return (f"{shown}: lookahead returns the sequences and its stats only "
                f"(return_dict_in_generate=True: .sequences, .stats), drop it")
    strategies = ("penalty_alpha", "dola_layers", "constraints", "force_words_ids", "num_beam_groups",
                  "diversity_penalty", "length_penalty", "early_stopping", "low_memory", "prompt_lookup_num_tokens",
                  "max_matching_ngram_size", "num_assistant_tokens", "num_assistant_tokens_schedule",
                  "assistant_confidence_threshold", "assistant_early_exit", "assistant_lookbehind",
                  "target_lookbehind", "token_healing")
    if name in strategies:
        return (f"{shown}: a setting of another decoding strategy (beam, contrastive, DoLa, constrained or "
                f"assisted search), lookahead decodes greedily or by sampling, drop it")
    if name in GenerationConfig().__dict__:
        return (f"{shown}: a generation setting {call} takes inside a generation config, pass "
                f"generation_config=GenerationConfig({name}=...) instead")
    if known is None:  # a model input transformers handed on
        return f"{name}: a model input lookahead cannot pass to its forwards, drop it from the generate call"
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"{name}: no such argument{hint}, drop it"


def refuse_kwargs(kwargs: Mapping[str, Any], call: str, length: int,
                  takes: Callable[..., object] | None = None) -> None:
    """Refuse, by name, every keyword of a generate call that lookahead cannot honour, with what it
    supports instead; neutral ones (``use_cache``, default ``position_ids``, ``num_beams=1``, ...) pass.

    ``call`` names the call in the message; ``takes``: the function whose arguments those are (its
    parameter names give "did you mean"), None for the model inputs transformers hands a
    custom_generate callable (hf.py). Beam search, contrastive search, assisted generation and
    ``num_return_sequences`` get the refusal every path gives them (call/decoding.py check_supported).
    """
    asked = {name: value for name, value in kwargs.items() if not _neutral(name, value, length)}
    if not asked:
        return
    fields = GenerationConfig().__dict__
    modes = {name: value for name, value in asked.items() if name in fields and not name.startswith("output_")}
    if modes:
        settings = GenerationConfig()
        for name, value in modes.items():
            setattr(settings, name, value)  # not validated: transformers' checks would speak before ours
        try:
            check_supported(settings)
        except (TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, GenerateInputError):
                raise
            raise GenerateInputError(f"invalid generation settings {modes}: {exc}") from None
    known = None if takes is None else [name for name, parameter in inspect.signature(takes).parameters.items()
                                        if parameter.kind is not inspect.Parameter.VAR_KEYWORD]
    clauses = [_instead(name, value, call, known) for name, value in asked.items()]
    raise GenerateInputError(f"{call} cannot honour {'; '.join(clauses)}")
