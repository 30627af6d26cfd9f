"""lookahead: model-free lookahead / n-gram decoding with exactly the target's greedy output."""

from .config import ConfigError, LookaheadConfig
from .device import DeviceError
from .draftcheck import DraftModelError
from .engine import Learned, LookaheadGenerator
from .errors import ModelLoadError
from .hf import CustomGenerate, custom_generate
from .inputs import ContextLimitWarning, GenerateInputError
from .models import DEFAULT_MODEL, load_model
from .processing import ProcessorOutputError
from .result import LookaheadOutput
from .stats import GenerationStats
from .support import UnsupportedModelError, UntestedModelWarning

__all__ = [
    "LookaheadGenerator", "LookaheadConfig", "load_model", "DEFAULT_MODEL", "GenerationStats",
    "custom_generate", "CustomGenerate", "LookaheadOutput", "Learned",
    "ConfigError", "GenerateInputError", "ModelLoadError", "UnsupportedModelError", "DeviceError",
    "DraftModelError", "ProcessorOutputError",
    "UntestedModelWarning", "ContextLimitWarning",
]
__version__ = "0.1.0"
