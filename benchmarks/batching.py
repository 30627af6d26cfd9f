"""Batch throughput: lookahead against model.generate on the same left-padded batches.

    batch_throughput(model, tokenizer, prompts, sizes=(1, 4, 8), max_new_tokens=64) -> [row per size]

Prompts (token id lists) are cut into batches of each size, left-padded, and
decoded greedily by ``model.generate`` and by ``LookaheadGenerator.generate``,
interleaved batch by batch (``model.generate`` first). Each row reports new
tokens per second of both (new tokens summed over the batch rows, up to each
row's EOS), their ratio, lookahead's tokens per forward and how many batch
rows are identical to ``model.generate`` on that prompt alone (the exactness
contract: batched ``model.generate`` may itself differ from it in float noise).
"""

from __future__ import annotations

import time

import torch

from lookahead import LookaheadConfig, LookaheadGenerator


def left_pad(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids [B, T] and attention_mask [B, T] of prompts padded on the left."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def _new_tokens(out: torch.Tensor, width: int, eos: set[int]) -> list[list[int]]:
    """Each row's new tokens up to and including its first EOS."""
    rows = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        rows.append(row[:cut])
    return rows


@torch.inference_mode()
def batch_throughput(model, tokenizer, prompts: list[list[int]], sizes=(1, 4, 8), max_new_tokens: int = 64,
                     config: LookaheadConfig | None = None) -> list[dict]:
    """One summary row per batch size (see the module docstring)."""
    gen = LookaheadGenerator(model, tokenizer, config or LookaheadConfig())
    pad = model.generation_config.pad_token_id
    pad = pad if pad is not None else tokenizer.eos_token_id
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    alone = {}
    rows = []
    for size in sizes:
        totals = {"hf_s": 0.0, "la_s": 0.0, "hf_tokens": 0, "la_tokens": 0, "steps": 0, "rows": 0, "same": 0}
        for start in range(0, len(prompts) - size + 1, size):
            batch = prompts[start:start + size]
            ids, mask = left_pad(batch, pad)
            began = time.perf_counter()
            ref = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=pad)
            totals["hf_s"] += time.perf_counter() - began
            began = time.perf_counter()
            out = gen.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False)
            totals["la_s"] += time.perf_counter() - began
            totals["steps"] += gen.last_stats.steps
            got = _new_tokens(out, ids.shape[1], eos)
            totals["hf_tokens"] += sum(len(r) for r in _new_tokens(ref, ids.shape[1], eos))
            totals["la_tokens"] += sum(len(r) for r in got)
            for prompt, row in zip(batch, got):
                key = tuple(prompt)
                if key not in alone:
                    single = torch.tensor([prompt])
                    alone[key] = _new_tokens(model.generate(single, attention_mask=torch.ones_like(single),
                                                            max_new_tokens=max_new_tokens, do_sample=False,
                                                            pad_token_id=pad), len(prompt), eos)[0]
                totals["same"] += row == alone[key]
                totals["rows"] += 1
        rows.append(_summary(size, totals))
    return rows


def _summary(size: int, t: dict) -> dict:
    hf = t["hf_tokens"] / t["hf_s"] if t["hf_s"] else 0.0
    la = t["la_tokens"] / t["la_s"] if t["la_s"] else 0.0
    return {"batch": size, "rows": t["rows"], "generate_tokens_per_s": hf, "lookahead_tokens_per_s": la,
            "speedup": la / hf if hf else 0.0, "tokens_per_forward": t["la_tokens"] / max(t["steps"], 1),
            "rows_equal_to_alone": t["same"]}


def batch_table(rows: list[dict]) -> str:
    """Markdown table of batch_throughput's rows."""
    lines = ["| batch | rows | model.generate tokens/s | lookahead tokens/s | speedup | tokens/forward "
             "(all rows) | rows == generate alone |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['rows']} | {r['generate_tokens_per_s']:.1f} | "
                     f"{r['lookahead_tokens_per_s']:.1f} | {r['speedup']:.2f}x | {r['tokens_per_forward']:.2f} | "
                     f"{r['rows_equal_to_alone']}/{r['rows']} |")
    return "\n".join(lines)
