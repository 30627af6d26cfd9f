"""Forward-cost curve: time of one forward over k new tokens, relative to k = 1.

With ``context`` tokens already in the KV cache, one forward pass over k new
tokens is timed (median of ``repeats``) for every k; the cache is cropped back
to the context after each pass. On a memory-bound machine the curve stays
near 1 for small k: that slack is what speculation spends.
"""

from __future__ import annotations

import statistics
import time

import torch

KS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


@torch.inference_mode()
def cost_curve(model, context: int = 300, ks=KS, repeats: int = 5, seed: int = 0) -> dict:
    """{"context", "repeats", "k", "seconds" (median per k), "relative" (to k = 1)}."""
    from transformers import DynamicCache

    vocab = int(model.get_input_embeddings().weight.shape[0])
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, vocab, (1, context), generator=gen).to(device)  # [1, C]
    cache = DynamicCache(config=model.config)
    model(input_ids=prefix, past_key_values=cache, use_cache=True, logits_to_keep=1)
    seconds = []
    for k in ks:
        ids = torch.randint(0, vocab, (1, k), generator=gen).to(device)  # [1, k]
        positions = torch.arange(context, context + k, device=device)[None]  # [1, k]
        times = []
        for rep in range(repeats + 1):  # the first pass is a warm-up
            start = time.perf_counter()
            model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True)
            elapsed = time.perf_counter() - start
            cache.crop(-k)  # back to the context (5.x: negative = tokens to drop)
            if rep:
                times.append(elapsed)
        if cache.get_seq_length() != context:
            raise RuntimeError(f"cache holds {cache.get_seq_length()} tokens after crop, expected {context}")
        seconds.append(statistics.median(times))
    base = seconds[0]
    return {"context": context, "repeats": repeats, "k": list(ks), "seconds": seconds,
            "relative": [s / base for s in seconds]}
