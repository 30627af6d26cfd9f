"""lookahead: model-free lookahead / n-gram decoding with exactly the target's greedy output."""

from .config import ConfigError, LookaheadConfig
from .engine import Learned, LookaheadGenerator
from .hf import CustomGenerate, custom_generate
from .inputs import GenerateInputError
from .models import DEFAULT_MODEL, ModelLoadError, load_model
from .result import LookaheadOutput
from .stats import GenerationStats
from .support import UnsupportedModelError

__all__ = [
    "LookaheadGenerator", "LookaheadConfig", "load_model", "DEFAULT_MODEL", "GenerationStats",
    "custom_generate", "CustomGenerate", "LookaheadOutput", "Learned",
    "ConfigError", "GenerateInputError", "ModelLoadError", "UnsupportedModelError",
]
__version__ = "0.1.0"
