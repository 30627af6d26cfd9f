"""vLLM's engine on this CPU with lookahead's proposer (``method="custom_class"``) against the same
engine without speculation: the same greedy text, drafts accepted, and the memory across requests
raising acceptance within an engine and, through its file, across engines.

Each engine starts in about half a minute (``enforce_eager``: no compilation); they run one after the
other and are shut down in between.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "List the planets of the solar system in order, one per line.",
    "Translate to French: The cat sits on the mat and the dog sleeps by the door.",
    "Explain in three sentences why the sky is blue.",
]
MAX_TOKENS = 64
PROPOSER = "lookahead.vllm.LookaheadProposer"


def _engine(model_dir: Path, proposer: bool, settings: dict | None = None):
    from vllm import LLM

    spec = {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": 4} if proposer else None
    return LLM(model=str(model_dir), dtype="float32", max_model_len=2048, gpu_memory_utilization=0.2,
               enforce_eager=True, seed=0, speculative_config=spec, disable_log_stats=False,
               additional_config={"lookahead": settings} if settings else {})


def _generate(llm) -> list[list[int]]:
    """Greedy token ids of every prompt, as a chat, in one batch."""
    from vllm import SamplingParams

    outs = llm.chat([[{"role": "user", "content": p}] for p in PROMPTS],
                    SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def _counters(llm) -> dict[str, float]:
    """vLLM's spec-decode counters: drafts, draft tokens, accepted tokens."""
    found = {}
    for metric in llm.get_metrics():
        if metric.name in ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens"):
            found[metric.name.rsplit("_", 2)[-2]] = float(metric.value)
    return found


def _shutdown(llm) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


@pytest.fixture(scope="module")
def plain(model_dir: Path) -> list[list[int]]:
    """vLLM's greedy text without speculation."""
    llm = _engine(model_dir, proposer=False)
    try:
        return _generate(llm)
    finally:
        _shutdown(llm)


def test_same_greedy_text_drafts_accepted_and_memory_within_and_across_engines(model_dir, plain, tmp_path):
    memory = tmp_path / "vllm.lkm"
    # A fixed least_accept: "auto" learns it from this machine's step times, so what it drafts (and how much
    # the memory can show) would depend on how fast and how busy the machine is (on one CI machine it drafted
    # 9 tokens in two rounds). Fixed, the drafts are a function of the tokens alone.
    settings = {"memory": str(memory), "save_seconds": 0, "least_accept": 0.3}
    llm = _engine(model_dir, proposer=True, settings=settings)
    try:
        first = _generate(llm)
        after_first = _counters(llm)
        second = _generate(llm)  # the same requests again: the memory holds the first answers
        after_second = _counters(llm)
        # One more request ends the second round's requests in the proposer's eyes (it sees a request end
        # when its row is taken or emptied at the next step), so the memory file holds them all.
        _generate(llm)
    finally:
        _shutdown(llm)
    assert first == plain and second == plain
    assert after_first["accepted"] > 0, after_first
    accepted_second = after_second["accepted"] - after_first["accepted"]
    assert accepted_second > 2 * after_first["accepted"], (after_first, after_second)
    assert memory.exists() and memory.stat().st_size > 0

    llm = _engine(model_dir, proposer=True, settings=settings)  # a new engine loads the file
    try:
        again = _generate(llm)
        fresh = _counters(llm)
    finally:
        _shutdown(llm)
    assert again == plain
    assert fresh["accepted"] > 2 * after_first["accepted"], (after_first, fresh)
