"""Every error and warning lookahead raises, and errors whose fix is one option (the message names it
for Python callers, ``cli_text`` for the CLI)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OptionFix:
    """How to get past an error by passing one option.

    ``option`` is the Python name (a LookaheadConfig field or a load_model
    argument); the CLI spells it ``--option-name`` (cli/main.py maps every
    option that way).
    """

    option: str  # e.g. "allow_untested_models"
    python: str  # how a Python caller passes it, e.g. "LookaheadConfig(allow_untested_models=True)"
    purpose: str  # e.g. "to try it anyway"

    def python_text(self) -> str:
        """'pass LookaheadConfig(allow_untested_models=True) to try it anyway'."""
        return f"pass {self.python} {self.purpose}"

    def cli_text(self) -> str:
        """'pass --allow-untested-models to try it anyway'."""
        return f"pass --{self.option.replace('_', '-')} {self.purpose}"


def one_line(exc: BaseException) -> str:
    """An exception's whole message on one line (transformers' errors span several), or its type's name."""
    return " ".join(str(exc).split()) or type(exc).__name__


def with_fix(error_type: type[Exception], problem: str, fix: OptionFix) -> Exception:
    """An ``error_type`` saying problem and the Python fix; ``.problem`` and ``.fix`` kept for the CLI."""
    error: Any = error_type(f"{problem}; {fix.python_text()}")  # (any exception takes the two attributes)
    error.problem = problem
    error.fix = fix
    return error


class ModelLoadError(RuntimeError):
    """A model name or path could not be resolved or loaded."""


class ConfigError(ValueError):
    """A configuration value is out of range; the message names the field and the fix."""


class GenerateInputError(ValueError):
    """An argument of generate() is unusable; the message names it and the fix."""


class ProcessorOutputError(GenerateInputError):
    """The logits processors left a row with nothing to sample from (NaN, +inf, or every score -inf)."""


class ContextLimitWarning(UserWarning):
    """Generation stopped at the model's context (max_position_embeddings) before max_new_tokens."""


class PaddingWarning(UserWarning):
    """input_ids look padded (the pad token at a row's start or end) and no attention_mask says which
    tokens are padding: the padding is read as text (what transformers warns about too)."""


class UnsupportedModelError(ValueError):
    """The engine cannot drive this model exactly; the message says why and what to do."""


class UntestedModelWarning(UserWarning):
    """The model's architecture is driven on request, without an exactness test behind it."""


class DraftModelError(ValueError):
    """The draft model cannot propose for this target; the message says why and what to do."""


class DeviceError(ValueError):
    """The device names nothing usable on this machine; the message says what is there instead."""


class RegistryError(RuntimeError):
    """A packaged file could not be found, fetched or verified."""


class MemoryFileError(ValueError):
    """A memory file (save_memory / load_memory, --memory) cannot be read or written; the message says why
    and what to do. A file that fails a check is refused whole: nothing of it is loaded."""
