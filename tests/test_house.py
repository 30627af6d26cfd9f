"""The house rule of the code: comments, docstrings and --help state contracts, never history.

A run number ("run 118"), a CPU model name (AMD EPYC, Xeon, ...) or a date belongs in
results/RESULTS.md, where the measurement lives; the code says what it guarantees and, where a
number came from a measurement, which command measures it. These tests read every source file of
lookahead/ and cli/ (.py, .cpp, .h), the reference docs (docs/DESIGN.md, docs/serve.md, docs/vllm.md)
and the --help text of the `lookahead` command and of each of its subcommands, and name every line
that cites one.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from lookahead.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("lookahead", "cli")
SOURCE_SUFFIXES = (".py", ".cpp", ".h")
REFERENCE_DOCS = ("docs/DESIGN.md", "docs/serve.md", "docs/vllm.md")  # checked where they exist

BREAK = r"(?:\s|#|//|\*)+"  # between two words: spaces, or a line break inside a comment
HISTORY = {
    # a run of results/RESULTS.md: "run 118", "runs 128 and 130", "RESULTS.md, run 96", "run\n# 134"
    "run citation": re.compile(rf"\bruns?{BREAK}\d{{3,4}}\b|RESULTS\.md,?{BREAK}runs?{BREAK}\d+"),
    "CPU model name": re.compile(r"\b(?:EPYC|Xeon|Ryzen|Threadripper|Graviton\d*|Core i[3579])\b", re.IGNORECASE),
    "ISO date": re.compile(r"\b(?:19|20)\d{2}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])\b"),
}


def history_in(text: str) -> list[tuple[int, str, str]]:
    """Every (line number, what, line) of ``text`` that cites history (HISTORY), by where each citation
    starts; a citation broken over two lines counts on its first."""
    lines = text.splitlines()
    found = {(text.count("\n", 0, match.start()) + 1, what)
             for what, pattern in HISTORY.items() for match in pattern.finditer(text)}
    return [(number, what, lines[number - 1].strip()) for number, what in sorted(found)]


@pytest.mark.parametrize("text", [
    "as measured in run 118, the kernel",
    "(results/RESULTS.md, run 96)",
    "runs 128 and 130 agree",
    "on a 2-core AMD EPYC with AVX-512",
    "an Intel Xeon Platinum",
    "a Ryzen 7 laptop",
    "an Intel Core i7-1260P",
    "AWS Graviton3",
    "a Threadripper 3990X",
    "measured 2025-06-30",
    "(2-core, results/RESULTS.md, run\n# 134)",
    "the kernel, see run\n// 129 for the timings",
])
def test_history_in_names_a_citation(text: str) -> None:
    found = history_in(f"first line\n{text}\nlast line")
    assert {number for number, _, _ in found} == {2}, found


@pytest.mark.parametrize("text", [
    "each row count runs through whichever was faster",
    "a step runs 64 rows at most",
    "run 2 steps, then 16 more",
    "the scores' core index, an EPYCness",
    "the curve's 1-32 rows at 2-64 threads",
    "version 2.13.0 of torch; 2024 tokens",
    "`lookahead roofline --rows 8` measures it",
])
def test_history_in_passes_contracts_and_numbers(text: str) -> None:
    assert history_in(text) == []


def source_files() -> list[Path]:
    return sorted(path for folder in SOURCE_DIRS for path in (ROOT / folder).rglob("*")
                  if path.is_file() and path.suffix in SOURCE_SUFFIXES)


def test_sources_cite_no_run_cpu_or_date() -> None:
    files = source_files()
    assert any(path.name == "main.py" for path in files) and any(path.suffix == ".cpp" for path in files), \
        f"found no sources under {SOURCE_DIRS} (is the test reading the repository?)"
    cited = [f"{path.relative_to(ROOT)}:{number}: {what}: {line}"
             for path in files for number, what, line in history_in(path.read_text(encoding="utf-8"))]
    assert not cited, ("comments and docstrings state contracts; move these to results/RESULTS.md and name the "
                       "command that measures the number instead:\n" + "\n".join(cited))


def test_reference_docs_cite_no_run_cpu_or_date() -> None:
    docs = [ROOT / name for name in REFERENCE_DOCS if (ROOT / name).is_file()]
    assert any(path.name == "DESIGN.md" for path in docs), \
        f"docs/DESIGN.md not found among {REFERENCE_DOCS} (is the test reading the repository?)"
    cited = [f"{path.relative_to(ROOT)}:{number}: {what}: {line}"
             for path in docs for number, what, line in history_in(path.read_text(encoding="utf-8"))]
    assert not cited, ("the reference docs state contracts and name the command that measures a number; move "
                       "these to results/RESULTS.md and link it instead:\n" + "\n".join(cited))


def command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The argument path of every command under ``group``, its subgroups' commands too, and the group's own."""
    paths = [prefix]
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            paths += command_paths(command, (*prefix, name))
        else:
            paths.append((*prefix, name))
    return paths


def test_every_help_text_cites_no_run_cpu_or_date() -> None:
    paths = command_paths(main)
    assert ("generate",) in paths and ("costs", "measure") in paths, paths
    runner = CliRunner()
    cited = []
    for path in paths:
        result = runner.invoke(main, [*path, "--help"], terminal_width=200)
        assert result.exit_code == 0, (path, result.output)
        assert "Usage:" in result.output, (path, result.output)
        cited += [f"lookahead {' '.join(path)} --help: {what}: {line}" for _, what, line in history_in(result.output)]
    assert not cited, "help texts state contracts:\n" + "\n".join(cited)


def test_the_configuration_page_is_generated_from_the_fields() -> None:
    """docs/configuration.md's table is configuration_table(): the fields' declarations, one place each
    (regenerate with `python -c "from lookahead.config import configuration_table as t; print(t())"`)."""
    from pathlib import Path

    from lookahead.config import configuration_table

    page = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    assert configuration_table() in page
