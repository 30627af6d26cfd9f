"""Validation of generate()'s arguments: one clear error per bad input (and a warning where transformers
warns: padding without an attention_mask)."""

from __future__ import annotations

import numbers
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import ContextLimitWarning as ContextLimitWarning  # re-exported: generator.py imports it from here
from ..errors import GenerateInputError
from ..errors import PaddingWarning as PaddingWarning  # re-exported beside prompt_rows, which gives it

if TYPE_CHECKING:
    from transformers import GenerationConfig

DEFAULT_MAX_NEW_TOKENS = 20  # new tokens when neither the call nor the generation_config says (model.generate's 20)


def _integer(value: object) -> int | None:
    """value as a Python int when it is an integer (numpy and 0-d torch integers too), else None."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_floating_point():
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def budget(max_new_tokens: object, default: int | None) -> int:
    """max_new_tokens checked (None -> ``default``, the model's generation_config value; None there too ->
    DEFAULT_MAX_NEW_TOKENS): budget(None, 50) = 50, budget(np.int64(8), 50) = 8, budget(-1, 50) raises."""
    given = default if max_new_tokens is None else max_new_tokens
    value = DEFAULT_MAX_NEW_TOKENS if given is None else _integer(given)
    if value is None or value < 0:
        raise GenerateInputError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    return value


def eos_ids(eos_token_id: Any, generation_config: GenerationConfig | None) -> np.ndarray:
    """All end-of-sequence ids (an int, a list, a numpy or torch array, or the model's generation_config)."""
    value = eos_token_id if eos_token_id is not None else getattr(generation_config, "eos_token_id", None)
    if value is None:
        return np.zeros(0, dtype=np.int64)
    if isinstance(value, (torch.Tensor, np.ndarray)):
        value = value.tolist()
    values = [value] if _integer(value) is not None or not isinstance(value, (list, tuple)) else list(value)
    ids = [_integer(v) for v in values]
    if not all(i is not None and i >= 0 for i in ids):
        raise GenerateInputError(f"eos_token_id must be a token id >= 0 or a list of them, got {value!r}")
    return np.asarray(ids, dtype=np.int64)


def _check_not_meta(name: str, value: object) -> None:
    """Refuse a tensor on the meta device: it has a shape but no values to read."""
    if isinstance(value, torch.Tensor) and value.device.type == "meta":
        raise GenerateInputError(f"{name} is on the meta device, which holds shapes but no values: pass real "
                                 f"token ids on the CPU or the model's device, e.g. "
                                 f"tokenizer(text, return_tensors='pt').{name}")


def _mask_tensor(attention_mask: Any) -> torch.Tensor:
    """attention_mask (a tensor, a numpy array or nested lists of 0s and 1s) as a CPU tensor."""
    _check_not_meta("attention_mask", attention_mask)
    try:
        return torch.as_tensor(attention_mask).to("cpu")
    except (TypeError, ValueError, RuntimeError):
        raise GenerateInputError(f"attention_mask must be 0s and 1s shaped like input_ids (a tensor, array or "
                                 f"nested list), got {type(attention_mask).__name__}; pass "
                                 f"torch.ones_like(input_ids), or leave it out when there is no padding") from None


def padding_without_mask(ids: torch.Tensor, pad_token_id: Any, bos_token_id: Any = None,
                         eos_token_id: Any = None) -> bool:
    """Whether ids [B, T] look padded: the pad token at a row's start (left padding) or end (right
    padding), as transformers' own check reads the first and last ids. Where the pad token is also
    the BOS, a row must start with it twice (a prompt starts with one BOS); where it is also an EOS,
    a row's last id is not counted (a prompt may end with one)."""
    pad = _integer(pad_token_id)
    if pad is None or ids.numel() == 0:
        return False
    bos = _integer(bos_token_id)
    eos = {_integer(e) for e in (eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id])}
    first = ids[:, 0] == pad
    if pad == bos:
        first &= (ids[:, 1] == pad) if ids.shape[1] > 1 else torch.zeros_like(first)
    last = ids[:, -1] == pad if pad not in eos else torch.zeros_like(first)
    return bool((first | last).any())


def padding_message(pad_token_id: int) -> str:
    """The PaddingWarning's text: what goes wrong and the fix."""
    return (f"input_ids hold the pad token ({pad_token_id}) at a row's start or end and no attention_mask "
            f"was given: the padding is read as text, so a padded row decodes differently from the same "
            f"prompt alone; pass the tokenizer's mask, e.g. batch = tokenizer(texts, padding=True, "
            f"return_tensors='pt') (padding_side='left') and generate(batch['input_ids'], "
            f"attention_mask=batch['attention_mask'])")


def prompt_rows(input_ids: torch.Tensor, attention_mask: Any, vocab: int,
                special: GenerationConfig | None = None) -> tuple[torch.Tensor, torch.Tensor, list[np.ndarray]]:
    """A left-padded batch: (ids [B, T], mask [B, T] int64 on the CPU, each row's prompt without padding).

    ``special``: where the pad, BOS and EOS ids are read (the model's generation_config); without an
    attention_mask, ids that look padded (``padding_without_mask``) get a PaddingWarning, as transformers
    warns (every token is still read as text, as it was given).
    """
    if not isinstance(input_ids, torch.Tensor):
        raise GenerateInputError(f"input_ids must be a torch.LongTensor, got {type(input_ids).__name__}")
    _check_not_meta("input_ids", input_ids)
    ids = input_ids[None] if input_ids.dim() == 1 else input_ids
    if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
        raise GenerateInputError(f"input_ids must be integer token ids [batch, tokens], got shape "
                                 f"{tuple(input_ids.shape)} dtype {input_ids.dtype}")
    ids = ids.to("cpu", torch.int64)
    if attention_mask is None and special is not None:
        given = getattr(special, "pad_token_id", None)
        pad = _integer(given[0] if isinstance(given, (list, tuple)) and given else given)
        if pad is not None and padding_without_mask(ids, pad, getattr(special, "bos_token_id", None),
                                                    getattr(special, "eos_token_id", None)):
            warnings.warn(padding_message(pad), PaddingWarning, stacklevel=3)
    mask = torch.ones_like(ids) if attention_mask is None else _mask_tensor(attention_mask)
    mask = mask[None] if mask.dim() == 1 else mask
    if tuple(mask.shape) != tuple(ids.shape):
        raise GenerateInputError(f"attention_mask shape {tuple(mask.shape)} != input_ids shape {tuple(ids.shape)}")
    mask = (mask != 0).to(torch.int64)
    if ids.shape[1] == 0 or bool((mask.sum(1) == 0).any()):
        raise GenerateInputError("a prompt is empty: give every row at least one token")
    if bool((mask[:, 1:] < mask[:, :-1]).any()):
        raise GenerateInputError("attention_mask has padding after a token: pad on the left "
                                 "(tokenizer.padding_side = 'left'), as for model.generate")
    real = ids[mask.bool()]
    if int(real.min()) < 0 or int(real.max()) >= vocab:
        raise GenerateInputError(f"input_ids hold token ids outside the vocabulary [0, {vocab})")
    prompts = [row[m.bool()].numpy().copy() for row, m in zip(ids, mask)]
    return ids, mask, prompts


def tokens_left_in_context(prompt_len: int, context: int | None) -> int | None:
    """New tokens that fit in the model's context after a prompt (None: the model names no limit).

    The sequence never grows past max_position_embeddings (model.generate
    warns there, and models with learned positions fail); a prompt that
    already fills the context is refused.
    """
    if context is None:
        return None
    if prompt_len >= context:
        raise GenerateInputError(
            f"the prompt has {prompt_len} tokens but the model's context (max_position_embeddings) is {context}: "
            f"no room for new tokens; shorten the prompt to at most {context - 1} tokens")
    return context - prompt_len


def context_cut_message(prompt_len: int, new_tokens: int, asked: int, context: int) -> str:
    """The warning given when generation stops at the context before max_new_tokens."""
    return (f"generation stopped after {new_tokens} new tokens at the model's context "
            f"(prompt {prompt_len} + {new_tokens} = max_position_embeddings {context}); max_new_tokens={asked} "
            f"would run past what the model was trained on (model.generate warns there, and models with "
            f"learned positions fail); lower max_new_tokens or shorten the prompt")
