"""lookahead: model-free lookahead / n-gram decoding with exactly the target's greedy output.

The public names load on first use (PEP 562), so ``import lookahead`` (and the ``lookahead``
command's start, where Ctrl-C must already be caught) does not import torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .call.result import LookaheadOutput
    from .call.stats import GenerationStats
    from .config import LookaheadConfig
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

__all__ = [
    "LookaheadGenerator", "LookaheadConfig", "load_model", "DEFAULT_MODEL", "GenerationStats",
    "custom_generate", "CustomGenerate", "LookaheadOutput", "Learned",
    "ConfigError", "GenerateInputError", "ModelLoadError", "UnsupportedModelError", "DeviceError",
    "DraftModelError", "ProcessorOutputError", "MemoryFileError",
    "UntestedModelWarning", "ContextLimitWarning",
]
__version__ = "0.1.0"

_HOMES = {  # public name -> the module defining it
    "LookaheadOutput": ".call.result", "GenerationStats": ".call.stats", "LookaheadConfig": ".config",
    "Learned": ".generator", "LookaheadGenerator": ".generator", "CustomGenerate": ".hf", "custom_generate": ".hf",
    "DEFAULT_MODEL": ".loading.models", "load_model": ".loading.models",
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
