"""The ``lookahead`` command: generate, and the benches (cli/bench.py, bench_batch.py, bench_memory.py);
the options and checks they share are in cli/options.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from lookahead.cli.bench import bench
from lookahead.cli.bench_batch import bench_batch
from lookahead.cli.bench_memory import bench_memory
from lookahead.cli.bench_serve import bench_serve
from lookahead.cli.bench_vllm import bench_vllm
from lookahead.cli.costs import costs
from lookahead.cli.options import (
    CLI_ERRORS,
    DTYPES,
    SAMPLING_FIELDS,
    checked_config,
    checked_memory_path,
    checked_prompt,
    checked_sampling,
    checked_seed,
    cli_message,
    config_options,
    fail,
    interrupted,
    products_option,
    reader_gone,
    sampling_options,
    threads_option,
    trust_remote_code_option,
    warn_line,
    warnings_as_lines,
    weights_option,
)
from lookahead.cli.roofline import roofline
from lookahead.cli.serve import serve
from lookahead.config import LookaheadConfig

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from lookahead import LookaheadGenerator


class LookaheadGroup(click.Group):
    """The ``lookahead`` command group: Ctrl-C in any command ends it with one line and exit status 130
    (not a traceback, not click's "Aborted!" and 1); a reader of stdout that goes away (``| head``) ends
    it quietly with status 141 (options.reader_gone says why)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            interrupted()
        except BrokenPipeError:
            reader_gone()


@click.group(cls=LookaheadGroup)
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
@click.option("--max-new-tokens", type=int, default=128, show_default=True,
              help="Most new tokens to generate (the answer is cut there, said on stderr); the model's context "
                   "(max_position_embeddings) caps it, with a warning at start.")
@click.option("--chat/--no-chat", default=True, show_default=True, help="Apply the tokenizer's chat template.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of streaming text.")
@click.option("--draft-model", default=None,
              help="A small model with the target's tokenizer (any name --model takes) that drafts "
                   "candidates too, on the same device and dtype.")
@click.option("--device", default="cpu", show_default=True,
              help="Where the model runs: cpu, cuda, cuda:N, mps (a torch device on this machine).")
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True,
              help="The weights' dtype. Greedy output equals model.generate's exactly in float32; in bfloat16 or "
                   "float16 a near-tie can round the other way, and float16 on a CPU is several times slower.")
@click.option("--memory", "memory_path", default=None, metavar="PATH",
              help="Remember requests across runs in this file: read before generating (when it exists), "
                   "written back after (it holds your prompts' outputs).")
@click.option("--prediction-file", default=None, metavar="PATH",
              help="Predicted Outputs: a UTF-8 text file holding what the answer is expected to be (e.g. the file "
                   "being edited); its tokens are proposed where the answer follows them, and the answer stays "
                   "the same. The stats count the predicted tokens accepted and rejected.")
@trust_remote_code_option
@weights_option
@products_option
@threads_option
@sampling_options
@config_options
def generate(model_name: str, prompt: str, max_new_tokens: int, chat: bool, as_json: bool, draft_model: str | None,
             device: str, dtype: str, memory_path: str | None, prediction_file: str | None, trust_remote_code: bool,
             weights: str, products: str, seed: int | None, **values: Any) -> None:
    """Generate text with lookahead decoding (greedy, or sampled with --sample)."""
    checked_prompt(prompt)
    prediction = read_prediction(prediction_file)
    seed = checked_seed(seed)
    if max_new_tokens < 0:
        fail(f"--max-new-tokens must be >= 0, got {max_new_tokens}")
    sampling = {name: values.pop(name) for name in SAMPLING_FIELDS}
    checked_sampling(sampling)
    config = checked_config(values)
    checked_memory_path(memory_path, config.memory_tokens)
    warn_about_dtype(dtype, device)
    try:
        with warnings_as_lines():
            result = _generate(model_name, prompt, max_new_tokens, chat, as_json,
                               (device, dtype, trust_remote_code, draft_model, weights, products), config, sampling,
                               seed, memory_path, prediction)
    except CLI_ERRORS as exc:
        fail(cli_message(exc))
    if as_json:
        click.echo(json.dumps(result))


def read_prediction(path: str | None) -> str | None:
    """The text of --prediction-file (None: not given); one line and exit status 2 when it cannot be read,
    is not UTF-8 text or is empty."""
    if path is None:
        return None
    try:
        text = Path(path).expanduser().read_bytes().decode("utf-8")
    except OSError as exc:
        fail(f"--prediction-file {path}: {exc.strerror or exc}: pass a readable text file")
    except UnicodeDecodeError as exc:
        fail(f"--prediction-file {path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
             f"{exc.start}): save it as UTF-8")
    if not text.strip():
        fail(f"--prediction-file {path} is empty: put the predicted answer in it, or leave the option out")
    return text


def warn_about_dtype(dtype: str, device: str) -> None:
    """One warning line for a half-precision --dtype: greedy output is exact only in float32, and float16
    on a CPU is computed slowly."""
    if dtype == "float32":
        return
    slow = (" and most CPUs compute float16 in software, typically several times slower than float32"
            if dtype == "float16" and device.split(":")[0] == "cpu" else "")
    warn_line(f"--dtype {dtype}: greedy output equals model.generate's exactly only in float32 (in {dtype} a "
              f"forward over many rows can round differently from one over a single row, so a near-tie can go "
              f"the other way){slow}; pass --dtype float32 (the default) for exact output")


def _generate(model_name: str, prompt: str, max_new_tokens: int, chat: bool, as_json: bool,
              loading: tuple[str, str, bool, str | None, str, str], config: LookaheadConfig, sampling: dict[str, Any],
              seed: int | None, memory_path: str | None = None, prediction: str | None = None) -> dict:
    """Load (device, dtype, trust_remote_code, draft model name, weights, products = loading), generate
    (streaming unless as_json), report stats; the JSON result. With ``memory_path``, the generator's memory across
    requests is read from that file first (when it exists: checked right after the model and its
    tokenizer load, before the generator measures costs) and written back after, each said on stderr.
    ``prediction``: the predicted answer's text (Predicted Outputs), or None."""
    import torch
    from transformers import TextStreamer

    from lookahead import LookaheadGenerator, load_model
    from lookahead.model.quantized import quantized_modules, weights_summary
    from lookahead.model.support import context_length
    from lookahead.proposers.draft.checks import check_draft_source

    device, dtype, trust_remote_code, draft_name, weights, products = loading
    model, tokenizer = load_model(model_name, device=device, dtype=getattr(torch, dtype),
                                  trust_remote_code=trust_remote_code, weights=weights, products=products,
                                  cost_cache_dir=config.cost_cache_dir)
    held = weights_summary(model)
    if quantized_modules(model):  # (said where a GGUF's blocks are kept: which formats the step reads)
        click.echo(f"lookahead: {model_name}: {held}", err=True)
    memory_file = Path(memory_path).expanduser() if memory_path is not None else None
    if memory_file is not None and memory_file.exists():
        check_memory_file(memory_file, model, tokenizer)  # a foreign or damaged file fails before the cost curve
    draft, draft_tokenizer = None, None
    if draft_name is not None:
        check_draft_source(model, draft_name)  # its vocabulary, from its config, before its weights load
        draft, draft_tokenizer = load_model(draft_name, device=device, dtype=getattr(torch, dtype),
                                            trust_remote_code=trust_remote_code, weights=weights,
                                            products=products, cost_cache_dir=config.cost_cache_dir)
    ids = encode_prompt(tokenizer, prompt, chat).to(device)
    context = context_length(model.config)
    warn_about_context(ids.shape[1], max_new_tokens, context)
    gen = LookaheadGenerator(model, tokenizer, config, draft, draft_tokenizer=draft_tokenizer)
    if memory_file is not None and memory_file.exists():
        gen.load_memory(memory_file)
        click.echo(f"lookahead: memory: loaded {memory_held(gen)} from {memory_path}", err=True)
    elif memory_file is not None:
        click.echo(f"lookahead: memory: {memory_path} does not exist yet; it is written after this request",
                   err=True)
    streamer = None if as_json else TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    if seed is not None:
        torch.manual_seed(seed)
    try:
        out = gen.generate(ids, max_new_tokens=max_new_tokens, streamer=streamer, prediction=prediction, **sampling)
    except ValueError as exc:  # (a prediction's problem named by the option that gave it)
        if prediction is not None and str(exc).startswith("prediction"):
            raise ValueError(f"--prediction-file: {exc}") from None
        raise
    stats = gen.last_stats
    assert stats is not None  # (set by every generate call)
    if memory_file is not None:
        gen.save_memory(memory_file)
        click.echo(f"lookahead: memory: saved {memory_held(gen)} to {memory_path}", err=True)
    new = out[0, ids.shape[1]:].tolist()
    used = settings_used(model, sampling)
    reason = stop_reason(new, used.pop("eos"), max_new_tokens, None if context is None else context - ids.shape[1])
    text = tokenizer.decode(new, skip_special_tokens=True)
    click.echo(f"[lookahead] {stats.new_tokens} new tokens in {stats.steps} forward passes after the prefill, "
               f"{stats.accepted_per_step:.2f} tokens/step, {stats.tokens_per_s:.1f} tokens/s"
               + (f", {stats.draft_forwards} draft forwards" if draft is not None else "")
               + (f", prediction: {stats.accepted_prediction_tokens} tokens accepted, "
                  f"{stats.rejected_prediction_tokens} rejected" if prediction is not None else ""), err=True)
    if reason == "length" and max_new_tokens > 0 and not as_json:
        click.echo(f"lookahead: the answer was cut at --max-new-tokens {max_new_tokens} before it ended: pass a "
                   f"larger --max-new-tokens for the rest", err=True)
    return {"text": text, "model": model_name, "weights": held, "prompt_tokens": stats.prompt_tokens,
            "new_tokens": stats.new_tokens, "stop_reason": reason, "steps": stats.steps,
            "accepted_per_step": stats.accepted_per_step, "tokens_per_s": stats.tokens_per_s,
            "wall_time_s": stats.wall_time_s, "memory_s": stats.memory_s, "sampling": {**used, "seed": seed},
            "draft_model": draft_name, "draft_forwards": stats.draft_forwards,
            "accepted_prediction_tokens": stats.accepted_prediction_tokens,
            "rejected_prediction_tokens": stats.rejected_prediction_tokens,
            "routes": {route: stats.routes.count(route) for route in sorted(set(stats.routes)) if route},
            "config": dataclasses.asdict(config),
            "window": [gen.run_config.window, gen.run_config.ngram]}  # (W, N) decoded with: auto_window's choice


def check_memory_file(path: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Read the --memory file through every check load_memory makes (format version, the tokenizer's
    vocabulary, size and checksum, ids in range): MemoryFileError before the generator is built."""

    from lookahead.model.quantized import embedding_facts
    from lookahead.proposers.memory import file

    vocab = embedding_facts(model)[2]  # what the generator bounds ids by (lookahead/model/target.py)
    file.read(path, file.vocabulary_key(tokenizer, vocab), vocab)


def memory_held(gen: LookaheadGenerator) -> str:
    """'N requests (M tokens)': what the generator's memory store holds."""
    from lookahead.proposers.memory import RequestMemory

    store = gen.memory.store if isinstance(gen.memory, RequestMemory) else None
    requests, tokens = (store.requests, store.tokens) if store is not None else (0, 0)
    return f"{requests} request{'s' if requests != 1 else ''} ({tokens} token{'s' if tokens != 1 else ''})"


def warn_about_context(prompt_tokens: int, max_new_tokens: int, context: int | None) -> None:
    """A warning at start when the prompt and --max-new-tokens do not fit in the model's context (a prompt
    that fills it is refused by generate itself)."""
    if context is None or prompt_tokens >= context or prompt_tokens + max_new_tokens <= context:
        return
    warn_line(f"--max-new-tokens {max_new_tokens} does not fit: the model's context (max_position_embeddings) "
              f"is {context} tokens and the prompt takes {prompt_tokens}, so at most {context - prompt_tokens} "
              f"new tokens are generated")


def settings_used(model: PreTrainedModel, sampling: dict[str, Any]) -> dict[str, Any]:
    """The sampling settings generate decoded with: the options given over the model's generation_config,
    resolved as model.generate resolves them (temperature 0 is greedy), and the end-of-sequence ids ("eos")."""
    from lookahead.call.inputs import eos_ids

    mixin: Any = model  # GenerationMixin's own resolution, as lookahead/call/decoding.py uses it
    config, _ = mixin._prepare_generation_config(None, **{k: v for k, v in sampling.items() if v is not None})  # noqa: SLF001
    used = {name: getattr(config, name, None) for name in SAMPLING_FIELDS}
    used["do_sample"] = bool(config.do_sample) and config.temperature != 0
    used["eos"] = set(eos_ids(None, config).tolist())
    return used


def stop_reason(new: list[int], eos: set[int], max_new_tokens: int, context_left: int | None) -> str:
    """Why generation stopped: "eos" (the model ended its answer), "length" (cut at --max-new-tokens),
    "context" (the model's context is full), else "other" (a stopping criterion the CLI does not set)."""
    if new and new[-1] in eos:
        return "eos"
    if len(new) >= max_new_tokens:
        return "length"
    if context_left is not None and len(new) >= context_left:
        return "context"
    return "other"


main.add_command(bench)
main.add_command(bench_batch)
main.add_command(bench_memory)
main.add_command(bench_serve)
main.add_command(bench_vllm)
main.add_command(costs)
main.add_command(roofline)
main.add_command(serve)


if __name__ == "__main__":
    main()
