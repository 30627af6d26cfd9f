"""The distribution: its name, one version, lookahead.cli / lookahead.benchmarks installed
under the lookahead namespace (no top-level cli/ or benchmarks/) with the benchmarks' prompt
files and without the run logs and figures (results/), the [bench] extra."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from click.testing import CliRunner

import lookahead
from lookahead.cli.bench import BENCH_MODULES, DISTRIBUTION
from lookahead.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "lookahead", "cli", "benchmarks")  # what a wheel is built from


def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def package_dirs() -> dict[str, Path]:
    """Every package the wheel must hold: lookahead/ and its subpackages, cli/ and benchmarks/ mapped in."""
    found = {".".join(p.parent.relative_to(ROOT).parts): p.parent for p in (ROOT / "lookahead").rglob("__init__.py")}
    found["lookahead.cli"] = ROOT / "cli"
    found["lookahead.benchmarks"] = ROOT / "benchmarks"
    return found


def test_distribution_name_is_ours_and_the_command_stays_lookahead():
    project = pyproject()["project"]
    assert project["name"] == DISTRIBUTION != "lookahead"
    assert project["scripts"] == {"lookahead": "lookahead.cli.main:main"}


def test_one_version_string():
    data = pyproject()
    assert "version" not in data["project"] and "version" in data["project"]["dynamic"]
    assert data["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "lookahead.__version__"}
    assert lookahead.__version__.count(".") == 2


def test_every_package_is_listed_and_cli_benchmarks_are_mapped():
    setuptools = pyproject()["tool"]["setuptools"]
    assert sorted(setuptools["packages"]) == sorted(package_dirs())
    assert setuptools["package-dir"] == {"lookahead.cli": "cli", "lookahead.benchmarks": "benchmarks"}


def test_bench_modules_are_the_bench_extra_and_not_core_dependencies():
    project = pyproject()["project"]
    extra = {req.split(">")[0].split("=")[0] for req in project["optional-dependencies"]["bench"]}
    core = {req.split(">")[0].split("=")[0].split("<")[0] for req in project["dependencies"]}
    assert extra == set(BENCH_MODULES)
    assert not extra & core


def test_bench_without_the_extra_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # find_spec -> None: as if not installed
    result = CliRunner().invoke(main, ["bench", "--model", "/nonexistent/model"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    assert f'pip install "{DISTRIBUTION}[bench]"' in lines[0] and "matplotlib" in lines[0]


def test_bench_help_needs_no_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = CliRunner().invoke(main, ["bench", "--help"])
    assert result.exit_code == 0 and "--dataset" in result.output


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A regular wheel built from a copy of the sources (offline: the installed setuptools)."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed (the wheel is built without build isolation)")
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(ROOT / name, src / name)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "--quiet", "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (path,) = (tmp / "dist").glob("*.whl")
    return path


def test_wheel_installs_cli_and_benchmarks_under_lookahead_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"lookahead", f"{DISTRIBUTION.replace('-', '_')}-{lookahead.__version__}.dist-info"}
    for module in ("lookahead/cli/main.py", "lookahead/cli/bench.py", "lookahead/benchmarks/runner.py",
                   "lookahead/benchmarks/report.py", "lookahead/kernels/pool.py", "lookahead/proposers/base.py"):
        assert module in names


def test_wheel_holds_the_prompt_files_and_no_run_logs_or_figures(wheel):
    """benchmarks/prompts/*.jsonl is package data the benchmarks read; RESULTS.md and the runs' figures live in
    results/ at the top of the repository and are never installed."""
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {Path(name).name for name in names if name.startswith("lookahead/benchmarks/prompts/")}
    assert shipped == {p.name for p in (ROOT / "benchmarks" / "prompts").glob("*.jsonl")} != set()
    assert not [name for name in names if name.startswith("lookahead/benchmarks/") and name.endswith((".md", ".png"))]
    assert (ROOT / "results" / "RESULTS.md").is_file() and not (ROOT / "benchmarks" / "RESULTS.md").exists()


def test_wheel_metadata_name_version_extra_and_command(wheel):
    archive = zipfile.ZipFile(wheel)
    info = f"{DISTRIBUTION.replace('-', '_')}-{lookahead.__version__}.dist-info"
    meta = Parser().parsestr(archive.read(f"{info}/METADATA").decode())
    assert meta["Name"] == DISTRIBUTION and meta["Version"] == lookahead.__version__
    assert {"bench", "test"} <= set(meta.get_all("Provides-Extra"))
    requires = meta.get_all("Requires-Dist")
    assert all("extra ==" in req for req in requires if req.startswith(("matplotlib", "tqdm")))
    entry_points = archive.read(f"{info}/entry_points.txt").decode()
    assert "lookahead = lookahead.cli.main:main" in entry_points


def test_the_cli_module_runs_as_a_script():
    """``python -m lookahead.cli.main`` (the module as __main__) lists every command: no command module
    imports main.py back (they share cli/options.py), so nothing is imported half-initialised."""
    done = subprocess.run([sys.executable, "-m", "lookahead.cli.main", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    for command in ("generate", "bench", "bench-batch", "bench-memory"):
        assert f"\n  {command} " in done.stdout, done.stdout
