"""generate's ``prediction`` (Predicted Outputs, proposers/prediction.py): the predicted output of each row
as token ids, checked, with one clear error per bad input."""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import GenerateInputError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TAKES = ("prediction takes the predicted output as text (a str), as token ids (a list of ints or a 1-D "
         "integer tensor or array) or, for a batch, a list of those with one entry per row (None for a row "
         "without one)")


def _ids_like(value: Any) -> bool:
    """Whether ``value`` is one prediction's token ids (not a list of per-row predictions)."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return True
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) for v in value)


def _one(value: Any, where: str, vocab: int, tokenizer: PreTrainedTokenizerBase | None) -> np.ndarray:
    """One prediction [P] as int64 token ids, or GenerateInputError naming ``where``."""
    if isinstance(value, str):
        if not value:
            raise GenerateInputError(f"{where} is empty text: pass the predicted output, or leave prediction out")
        if tokenizer is None:
            raise GenerateInputError(f"{where} is text and this generator has no tokenizer: build "
                                     f"LookaheadGenerator(model, tokenizer), pass tokenizer=, or pass token ids")
        ids = np.asarray(tokenizer(value, add_special_tokens=False)["input_ids"], dtype=np.int64).reshape(-1)
        if ids.shape[0] == 0:
            raise GenerateInputError(f"{where} makes no tokens: pass the predicted output, or leave prediction out")
    elif isinstance(value, (torch.Tensor, np.ndarray)):
        array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value
        if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
            raise GenerateInputError(f"{where} must be 1-D integer token ids, got shape {tuple(array.shape)} "
                                     f"dtype {array.dtype}; for a batch pass a list of 1-D predictions")
        ids = array.astype(np.int64)
    elif isinstance(value, (list, tuple)) and _ids_like(value):
        ids = np.asarray([int(v) for v in value], dtype=np.int64)
    elif isinstance(value, (list, tuple)) and not value:
        raise GenerateInputError(f"{where} is an empty list: pass the predicted output, or leave prediction out")
    else:
        raise GenerateInputError(f"{where} is a {type(value).__name__}: {TAKES}")
    if ids.shape[0] == 0:
        raise GenerateInputError(f"{where} holds no tokens: pass the predicted output, or leave prediction out")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise GenerateInputError(f"{where} holds token ids outside the vocabulary [0, {vocab})")
    return ids


def prediction_rows(prediction: Any, contexts_left: list[int | None], vocab: int,
                    tokenizer: PreTrainedTokenizerBase | None) -> list[np.ndarray | None] | None:
    """generate's ``prediction`` for a batch whose rows have ``contexts_left`` new tokens left in the model's context
    (None: no limit): per row, its predicted tokens [P] or None; None when no prediction was given.

    One prediction (text or ids) goes with a batch of one row; a batch takes a list of one entry per row.
    A prediction longer than the new tokens its row can hold is refused (the output can never reach it).
    """
    if prediction is None:
        return None
    batch = len(contexts_left)
    if isinstance(prediction, str) or _ids_like(prediction):
        if batch != 1:
            raise GenerateInputError(f"prediction: one prediction for a batch of {batch} rows; pass a list of "
                                     f"{batch} predictions, one per row (None for a row without one)")
        entries: list[Any] = [prediction]
    elif isinstance(prediction, (list, tuple)) and prediction:
        if any(isinstance(v, numbers.Number) for v in prediction):
            raise GenerateInputError(f"prediction holds values that are no token ids ({prediction[:4]!r}...): "
                                     f"{TAKES}")
        if len(prediction) != batch:
            raise GenerateInputError(f"prediction holds {len(prediction)} entries for a batch of {batch} rows: "
                                     f"pass one per row (None for a row without one)")
        entries = list(prediction)
    else:
        _one(prediction, "prediction", vocab, tokenizer)  # (raises: empty, or of a type no prediction has)
        raise AssertionError("unreachable: _one refuses what is neither text nor ids")
    rows: list[np.ndarray | None] = []
    for b, (entry, left) in enumerate(zip(entries, contexts_left)):
        where = "prediction" if batch == 1 and len(entries) == 1 and entry is prediction else f"prediction[{b}]"
        if entry is None:
            rows.append(None)
            continue
        ids = _one(entry, where, vocab, tokenizer)
        if left is not None and ids.shape[0] > left:
            raise GenerateInputError(f"{where} has {ids.shape[0]} tokens but the model's context holds at most "
                                     f"{left} new tokens after the prompt: shorten the prediction to at most "
                                     f"{left} tokens")
        rows.append(ids)
    return rows
