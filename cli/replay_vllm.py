"""``python -m lookahead.cli.replay_vllm``: vLLM's chain verification replayed without vLLM, lookahead's
proposer against SuffixDecoding on a chat data set's greedy answers (the replay itself:
lookahead/vllm/replay.py). The command reads the data sets and builds SuffixDecoding from the
benchmarks; the replay it drives imports neither."""

from __future__ import annotations

import json
from typing import IO, Any

import click

from lookahead.vllm.replay import markdown, replay_all


def chat_prompts(name: str, limit: int) -> list[list[dict[str, Any]]]:
    """The data set's first ``limit`` prompts as chat messages (a data set of completion prompts refused)."""
    from lookahead.benchmarks.datasets import chat_messages

    try:
        return [messages for _, messages in chat_messages(name, limit)]
    except ValueError as exc:
        raise click.BadParameter(f"{exc}: pick a chat data set such as tool-calls or mt-bench-1",
                                 param_hint="--dataset") from None


@click.command()
@click.option("--model", "model_name", default="smollm2-135m", show_default=True)
@click.option("--dataset", "datasets", multiple=True, default=("tool-calls",), show_default=True,
              help="Chat data set replayed in order (repeatable).")
@click.option("--limit", type=click.IntRange(1), default=24, show_default=True, help="Prompts per data set.")
@click.option("--max-tokens", type=click.IntRange(1), default=64, show_default=True)
@click.option("--k", type=click.IntRange(1, 32), default=6, show_default=True, help="num_speculative_tokens.")
@click.option("--step-ms", type=click.FloatRange(min=0.0, min_open=True), default=26.3, show_default=True,
              help="vLLM's cost of a verification step, one request (`lookahead bench-vllm` measures it on "
                   "this machine; the default is one such measurement's).")
@click.option("--draft-ms", type=click.FloatRange(min=0.0), default=3.84, show_default=True,
              help="vLLM's cost of a draft token's row.")
@click.option("--lookahead-settings", default="{}", show_default=True,
              help="additional_config['lookahead'] of lookahead's proposer, as JSON.")
@click.option("--suffix/--no-suffix", default=True, show_default=True,
              help="Also replay SuffixDecoding (arctic-inference, built from source once) and the oracle.")
@click.option("--out", default=None, help="Write the report as JSON to this file.")
@click.option("--log", "log_path", default=None,
              help="Write lookahead's lane step by step to this file (JSON lines: the draft, what was accepted, "
                   "the answer's next tokens and every source's candidate rows).")
def main(model_name: str, datasets: tuple[str, ...], limit: int, max_tokens: int, k: int, step_ms: float,
         draft_ms: float, lookahead_settings: str, suffix: bool, out: str | None, log_path: str | None) -> None:
    """Replay lookahead's vLLM proposer (and SuffixDecoding) on the model's greedy answers; see
    lookahead/vllm/replay.py."""
    from lookahead.vllm.settings import settings_from

    try:
        settings = json.loads(lookahead_settings)
        settings_from({"lookahead": settings})
    except (ValueError, TypeError) as exc:
        raise click.BadParameter(str(exc), param_hint="--lookahead-settings") from None
    cache_class, skipped = None, None
    if suffix:
        from lookahead.benchmarks.suffix_anchor import AnchorUnavailable, build_suffix_decoding

        try:
            cache_class = build_suffix_decoding(log=lambda line: click.echo(line, err=True))
        except AnchorUnavailable as exc:
            skipped = str(exc)
    chats = {name: chat_prompts(name, limit) for name in datasets}
    log_file = open_log(log_path)
    try:
        report = replay_all(model_name, chats, max_tokens, k, step_ms, draft_ms, settings, cache_class, skipped,
                            log_file)
    finally:
        if log_file is not None:
            log_file.close()
    click.echo(markdown(report))
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=1)


def open_log(path: str | None) -> IO[str] | None:
    """The step log's file, open for writing (None without one); a path it cannot be written at is refused
    with the reason, before any model is loaded."""
    if path is None:
        return None
    try:
        return open(path, "w")
    except OSError as exc:
        raise click.BadParameter(f"cannot write {path!r}: {exc.strerror}; name a file in an existing, writable "
                                 "directory", param_hint="--log") from None




if __name__ == "__main__":
    main()
