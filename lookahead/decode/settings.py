"""One call's settings resolved into its ``Decoding``: the path ``generate`` and an open batch's ``join`` share.

The arguments are ``LookaheadGenerator.generate``'s (each None: the model's generation_config value),
resolved in one order for both: OpenAI's penalties and bias after the call's own processors
(verify/penalties.py), transformers' processors and stopping criteria over the generation_config
(call/decoding.py), the logprobs asked for (call/logprobs.py), then a response_format's grammar mask first
among the processors (verify/grammar.py). Every bad value raises GenerateInputError naming the argument.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ..call.decoding import Decoding, resolve_decoding
from ..call.grammar import Grammar
from ..call.logprobs import with_logprobs
from ..verify.grammar import constrained
from ..verify.penalties import Penalties, merged_processors

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel


def call_decoding(model: PreTrainedModel, prompt_len: int, device: torch.device, vocab: int,
                  grammar: Callable[[Any], Grammar | None], *, presence_penalty: Any = None,
                  frequency_penalty: Any = None, logit_bias: Any = None, logits_processor: Any = None,
                  logprobs: Any = None, response_format: Any = None, return_dict_in_generate: Any = None,
                  **settings: Any) -> Decoding:
    """The Decoding of a call on prompts of ``prompt_len`` columns; ``grammar``: ``response_format``
    compiled (None for None); ``settings``: the rest of resolve_decoding's keywords."""
    penalties = Penalties(presence_penalty or 0.0, frequency_penalty or 0.0,
                          logit_bias if logit_bias is not None else {}, vocab)
    processors = cast(Any, merged_processors(logits_processor, penalties, prompt_len))  # (resolve checks it)
    decoding = resolve_decoding(model, prompt_len, device, logits_processor=processors,
                                return_dict_in_generate=return_dict_in_generate, **settings)
    decoding = with_logprobs(decoding, logprobs, return_dict_in_generate)
    return constrained(decoding, grammar(response_format), prompt_len)
