"""Whether a draft model can propose for a target: a causal LM the engine drives, the same
vocabulary, on the target's device (unless the caller says otherwise)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ...errors import DraftModelError
from ...model.quantized import embedding_facts
from ...model.support import AttentionLayout, UnsupportedModelError, check_model
from ...model.target import input_device

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

OTHER_VOCABULARY = "token ids cannot pass between them; pick a draft of the target's family with the same tokenizer"


def check_draft(target: PreTrainedModel, draft: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None = None,
                draft_tokenizer: PreTrainedTokenizerBase | None = None, allow_other_device: bool = False,
                allow_untested: bool = False) -> AttentionLayout:
    """Raise DraftModelError unless ``draft`` can draft for ``target``; its attention layout.

    Token ids pass between the two as they are, so the vocabularies must be
    the same: the embedding sizes, and the tokenizers' vocabularies when both
    are given.
    """
    if not isinstance(draft, torch.nn.Module) or not hasattr(draft, "get_input_embeddings") \
            or not hasattr(draft, "config"):
        raise DraftModelError(f"draft_model must be a transformers causal LM (e.g. from load_model or "
                              f"AutoModelForCausalLM), got {type(draft).__name__}")
    try:
        layout = check_model(draft, allow_untested)
    except UnsupportedModelError as exc:
        raise DraftModelError(f"draft_model: {exc}") from None
    target_vocab, draft_vocab = _vocabulary(target), _vocabulary(draft)
    if target_vocab != draft_vocab:
        raise DraftModelError(f"the draft's vocabulary ({draft_vocab} tokens) differs from the target's "
                              f"({target_vocab} tokens): {OTHER_VOCABULARY}")
    _check_tokenizers(tokenizer, draft_tokenizer)
    where, own = input_device(draft), input_device(target)
    if where != own and not allow_other_device:
        raise DraftModelError(
            f"the draft model is on {where} but the target on {own}; move it with draft_model.to('{own}'), "
            f"or pass allow_draft_device=True to run it where it is")
    return layout


def check_draft_source(target: PreTrainedModel, draft_name: str, cache_dir: str | None = None) -> None:
    """Raise DraftModelError before the draft named draft_name loads when the vocabulary it declares
    (its config.json or GGUF header: models.declared_vocab_size) differs from the target's embeddings.

    When the vocabulary cannot be read without loading, nothing is said here:
    ``check_draft`` compares the loaded models.
    """
    from ...loading.models import declared_vocab_size

    draft_vocab = declared_vocab_size(draft_name, cache_dir)
    target_vocab = _vocabulary(target)
    if draft_vocab is not None and draft_vocab != target_vocab:
        raise DraftModelError(f"the draft model {draft_name} declares a vocabulary of {draft_vocab} tokens (its "
                              f"config, read before its weights), the target has {target_vocab}: {OTHER_VOCABULARY}")


def _vocabulary(model: PreTrainedModel) -> int:
    """Rows of the model's input embedding: the ids it can read."""
    return embedding_facts(model)[2]


def _check_tokenizers(tokenizer: PreTrainedTokenizerBase | None,
                      draft_tokenizer: PreTrainedTokenizerBase | None) -> None:
    """Raise DraftModelError when both tokenizers are given and their vocabularies differ."""
    if tokenizer is None or draft_tokenizer is None:
        return
    mine, theirs = tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if mine == theirs:
        return
    differ = sorted(set(mine.items()) ^ set(theirs.items()))[:3]
    raise DraftModelError(
        f"the draft's tokenizer ({len(theirs)} tokens) does not match the target's ({len(mine)} tokens), "
        f"e.g. {differ}: token ids would mean different text; pick a draft with the target's tokenizer")
