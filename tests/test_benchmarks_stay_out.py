"""Nothing the package runs imports its benchmarks: only lookahead.benchmarks itself and the command
(lookahead.cli) may import lookahead.benchmarks. The config parser every caller shares lives in the
config module (``LookaheadConfig.from_mapping``), the vLLM proposer and its replay read no data set.
Imports inside functions and under TYPE_CHECKING count.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = "lookahead.benchmarks"


def imported_modules(name: str, path: Path) -> set[str]:
    """Every module the module ``name`` (at ``path``) imports, anywhere in its body, relative imports
    resolved: ``from ..benchmarks.configs import x`` in lookahead.vllm.settings -> lookahead.benchmarks.configs,
    and ``from .. import benchmarks`` -> lookahead.benchmarks."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)
    return out


def package_modules() -> dict[str, Path]:
    """Every module under lookahead/ by its dotted name (cli/ and benchmarks/ sit outside that folder)."""
    found = {}
    for path in (ROOT / "lookahead").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def benchmark_imports(modules: dict[str, Path]) -> list[str]:
    """``module: imported`` for every import of lookahead.benchmarks (or a module of it) in ``modules``."""
    return sorted(f"{name}: {target}" for name, path in modules.items() for target in imported_modules(name, path)
                  if target == BENCHMARKS or target.startswith(BENCHMARKS + "."))


def test_no_module_under_lookahead_imports_the_benchmarks():
    modules = package_modules()
    assert "lookahead.vllm.proposer" in modules and "lookahead.config" in modules and len(modules) > 50, \
        "found too few modules: is the test reading the repository?"
    assert benchmark_imports(modules) == [], "lookahead.benchmarks is for the benchmarks and the command"


def test_the_check_sees_a_benchmarks_import_hidden_in_a_function(tmp_path):
    """It can fail: relative and absolute imports of the benchmarks, inside a function, are found."""
    path = tmp_path / "fake.py"
    path.write_text("def f():\n    from ..benchmarks.configs import parse_config_spec\n"
                    "    from .. import benchmarks\n    import lookahead.benchmarks.datasets\n"
                    "    from ..config import LookaheadConfig\n")
    assert benchmark_imports({"lookahead.vllm.fake": path}) == [
        "lookahead.vllm.fake: lookahead.benchmarks", "lookahead.vllm.fake: lookahead.benchmarks.configs",
        "lookahead.vllm.fake: lookahead.benchmarks.configs.parse_config_spec",
        "lookahead.vllm.fake: lookahead.benchmarks.datasets"]


def test_the_proposer_settings_and_options_run_without_the_benchmarks():
    """Importing (and using) the vLLM proposer, its replay and settings and the commands' shared options
    leaves lookahead.benchmarks unloaded."""
    code = ("import sys\n"
            "from types import SimpleNamespace\n"
            "import lookahead.cli.options, lookahead.vllm.replay\n"
            "from lookahead.vllm import LookaheadProposer\n"
            "model = SimpleNamespace(max_model_len=64, get_vocab_size=lambda: 32, tokenizer=None, "
            "trust_remote_code=False)\n"
            "engine = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=3), model_config=model,"
            " additional_config={'lookahead': {'match_max': '5', 'least_accept': 0.0}})\n"
            "proposer = LookaheadProposer(engine)\n"
            "assert proposer.settings.config.match_max == 5\n"
            "assert lookahead.cli.options.checked_config({'window': 3}).window == 3\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('lookahead.benchmarks'))\n"
            "assert not loaded, loaded\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
