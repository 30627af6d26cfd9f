"""Errors whose fix is one option: the message names it for Python callers, ``cli_text`` for the CLI."""

from __future__ import annotations

from dataclasses import dataclass


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
        return f"pass {self.python} {self.purpose}"

    def cli_text(self) -> str:
        return f"pass --{self.option.replace('_', '-')} {self.purpose}"


def one_line(exc: BaseException) -> str:
    """An exception's whole message on one line (transformers' errors span several), or its type's name."""
    return " ".join(str(exc).split()) or type(exc).__name__


def with_fix(error_type: type[Exception], problem: str, fix: OptionFix) -> Exception:
    """An ``error_type`` saying problem and the Python fix; ``.problem`` and ``.fix`` kept for the CLI."""
    error = error_type(f"{problem}; {fix.python_text()}")
    error.problem = problem
    error.fix = fix
    return error


class ModelLoadError(RuntimeError):
    """A model name or path could not be resolved or loaded."""
