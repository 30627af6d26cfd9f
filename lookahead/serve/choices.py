"""A request's ``n`` choices: each one a sequence of its own in the engine's batch, read together.

``choice_seed`` gives each choice its own random stream: choice 0 keeps the request's ``seed`` (so it is
the answer the same request with n=1 gets), choice i > 0 takes the first 8 bytes of
SHA-256(``"lookahead-choice:{seed}:{i}"``) read little-endian, shifted right by one bit (an integer in
[0, 2**63)). The same seed and n give the same choices, request after request; a greedy request ignores
the seed, so its choices are all the same text. Without a seed every choice draws from the engine's own
random stream (different, not reproducible).

``merged`` reads the choices' streams of steps at once, each item tagged with its choice's index, in the
order they arrive (one choice's items keep their order). ``summed_usage`` is the request's usage: the
prompt counted once, the completion tokens and the accepted and rejected predicted tokens summed over
the choices.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any, TypeVar, cast

T = TypeVar("T")


def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of choice ``index`` of a request seeded with ``seed`` (None: unseeded; see the module)."""
    if seed is None or index == 0:
        return seed
    digest = hashlib.sha256(f"lookahead-choice:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


async def merged(streams: Sequence[AsyncIterator[T]]) -> AsyncGenerator[tuple[int, T], None]:
    """Every item of ``streams`` as (its stream's index, the item), as they arrive, until all have ended; an
    exception in one stream is raised here. Closing this iterator early stops reading all of them."""
    if len(streams) == 1:  # (one choice: read in place, no task)
        async for item in streams[0]:
            yield 0, item
        return
    queue: asyncio.Queue[tuple[int, T | None, BaseException | None, bool]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                queue.put_nowait((index, item, None, False))
        except Exception as exc:  # handed to the reader, which raises it
            queue.put_nowait((index, None, exc, True))
            return
        queue.put_nowait((index, None, None, True))

    tasks = [asyncio.create_task(pump(i, stream)) for i, stream in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            index, value, error, ended = await queue.get()
            if error is not None:
                raise error
            if ended:
                running -= 1
            else:
                yield index, cast(T, value)  # (an item: not the end marker)
    finally:
        for task in tasks:
            task.cancel()


def summed_usage(usages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The request's usage from its choices' (OpenAI's shape; see the module)."""
    prompt = usages[0]["prompt_tokens"]
    completion = sum(u["completion_tokens"] for u in usages)
    details = [u.get("completion_tokens_details") or {} for u in usages]
    cached = min((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0) for u in usages)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
            "completion_tokens_details": {
                "accepted_prediction_tokens": sum(d.get("accepted_prediction_tokens", 0) for d in details),
                "rejected_prediction_tokens": sum(d.get("rejected_prediction_tokens", 0) for d in details)}}
