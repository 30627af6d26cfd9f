"""Validation of generate()'s arguments: one clear error per bad input."""

from __future__ import annotations

import numpy as np
import torch


class GenerateInputError(ValueError):
    """An argument of generate() is unusable; the message names it and the fix."""


def budget(max_new_tokens, default: int | None) -> int:
    """max_new_tokens checked (None -> the model's generation_config value, else 20)."""
    value = default if max_new_tokens is None else max_new_tokens
    value = 20 if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GenerateInputError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    return value


def eos_ids(eos_token_id, generation_config) -> np.ndarray:
    """All end-of-sequence ids (an int, a list, or the model's generation_config)."""
    value = eos_token_id if eos_token_id is not None else getattr(generation_config, "eos_token_id", None)
    if value is None:
        return np.zeros(0, dtype=np.int64)
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    values = [value] if isinstance(value, int) else list(value)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise GenerateInputError(f"eos_token_id must be token ids >= 0, got {value!r}")
    return np.asarray(values, dtype=np.int64)


def prompt_rows(input_ids, attention_mask, vocab: int) -> tuple[torch.Tensor, torch.Tensor, list[np.ndarray]]:
    """A left-padded batch: (ids [B, T], mask [B, T] int64 on the CPU, each row's prompt without padding)."""
    if not isinstance(input_ids, torch.Tensor):
        raise GenerateInputError(f"input_ids must be a torch.LongTensor, got {type(input_ids).__name__}")
    ids = input_ids[None] if input_ids.dim() == 1 else input_ids
    if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
        raise GenerateInputError(f"input_ids must be integer token ids [batch, tokens], got shape "
                                 f"{tuple(input_ids.shape)} dtype {input_ids.dtype}")
    ids = ids.to("cpu", torch.int64)
    mask = torch.ones_like(ids) if attention_mask is None else torch.as_tensor(attention_mask).to("cpu")
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
