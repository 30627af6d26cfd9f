"""The ``lookahead`` command: generate (and bench, see cli/bench.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import warnings
from pathlib import Path

import click

from lookahead.config import CHOICES, ConfigError, LookaheadConfig
from lookahead.errors import one_line

CLI_ERRORS = (ValueError, RuntimeError, OSError)  # every error type of ours subclasses one of these
DTYPES = ("float32", "bfloat16", "float16")


def config_options(func):
    """One click option per LookaheadConfig field (``--window`` <-> ``window``), defaults from the dataclass."""
    for field in reversed(dataclasses.fields(LookaheadConfig)):
        flag = field.name.replace("_", "-")
        if field.type in ("bool", bool):
            func = click.option(f"--{flag}/--no-{flag}", field.name, default=field.default, show_default=True,
                                help=f"LookaheadConfig.{field.name}")(func)
        elif field.type in ("str", str):  # checked by LookaheadConfig, so a bad value gets one line
            choices = f": {' or '.join(CHOICES[field.name])}" if field.name in CHOICES else ""
            func = click.option(f"--{flag}", field.name, type=str, default=field.default, show_default=True,
                                help=f"LookaheadConfig.{field.name}{choices}")(func)
        else:
            func = click.option(f"--{flag}", field.name, type=int, default=field.default, show_default=True,
                                help=f"LookaheadConfig.{field.name}")(func)
    return func


def _set_threads(ctx, param, value):
    """--threads N: torch.set_num_threads(N) as soon as the option is read (before any model loads)."""
    if value is not None:
        import torch

        torch.set_num_threads(value)
    return value


def threads_option(func):
    """--threads N: the threads torch (and so lookahead) computes on; left out, torch's own choice."""
    return click.option("--threads", type=click.IntRange(min=1), default=None, expose_value=False,
                        callback=_set_threads,
                        help="Threads to compute on (torch.set_num_threads; lookahead never uses more) "
                             "[default: torch's, i.e. OMP_NUM_THREADS or every core]. On a machine where other "
                             "work runs, fewer can be much faster.")(func)


def trust_remote_code_option(func):
    """--trust-remote-code: load_model(trust_remote_code=True)."""
    return click.option("--trust-remote-code", is_flag=True,
                        help="Let a checkpoint that ships its own modelling code run it "
                             "(load_model(trust_remote_code=True)).")(func)


SAMPLING_FIELDS = ("do_sample", "temperature", "top_k", "top_p", "min_p", "repetition_penalty")


def sampling_options(func):
    """--sample/--greedy, --temperature, --top-k, --top-p, --min-p, --repetition-penalty, --seed.

    Left out, each takes the model's generation_config value, as model.generate does.
    """
    options = [
        click.option("--sample/--greedy", "do_sample", default=None,
                     help="Sample (exactly the model's distribution) or decode greedily "
                          "[default: the model's generation_config, usually greedy]."),
        click.option("--temperature", type=float, default=None, help="Sampling temperature (0 = greedy)."),
        click.option("--top-k", type=int, default=None, help="Keep the k most likely tokens (0 = off)."),
        click.option("--top-p", type=float, default=None, help="Nucleus sampling mass in (0, 1]."),
        click.option("--min-p", type=float, default=None, help="Drop tokens below min_p x the top probability."),
        click.option("--repetition-penalty", type=float, default=None, help="> 1 penalises repeated tokens."),
        click.option("--seed", type=str, default=None,
                     help="torch.manual_seed before generating (reproducible samples): a whole number from 0 to "
                          "2**64-1."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


SEED_MAX = 2 ** 64 - 1  # torch.manual_seed takes 0 .. 2**64-1 (negatives only wrap around to those)


def checked_seed(text: str | None) -> int | None:
    """--seed as an int in 0 .. SEED_MAX (None when left out), or one line naming the range and exit status 2."""
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= SEED_MAX:
        fail(f"--seed must be a whole number from 0 to 2**64-1 ({SEED_MAX}), got {text}")
    return value


def checked_prompt(prompt: str) -> None:
    """One line and exit status 2 when --prompt is empty or not UTF-8 (bytes the shell handed over
    undecoded reach Python as lone surrogates, which no tokenizer takes)."""
    if not prompt.strip():
        fail("the prompt is empty: pass some text with --prompt")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(prompt[exc.start])
        what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"character U+{code:04X}"
        fail(f"--prompt is not UTF-8 text ({what} at character {exc.start + 1}): pass UTF-8 text, e.g. convert "
             f"it with iconv -f latin1 -t utf-8")


def config_from(values: dict) -> LookaheadConfig:
    """The LookaheadConfig named by the CLI options in values."""
    return LookaheadConfig(**{f.name: values[f.name] for f in dataclasses.fields(LookaheadConfig)})


def fail(message: str) -> None:
    """One clear line on stderr and exit status 2."""
    click.echo(f"lookahead: error: {message}", err=True)
    sys.exit(2)


def cli_message(exc: Exception) -> str:
    """An error's message on one line, its fix spelled as a CLI option (--allow-untested-models, ...)."""
    fix = getattr(exc, "fix", None)
    if fix is not None and hasattr(fix, "cli_text"):
        return f"{exc.problem}; {fix.cli_text()}"
    return one_line(exc)


@contextlib.contextmanager
def warnings_as_lines():
    """Show every warning raised inside as one line on stderr (not Python's two-line format)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        try:
            yield
        finally:
            for warning in caught:
                click.echo(f"lookahead: warning: {one_line(warning.message)}", err=True)


def checked_config(values: dict) -> LookaheadConfig:
    """config_from(values), or one line naming the bad option and exit status 2."""
    try:
        return config_from(values)
    except ConfigError as exc:
        fail(f"{exc} (option --{str(exc).split()[0].replace('_', '-')})")


@click.group()
def main() -> None:
    """Lookahead decoding: the same greedy tokens as model.generate, in fewer forward passes."""


def encode_prompt(tokenizer, prompt: str, chat: bool):
    """Token ids [1, T] of the prompt, through the chat template unless chat is False."""
    if chat and getattr(tokenizer, "chat_template", None):
        encoded = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                return_tensors="pt", return_dict=True)
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
def generate(model_name, prompt, max_new_tokens, chat, as_json, draft_model, device, dtype, memory_path,
             trust_remote_code, seed, **values):
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


def _generate(model_name, prompt, max_new_tokens, chat, as_json, loading, config, sampling, seed,
              memory_path=None) -> dict:
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


from lookahead.cli.bench import bench  # noqa: E402
from lookahead.cli.bench_batch import bench_batch  # noqa: E402
from lookahead.cli.bench_memory import bench_memory  # noqa: E402
main.add_command(bench)
main.add_command(bench_batch)
main.add_command(bench_memory)


if __name__ == "__main__":
    main()
