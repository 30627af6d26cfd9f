"""ONE forward of the target model over a step's rows -> the kept rows' logits, on the device.

The decode loop and the cost model (costmodel.py) both go through ``Target``,
so what the budget measures is exactly what a step runs: explicit positions,
a 4-D mask per layer kind (mask.py) and logits only for the rows that matter.
Nothing here reads back to the host.
"""

from __future__ import annotations

import numpy as np
import torch

from .cache import new_cache
from .mask import batch_model_mask, model_mask
from .support import AttentionLayout


class Target:
    """A stock transformers causal LM driven with custom masks and positions."""

    def __init__(self, model, layout: AttentionLayout):
        self.model = model
        self.layout = layout
        embedding = model.get_input_embeddings().weight  # the input device is the embedding's
        self.device = embedding.device
        self.dtype = embedding.dtype
        self.vocab = int(embedding.shape[0])

    def new_cache(self):
        """An empty KV cache this target can roll back (see cache.py)."""
        return new_cache()

    def prefill(self, cache, tokens: np.ndarray) -> None:
        """Run tokens [T] through the model into the cache (their logits are not needed)."""
        if tokens.shape[0] == 0:
            return
        ids = torch.from_numpy(np.ascontiguousarray(tokens)).to(self.device)[None]  # [1, T]
        self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)

    def forward(self, cache, tokens: np.ndarray, offsets: np.ndarray, local_mask: np.ndarray, past: int,
                keep: np.ndarray) -> torch.Tensor:
        """Logits [K, V] (on the device) of rows ``keep`` [K] of one step.

        tokens[Q] sit at positions past + offsets[Q]; local_mask[Q, Q] says
        which step rows each row sees (all of the past, minus a sliding window).
        """
        dev = self.device
        offsets_t = torch.from_numpy(offsets).to(dev)  # [Q]
        local = torch.from_numpy(np.ascontiguousarray(local_mask)).to(dev)  # [Q, Q]
        mask = model_mask(self.layout.kinds, self.layout.sliding_window, local, offsets_t, past, self.dtype)
        out = self.model(input_ids=torch.from_numpy(np.ascontiguousarray(tokens)).to(dev)[None],  # [1, Q]
                         position_ids=(past + offsets_t)[None],  # [1, Q]
                         attention_mask=mask, past_key_values=cache, use_cache=True,
                         logits_to_keep=torch.from_numpy(keep).to(dev))
        return out.logits[0]  # [K, V]

    def forward_batch(self, cache, tokens: torch.Tensor, q_pos: torch.Tensor, visible: torch.Tensor,
                      k_pos: torch.Tensor) -> torch.Tensor:
        """Logits [A, Q, V] (on the device) of a batched step.

        tokens [A, Q] sit at positions q_pos [A, Q]; visible [A, Q, P+Q] says which cache
        slots and step rows each row sees (holes and padding hidden); k_pos [A, P+Q] is the
        position of every key, per row (for sliding windows).
        """
        mask = batch_model_mask(self.layout.kinds, self.layout.sliding_window, visible, q_pos, k_pos, self.dtype)
        out = self.model(input_ids=tokens, position_ids=q_pos, attention_mask=mask, past_key_values=cache,
                         use_cache=True)
        return out.logits  # [A, Q, V]
