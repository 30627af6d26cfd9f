"""lookahead: model-free lookahead / n-gram decoding with exactly the target's greedy output.

The public names load on first use (PEP 562), so ``import lookahead`` (and the ``lookahead``
command's start, where Ctrl-C must already be caught) does not import torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .call.grammar import Grammar, GrammarInputError, TaggedCall
    from .call.logprobs import MAX_TOP_LOGPROBS, SequenceLogprobs, StepLogprobs
    from .call.result import LookaheadOutput
    from .call.stats import GenerationStats
    from .config import LookaheadConfig
    from .decode.batch import BatchEvent, BatchHandle, OpenBatch
    from .errors import (
        ConfigError,
        ContextLimitWarning,
        DeviceError,
        DraftModelError,
        GenerateInputError,
        MemoryFileError,
        ModelLoadError,
        ProcessorOutputError,
        UnsupportedModelError,
        UntestedModelWarning,
    )
    from .generator import Learned, LookaheadGenerator
    from .hf import CustomGenerate, custom_generate
    from .loading.models import DEFAULT_MODEL, load_model
    from .verify.penalties import BIAS_RANGE, PENALTY_RANGE

__all__ = [
    "LookaheadGenerator", "LookaheadConfig", "load_model", "DEFAULT_MODEL", "GenerationStats",
    "custom_generate", "CustomGenerate", "LookaheadOutput", "Learned",
    "OpenBatch", "BatchHandle", "BatchEvent", "StepLogprobs", "SequenceLogprobs",
    "MAX_TOP_LOGPROBS", "PENALTY_RANGE", "BIAS_RANGE", "Grammar", "GrammarInputError", "TaggedCall",
    "ConfigError", "GenerateInputError", "ModelLoadError", "UnsupportedModelError", "DeviceError",
    "DraftModelError", "ProcessorOutputError", "MemoryFileError",
    "UntestedModelWarning", "ContextLimitWarning",
]
__version__ = "0.1.0"

_HOMES = {  # public name -> the module defining it
    "LookaheadOutput": ".call.result", "GenerationStats": ".call.stats", "LookaheadConfig": ".config",
    "Learned": ".generator", "LookaheadGenerator": ".generator", "CustomGenerate": ".hf", "custom_generate": ".hf",
    "DEFAULT_MODEL": ".loading.models", "load_model": ".loading.models",
    "OpenBatch": ".decode.batch", "BatchHandle": ".decode.batch", "BatchEvent": ".decode.batch",
    "StepLogprobs": ".call.logprobs", "SequenceLogprobs": ".call.logprobs", "MAX_TOP_LOGPROBS": ".call.logprobs",
    "PENALTY_RANGE": ".verify.penalties", "BIAS_RANGE": ".verify.penalties",
    **{name: ".call.grammar" for name in ("Grammar", "GrammarInputError", "TaggedCall")},
    **{name: ".errors" for name in ("ConfigError", "ContextLimitWarning", "DeviceError", "DraftModelError",
                                    "GenerateInputError", "MemoryFileError", "ModelLoadError", "ProcessorOutputError",
                                    "UnsupportedModelError", "UntestedModelWarning")},
}


def __getattr__(name: str) -> Any:
    """A public name, imported from its module the first time it is asked for."""
    if name not in _HOMES:
        raise AttributeError(f"module 'lookahead' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
