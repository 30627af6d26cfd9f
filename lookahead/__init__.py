"""lookahead: model-free lookahead / n-gram decoding with exactly the target's greedy output."""

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
