"""The ``lookahead`` command: generate, and the benches (cli/bench.py, bench_batch.py, bench_memory.py);
the options and checks they share are in cli/options.py."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from lookahead.cli.bench import bench
from lookahead.cli.bench_batch import bench_batch
from lookahead.cli.bench_memory import bench_memory
from lookahead.cli.bench_serve import bench_serve
from lookahead.cli.options import (
    CLI_ERRORS,
    DTYPES,
    SAMPLING_FIELDS,
    checked_config,
    checked_prompt,
    checked_seed,
    cli_message,
    config_options,
    fail,
    sampling_options,
    threads_option,
    trust_remote_code_option,
    warnings_as_lines,
)
from lookahead.cli.roofline import roofline
from lookahead.cli.serve import serve
from lookahead.config import LookaheadConfig

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase


@click.group()
def main() -> None:
    """Lookahead decoding: the same greedy tokens as model.generate, in fewer forward passes."""


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str, chat: bool) -> torch.Tensor:
    """Token ids [1, T] of the prompt, through the chat template unless chat is False."""
    if chat and getattr(tokenizer, "chat_template", None):
        encoded: Any = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                     return_tensors="pt", return_dict=True)  # a BatchEncoding
        return encoded["input_ids"]
    return tokenizer(prompt, return_tensors="pt")["input_ids"]


@main.command()
@click.option("--model", "model_name", default="smollm2-135m", show_default=True,
              help="Built-in alias, .gguf file, local directory or hub id.")
@click.option("--prompt", required=True, help="The text to continue (a user message unless --no-chat).")
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.option("--chat/--no-chat", default=True, show_default=True, help="Apply the tokenizer's chat template.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of streaming text.")
@click.option("--draft-model", default=None,
              help="A small model with the target's tokenizer (any name --model takes) that drafts "
                   "candidates too, on the same device and dtype.")
@click.option("--device", default="cpu", show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option("--memory", "memory_path", default=None, metavar="PATH",
              help="Remember requests across runs in this file: read before generating (when it exists), "
                   "written back after (it holds your prompts' outputs).")
@trust_remote_code_option
@threads_option
@sampling_options
@config_options
def generate(model_name: str, prompt: str, max_new_tokens: int, chat: bool, as_json: bool, draft_model: str | None,
             device: str, dtype: str, memory_path: str | None, trust_remote_code: bool, seed: int | None,
             **values: Any) -> None:
    """Generate text with lookahead decoding (greedy, or sampled with --sample)."""
    checked_prompt(prompt)
    seed = checked_seed(seed)
    if max_new_tokens < 0:
        fail(f"--max-new-tokens must be >= 0, got {max_new_tokens}")
    sampling = {name: values.pop(name) for name in SAMPLING_FIELDS}
    config = checked_config(values)
    checked_memory_path(memory_path, config)
    try:
        with warnings_as_lines():
            result = _generate(model_name, prompt, max_new_tokens, chat, as_json,
                               (device, dtype, trust_remote_code, draft_model), config, sampling, seed, memory_path)
    except CLI_ERRORS as exc:
        fail(cli_message(exc))
    if as_json:
        click.echo(json.dumps(result))


def checked_memory_path(path: str | None, config: LookaheadConfig) -> None:
    """One line and exit status 2, before any model loads, when --memory cannot work: no store
    (--memory-tokens 0), a directory, or a place the file cannot be written back to."""
    if path is None:
        return
    if config.memory_tokens == 0:
        fail("--memory keeps requests in a memory store, and --memory-tokens 0 turns it off: "
             "pass --memory-tokens N (N >= 2) or leave --memory out")
    where = Path(path).expanduser()
    if where.is_dir():
        fail(f"--memory {path} is a directory: pass a file path, e.g. {where / 'memory.lkm'}")
    parent = where.parent if where.parent != Path("") else Path(".")
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK) \
            or (where.exists() and not os.access(where, os.R_OK)):
        fail(f"--memory {path}: cannot read and write there (the directory {parent} does not exist or is not "
             f"writable): pass a path in a directory you can write to")


def _generate(model_name: str, prompt: str, max_new_tokens: int, chat: bool, as_json: bool,
              loading: tuple[str, str, bool, str | None], config: LookaheadConfig, sampling: dict[str, Any],
              seed: int | None, memory_path: str | None = None) -> dict:
    """Load (device, dtype, trust_remote_code, draft model name = loading), generate (streaming unless
    as_json), report stats; the JSON result. With ``memory_path``, the generator's memory across
    requests is read from that file first (when it exists) and written back after."""
    import torch
    from transformers import TextStreamer

    from lookahead import LookaheadGenerator, load_model
    from lookahead.proposers.draft.checks import check_draft_source

    device, dtype, trust_remote_code, draft_name = loading
    model, tokenizer = load_model(model_name, device=device, dtype=getattr(torch, dtype),
                                  trust_remote_code=trust_remote_code)
    draft, draft_tokenizer = None, None
    if draft_name is not None:
        check_draft_source(model, draft_name)  # its vocabulary, from its config, before its weights load
        draft, draft_tokenizer = load_model(draft_name, device=device, dtype=getattr(torch, dtype),
                                            trust_remote_code=trust_remote_code)
    ids = encode_prompt(tokenizer, prompt, chat).to(device)
    gen = LookaheadGenerator(model, tokenizer, config, draft, draft_tokenizer=draft_tokenizer)
    if memory_path is not None and Path(memory_path).expanduser().exists():
        gen.load_memory(Path(memory_path).expanduser())
    streamer = None if as_json else TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    if seed is not None:
        torch.manual_seed(seed)
    out = gen.generate(ids, max_new_tokens=max_new_tokens, streamer=streamer, **sampling)
    stats = gen.last_stats
    assert stats is not None  # (set by every generate call)
    if memory_path is not None:
        gen.save_memory(Path(memory_path).expanduser())
    text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    click.echo(f"[lookahead] {stats.new_tokens} new tokens in {stats.steps} forward passes after the prefill, "
               f"{stats.accepted_per_step:.2f} tokens/step, {stats.tokens_per_s:.1f} tokens/s"
               + (f", {stats.draft_forwards} draft forwards" if draft is not None else ""), err=True)
    return {"text": text, "model": model_name, "prompt_tokens": stats.prompt_tokens,
            "new_tokens": stats.new_tokens, "steps": stats.steps,
            "accepted_per_step": stats.accepted_per_step, "tokens_per_s": stats.tokens_per_s,
            "wall_time_s": stats.wall_time_s, "memory_s": stats.memory_s, "sampling": {**sampling, "seed": seed},
            "draft_model": draft_name, "draft_forwards": stats.draft_forwards,
            "routes": {route: stats.routes.count(route) for route in sorted(set(stats.routes)) if route},
            "config": dataclasses.asdict(config),
            "window": [gen.run_config.window, gen.run_config.ngram]}  # (W, N) decoded with: auto_window's choice


main.add_command(bench)
main.add_command(bench_batch)
main.add_command(bench_memory)
main.add_command(bench_serve)
main.add_command(roofline)
main.add_command(serve)


if __name__ == "__main__":
    main()
