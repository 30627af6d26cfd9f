"""``model.generate(..., custom_generate=lookahead.custom_generate)``: lookahead behind transformers' generate.

For a callable ``custom_generate``, transformers (5.x) ``generate`` does its
usual preparation (the generation config with the call's arguments merged
in, the prompt, the full LogitsProcessorList and StoppingCriteriaList built
from that config with the user's lists merged in) and then calls

    custom_generate(model, input_ids, logits_processor=..., stopping_criteria=...,
                    generation_config=..., <keywords of ours>, **model_kwargs)

Every keyword the callable declares beyond transformers' own ``_sample``
signature is taken out of the call's kwargs and handed to it. We decode with
the prepared config and lists exactly as they are
(``LookaheadGenerator.generate_prepared``): nothing is applied twice.

What transformers does NOT hand a callable, and what to pass instead:

- ``streamer=``: generate pushes the prompt to it and then drops it, so it
  would never see a new token nor ``end()`` (a TextIteratorStreamer would
  wait forever). Pass ``lookahead_streamer=`` instead: it receives the
  prompt, every accepted token in order, then ``end()``. A ``streamer=`` is
  refused (``GenerateInputError``, the streamer ended first); it is seen in
  generate's own frame, the only place it is left (``streamer_given``).
- ``tokenizer=``: dropped as well; stop strings need it, so pass
  ``lookahead_tokenizer=``. ``stop_strings`` is one of our keywords (left to
  transformers it would fail for lack of the tokenizer).
"""

from __future__ import annotations

import sys
import weakref
from types import FrameType
from typing import TYPE_CHECKING, Any

import torch
from transformers.generation.stopping_criteria import StoppingCriteriaList, StopStringCriteria

from .call.decoding import stop_string_list
from .call.inputs import GenerateInputError
from .call.keywords import refuse_kwargs
from .call.result import LookaheadOutput
from .config import LookaheadConfig
from .generator import Learned, LookaheadGenerator

if TYPE_CHECKING:
    from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, PreTrainedTokenizerBase
    from transformers.generation.streamers import BaseStreamer

def prompt_mask(model_kwargs: dict, length: int) -> torch.Tensor | None:
    """The prompt's attention mask (None: no padding), after checking the rest of model_kwargs.

    What lookahead does itself is dropped (a fresh empty cache, logits_to_keep,
    use_cache, default positions); anything it cannot honour is refused by name
    with what it takes instead, in the words ``LookaheadGenerator.generate`` uses
    (call/inputs.py ``refuse_kwargs``).
    """
    kwargs = dict(model_kwargs)
    mask = kwargs.pop("attention_mask", None)
    for name in ("past_key_values", "cache"):  # transformers 5.24 renamed the first to the second
        cache = kwargs.get(name)
        if cache is not None and not getattr(cache, "_is_user_defined", False) and cache.get_seq_length() == 0:
            del kwargs[name]  # the empty cache transformers made for its own forwards
    refuse_kwargs(kwargs, "model.generate(..., custom_generate=lookahead.custom_generate)", length)
    return mask


def streamer_given(frame: FrameType | None) -> object | None:
    """The ``streamer=`` of the model.generate call running in ``frame`` (a custom_generate callable's
    caller), which transformers does not hand the callable; None when there is none or the frame is
    not GenerationMixin.generate's."""
    if frame is None or frame.f_code.co_name != "generate" or "generation_mode_kwargs" not in frame.f_locals:
        return None
    return frame.f_locals.get("streamer")


def refuse_streamer(streamer: Any) -> None:
    """End the streamer transformers gave the prompt to (a reader thread stops waiting) and say what to pass."""
    streamer.end()
    raise GenerateInputError("streamer=: transformers does not hand a streamer to a custom_generate callable (it "
                             "would get the prompt and nothing more); pass lookahead_streamer=streamer to "
                             "model.generate instead, or stream with LookaheadGenerator(model, tokenizer)"
                             ".generate(..., streamer=streamer)")


class CustomGenerate:
    """The callable for ``model.generate(**inputs, custom_generate=...)`` (exported as
    ``lookahead.custom_generate``): greedy output identical to model.generate, sampling with
    exactly the model's distribution, under the generation settings of the call.

    Keywords of its own, passed to ``model.generate`` (or in a pipeline's ``generate_kwargs``):
    ``lookahead_config`` (a LookaheadConfig), ``lookahead_streamer`` (instead of ``streamer``),
    ``lookahead_tokenizer`` (for ``stop_strings`` and a text ``prediction``), ``stop_strings`` and
    ``prediction`` (Predicted Outputs, as ``LookaheadGenerator.generate`` takes it).

    What each generator learned (recycled successors, acceptance estimates, the
    cost curve) is kept per model and config between calls, without keeping the
    model alive.
    """

    def __init__(self):
        self._learned: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {config: Learned}

    def generator(self, model: PreTrainedModel, config: LookaheadConfig | None = None,
                  tokenizer: PreTrainedTokenizerBase | None = None) -> LookaheadGenerator:
        """A LookaheadGenerator for model and config that continues from what earlier calls learned.

        Args:
            model: the target causal LM.
            config: the engine's settings (the defaults when None).
            tokenizer: the model's tokenizer, for what needs text.

        Returns:
            A generator sharing this callable's learned statistics for (model, config).
        """
        config = config if config is not None else LookaheadConfig()
        if not isinstance(config, LookaheadConfig):
            raise TypeError(f"lookahead_config must be a LookaheadConfig, got {type(config).__name__}")
        learned: dict[LookaheadConfig, Learned] = self._learned.setdefault(model, {})
        gen = LookaheadGenerator(model, tokenizer, config, learned=learned.get(config))
        learned[config] = gen.learned
        return gen

    def __call__(self, model: PreTrainedModel, input_ids: torch.LongTensor,
                 logits_processor: LogitsProcessorList | None = None,
                 stopping_criteria: StoppingCriteriaList | None = None,
                 generation_config: GenerationConfig | None = None,
                 lookahead_config: LookaheadConfig | None = None,
                 lookahead_streamer: BaseStreamer | None = None,
                 lookahead_tokenizer: PreTrainedTokenizerBase | None = None,
                 stop_strings: str | list[str] | None = None, prediction: Any = None,
                 **model_kwargs: Any) -> torch.LongTensor | LookaheadOutput:
        """Decode as model.generate prepared it; ids [1, prompt + new], or a LookaheadOutput when the
        config says return_dict_in_generate.

        Args:
            model: the model ``generate`` was called on.
            input_ids: [1, T] the prompt.
            logits_processor, stopping_criteria, generation_config: what transformers prepared.
            lookahead_config: the engine's settings (the defaults when None).
            lookahead_streamer: receives the prompt, then the kept tokens.
            lookahead_tokenizer: the tokenizer, for stop strings and text predictions.
            stop_strings: text that ends the output.
            prediction: expected output ids or text (Predicted Outputs).
            model_kwargs: refused where lookahead cannot honour them (named in the error).

        Returns:
            [1, T + N] ids, or a LookaheadOutput.
        """
        if generation_config is None:
            raise GenerateInputError("custom_generate is called by model.generate(..., custom_generate=...); "
                                     "to decode directly, use LookaheadGenerator(model).generate")
        if (dropped := streamer_given(sys._getframe(1))) is not None:  # noqa: SLF001
            refuse_streamer(dropped)
        mask = prompt_mask(model_kwargs, input_ids.shape[-1])
        criteria = StoppingCriteriaList(stopping_criteria if stopping_criteria is not None else [])
        if stop_strings is not None:
            if lookahead_tokenizer is None:
                raise GenerateInputError("stop_strings need the tokenizer, and transformers does not hand "
                                         "tokenizer= to a custom_generate callable: pass lookahead_tokenizer=tokenizer")
            criteria.append(StopStringCriteria(lookahead_tokenizer, stop_string_list(stop_strings)))
        gen = self.generator(model, lookahead_config, lookahead_tokenizer)
        return gen.generate_prepared(input_ids, mask, generation_config, logits_processor, criteria,
                                     lookahead_streamer, prediction)


custom_generate = CustomGenerate()  # the instance users pass; it holds the learned state per model
