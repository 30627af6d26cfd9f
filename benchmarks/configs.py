"""LookaheadConfig from a benchmark's spec such as ``"wide:window=5,ngram=4,context_match=false"``.

``lookahead bench --config`` / ``--preset`` and the benchmark scripts read such specs with
``parse_config_spec``. Each value is read, and the config made, by the config module itself
(``LookaheadConfig.from_mapping``, ``parse_value``: lookahead/config.py), the one parser behind the
commands' options and vLLM's settings too; what lives here is the spec's syntax alone.
"""

from __future__ import annotations

from lookahead.config import LookaheadConfig, parse_value


def parse_config_spec(spec: str, base: LookaheadConfig | None = None) -> tuple[str, LookaheadConfig]:
    """``"wide:window=5,ngram=4,candidates=8"`` -> ("wide", LookaheadConfig(window=5, ...)).

    The name is optional (``"window=5"`` is named ``lookahead[window=5]``); a field may be spelled with '-'
    for '_'; unnamed fields keep ``base``'s values. ValueError names the bad part.
    """
    name, _, body = spec.rpartition(":") if ":" in spec else ("", "", spec)
    name = name.strip() or f"lookahead[{body.strip()}]"
    fields = LookaheadConfig.field_names()
    values = {}
    for part in filter(None, (p.strip() for p in body.split(","))):
        key, eq, raw = part.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in fields:
            raise ValueError(f"bad config {spec!r}: {part!r} is not FIELD=VALUE with FIELD one of "
                             f"{', '.join(fields)}")
        try:
            values[key] = parse_value(key, raw)
        except ValueError as exc:
            raise ValueError(f"bad config {spec!r}: {exc}") from None
    return name, LookaheadConfig.from_mapping(values, base)
