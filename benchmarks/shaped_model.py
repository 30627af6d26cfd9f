"""A model of a real model's shape with random weights, and the host syncs of a decode's steps.

Where no weights can be had (an accelerator machine without the hub), a
random-initialised model of the same shape reads the same bytes and runs the
same kernels, so its step costs, host time per step and host syncs are the
real model's; what it accepts is not (its text is noise), so tokens per
forward and speed-ups measured on it say nothing about real text.

    python -m lookahead.benchmarks.shaped_model build --shape smollm2-1.7b --tokenizer DIR --out DIR
    python -m lookahead.benchmarks.shaped_model syncs --model DIR --device cuda --dtype bfloat16

``build`` saves a checkpoint directory any ``--model`` option takes (the
tokenizer's files copied beside it); ``syncs`` decodes one prompt with
torch's CUDA sync debug mode on and prints how many times the host waited
for the device, per step (the loop's design: once a step).
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import click
import torch

# Llama-architecture shapes of real models (their config.json's sizes), vocabulary SmolLM2's.
SHAPES = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3),
    "smollm2-360m": dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15,
                         num_key_value_heads=5),
    "smollm2-1.7b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                         num_key_value_heads=32),
    "llama-8b-shape": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                           num_key_value_heads=8),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def shaped_config(shape: str, vocab: int = 49152):
    """A LlamaConfig of ``shape`` (a SHAPES name) with ``vocab`` tokens and tied embeddings."""
    from transformers import LlamaConfig

    if shape not in SHAPES:
        raise click.BadParameter(f"unknown shape {shape!r}: use one of {', '.join(SHAPES)}")
    return LlamaConfig(vocab_size=vocab, max_position_embeddings=8192, rope_theta=130000.0, tie_word_embeddings=True,
                       bos_token_id=1, eos_token_id=2, pad_token_id=2, **SHAPES[shape])


def build(shape: str, tokenizer_dir: Path, out: Path, dtype: torch.dtype, device: str, seed: int = 0) -> Path:
    """Save a random ``shape`` model in ``dtype`` (initialised on ``device``) with the tokenizer's files."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(shaped_config(shape), dtype=dtype)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out / name)
    return out


def count_syncs(model_dir: str, device: str, dtype: str, max_new_tokens: int, prompt: str) -> dict:
    """Decode ``prompt`` once untimed, then once with torch.cuda's sync debug mode set to warn: the host
    syncs it reports, the steps, and syncs per step."""
    from lookahead import LookaheadGenerator, load_model

    model, tokenizer = load_model(model_dir, device=device, dtype=getattr(torch, dtype))
    gen = LookaheadGenerator(model, tokenizer)
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(device)
    gen.generate(ids, max_new_tokens=8)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            gen.generate(ids, max_new_tokens=max_new_tokens)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [str(w.message).splitlines()[0] for w in caught if "synchroniz" in str(w.message)]
    steps = gen.last_stats.steps
    return {"steps": steps, "syncs": len(syncs), "syncs_per_step": len(syncs) / max(steps, 1),
            "kinds": sorted(set(syncs))[:10]}


@click.group()
def main() -> None:
    """Random-weight models of real shapes, for timing steps (see the module docstring)."""


@main.command("build")
@click.option("--shape", type=click.Choice(sorted(SHAPES)), required=True)
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              required=True, help="A directory with a tokenizer.json of a 49152-token vocabulary (SmolLM2's).")
@click.option("--out", type=click.Path(path_type=Path), required=True)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="bfloat16", show_default=True)
@click.option("--device", default="cpu", show_default=True, help="Where the weights are initialised.")
def build_command(shape: str, tokenizer_dir: Path, out: Path, dtype: str, device: str) -> None:
    click.echo(build(shape, tokenizer_dir, out, getattr(torch, dtype), device))


@main.command("syncs")
@click.option("--model", "model_dir", required=True)
@click.option("--device", default="cuda", show_default=True)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="bfloat16", show_default=True)
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--prompt", default="Write a Python function that returns the n-th Fibonacci number.", show_default=True)
def syncs_command(model_dir: str, device: str, dtype: str, max_new_tokens: int, prompt: str) -> None:
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        raise click.UsageError("syncs counts CUDA host syncs: give --device cuda on a machine with a CUDA GPU")
    click.echo(json.dumps(count_syncs(model_dir, device, dtype, max_new_tokens, prompt), indent=1))


if __name__ == "__main__":
    main()
