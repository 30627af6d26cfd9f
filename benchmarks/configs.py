"""LookaheadConfig from what a person typed: the one parser behind the ``lookahead`` commands and the benchmarks.

cli/options.py makes one option per LookaheadConfig field with the type ``field_kind`` gives and builds the
config with ``config_from``; ``lookahead bench --config`` / ``--preset`` and the benchmark scripts read specs
such as ``"wide:window=5,ngram=4,context_match=false"`` with ``parse_config_spec``, whose values
``parse_value`` reads. It lives in lookahead.benchmarks because the CLI imports the benchmarks and never the
other way round; it needs nothing but LookaheadConfig (no [bench] extra).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, fields

from lookahead.config import LookaheadConfig

FIELDS: tuple[str, ...] = tuple(f.name for f in fields(LookaheadConfig))
_DEFAULTS = asdict(LookaheadConfig())
TRUE_WORDS = ("true", "1", "yes")
FALSE_WORDS = ("false", "0", "no")


def field_kind(name: str) -> type:
    """The type of a LookaheadConfig field's value, read from its default: bool, int, float or str."""
    return type(_DEFAULTS[name])


def parse_value(name: str, raw: str) -> bool | int | float | str:
    """Field ``name``'s value written as text (stripped): true/false (or 1/0, yes/no) for a switch, a whole
    number for an int field, a number for a float field, the text itself for a str field. ValueError names
    the field and the text."""
    kind, text = field_kind(name), raw.strip()
    if kind is bool:
        if text.lower() not in TRUE_WORDS + FALSE_WORDS:
            raise ValueError(f"{name} must be true or false, got {text!r}")
        return text.lower() in TRUE_WORDS
    if kind is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{name} must be an integer, got {text!r}") from None
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{name} must be a number, got {text!r}") from None
    return text


def config_from(values: Mapping[str, object], base: LookaheadConfig | None = None) -> LookaheadConfig:
    """``base`` (default: LookaheadConfig()) with the fields named in ``values`` replaced.

    A value is the field's value (the CLI's options, already typed by click) or, for a bool, int or float field, its
    text (read by ``parse_value``). ValueError names a key that is no field; LookaheadConfig raises
    ConfigError for a value out of range.
    """
    unknown = [key for key in values if key not in _DEFAULTS]
    if unknown:
        raise ValueError(f"{unknown[0]!r} is no LookaheadConfig field; fields: {', '.join(FIELDS)}")
    typed = {key: parse_value(key, value) if isinstance(value, str) and field_kind(key) is not str else value
             for key, value in values.items()}
    return LookaheadConfig(**{**asdict(base or LookaheadConfig()), **typed})


def parse_config_spec(spec: str, base: LookaheadConfig | None = None) -> tuple[str, LookaheadConfig]:
    """``"wide:window=5,ngram=4,candidates=8"`` -> ("wide", LookaheadConfig(window=5, ...)).

    The name is optional (``"window=5"`` is named ``lookahead[window=5]``); a field may be spelled with '-'
    for '_'; unnamed fields keep ``base``'s values. ValueError names the bad part.
    """
    name, _, body = spec.rpartition(":") if ":" in spec else ("", "", spec)
    name = name.strip() or f"lookahead[{body.strip()}]"
    values = {}
    for part in filter(None, (p.strip() for p in body.split(","))):
        key, eq, raw = part.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in _DEFAULTS:
            raise ValueError(f"bad config {spec!r}: {part!r} is not FIELD=VALUE with FIELD one of "
                             f"{', '.join(FIELDS)}")
        try:
            values[key] = parse_value(key, raw)
        except ValueError as exc:
            raise ValueError(f"bad config {spec!r}: {exc}") from None
    return name, config_from(values, base)
