"""``lookahead bench``: greedy (or sampling) vs prompt lookup vs [assisted] vs lookahead (and lookahead-plain,
the same routes without speculation) on real prompts."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from lookahead.benchmarks.datasets import DATASETS, canonical_name

from .options import (
    CLI_ERRORS,
    DTYPES,
    checked_config,
    checked_seed,
    cli_message,
    config_options,
    fail,
    products_option,
    threads_option,
    trust_remote_code_option,
    warnings_as_lines,
    weights_option,
)

if TYPE_CHECKING:
    from lookahead.benchmarks.parsers import Prompt
    from lookahead.benchmarks.runner import Sampling
    from lookahead.config import LookaheadConfig

DISTRIBUTION = "lookahead-lm"  # this project's name on the package index (pyproject.toml [project] name)
BENCH_MODULES = ("matplotlib", "tqdm")  # what the [bench] extra installs
DEFAULT_DATASETS = ("humaneval", "mt-bench")  # --dataset when neither it nor --prompts is given


def missing_bench_modules() -> list[str]:
    """The modules of the [bench] extra that cannot be imported here."""
    return [name for name in BENCH_MODULES if importlib.util.find_spec(name) is None]


def require_bench_extra() -> None:
    """One line naming the install command and exit status 2 when the [bench] extra is missing."""
    missing = missing_bench_modules()
    if missing:
        fail(f"lookahead bench needs {', '.join(missing)}: pip install \"{DISTRIBUTION}[bench]\"")


@click.command()
@click.option("--model", "model_name", default="smollm2-135m", show_default=True,
              help="Target model: built-in alias, .gguf file, local directory or hub id.")
@click.option("--dataset", "datasets", multiple=True, default=(), show_default=", ".join(DEFAULT_DATASETS),
              help=f"Data set (repeatable; the default applies unless --prompts is given): {', '.join(DATASETS)}.")
@click.option("--prompts", "prompt_files", multiple=True, type=click.Path(dir_okay=False),
              help='Your own prompts (repeatable): a .jsonl file, one {"prompt": "..."} (chat message) or '
                   '{"text": "..."} (raw text to continue) object per line, optional "id"; used whole, '
                   'reported as a data set named after the file.')
@click.option("--limit", type=int, default=5, show_default=True, help="Prompts per data set (not per --prompts file).")
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--out", "out_dir", default="bench-out", show_default=True,
              help="Directory for bench.json, bench.md, bench.png.")
@click.option("--config", "extra_configs", multiple=True,
              help="Extra lookahead config (repeatable), e.g. 'wide:window=5,ngram=4,candidates=8'.")
@click.option("--preset", "presets", multiple=True,
              help="Named extra config (repeatable): lade-gpu, context-only, pool-only, recycle-only, "
                   "fixed-budget, no-speculation (one token per step, lookahead's CPU kernels; lookahead-plain, which "
                   "always runs, is the same with the window kept x alone), "
                   "stock-kernels (torch's own linear kernels), or all.")
@click.option("--draft-model", "--draft", "draft", default=None,
              help="Draft model (any name --model takes, same tokenizer): adds transformers assisted generation, "
                   "lookahead with the draft as one more source (lookahead+draft) and the draft alone (draft-only).")
@click.option("--cost-curve/--no-cost-curve", default=True, show_default=True,
              help="Measure the forward-cost curve (k = 1..64 new tokens, ~300 context).")
@click.option("--turn2/--turn1", default=True, show_default=True,
              help="MT-bench: time turn 2 after the model's own greedy turn-1 answer (default), or turn 1.")
@click.option("--sample/--greedy", default=False, show_default=True,
              help="Every method samples (do_sample=True, reference: transformers sampling) instead of "
                   "decoding greedily; speedups become ratios of new tokens/s and nothing must match.")
@click.option("--temperature", type=float, default=None, help="Sampling temperature (> 0; --sample only) "
              "[default: 0.7].")
@click.option("--top-k", type=int, default=None,
              help="Sampling top-k (0 = off; --sample only) [default: the model's generation_config].")
@click.option("--top-p", type=float, default=None,
              help="Sampling top-p in (0, 1] (--sample only) [default: the model's generation_config].")
@click.option("--seed", default="0", show_default=True,
              help="torch.manual_seed(seed + prompt index) before every method's run on a prompt "
                   "(lookahead's sampled text depends on the seed alone).")
@click.option("--ignore-eos", is_flag=True,
              help="With --sample: every method decodes exactly --max-new-tokens (EOS ignored), so that "
                   "tokens/s compare runs of equal length.")
@click.option("--busy-cores", type=click.IntRange(min=0), default=0, show_default=True,
              help="Run the whole comparison beside this many processes that keep a core busy each "
                   "(a machine where something else runs).")
@click.option("--device", default="cpu", show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@trust_remote_code_option
@weights_option
@products_option
@threads_option
@config_options
def bench(model_name: str, datasets: tuple[str, ...], prompt_files: tuple[str, ...], limit: int, max_new_tokens: int,
          out_dir: str, extra_configs: tuple[str, ...], presets: tuple[str, ...], draft: str | None, cost_curve: bool,
          turn2: bool, sample: bool, temperature: float | None, top_k: int | None, top_p: float | None, seed: str,
          ignore_eos: bool, busy_cores: int, device: str, dtype: str, trust_remote_code: bool, weights: str,
          products: str, **config_values: Any) -> None:
    """Benchmark decoding methods side by side (interleaved per prompt) and write a report.

    Lookahead options (--window, --ngram, ...) set the config of the 'lookahead'
    method; 'lookahead-plain' runs the same config with speculation off (no
    candidates, the window x alone), so the report splits lookahead's speedup
    into its kernels' gain and speculation's. The report's table and figure
    name the model, CPU, threads, prompts, new tokens and mode. Greedy
    (default): exits with status 1 if a lookahead method's tokens differ from
    greedy decoding in float32. --sample: every method samples with
    the same settings and seed; outputs differ, so nothing is checked.
    Needs the [bench] extra (matplotlib, tqdm).
    """
    require_bench_extra()
    if limit < 1:
        fail(f"--limit must be >= 1, got {limit}")
    if max_new_tokens < 1:
        fail(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    first_seed = checked_seed(seed)
    datasets = checked_datasets(datasets or (() if prompt_files else DEFAULT_DATASETS))
    prompt_sets = checked_prompt_files(prompt_files)
    sampling = checked_sampling(sample, temperature, top_k, top_p, ignore_eos)
    config = checked_config(config_values)
    from lookahead.benchmarks.configs import parse_config_spec
    from lookahead.benchmarks.runner import preset_specs
    try:
        extra_configs = tuple(extra_configs) + tuple(preset_specs(presets))
    except ValueError as exc:
        fail(f"{exc} (option --preset)")
    for spec in extra_configs:  # check before loading any model
        try:
            parse_config_spec(spec, config)
        except ValueError as exc:
            fail(f"{exc} (option --config)")
    checked_out_dir(out_dir)
    from lookahead.benchmarks.busy import busy_cores as busy
    try:
        with warnings_as_lines(), busy(busy_cores):
            table, paths, mismatch = _bench(model_name, datasets, prompt_sets, limit, max_new_tokens, out_dir,
                                            extra_configs, draft, cost_curve, turn2,
                                            (device, dtype, trust_remote_code, weights, products),
                                            config, sampling, first_seed, busy_cores)
    except CLI_ERRORS as exc:
        fail(cli_message(exc))
    click.echo(table)
    click.echo(f"\nwrote {paths['json']}, {paths['markdown']}, {paths['figure']}")
    if mismatch is not None:
        click.echo(f"lookahead: EXACT MATCH FAILED: {mismatch}", err=True)
        sys.exit(1)


def checked_datasets(names: Iterable[str]) -> tuple[str, ...]:
    """The --dataset values as names in DATASETS (spellings folded), or one line listing the valid
    names and exit 2, before any model loads."""
    try:
        return tuple(canonical_name(name) for name in names)
    except ValueError as exc:
        fail(f"{exc} (option --dataset)")


def checked_prompt_files(paths: Iterable[str]) -> list[list[Prompt]]:
    """The prompts of every --prompts file (lists of Prompt), or one line naming the bad file and exit 2,
    before any model loads."""
    from lookahead.benchmarks.parsers import parse_prompt_file

    sets = []
    for path in paths:
        try:
            sets.append(parse_prompt_file(path))
        except (ValueError, OSError) as exc:
            fail(f"{exc} (option --prompts)")
    return sets


def checked_out_dir(out_dir: str) -> None:
    """Fail now, before any model loads, unless the report can be written under --out.

    A probe file is written (and removed) in --out, or in its nearest existing
    parent when --out does not exist yet; nothing is left behind.
    """
    path = Path(out_dir).expanduser().absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    try:
        if not existing.is_dir():
            raise NotADirectoryError(f"{existing} is a file")
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".lookahead-write-check-"):
            pass
    except OSError as exc:
        fail(f"cannot write the report to --out {out_dir}: {exc.strerror or exc}; pick a writable directory")


def checked_sampling(sample: bool, temperature: float | None, top_k: int | None, top_p: float | None,
                     ignore_eos: bool = False) -> Sampling | None:
    """The Sampling settings of --sample (None when greedy), or one line naming the bad option and exit 2."""
    from lookahead.benchmarks.runner import Sampling

    if not sample:
        given = [flag for flag, value in (("--temperature", temperature), ("--top-k", top_k), ("--top-p", top_p),
                                          ("--ignore-eos", ignore_eos or None)) if value is not None]
        if given:
            fail(f"{given[0]} only applies with --sample")
        return None
    try:
        return Sampling(**({} if temperature is None else {"temperature": temperature}), top_k=top_k, top_p=top_p,
                        ignore_eos=ignore_eos)
    except ValueError as exc:
        fail(f"{exc} (option --{str(exc).split()[0].replace('_', '-')})")


def _bench(model_name: str, datasets: Iterable[str], prompt_sets: list[list[Prompt]], limit: int, max_new_tokens: int,
           out_dir: str, extra_configs: tuple[str, ...], draft: str | None, cost_curve: bool, turn2: bool,
           loading: tuple[str, str, bool, str, str], config: LookaheadConfig, sampling: Sampling | None,
           seed: int | None, busy_cores: int = 0) -> tuple[str, dict[str, Any], str | None]:
    """Load (device, dtype, trust_remote_code, weights, products = loading), run every method on every prompt,
    write the report; (table, paths, mismatch or None). ``busy_cores``: spinning processes beside it (recorded)."""
    import torch
    from tqdm import tqdm

    from lookahead import load_model
    from lookahead.benchmarks.costcurve import cost_curve as measure_cost
    from lookahead.benchmarks.datasets import canonical_name, load_dataset
    from lookahead.benchmarks.report import cost_table, write_report
    from lookahead.benchmarks.runner import (
        ExactMatchError,
        check_exact,
        default_methods,
        prepare_prompts,
        run_benchmark,
    )

    started = time.perf_counter()
    device, dtype, trust_remote_code, weights, products = loading
    datasets = [canonical_name(d) for d in datasets]
    torch_dtype = getattr(torch, dtype)
    model, tokenizer = load_model(model_name, device=device, dtype=torch_dtype, trust_remote_code=trust_remote_code,
                                  weights=weights, products=products, cost_cache_dir=config.cost_cache_dir)
    if model.generation_config.pad_token_id is None and tokenizer.eos_token_id is not None:
        model.generation_config.pad_token_id = tokenizer.eos_token_id
    if draft:
        from lookahead.proposers.draft.checks import check_draft_source

        check_draft_source(model, draft)  # a draft of another vocabulary is refused before its weights load
    draft_model = (load_model(draft, device=device, dtype=torch_dtype, trust_remote_code=trust_remote_code,
                              weights=weights, products=products, cost_cache_dir=config.cost_cache_dir)[0]
                   if draft else None)
    methods = default_methods(model, tokenizer, config, extra_configs, draft_model, sampling)

    prompts = []
    sources = [(name, name, load_dataset(name, limit)) for name in datasets]
    sources += [(raw[0].dataset, f"{raw[0].dataset} (--prompts)", raw) for raw in prompt_sets]
    for name, label, raw in sources:
        click.echo(f"[bench] {label}: {len(raw)} prompts" + (" (rendering turn 2 after greedy turn 1)"
                                                              if turn2 and name == "mt-bench" else ""), err=True)
        prompts += prepare_prompts(name, raw, model, tokenizer, max_new_tokens, turn2=turn2)

    bar = tqdm(total=len(prompts) * len(methods), desc="bench", unit="run", file=sys.stderr)

    def progress(label: str) -> None:
        bar.set_postfix_str(label, refresh=False)
        bar.update(1)

    records = run_benchmark(model, methods, prompts, max_new_tokens, progress=progress, seed=seed)
    bar.close()
    cost = None
    if cost_curve:
        click.echo("[bench] measuring the forward-cost curve", err=True)
        cost = measure_cost(model)
    meta: dict[str, Any] = {
        "model": model_name, "draft": draft, "datasets": datasets + [raw[0].dataset for raw in prompt_sets],
        "limit": limit,
        "max_new_tokens": max_new_tokens, "dtype": dtype, "device": device, "mt_bench_turn": 2 if turn2 else 1,
        "sampling": dataclasses.asdict(sampling) if sampling else None,  # as given; None = model default
        "methods": [{"name": m.name, "must_match": m.exact, "config": m.config} for m in methods],
        "busy_cores": busy_cores, "command": sys.argv, "bench_wall_s": None}
    meta["bench_wall_s"] = time.perf_counter() - started
    paths = write_report(out_dir, records, cost, meta)
    mismatch = None
    try:
        check_exact(records)
    except ExactMatchError as exc:
        if dtype == "float32":
            mismatch = str(exc)
        else:
            click.echo(f"[bench] note ({dtype}, not enforced): {exc}", err=True)
    table = paths["table"] + ("\n\n" + cost_table(cost) if cost else "")
    table += f"\n\nbench wall time {meta['bench_wall_s']:.0f} s"
    json.dumps(meta)  # fail here, not later, if meta is not JSON-serialisable
    return table, paths, mismatch
