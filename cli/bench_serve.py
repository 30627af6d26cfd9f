"""``lookahead bench-serve``: lookahead serve, the same server with speculation off, transformers serve and,
where a build is given (``--llama-server``), llama.cpp's server, each started here and replayed a data set
by concurrent OpenAI clients (lookahead/benchmarks/serving.py); ``--dataset agent`` replays multi-turn
tool-call conversations instead (lookahead/benchmarks/agent.py)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import click

from .bench import checked_datasets, checked_out_dir, require_bench_extra
from .options import CLI_ERRORS, cli_message, fail

DEFAULT_DATASETS = ("tool-calls", "mt-bench-1")  # lookahead.benchmarks.serving.DEFAULT_DATASETS
SERVER_NAMES = ("lookahead", "lookahead-plain", "transformers", "llama.cpp")  # lookahead.benchmarks.serving.SERVERS
DEFAULT_SERVERS = ("lookahead", "lookahead-plain", "transformers")  # and llama.cpp where --llama-server is given
AGENT = "agent"  # the conversations of lookahead.benchmarks.agent, a data set of bench-serve's alone
CLIENT_MODULES = ("openai", "fastapi", "uvicorn")  # the clients, and what both servers run on


@click.command("bench-serve")
@click.option("--model", "model_name", default="smollm2-135m", show_default=True,
              help="Built-in alias, .gguf file or local directory (transformers serve gets its directory).")
@click.option("--dataset", "datasets", multiple=True, default=(), show_default=", ".join(DEFAULT_DATASETS),
              help="Chat data set replayed in order (repeatable), as `lookahead bench` names them, or agent: "
                   "multi-turn tool-call conversations (needs a model whose chat template takes tools).")
@click.option("--concurrency", default="1,4", show_default=True,
              help="Concurrent clients, comma-separated levels; each level runs on a freshly started server.")
@click.option("--max-tokens", type=int, default=96, show_default=True, help="max_tokens of every request.")
@click.option("--limit", type=int, default=16, show_default=True, help="Prompts per data set, in its order.")
@click.option("--server", "servers", multiple=True, type=click.Choice(SERVER_NAMES), default=(),
              show_default="all three", help="Servers to measure (repeatable); llama.cpp is added wherever "
                                             "--llama-server is given.")
@click.option("--llama-server", "llama_server", default=None, metavar="PATH",
              help="llama.cpp's llama-server binary: run it too (--jinja, the same threads, greedy) on the model's "
                   "GGUF file, as one more server in the comparison.")
@click.option("--llama-gguf", "llama_gguf", default=None, metavar="PATH",
              help="The GGUF file llama-server serves [default: the file behind the alias or .gguf --model].")
@click.option("--llama-arg", "llama_args", multiple=True, metavar="ARG",
              help="Extra argument for llama-server (repeatable), e.g. --llama-arg=--spec-type --llama-arg=ngram-mod.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Torch threads of every server (OMP_NUM_THREADS, and lookahead serve --threads) "
                   "[default: this machine's cores as torch counts them].")
@click.option("--startup-timeout", type=click.FloatRange(min=1), default=600.0, show_default=True,
              help="Seconds a server may take to answer GET /health (a first start measures cost curves).")
@click.option("--request-timeout", type=click.FloatRange(min=1), default=600.0, show_default=True,
              help="Seconds one request may take.")
@click.option("--lookahead-arg", "lookahead_args", multiple=True, metavar="ARG",
              help="Extra argument for both lookahead servers (repeatable), e.g. --lookahead-arg=--cost-cache-dir=D.")
@click.option("--rounds", type=click.IntRange(min=1), default=1, show_default=True,
              help="Run every server this many times, the servers' order reversed each round (a machine that "
                   "slows down or speeds up then weighs on all alike); the ratios pool the rounds.")
@click.option("--out", "out_dir", default="bench-serve-out", show_default=True,
              help="Directory for bench-serve.json, bench-serve.md, bench-serve.png and the servers' logs.")
def bench_serve(model_name: str, datasets: tuple[str, ...], concurrency: str, max_tokens: int, limit: int,
                servers: tuple[str, ...], llama_server: str | None, llama_gguf: str | None,
                llama_args: tuple[str, ...], threads: int | None, startup_timeout: float, request_timeout: float,
                lookahead_args: tuple[str, ...], rounds: int, out_dir: str) -> None:
    """Measure serving: throughput, TTFT, TPOT and tokens per forward of lookahead serve against the same
    server with speculation off and transformers serve (with one client as it starts by default, with more
    with --continuous-batching where that runs), and llama.cpp's server where --llama-server gives a build,
    at each concurrency, greedy, streamed.

    Needs the [bench] and [serve] extras. Run it on an otherwise idle machine: the servers, one at a
    time, and the clients share its cores.
    """
    require_bench_extra()
    missing = [name for name in CLIENT_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        fail(f"lookahead bench-serve needs {', '.join(missing)}: pip install \"lookahead-lm[bench,serve]\"")
    if limit < 1:
        fail(f"--limit must be >= 1, got {limit}")
    if max_tokens < 1:
        fail(f"--max-tokens must be >= 1, got {max_tokens}")
    from lookahead.benchmarks.serving import parse_concurrency

    try:
        levels = parse_concurrency(concurrency)
    except ValueError as exc:
        fail(f"{exc} (option --concurrency)")
    names = bench_serve_datasets(datasets or DEFAULT_DATASETS)
    chosen = chosen_servers(servers, llama_server)
    checked_llama_files(llama_server, llama_gguf)
    checked_out_dir(out_dir)
    from lookahead.benchmarks.serving import write_report

    try:
        prompts = chat_prompts(names, limit)
        model_dir = local_model_dir(model_name)
        llama = llama_spec(model_name, llama_server, llama_gguf, llama_args) if "llama.cpp" in chosen else None
        data = _run(model_name, model_dir, prompts, chosen, levels, max_tokens, limit, threads, startup_timeout,
                    request_timeout, lookahead_args, out_dir, llama, rounds)
    except CLI_ERRORS as exc:
        partial = getattr(exc, "results", None)  # the runs measured before a server failed
        if partial:
            partial["meta"]["command"] = list(sys.argv)
            partial["meta"]["incomplete"] = cli_message(exc)
            paths = write_report(out_dir, partial)
            click.echo(f"lookahead: the runs measured so far are in {paths['json']}", err=True)
        fail(cli_message(exc))
    paths = write_report(out_dir, data)
    click.echo(paths["text"])
    click.echo(f"wrote {paths['json']}, {paths['markdown']}, {paths['figure']}")


def bench_serve_datasets(names: Iterable[str]) -> tuple[str, ...]:
    """The --dataset values: agent as it is, the others as `lookahead bench` names them (one line and exit 2
    for an unknown one)."""
    named = tuple(names)
    others = iter(checked_datasets([n for n in named if n.strip().lower() != AGENT]))
    return tuple(AGENT if n.strip().lower() == AGENT else next(others) for n in named)


def chosen_servers(servers: tuple[str, ...], llama_server: str | None) -> list[str]:
    """The servers to run, in SERVER_NAMES' order: those --server names (else DEFAULT_SERVERS), and llama.cpp
    wherever --llama-server is given; one line and exit 2 for llama.cpp without --llama-server."""
    named = set(servers or DEFAULT_SERVERS) | ({"llama.cpp"} if llama_server else set())
    chosen = [name for name in SERVER_NAMES if name in named]
    if "llama.cpp" in chosen and not llama_server:
        fail("--server llama.cpp needs --llama-server PATH, the llama-server binary of a llama.cpp build "
             "(option --llama-server)")
    return chosen


def checked_llama_files(llama_server: str | None, llama_gguf: str | None) -> None:
    """One line naming the option and exit 2 when --llama-server is no executable file or --llama-gguf no file."""
    from lookahead.benchmarks.llamacpp import file_problem

    for path, option, executable in ((llama_server, "--llama-server", True), (llama_gguf, "--llama-gguf", False)):
        problem = file_problem(path, option, executable) if path is not None else None
        if problem:
            fail(problem)


def llama_spec(model_name: str, binary: str | None, gguf: str | None, args: tuple[str, ...]) -> Any:
    """llama.cpp's server for the run (a lookahead.benchmarks.serving.LlamaServer): the binary, the GGUF file
    (--llama-gguf, else the one behind the alias or .gguf --model, assembled once), the extra arguments."""
    from lookahead.benchmarks.serving import LlamaServer
    from lookahead.loading.models import gguf_source
    from lookahead.loading.registry import default_cache_dir

    if binary is None:
        raise ValueError("llama.cpp needs --llama-server PATH")
    if gguf is None:
        source = gguf_source(model_name, default_cache_dir())
        if source is None:
            raise ValueError(f"--model {model_name} is no GGUF file and no alias of one: pass --llama-gguf FILE, "
                             f"the GGUF file llama-server should serve (option --llama-gguf)")
        gguf = str(source[0])
    return LlamaServer(binary=binary, gguf=gguf, args=tuple(args))


def chat_prompts(names: Iterable[str], limit: int) -> dict[str, list[tuple[Any, ...]]]:
    """Each data set's first ``limit`` prompts as (id, chat messages, request fields such as a prediction), in
    order, agent's as its conversations (id, messages, the tools, the plan: lookahead.benchmarks.agent); one
    line and exit 2 for a data set of completion prompts (no chat messages to send)."""
    from lookahead.benchmarks.agent import agent_requests
    from lookahead.benchmarks.datasets import chat_requests

    prompts: dict[str, list[tuple[Any, ...]]] = {}
    for name in names:
        if name == AGENT:
            prompts[name] = list(agent_requests(limit))
            continue
        try:
            prompts[name] = list(chat_requests(name, limit))
        except ValueError as exc:
            fail(f"{exc}: pick a chat data set such as {' or '.join(DEFAULT_DATASETS)} (option --dataset)")
    return prompts


def local_model_dir(model_name: str) -> str:
    """The model as a local directory (an alias or a .gguf de-quantized once in lookahead's cache), the
    name itself for a hub id (transformers serve reads its hub cache)."""
    from lookahead.errors import ModelLoadError
    from lookahead.loading.models import resolve_local_dir
    from lookahead.loading.registry import RegistryError, default_cache_dir

    try:
        local, _ = resolve_local_dir(model_name, default_cache_dir())
    except RegistryError as exc:
        raise ModelLoadError(f"cannot find model {model_name!r}: {exc}") from exc
    return str(local) if local is not None else model_name


def token_counter(model_dir: str) -> Callable[[str], int] | None:
    """Counts a reply's tokens with the model's tokenizer (for a server whose stream carries no usage)."""
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except Exception:  # noqa: BLE001 (no tokenizer there, whatever the reason: replies without usage count 0)
        return None
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _run(model_name: str, model_dir: str, prompts: dict[str, list[tuple[Any, ...]]],
         servers: list[str], levels: list[int], max_tokens: int, limit: int, threads: int | None,
         startup_timeout: float, request_timeout: float, lookahead_args: tuple[str, ...],
         out_dir: str, llama: Any = None, rounds: int = 1) -> dict[str, Any]:
    """The measurement (lookahead.benchmarks.serving.run_bench) with the command line recorded."""
    import torch

    from lookahead.benchmarks.serving import Settings, run_bench

    threads = threads or torch.get_num_threads()
    settings = Settings(model=model_name, model_dir=model_dir, datasets=prompts, servers=servers, concurrency=levels,
                        max_tokens=max_tokens, limit=limit, threads=threads, startup_timeout=startup_timeout,
                        request_timeout=request_timeout, lookahead_args=("--threads", str(threads), *lookahead_args),
                        count_tokens=token_counter(model_dir), llama=llama, rounds=rounds)
    Path(out_dir).expanduser().mkdir(parents=True, exist_ok=True)
    data = run_bench(settings, Path(out_dir).expanduser(), log=lambda line: click.echo(line, err=True))
    data["meta"]["command"] = list(sys.argv)
    return data
