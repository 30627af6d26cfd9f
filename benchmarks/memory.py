"""Memory of one long generation: resident memory against the KV cache, every few hundred tokens.

    python -m lookahead.benchmarks.memory --model smollm2-135m --max-new-tokens 4000

Decodes one prompt greedily with EOS ignored (so it runs the whole length),
and reads the process's resident set size (``/proc/self/statm``) from a
streamer every ``--every`` new tokens. Prints one markdown row per reading:
new tokens, RSS growth since the first reading, the KV cache's size at that
length (layers x 2 x KV heads x head size x bytes, per token), and what is
left when the KV cache's growth is taken away: flat apart from the KV cache
means that last column stays near zero. Linux only (statm).
"""

from __future__ import annotations

import os

import click
import torch
from transformers.generation.streamers import BaseStreamer

from lookahead import LookaheadGenerator, load_model
from lookahead.model.quantized import embedding_facts

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """Resident set size of this process."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * PAGE


def kv_bytes_per_token(model) -> int:
    """Bytes the KV cache grows by per token: layers x (K and V) x KV heads x head size x element size."""
    cfg = model.config.get_text_config(decoder=True)
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    dtype = embedding_facts(model)[1]  # (the cache's dtype: what the embedding returns, float32 for GGUF blocks)
    return cfg.num_hidden_layers * 2 * heads * head_dim * torch.tensor([], dtype=dtype).element_size()


class RssProbe(BaseStreamer):
    """A streamer that records (new tokens, RSS) every ``every`` new tokens (the prompt's put is skipped)."""

    def __init__(self, every: int):
        self.every, self.seen, self.readings, self.prompt_seen = every, 0, [], False

    def put(self, value) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        before = self.seen
        self.seen += int(value.numel())
        if self.seen // self.every > before // self.every or not self.readings:
            self.readings.append((self.seen, rss_bytes()))

    def end(self) -> None:
        self.readings.append((self.seen, rss_bytes()))


@click.command()
@click.option("--model", "model_name", default="smollm2-135m", show_default=True)
@click.option("--max-new-tokens", default=4000, show_default=True)
@click.option("--every", default=500, show_default=True, help="New tokens between two readings.")
@click.option("--prompt", default="Write a long story about a lighthouse keeper and the sea.", show_default=True)
def main(model_name: str, max_new_tokens: int, every: int, prompt: str) -> None:
    """Print RSS growth against KV-cache growth over one long greedy generation."""
    model, tokenizer = load_model(model_name)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    gen = LookaheadGenerator(model, tokenizer)
    gen.generate(ids, max_new_tokens=16)  # one-time allocations (kernels, cost curve) before the first reading
    probe = RssProbe(every)
    unused_eos = model.config.vocab_size + 1  # no token ends the text: it runs the whole length
    gen.generate(ids, max_new_tokens=max_new_tokens, eos_token_id=unused_eos, streamer=probe)
    per_token = kv_bytes_per_token(model)
    first_tokens, first_rss = probe.readings[0]
    click.echo(f"model {model_name}, prompt {ids.shape[1]} tokens, KV cache {per_token / 1024:.1f} KiB per token, "
               f"{gen.last_stats.steps} steps")
    click.echo("| new tokens | RSS MiB | RSS growth MiB | KV-cache growth MiB | growth beyond the KV cache MiB |")
    click.echo("|---:|---:|---:|---:|---:|")
    for tokens, rss in probe.readings:
        grown, kv = (rss - first_rss) / 2 ** 20, (tokens - first_tokens) * per_token / 2 ** 20
        click.echo(f"| {tokens} | {rss / 2 ** 20:.0f} | {grown:.1f} | {kv:.1f} | {grown - kv:.1f} |")


if __name__ == "__main__":
    main()
