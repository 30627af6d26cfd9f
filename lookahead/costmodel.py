"""What one forward pass over q rows costs on this model, device and dtype.

The curve is measured once (a few passes per q over a synthetic context,
each pass shaped like a decode step: explicit positions, a 4-D mask, logits
only for the kept rows, the host sync) and cached on disk per model, device,
dtype and thread count. While decoding, the per-step time the loop actually
sees refines it: the difference to the measured forward (Python work, the
context growing) is tracked as a running overhead.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from .support import AttentionLayout
from .target import Target, input_device

GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def row_grid(max_rows: int) -> tuple[int, ...]:
    """Row counts measured for a step of at most max_rows rows."""
    return tuple(sorted({q for q in GRID if q < max_rows} | {max_rows}))


@dataclass
class CostModel:
    """Seconds of one decode step over q rows: measured forward + running overhead."""

    rows: np.ndarray  # [S] increasing row counts
    seconds: np.ndarray  # [S] median forward seconds at each
    overhead: float = 0.0  # seconds per step beyond the measured forward (running mean)
    smoothing: float = 0.1  # weight of the newest step in the running overhead
    # The curve is kept as measured, dips included: on CPUs a matrix product over 16 rows
    # can be faster than over 12 (seen on SmolLM2 and Qwen2.5-1.5B here), and the budget
    # should use that. Noise is fought with the median of several passes instead.

    def forward(self, q: np.ndarray) -> np.ndarray:
        """Measured forward seconds at q rows (interpolated; linear past the last point)."""
        q = np.asarray(q, dtype=np.float64)
        inside = np.interp(q, self.rows, self.seconds)
        if self.rows.shape[0] < 2:
            return inside
        slope = max(self.seconds[-1] - self.seconds[-2], 0.0) / max(self.rows[-1] - self.rows[-2], 1)
        return np.where(q > self.rows[-1], self.seconds[-1] + slope * (q - self.rows[-1]), inside)

    def step(self, q: np.ndarray) -> np.ndarray:
        """Expected seconds of a whole decode step with q rows."""
        return np.maximum(self.forward(q) + self.overhead, 1e-9)

    def observe(self, q: int, seconds: float) -> None:
        """A step over q rows took ``seconds``: update the running overhead."""
        residual = seconds - float(self.forward(q))
        floor = -0.5 * float(self.seconds[0])
        self.overhead = max((1 - self.smoothing) * self.overhead + self.smoothing * residual, floor)

    def relative(self) -> np.ndarray:
        """The curve relative to one row."""
        return self.seconds / self.seconds[0]


def model_fingerprint(model, rows: tuple[int, ...], context: int, repeats: int) -> dict:
    """What the measured curve depends on.

    The device is where the inputs go (target.input_device: with a device_map
    the first parameter may be offloaded to "meta"); a device_map that places
    modules on more than one device (several GPUs, CPU or disk offload) is part
    of the fingerprint, since it changes the cost of every forward.
    """
    device = input_device(model)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    fingerprint = {"name_or_path": str(getattr(model.config, "_name_or_path", "")),
                   "model_type": str(getattr(model.config, "model_type", type(model).__name__)),
                   "parameters": int(sum(p.numel() for p in model.parameters())),
                   "dtype": str(model.get_input_embeddings().weight.dtype), "device": name,
                   "threads": torch.get_num_threads(), "torch": torch.__version__, "rows": list(rows),
                   "context": context, "repeats": repeats}
    placement = {module: str(where) for module, where in (getattr(model, "hf_device_map", None) or {}).items()}
    if len(set(placement.values())) > 1:
        fingerprint["device_map"] = placement
    return fingerprint


@torch.inference_mode()
def measure_forward_seconds(model, layout: AttentionLayout, rows: tuple[int, ...], context: int,
                            repeats: int, seed: int = 0, batch: int = 1) -> list[float]:
    """Median seconds of one decode-shaped forward over q new rows, for every q in rows.

    Each pass goes through ``Target.forward`` exactly as a decode step does
    (``Target.forward_batch`` for a batch of ``batch`` rows of q tokens),
    plus the step's host sync (an argmax read back). A synthetic context of
    ``context`` random tokens is prefilled once; each pass is cropped away
    again. One untimed pass at the largest q warms up.
    """
    target = Target(model, layout)
    rng = np.random.default_rng(seed)
    cache = target.new_cache()
    prefix = rng.integers(0, target.vocab, (batch, context), dtype=np.int64)  # [B, C]
    model(input_ids=torch.from_numpy(prefix).to(target.device), past_key_values=cache, use_cache=True,
          logits_to_keep=1)
    medians = []
    for index, q in enumerate((rows[-1],) + tuple(rows)):
        step = _step_pass(target, rng.integers(0, target.vocab, (batch, q), dtype=np.int64), context)
        times = []
        for _ in range(repeats if index else 1):
            start = time.perf_counter()
            step(cache).argmax(-1).cpu()  # the step's host sync
            elapsed = time.perf_counter() - start
            cache.crop(-q)
            times.append(elapsed)
        medians.append(statistics.median(times))
    return medians[1:]


def _step_pass(target: Target, tokens: np.ndarray, context: int):
    """A function cache -> logits running one causal step over tokens [B, q] after ``context`` slots."""
    batch, q = tokens.shape
    offsets = np.arange(q, dtype=np.int64)  # [q]
    local = np.tril(np.ones((q, q), dtype=bool))  # [q, q]
    if batch == 1:
        return lambda cache: target.forward(cache, tokens[0], offsets, local, context, offsets)
    dev = target.device
    tokens_t = torch.from_numpy(tokens).to(dev)  # [B, q]
    q_pos = torch.from_numpy(context + offsets).to(dev)[None].expand(batch, -1)  # [B, q]
    visible = torch.cat([torch.ones(batch, q, context, dtype=torch.bool, device=dev),
                         torch.from_numpy(local).to(dev)[None].expand(batch, -1, -1)], dim=2)  # [B, q, C+q]
    k_pos = torch.cat([torch.arange(context, device=dev)[None].expand(batch, -1), q_pos], dim=1)  # [B, C+q]
    return lambda cache: target.forward_batch(cache, tokens_t, q_pos, visible, k_pos)


def load_cost_model(model, layout: AttentionLayout, max_rows: int, context: int, repeats: int,
                    cache_dir: str, batch: int = 1) -> CostModel:
    """The cached curve for this model/device/dtype (and batch size), measured and saved when absent.

    ``cache_dir`` "" measures without reading or writing the disk.
    """
    rows = row_grid(max_rows)
    fingerprint = model_fingerprint(model, rows, context, repeats)
    if batch > 1:
        fingerprint["batch"] = batch
    path = None
    if cache_dir:
        key = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:24]
        path = os.path.join(os.path.expanduser(cache_dir), f"{key}.json")
        saved = _read(path, fingerprint)
        if saved is not None:
            return CostModel(np.array(rows, dtype=np.float64), np.array(saved, dtype=np.float64))
    seconds = measure_forward_seconds(model, layout, rows, context, repeats, batch=batch)
    if path is not None:
        _write(path, fingerprint, seconds)
    return CostModel(np.array(rows, dtype=np.float64), np.array(seconds, dtype=np.float64))


def _read(path: str, fingerprint: dict) -> list[float] | None:
    """Saved seconds for exactly this fingerprint, or None (missing, foreign or corrupt file)."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("fingerprint") != fingerprint:
        return None
    seconds = data.get("seconds")
    if not isinstance(seconds, list) or len(seconds) != len(fingerprint["rows"]) \
            or not all(isinstance(s, float) and s > 0 for s in seconds):
        return None
    return seconds


def _write(path: str, fingerprint: dict, seconds: list[float]) -> None:
    """Save atomically; a read-only or full disk only costs a re-measurement next time."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as handle:
            json.dump({"fingerprint": fingerprint, "seconds": seconds}, handle)
        os.replace(tmp, path)
    except OSError:
        pass
