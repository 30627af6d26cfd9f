"""The OpenAI-compatible HTTP face of the engine (a FastAPI app; ``lookahead serve`` runs it under uvicorn).

    POST /v1/chat/completions   messages rendered through the tokenizer's chat template
    POST /v1/completions        a prompt string, continued
    GET  /v1/models             the one model served (and /v1/models/{id})
    GET  /health                200 while the server answers (no API key needed)
    GET  /metrics               the engine's counters and gauges in Prometheus' text format

Both completion endpoints answer in one JSON body, or streamed as server-sent events in OpenAI's
chunk format (``data: {...}`` ending with ``data: [DONE]``); a request's ``n`` choices (up to the engine's
batch size) are n sequences of the batch, read together (choices.py). Every error is OpenAI's shape,
``{"error": {"message", "type", "param", "code"}}``, naming the field and the fix. A client that
disconnects before its answer is complete cancels its request: it leaves the engine's batch.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import Grammar
from .choices import choice_seed, merged, summed_usage
from .engine import Completion, Engine, QueueFull, Ticket
from .prediction import prediction_ids, prediction_text
from .schemas import (
    UNSUPPORTED_CHAT,
    UNSUPPORTED_COMPLETION,
    APIError,
    ChatRequest,
    Common,
    CompletionRequest,
    bad_request,
    chat_messages,
    check_fields,
    check_sampling,
    choice_count,
    field_path,
    max_tokens,
    parse_body,
    prompt_text,
    stop_strings,
    validated,
)
from .scoring import LogprobShape, TokenScore, reply_shape, scoring_fields, take, token_scores
from .structured import constraint, tool_constraint
from .text import ReplyText
from .toolreply import ToolReply, tool_message
from .tools import ToolError, ToolSettings, tool_parser, tool_settings

MAX_BODY_BYTES = 16 * 1024 * 1024  # a request body past this is refused (413) before it is parsed
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # /v1/completions without max_tokens: OpenAI's default
CHAT_DEFAULT_MAX_TOKENS = 4096  # chat without max_tokens on a model that names no context (else: the context left)
ROUTES = "POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health, GET /metrics"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ToolReplies = Callable[[], ToolReply]  # makes one choice's reader of the model's calls
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

METRIC_HELP = {
    "requests_total": "Requests the engine took.",
    "requests_running": "Sequences decoding in the batch now (a request's n choices are n sequences).",
    "queue_depth": "Requests waiting to join the batch.",
    "batch_size": "Sequences in the batch now.",
    "tokens_generated_total": "Tokens generated.",
    "forwards_total": "Forward passes of the model (decode steps).",
    "sequence_steps_total": "Decode steps counted once per sequence in them (a step of 4 sequences counts 4).",
    "tokens_per_forward": "Tokens each sequence gained per step it was in (1.0 for plain decoding at any batch size).",
    "tokens_per_second": "Tokens generated per second of decode steps.",
    "memory_fill": "Fraction of the memory across requests in use.",
    "prefix_cache_tokens": "Prompt tokens whose prefilled keys and values the prefix cache holds.",
    "prefix_cache_bytes": "Bytes of keys and values the prefix cache holds.",
    "prefix_cache_reused_tokens_total": "Prompt tokens the prefix cache gave back instead of a prefill.",
    "step_seconds_total": "Seconds spent in decode steps (a request's join, its prefill, is not in them).",
    "host_seconds_total": "Seconds of the decode steps' host work: proposing, planning, committing, the cache's "
                          "bookkeeping, learning.",
    "forward_seconds_total": "Seconds of the decode steps' forwards with their read-back of the results.",
    "http_responses_total": "HTTP responses sent, by status code.",
    "client_disconnects_total": "Requests cancelled because their client disconnected before the answer was complete.",
}


@dataclass
class Step:
    """What a reply's events added: text, and on the last one the finish reason (or the error) and usage."""

    text: str
    finish_reason: str | None = None  # "stop" or "length"
    error: APIError | None = None
    logprobs: list[TokenScore] = field(default_factory=list)  # its tokens' logprobs (when the request asks)
    usage: dict[str, Any] | None = None

    @property
    def final(self) -> bool:
        return self.finish_reason is not None or self.error is not None


async def reply_steps(ticket: Ticket, reply: ReplyText) -> AsyncIterator[Step]:
    """The ticket's events as text steps, cut at the first stop string (the engine's tokens include it;
    where the text meets one first, the ticket is cancelled and the reply ends there), ending with
    one final step."""
    cut = False
    held: list[TokenScore] = []  # logprobs of tokens whose text no step has shown yet
    async for event in ticket.events():
        text = ""
        if not cut:
            held.extend(token_scores(event.tokens, event.logprobs))
            text, cut = reply.push(event.tokens)
            if cut:
                ticket.cancel()  # (no-op when the engine has ended the request already)
        if event.finish_reason is None:
            if text:
                yield Step(text, logprobs=take(held))
            continue
        usage: dict[str, Any] = {
            "prompt_tokens": event.prompt_tokens, "completion_tokens": event.completion_tokens,
            "total_tokens": event.prompt_tokens + event.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": event.cached_tokens},
            "completion_tokens_details": {"accepted_prediction_tokens": event.prediction[0],
                                          "rejected_prediction_tokens": event.prediction[1]}}
        if cut or event.finish_reason in ("stop", "length"):
            if not cut:
                rest, cut = reply.finish()
                text += rest
            yield Step(text, "stop" if cut else event.finish_reason, usage=usage, logprobs=take(held))
        elif event.finish_reason == "error":
            why = event.error or "no reason given"
            yield Step(text, error=APIError(500, f"the engine failed on this request: {why}", "server_error", None,
                                            "engine_error"), usage=usage)
        else:  # "cancelled", and not by this reply: the server is stopping
            yield Step(text, error=APIError(503, "the request was cancelled before it finished (the server is "
                                                 "stopping): send it again", "server_error", None, "cancelled"),
                       usage=usage)
        return
    raise RuntimeError("the engine ended a request without its final event")


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event: ``data: {json}`` and a blank line."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


class Guard:
    """One request's answer in progress (its choices' tickets): cancels the tickets still decoding, once, when
    the client leaves before the end, or when one choice failed and the answer ends with its error."""

    def __init__(self, server: Server, tickets: list[Ticket]) -> None:
        self.server, self.tickets = server, tickets
        self.unfinished = set(range(len(tickets)))  # choices whose final step was not read yet
        self.left = False

    def finished(self, index: int) -> None:
        """Choice ``index``'s final step was read: nothing left to cancel for it."""
        self.unfinished.discard(index)

    def client_left(self) -> None:
        """The client disconnected (or its handler was cancelled): the request leaves the engine's batch."""
        if not self.unfinished or self.left:
            return
        self.left = True
        self.server.disconnects += 1
        self.abandon()

    def abandon(self) -> None:
        """The answer ends now (a choice failed): the other choices leave the batch."""
        for index in sorted(self.unfinished):
            self.tickets[index].cancel()
        self.unfinished.clear()


@dataclass
class Choice:
    """One of a request's ``n`` choices: its index, its ticket, its visible text, its calls read back."""

    index: int
    ticket: Ticket
    reply: ReplyText
    tools: ToolReply | None = None


@dataclass
class Server:
    """What the endpoints share: the engine, the served model's name, the API key, the HTTP counters."""

    engine: Engine
    model_name: str
    api_key: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    statuses: Counter[int] = field(default_factory=Counter)
    disconnects: int = 0

    # ------------------------------------------------------------------ checks
    def authorize(self, request: Request) -> None:
        """APIError 401 unless the request carries the API key (when one is set) as ``Authorization: Bearer``."""
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise APIError(401, "no API key: send the header 'Authorization: Bearer YOUR_KEY' (the key the server "
                                "was started with, --api-key)", "invalid_request_error", None, "invalid_api_key",
                           {"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise APIError(401, "wrong API key: send the key the server was started with (--api-key) as "
                                "'Authorization: Bearer YOUR_KEY'", "invalid_request_error", None, "invalid_api_key",
                           {"WWW-Authenticate": "Bearer"})

    def check_model(self, model: str | None) -> None:
        """APIError 404 for a model other than the one served (None: the one served)."""
        if model is not None and model != self.model_name:
            raise APIError(404, f"the model '{model}' does not exist here: this server serves '{self.model_name}' "
                                f"(GET /v1/models)", "invalid_request_error", "model", "model_not_found")

    def tokenizer(self) -> Any:
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise APIError(500, "the served generator has no tokenizer: start the server with one", "server_error",
                           None, "no_tokenizer")
        return tokenizer

    def render_chat(self, messages: list[dict[str, Any]], tools: ToolSettings | None = None) -> list[int]:
        """The messages' token ids through the tokenizer's chat template, with the assistant's turn opened (and
        the tools, where ``tools`` asks for them: tool_choice "auto")."""
        tokenizer = self.tokenizer()
        if not getattr(tokenizer, "chat_template", None):
            raise bad_request(f"the model '{self.model_name}' has no chat template: send the text to "
                              f"POST /v1/completions as a prompt", "messages", "no_chat_template")
        rendered = list(tools.tools) if tools is not None and tools.active else None
        try:
            encoded = tokenizer.apply_chat_template(messages, tools=rendered, add_generation_prompt=True,
                                                    tokenize=True, return_dict=True)
        except Exception as exc:  # the template refused the conversation (roles, order): the client can fix it
            raise bad_request(f"the model's chat template refused these messages: {_one_line(exc)}", "messages",
                              "invalid_messages") from None
        return _ids(encoded["input_ids"])

    def tool_reply(self, body: ChatRequest, messages: list[dict[str, Any]]) -> tuple[ToolSettings | None,
                                                                                      ToolReplies | None]:
        """The request's tool settings and what makes each choice's reader of the model's calls (None, None: no
        tools); APIError 400 naming the tool field or message the server cannot take (tools.py)."""
        try:
            settings = tool_settings(body.tools, body.tool_choice, body.parallel_tool_calls)
            factory = tool_parser(self.tokenizer(), settings, messages, self.model_name)
        except ToolError as exc:
            raise bad_request(exc.message, exc.param, exc.code) from None
        if factory is None or settings is None:
            return settings, None
        names, most = settings.names, None if settings.parallel else 1
        return settings, lambda: ToolReply(factory(names, most))

    def encode(self, prompt: str) -> list[int]:
        """A completion prompt's token ids (with the special tokens the tokenizer adds, as a pipeline does)."""
        return _ids(self.tokenizer()(prompt)["input_ids"])

    def budget(self, prompt: list[int], requested: int | None, name: str, prompt_field: str, default: int) -> int:
        """max_tokens for the engine: ``requested``, or ``default`` cut to the context left; APIError 400 when the
        prompt, or the prompt and the requested tokens, do not fit the model's context."""
        context, n = self.engine.context_length, len(prompt)
        if n == 0:
            raise bad_request(f"'{prompt_field}' makes no tokens: send some text", prompt_field, "invalid_value")
        if context is not None and n >= context:
            raise bad_request(f"the prompt is {n} tokens and the model's context is {context} tokens, with no room "
                              f"for a reply: shorten it to at most {context - 1} tokens", prompt_field,
                              "context_length_exceeded")
        if requested is None:
            return default if context is None else min(default, context - n)
        if context is not None and n + requested > context:
            raise bad_request(f"the prompt ({n} tokens) and '{name}' ({requested}) come to {n + requested} tokens, "
                              f"past the model's context of {context}: set '{name}' to at most {context - n} "
                              f"or shorten the prompt", name, "context_length_exceeded")
        return requested

    # ------------------------------------------------------------------ answering
    async def answer(self, request: Request, body: Common, prompt: list[int], kind: str,
                     tools: ToolReplies | None = None, call: Grammar | None = None) -> Response:
        """Submit the request's ``n`` choices and answer them, streamed or in one body (``tools``: makes each
        choice's reader of the model's calls; ``call``: the mask making the reply tool calls, tool_choice
        "required" or named)."""
        requested, name = max_tokens(body)
        stops = stop_strings(body.stop)
        check_sampling(body)
        count = choice_count(body.n, self.engine.max_batch)
        chat = kind == "chat"
        scoring = scoring_fields(body, self.engine.generator.vocab)
        if body.stream_options is not None and not body.stream:
            raise bad_request("'stream_options' is only allowed with \"stream\": true", "stream_options",
                              "invalid_value")
        default = (self.engine.context_length or CHAT_DEFAULT_MAX_TOKENS) if chat else COMPLETIONS_DEFAULT_MAX_TOKENS
        limit = self.budget(prompt, requested, name, "messages" if chat else "prompt", default)
        predicted = prediction_text(body.prediction)
        prediction = () if predicted is None else prediction_ids(self.tokenizer(), predicted, len(prompt),
                                                                   self.engine.context_length)
        constrained = await off_loop(constraint, self.engine.generator, body.response_format)  # (None: free text)
        if call is not None and constrained is not None:
            raise bad_request("'response_format' asks for JSON but 'tool_choice' asks for a tool call: send one of "
                              "them (\"tool_choice\": \"auto\" with a response_format)", "response_format",
                              "invalid_value")
        constrained = call if call is not None else constrained
        completion = Completion(prompt=prompt, max_tokens=limit, temperature=body.temperature, top_p=body.top_p,
                                seed=body.seed, stop=stops, prediction=prediction, constraint=constrained)
        completion = replace(completion, scoring=scoring)
        tickets = self.submit([replace(completion, seed=choice_seed(body.seed, i)) for i in range(count)])
        choices = [Choice(i, ticket, ReplyText(self.tokenizer(), prompt, stops), tools() if tools else None)
                   for i, ticket in enumerate(tickets)]
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(self.stream(request, choices, chat, usage, rid),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await self.whole(request, choices, chat, rid)

    def submit(self, completions: list[Completion]) -> list[Ticket]:
        """The engine's tickets, one per choice, all or none; APIError 429 (queue full, with Retry-After), 400
        (refused), 503 (not running)."""
        try:
            return self.engine.submit_all(completions)
        except QueueFull as exc:
            wait = max(1, math.ceil(exc.retry_after))
            raise APIError(429, f"the server's queue is full: retry after {wait} s", "requests", None,
                           "rate_limit_exceeded", {"Retry-After": str(wait)}) from None
        except ValueError as exc:
            raise bad_request(f"the engine refused the request: {_one_line(exc)}") from None
        except RuntimeError as exc:
            raise APIError(503, f"the engine is not running ({_one_line(exc)}): retry later", "server_error", None,
                           "engine_stopped") from None

    async def watch(self, request: Request, guard: Guard) -> None:
        """Cancel the request when its client disconnects before the answer is complete."""
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                guard.client_left()
                return

    async def whole(self, request: Request, choices: list[Choice], chat: bool, rid: str) -> Response:
        """The answer in one JSON body, its choices in index order (or the error the engine gave one)."""
        guard = Guard(self, [c.ticket for c in choices])
        watcher = asyncio.create_task(self.watch(request, guard))
        texts: list[list[str]] = [[] for _ in choices]
        scores: list[list[TokenScore]] = [[] for _ in choices]
        done: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}  # index -> (choice, usage)
        shape = reply_shape(self.tokenizer(), choices[0].ticket.completion.scoring, chat)
        try:
            async with aclosing(merged([reply_steps(c.ticket, c.reply) for c in choices])) as steps:
                async for index, step in steps:
                    texts[index].append(step.text)
                    scores[index].extend(step.logprobs)
                    if step.error is not None:
                        guard.finished(index)
                        guard.abandon()
                        raise step.error
                    if step.final:
                        guard.finished(index)
                        body = whole_choice(choices[index], "".join(texts[index]), scores[index], step, shape, chat)
                        done[index] = body, step.usage or {}
            if len(done) != len(choices):
                raise RuntimeError("the reply ended without its final step")
            return JSONResponse({"id": rid, "object": "chat.completion" if chat else "text_completion",
                                 "created": int(time.time()), "model": self.model_name, "system_fingerprint": None,
                                 "choices": [done[i][0] for i in range(len(choices))],
                                 "usage": summed_usage([done[i][1] for i in range(len(choices))])})
        finally:
            watcher.cancel()
            guard.client_left()  # (nothing once the reply is complete; a cancelled handler leaves no request behind)

    async def stream(self, request: Request, choices: list[Choice], chat: bool, include_usage: bool,
                     rid: str) -> AsyncIterator[bytes]:
        """The answer as server-sent events in OpenAI's chunk format, ending with ``data: [DONE]``: each chunk
        holds one choice, its ``index`` saying which (OpenAI's format for n > 1); each choice ends with its
        own finish_reason; the usage chunk (when asked for) comes after the last choice has ended."""
        guard = Guard(self, [c.ticket for c in choices])
        watcher = asyncio.create_task(self.watch(request, guard))
        created = int(time.time())
        base = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
                "model": self.model_name, "system_fingerprint": None}
        if include_usage:
            base["usage"] = None
        shape = reply_shape(self.tokenizer(), choices[0].ticket.completion.scoring, chat)
        pending: list[list[TokenScore]] = [[] for _ in choices]  # each choice's logprobs for its next chunk

        def chunk(index: int, text: str | None, finish_reason: str | None = None, role: bool = False) -> bytes:
            scored = shape.field(take(pending[index])) if shape is not None and pending[index] else None
            choice: dict[str, Any] = {"index": index, "logprobs": scored, "finish_reason": finish_reason}
            if chat:
                delta: dict[str, Any] = {"role": "assistant"} if role else {}
                if text is not None:
                    delta["content"] = text
                choice["delta"] = delta
            else:
                choice["text"] = text or ""
            return sse({**base, "choices": [choice]})

        def delta_chunk(index: int, delta: dict[str, Any]) -> bytes:  # (tool reply content with its logprobs; a call)
            held = pending[index]
            scored = shape.field(take(held)) if shape is not None and held and "content" in delta else None
            return sse({**base, "choices": [{"index": index, "logprobs": scored, "finish_reason": None,
                                             "delta": delta}]})

        try:
            if chat:
                for c in choices:
                    yield chunk(c.index, "", role=True)
            usages: dict[int, dict[str, Any]] = {}
            async with aclosing(merged([reply_steps(c.ticket, c.reply) for c in choices])) as steps:
                async for index, step in steps:
                    tools = choices[index].tools
                    pending[index].extend(step.logprobs)
                    if step.text and tools is not None:
                        for delta in tools.feed(step.text):
                            yield delta_chunk(index, delta)
                    elif step.text:
                        yield chunk(index, step.text)
                    if step.error is not None:
                        guard.finished(index)
                        guard.abandon()
                        yield sse(step.error.body())
                        break
                    if step.final:
                        guard.finished(index)
                        for delta in tools.finish() if tools is not None else []:
                            yield delta_chunk(index, delta)
                        reason = step.finish_reason or "stop"
                        yield chunk(index, None, tools.finish_reason(reason) if tools is not None
                                    else step.finish_reason)
                        usages[index] = step.usage or {}
            if include_usage and len(usages) == len(choices):
                yield sse({**base, "choices": [], "usage": summed_usage([usages[i] for i in range(len(choices))])})
            yield sse("[DONE]")
        finally:
            watcher.cancel()
            guard.client_left()  # (nothing once the reply is complete: the stream was closed early otherwise)

    # ------------------------------------------------------------------ reports
    def metrics_text(self) -> str:
        """The engine's metrics and the HTTP counters in Prometheus' text format (lookahead_ names)."""
        lines: list[str] = []
        described: set[str] = set()

        def metric(name: str, value: float, labels: dict[str, str] | None = None) -> None:
            full = f"lookahead_{_metric_name(name)}"
            if full not in described:
                described.add(full)
                lines.append(f"# HELP {full} {METRIC_HELP.get(name, name.replace('_', ' ') + '.')}")
                lines.append(f"# TYPE {full} {'counter' if name.endswith('_total') else 'gauge'}")
            label = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
            lines.append(f"{full}{label} {_number(value)}")

        for name, value in self.engine.metrics().items():
            metric(name, float(value))
        metric("client_disconnects_total", self.disconnects)
        for status, count in sorted(self.statuses.items()):
            metric("http_responses_total", count, {"status": str(status)})
        return "\n".join(lines) + "\n"


def whole_choice(choice: Choice, text: str, scores: list[TokenScore], step: Step, shape: LogprobShape | None,
                 chat: bool) -> dict[str, Any]:
    """One choice of a whole (not streamed) answer: its message (or text), logprobs and finish reason."""
    body: dict[str, Any] = {"index": choice.index, "logprobs": shape.field(scores) if shape else None,
                            "finish_reason": step.finish_reason}
    if chat and choice.tools is not None:
        body["message"] = tool_message(choice.tools, text)
        body["finish_reason"] = choice.tools.finish_reason(step.finish_reason or "stop")
    elif chat:
        body["message"] = {"role": "assistant", "content": text}
    else:
        body["text"] = text
    return body


async def off_loop(compile_constraint: Callable[[Any, Any], Grammar | None], generator: Any,
                   value: Any) -> Grammar | None:
    """A request's constraint compiled in a worker thread (None: nothing to constrain, answered at once): the
    grammar engine's compile of a large schema, and its first compile (the vocabulary's token table), would
    otherwise hold the event loop, and every stream's next chunk with it. Its APIError reaches the caller."""
    if value is None:
        return None
    return await asyncio.to_thread(compile_constraint, generator, value)


def _metric_name(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value == int(value) and abs(value) < 2 ** 53 else repr(value)


def _ids(value: Any) -> list[int]:
    """Token ids as a flat list of ints (a tokenizer may hand back a nested list or a tensor)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if value and isinstance(value[0], list):
        value = value[0]
    return [int(t) for t in value]


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


async def read_body(request: Request) -> bytes:
    """The request body; APIError 413 past MAX_BODY_BYTES (read no further)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise _too_large()
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _too_large()
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large() -> APIError:
    return APIError(413, f"the request body is larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB: send a shorter "
                         f"prompt", "invalid_request_error", None, "request_too_large")


class CountStatuses:
    """ASGI middleware: counts the status of every HTTP response (for /metrics)."""

    def __init__(self, app: ASGIApp, server: Server) -> None:
        self.app, self.server = app, server

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.server.statuses[int(message["status"])] += 1
            await send(message)

        await self.app(scope, receive, counted)


def create_app(engine: Engine, model_name: str, api_key: str | None = None, stop_engine: bool = False) -> FastAPI:
    """The FastAPI app answering for ``engine`` under the name ``model_name`` (what clients send as
    ``model``). ``api_key``: required as ``Authorization: Bearer`` on /v1/* and /metrics. The engine is
    started by the caller; with ``stop_engine`` the app stops it when the server shuts down (which
    saves its memory file)."""
    if api_key is not None and not api_key:
        raise ValueError("api_key is empty: pass a key, or None for no key")
    server = Server(engine, model_name, api_key)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        if stop_engine:
            await asyncio.to_thread(engine.stop)

    app = FastAPI(title="lookahead", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    app.add_middleware(CountStatuses, server=server)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}: this server answers {ROUTES}"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}: this server answers {ROUTES}"
        else:
            message = str(exc.detail)
        error = APIError(exc.status_code, message, "invalid_request_error", None,
                         "not_found" if exc.status_code == 404 else None, dict(exc.headers or {}))
        return JSONResponse(error.body(), status_code=exc.status_code, headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = field_path([p for p in first.get("loc", ()) if p != "body"])
        error = bad_request(f"invalid value for '{param}': {first.get('msg')}", param or None, "invalid_value")
        return JSONResponse(error.body(), status_code=400)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        error = APIError(500, f"internal server error: {type(exc).__name__}: {_one_line(exc)}", "server_error")
        return JSONResponse(error.body(), status_code=500)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        server.authorize(request)
        body = validated(ChatRequest, parse_body(await read_body(request)))
        server.check_model(body.model)
        check_fields(body, UNSUPPORTED_CHAT)
        messages = chat_messages(body.messages)
        settings, tools = server.tool_reply(body, messages)
        prompt = server.render_chat(messages, settings)
        call = await off_loop(tool_constraint, server.engine.generator, settings)  # (None: no call forced)
        return await server.answer(request, body, prompt, "chat", tools, call)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        server.authorize(request)
        body = validated(CompletionRequest, parse_body(await read_body(request)))
        server.check_model(body.model)
        check_fields(body, UNSUPPORTED_COMPLETION)
        prompt = server.encode(prompt_text(body.prompt))
        return await server.answer(request, body, prompt, "completion")

    def model_card() -> dict[str, Any]:
        return {"id": server.model_name, "object": "model", "created": server.created, "owned_by": "lookahead"}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        server.authorize(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str) -> dict[str, Any]:
        server.authorize(request)
        server.check_model(model_id)
        return model_card()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "model": server.model_name}

    @app.get("/metrics")
    async def metrics(request: Request) -> PlainTextResponse:
        server.authorize(request)
        return PlainTextResponse(server.metrics_text(), media_type="text/plain; version=0.0.4")

    return app
