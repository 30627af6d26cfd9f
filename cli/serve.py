"""``lookahead serve``: an OpenAI-compatible HTTP server (lookahead/serve/app.py under uvicorn) over one
continuous-batching engine (lookahead/serve/engine.py). SIGTERM or Ctrl-C stops it cleanly: requests
in flight get up to GRACEFUL_SHUTDOWN_S - STREAMS_END_S to finish, then the engine ends those still running
(each with its error event and [DONE]), stops and saves its memory file."""

from __future__ import annotations

import importlib.util
import ipaddress
import signal
import sys
from pathlib import Path
from typing import Any

import click

from lookahead.serve.defaults import SERVE_DEFAULTS

from .options import (
    CLI_ERRORS,
    DTYPES,
    checked_config,
    checked_memory_path,
    cli_message,
    config_options_with,
    fail,
    products_option,
    threads_option,
    trust_remote_code_option,
    warnings_as_lines,
    weights_option,
)

DISTRIBUTION = "lookahead-lm"  # pyproject.toml [project] name
SERVE_MODULES = ("fastapi", "uvicorn", "pydantic")  # what the [serve] extra installs that serving imports
GRACEFUL_SHUTDOWN_S = 10  # on SIGTERM / Ctrl-C: how long requests in flight may take to finish
STREAMS_END_S = 2  # that long before the grace ends, the engine ends the requests still running (error event, [DONE])


def require_serve_extra() -> None:
    """One line naming the install command and exit status 2 when the [serve] extra is missing."""
    missing = [name for name in SERVE_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        fail(f"lookahead serve needs {', '.join(missing)}: pip install \"{DISTRIBUTION}[serve]\"")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (localhost, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command()
@click.option("--model", "model_name", default="smollm2-135m", show_default=True,
              help="Built-in alias, .gguf file, local directory or hub id.")
@click.option("--served-model-name", default=None,
              help="The name clients send as \"model\" [default: --model as given].")
@click.option("--device", default="cpu", show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: every interface; set --api-key then).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="Port to listen on (0: any free one, printed at start).")
@click.option("--max-batch", type=click.IntRange(min=1), default=8, show_default=True,
              help="Sequences decoded together at most (a request with n choices takes n); more wait in the "
                   "queue, and the largest n a request may ask for.")
@click.option("--max-queue", type=click.IntRange(min=0), default=64, show_default=True,
              help="Sequences waiting at most beyond those the batch's free slots take next (a request with n "
                   "choices counts n); past that a request gets 429 with Retry-After, the wait at the pace the "
                   "latest requests left the batch.")
@click.option("--memory", "memory_path", default=None, metavar="PATH",
              help="Keep the memory of earlier requests in this file: read at start (when it exists), written "
                   "back every --save-every seconds and at shutdown. It holds your users' text.")
@click.option("--save-every", type=click.FloatRange(min=0, min_open=True), default=300.0, show_default=True,
              help="Seconds between saves of --memory.")
@click.option("--api-key", default=None,
              help="Require 'Authorization: Bearer KEY' on /v1/* and /metrics [default: no key]. A key on the "
                   "command line shows in the process list: --api-key-file keeps it out.")
@click.option("--api-key-file", default=None, metavar="PATH", type=click.Path(dir_okay=False),
              help="Read the --api-key from this file (its first line).")
@trust_remote_code_option
@weights_option
@products_option
@threads_option
@config_options_with(SERVE_DEFAULTS)
def serve(model_name: str, served_model_name: str | None, device: str, dtype: str, host: str, port: int,
          max_batch: int, max_queue: int, memory_path: str | None, save_every: float, api_key: str | None,
          api_key_file: str | None, trust_remote_code: bool, weights: str, products: str, **values: Any) -> None:
    """Serve the model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/models,
    /health, /metrics), decoding requests together with lookahead decoding."""
    require_serve_extra()
    if api_key_file is not None:
        api_key = read_api_key(api_key_file, api_key)
    if api_key is not None and not api_key.strip():
        fail("--api-key is empty: pass a key, or leave the option out for no key")
    config = checked_config(values)
    checked_memory_path(memory_path, config.memory_tokens)
    name = served_model_name if served_model_name is not None else model_name
    if not name.strip():
        fail("--served-model-name is empty: pass the name clients send as \"model\"")
    if not is_loopback(host) and api_key is None:
        click.echo(f"lookahead: warning: serving on {host} without --api-key: whoever reaches this port can use the "
                   f"model (and, through timing, tell what text went through it before)", err=True)
    try:
        with warnings_as_lines():
            engine = _engine(model_name, device, dtype, (trust_remote_code, weights, products), config, max_batch,
                             max_queue, memory_path, save_every)
            engine.start(thread=False)  # reads --memory: a damaged file stops here, before the port opens
    except CLI_ERRORS as exc:
        fail(cli_message(exc))
    if engine.memory_path is not None:
        where = (f"read {engine.memory_tokens} tokens of earlier requests from {engine.memory_path}"
                 if engine.memory_loaded else f"{engine.memory_path} does not exist yet: a new memory")
        click.echo(f"lookahead: memory: {where}; saved there every {save_every:g} s and on stop", err=True)
    _warm_up(engine)
    _settle_heap()
    try:
        _run(engine, name, host, port, api_key)
    finally:
        _unsettle_heap()


def _warm_up(engine: Any) -> None:
    """The steps a batch meets first, run before the port opens (lookahead/serve/warmup.py), in this (the
    decode loop's) thread; where that fails, one line says so and the first requests do that work."""
    from lookahead.serve.warmup import warm_up

    try:
        with warnings_as_lines():
            done = warm_up(engine.generator, engine.max_batch)
    except Exception as exc:  # noqa: BLE001  (the server still serves: its first requests make the traces)
        click.echo(f"lookahead: warning: warming up failed ({cli_message(exc)}); the first requests will "
                   f"make its traces and curves", err=True)
        return
    largest = max(count for count, _ in done.shapes)
    grammar = "; the grammar engine's token table" if done.grammar else ""
    click.echo(f"lookahead: warmed up in {done.seconds:.1f} s (a step of 1-{largest} sequences, of one row and "
               f"of several{grammar})", err=True)


def _settle_heap() -> None:
    """The objects start-up made, out of the garbage collector's full collections (lookahead/serve/warmup.py)."""
    from lookahead.serve.warmup import settle_heap

    settle_heap()


def _unsettle_heap() -> None:
    """Serving has ended: the frozen objects back to the collector, for the interpreter's finalization."""
    from lookahead.serve.warmup import unsettle_heap

    unsettle_heap()


def _engine(model_name: str, device: str, dtype: str, loading: tuple[bool, str, str], config: Any, max_batch: int,
            max_queue: int, memory_path: str | None, save_every: float) -> Any:
    """The model loaded, its generator and the engine over it (not started)."""
    import torch

    from lookahead import LookaheadGenerator, load_model
    from lookahead.serve.engine import Engine

    trust_remote_code, weights, products = loading
    model, tokenizer = load_model(model_name, device=device, dtype=getattr(torch, dtype),
                                  trust_remote_code=trust_remote_code, weights=weights, products=products,
                                  cost_cache_dir=config.cost_cache_dir)
    generator = LookaheadGenerator(model, tokenizer, config)
    memory = str(Path(memory_path).expanduser()) if memory_path is not None else None
    return Engine(generator, max_batch=max_batch, max_queue=max_queue, memory_path=memory, save_every_s=save_every)


def read_api_key(path: str, given: str | None) -> str:
    """The key in the first line of ``path`` (a one-line CLI error when it cannot be read, is empty, or
    --api-key is given too)."""
    if given is not None:
        fail("--api-key and --api-key-file both given: pass one")
    try:
        with open(path, encoding="utf-8") as handle:
            key = handle.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"--api-key-file {path}: cannot be read ({exc}); pass a readable text file holding the key")
    if not key:
        fail(f"--api-key-file {path}: its first line is empty; write the key there")
    return key


def _run(engine: Any, name: str, host: str, port: int, api_key: str | None) -> None:
    """uvicorn over the app on a thread of its own, the engine's decode loop in this (the main) thread, until
    SIGTERM or Ctrl-C; the engine stops (and saves) on the way out, also when the port cannot be opened.

    The decode loop keeps the main thread because the linear kernels' OpenMP parallel regions ran 1.5-2x
    slower when launched from any other thread (lookahead/serve/engine.py). On SIGTERM or Ctrl-C uvicorn
    stops taking requests, lets those in flight finish (they still decode here, for up to
    GRACEFUL_SHUTDOWN_S - STREAMS_END_S), then the engine ends those still running, each with its error event
    and [DONE], and stops; a second Ctrl-C does not wait for them."""
    import threading

    import uvicorn

    from lookahead.serve.app import create_app

    app = create_app(engine, name, api_key, stop_engine=True)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="info",
                                           timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S))

    failed: list[Exception] = []  # what stopping the engine raised on the server's thread (a failed save)

    def serve_http() -> None:
        try:
            server.run()  # (off the main thread uvicorn installs no signal handlers: ``shut`` below does)
        finally:
            try:
                engine.stop()  # ends the decode loop, also when the server never started
            except CLI_ERRORS as exc:
                failed.append(exc)

    # requests still running near the grace's end are ended by the engine, each with its error event and (streamed)
    # [DONE], before uvicorn would cut their connections mid-body
    ending = threading.Timer(GRACEFUL_SHUTDOWN_S - STREAMS_END_S, engine.stop)
    ending.daemon = True

    def shut(signum: int, frame: Any) -> None:
        server.force_exit = server.should_exit  # the second signal: no waiting for requests in flight
        server.should_exit = True
        if not ending.is_alive() and not ending.finished.is_set():
            ending.start()

    http = threading.Thread(target=serve_http, name="lookahead-http", daemon=True)
    previous = {sig: signal.signal(sig, shut) for sig in (signal.SIGTERM, signal.SIGINT)}
    where = f"http://{host}:{port}/v1" if port else f"http://{host}:PORT/v1 (the port uvicorn names below)"
    click.echo(f"lookahead: serving {name!r} on {where}: OpenAI-compatible; Ctrl-C stops", err=True)
    try:
        http.start()
        engine.run()  # until the server's shutdown (or a failed start) stops the engine
    finally:
        server.should_exit = True
        http.join()
        ending.cancel()
        if ending.is_alive():
            ending.join()  # the engine it stopped is saving its memory file: let it finish
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        try:
            engine.stop()  # (already stopped by the server's shutdown)
        except CLI_ERRORS as exc:
            failed.append(exc)
    if failed:
        fail(cli_message(failed[0]))
    if not server.started:
        sys.exit(1)  # uvicorn said why (the port is taken, the address does not exist)
