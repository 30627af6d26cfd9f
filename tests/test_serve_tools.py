"""Tool calling in `lookahead serve`: the request's tools checked (each bad one a 400 naming the field),
rendered through the model's own chat template (Qwen2.5's, copied from its tokenizer into
tests/fixtures), tool turns in the history, a template without tool support refused, and the model's
calls read back from its text (Qwen2.5's ``<tool_call>`` JSON), streamed or whole.

The parsers are tested on hand-written model text, fed whole and split at every character boundary.
The server is the real one (uvicorn on a loopback port, the real engine, a tiny random Llama and the
character-level tokenizer) talked to with the real openai client: a random model never calls a tool, so
there the test is that the model saw the tools (the prompt's tokens are the template's rendering with
them) and that its answer is still exactly model.generate's on those tokens."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import openai
import pytest
import torch
from conftest import reference, tiny_model, tiny_tokenizer
from test_serve import ServerThread, error_of

from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.loading.registry import default_cache_dir
from lookahead.serve.app import create_app
from lookahead.serve.engine import Engine, Event, Ticket
from lookahead.serve.schemas import APIError, ChatMessage, chat_messages
from lookahead.serve.text import ReplyText
from lookahead.serve.toolcalls import Call, TaggedJsonCalls, parser_for
from lookahead.serve.toolreply import ToolReply, call_id, tool_message
from lookahead.serve.tools import (
    ToolError,
    ToolSettings,
    read_tools,
    template_source,
    template_takes_tools,
    tool_parser,
    tool_settings,
)

FIXTURES = Path(__file__).parent / "fixtures"
QWEN = (FIXTURES / "qwen2.5_chat_template.jinja").read_text()  # Qwen2.5-Coder-Instruct's own chat template
SMOLLM2 = (FIXTURES / "smollm2_chat_template.jinja").read_text()  # SmolLM2-135M-Instruct's: no tools
MODEL = "tiny-llama"
KEY = "tools-key"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
NAMES = frozenset({"get_weather", "get_time"})


# ------------------------------------------------------------------ the parser, on hand-written model text


def pieces(parser: TaggedJsonCalls, parts: list[str]) -> tuple[str, list[Call]]:
    """(the content joined, the calls in order) of ``parts`` fed one by one, then the end."""
    out = [p for part in parts for p in parser.feed(part)] + parser.finish()
    return "".join(p for p in out if isinstance(p, str)), [p for p in out if isinstance(p, Call)]


CASES = [  # (model text, content, calls as (name, arguments))
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "", [("get_weather", {"city": "Paris"})]),
    ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
     '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
     "Let me look.", [("get_weather", {"city": "Paris"}), ("get_time", {})]),
    ('<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Zürich\\"}"}\n</tool_call>',
     "", [("get_weather", {"city": "Zürich"})]),
    ('<tool_call>\n[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}]\n'
     '</tool_call>', "", [("get_time", {}), ("get_weather", {"city": "Oslo"})]),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n',  # the end came before the close tag
     "", [("get_weather", {"city": "Rome"})]),
    ('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_cal',  # the end cut the close tag
     "", [("get_time", {})]),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Ro', '<tool_call>\n{"name": "get_weather", '
     '"arguments": {"city": "Ro', []),  # cut inside the JSON: content, as written
    ('<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call>',  # no tool of that name: content
     '<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call>', []),
    ('<tool_call>\nnot json\n</tool_call> after', '<tool_call>\nnot json\n</tool_call> after', []),
    ('<tool_call>{"name": "get_time", "arguments": [1]}</tool_call>',
     '<tool_call>{"name": "get_time", "arguments": [1]}</tool_call>', []),
    ('Plain text, < and <tool and <tool_ca spaces  \n\n', 'Plain text, < and <tool and <tool_ca spaces  \n\n', []),
    ('ends with <tool_c', 'ends with <tool_c', []),
    ('  leading and trailing  ', '  leading and trailing  ', []),
    ('<tool_call>{"name": "get_time"}</tool_call>\n\nDone. ', 'Done. ', [("get_time", {})]),
    ('', '', []),
]


@pytest.mark.parametrize("text, content, calls", CASES)
def test_the_qwen_parser_reads_content_and_calls_however_the_text_is_split(text, content, calls):
    expected = (content, [Call(name, json.dumps(args, ensure_ascii=False)) for name, args in calls])
    assert pieces(TaggedJsonCalls(NAMES), [text]) == expected
    assert pieces(TaggedJsonCalls(NAMES), list(text)) == expected  # one character at a time
    for at in range(1, len(text)):  # split in two at every character boundary
        assert pieces(TaggedJsonCalls(NAMES), [text[:at], text[at:]]) == expected, at
    for at in range(1, len(text) - 1, 3):  # and in three
        parts = [text[:at], text[at:at + 2], text[at + 2:]]
        assert pieces(TaggedJsonCalls(NAMES), parts) == expected, at


QWEN_CODER_UNTAGGED = [  # Qwen2.5-Coder-1.5B-Instruct's greedy answers on its own template's tool prompt (no tags)
    ('```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": ["Paris", "Tokyo"]\n  }\n}\n```',
     [("get_weather", {"city": ["Paris", "Tokyo"]})]),
    ('{{"name": "get_weather", "arguments": {"city": "Paris"}}', [("get_weather", {"city": "Paris"})]),
]
WHOLE_CASES = QWEN_CODER_UNTAGGED + [
    ('  [{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}]\n',
     [("get_time", {}), ("get_weather", {"city": "Oslo"})]),
    ('{{"name": "get_time", "arguments": {}}}', [("get_time", {})]),
    ('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', [("get_time", {})]),
    ('{"name": "get_time", "arguments": {}} and then prose', '{"name": "get_time", "arguments": {}} and then prose'),
    ('{"name": "launch", "arguments": {}}', '{"name": "launch", "arguments": {}}'),
    ('```python\nprint(1)\n```', '```python\nprint(1)\n```'),
    ('``', '``'),
    ('[link](x) {"name": "get_time"}', '[link](x) {"name": "get_time"}'),
    ('\n\n', '\n\n'),
]


def whole_pieces(parts: list[str], max_calls: int | None = None) -> tuple[str, list[Call]]:
    factory = parser_for(QWEN)
    assert factory is not None
    parser = factory(NAMES, max_calls)
    out = [p for part in parts for p in parser.feed(part)] + parser.finish()
    return "".join(p for p in out if isinstance(p, str)), [p for p in out if isinstance(p, Call)]


@pytest.mark.parametrize("text, expected", WHOLE_CASES)
def test_a_reply_that_is_only_a_calls_json_is_read_as_the_calls(text, expected):
    """(``expected``: the calls, or the content where the reply is no call.)"""
    if isinstance(expected, str):
        want = (expected, [])
    else:
        want = ("", [Call(name, json.dumps(args, ensure_ascii=False)) for name, args in expected])
    assert whole_pieces([text]) == want
    assert whole_pieces(list(text)) == want
    for at in range(1, len(text)):
        assert whole_pieces([text[:at], text[at:]]) == want, at
    if not isinstance(expected, str) and len(expected) > 1:
        assert whole_pieces([text], max_calls=1) == ("", want[1][:1])


def test_a_reply_that_cannot_be_a_bare_call_streams_at_once():
    factory = parser_for(QWEN)
    assert factory is not None
    parser = factory(NAMES, None)
    assert parser.feed("``") == [] and parser.feed("`py") == ["```py"]
    parser = factory(NAMES, None)
    assert parser.feed("{") == [] and parser.feed('"a": 1} ') == []
    assert "".join(map(str, parser.finish())) == '{"a": 1} '


def test_content_is_held_back_only_while_it_may_start_a_call():
    parser = TaggedJsonCalls(NAMES)
    assert parser.feed("Hello <tool") == ["Hello"]  # (the space may only separate it from a call)
    assert parser.feed("box> x") == [" <toolbox> x"]
    assert parser.feed("<tool_call>{\"name\": \"get_time\"") == []
    assert parser.feed("}</tool_call>") == [Call("get_time", "{}")]


def test_one_call_at_most_without_parallel_calls():
    text = ('<tool_call>{"name": "get_time", "arguments": {}}</tool_call>\n'
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>')
    assert pieces(TaggedJsonCalls(NAMES, max_calls=1), [text]) == ("", [Call("get_time", "{}")])
    with pytest.raises(ValueError, match="max_calls"):
        TaggedJsonCalls(NAMES, max_calls=0)


# ------------------------------------------------------------------ OpenAI's shapes


def test_tool_reply_deltas_message_and_finish_reason():
    ids = iter(["call_a", "call_b"])
    reply = ToolReply(TaggedJsonCalls(NAMES), lambda: next(ids))
    text = CASES[1][0]
    deltas = [d for part in (text[:20], text[20:70], text[70:]) for d in reply.feed(part)] + reply.finish()
    assert deltas == [
        {"content": "Let me look."},
        {"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                         "function": {"name": "get_time", "arguments": "{}"}}]}]
    assert reply.finish_reason("stop") == "tool_calls" and reply.finish_reason("length") == "length"
    message = tool_message(ToolReply(TaggedJsonCalls(NAMES)), CASES[0][0])
    assert message["content"] is None and [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    assert re.fullmatch(r"call_[0-9a-f]{24}", message["tool_calls"][0]["id"])
    plain = ToolReply(TaggedJsonCalls(NAMES))
    assert tool_message(plain, "no call here ") == {"role": "assistant", "content": "no call here "}
    assert plain.finish_reason("stop") == "stop"
    assert call_id() != call_id()


# ------------------------------------------------------------------ the request's fields


@pytest.mark.parametrize("tools, choice, parallel, param, words", [
    ("get_weather", None, None, "tools", "must be a list"),
    ([{"type": "function", "function": {"description": "no name"}}], None, None, "tools[0].function.name",
     "give the function a name"),
    ([{"type": "function", "function": {"name": "has space"}}], None, None, "tools[0].function.name", "1 to 64"),
    ([{"type": "retrieval"}], None, None, "tools[0].type", "\"type\": \"function\""),
    ([{"type": "function"}], None, None, "tools[0].function", "missing"),
    ([WEATHER, WEATHER], None, None, "tools[1].function.name", "its own name"),
    ([{"type": "function", "function": {"name": "f", "parameters": "[]"}}], None, None,
     "tools[0].function.parameters", "JSON schema object"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}], None, None,
     "tools[0].function.parameters.type", "\"type\": \"object\""),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": 3}}}}],
     None, None, "tools[0].function.parameters.properties.a", "JSON schema"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {},
                                                                     "required": ["a"]}}}],
     None, None, "tools[0].function.parameters.required", "does not define"),
    ([WEATHER], {"type": "function", "function": {"name": "get_time"}}, None, "tool_choice.function.name",
     "no tool defines"),
    (None, "required", None, "tool_choice", "no 'tools'"),
    ([WEATHER], "sometimes", None, "tool_choice", "\"auto\""),
    ([WEATHER], None, "yes", "parallel_tool_calls", "true or false"),
    ([{"type": "function", "function": {"name": "f", "strict": True}}], None, None, "tools[0].function.strict",
     "does not constrain decoding"),
])
def test_bad_tool_fields_name_the_field_and_the_fix(tools, choice, parallel, param, words):
    with pytest.raises(ToolError) as caught:
        tool_settings(tools, choice, parallel)
    assert caught.value.param == param and words in caught.value.message, caught.value.message


def test_tool_settings_of_good_fields():
    assert tool_settings(None, None, None) is None and tool_settings([], "auto", None) is None
    assert tool_settings(None, "none", None) is None
    settings = tool_settings([WEATHER, TIME], None, False)
    assert settings == ToolSettings((WEATHER, TIME), "auto", False) and settings.names == NAMES and settings.active
    assert not tool_settings([WEATHER], "none", True).active
    assert tool_settings([WEATHER, TIME], "required", None) == ToolSettings((WEATHER, TIME), "required")
    named = tool_settings([WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}}, None)
    assert named == ToolSettings((WEATHER, TIME), "required", True, "get_time") and named.forced and named.active
    with pytest.raises(ValueError, match="choice"):
        ToolSettings((WEATHER,), "sometimes")
    with pytest.raises(ValueError, match="function"):
        ToolSettings((WEATHER,), "auto", True, "get_weather")


def history(*messages: dict) -> list[ChatMessage]:
    return [ChatMessage.model_validate(m) for m in messages]


CALLED = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}


@pytest.mark.parametrize("messages, param, words", [
    ([{"role": "user", "content": "hi"}, CALLED, {"role": "tool", "content": "sunny"}], "messages[2].tool_call_id",
     "tool_call_id' is missing"),
    ([{"role": "user", "content": "hi"}, {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}],
     "messages[1].role", "answers no call"),
    ([{"role": "user", "content": "hi"}, CALLED, {"role": "tool", "content": "sunny", "tool_call_id": "call_9"}],
     "messages[2].tool_call_id", "call_1"),
    ([{"role": "user", "content": "hi"}, CALLED, {"role": "tool", "content": "a", "tool_call_id": "call_1"},
      {"role": "tool", "content": "b", "tool_call_id": "call_1"}], "messages[3].tool_call_id", "earlier tool message"),
    ([{"role": "user", "content": "hi"}, {**CALLED, "tool_calls": [{"type": "function", "function": {
        "name": "f", "arguments": "{}"}}]}], "messages[1].tool_calls[0].id", "missing"),
    ([{"role": "user", "content": "hi"}, {**CALLED, "tool_calls": [{"id": "c", "function": {
        "name": "f", "arguments": "{city"}}]}], "messages[1].tool_calls[0].function.arguments", "not valid JSON"),
    ([{"role": "user", "content": "hi"}, {**CALLED, "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}],
     "messages[1].tool_calls[0].function.name", "missing"),
    ([{"role": "user", "content": "hi", "tool_calls": CALLED["tool_calls"]}], "messages[0].tool_calls",
     "assistant message"),
])
def test_bad_tool_turns_in_the_history_name_the_message(messages, param, words):
    with pytest.raises(APIError) as caught:
        chat_messages(history(*messages))
    assert caught.value.status == 400 and caught.value.param == param and words in caught.value.message, \
        caught.value.message


def test_tool_turns_become_what_the_template_reads():
    out = chat_messages(history({"role": "user", "content": "hi"}, CALLED,
                                {"role": "tool", "content": [{"type": "text", "text": "sunny"}],
                                 "tool_call_id": "call_1"}))
    assert out[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    assert out[2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1", "name": "get_weather"}


# ------------------------------------------------------------------ the templates


def test_which_templates_take_tools_and_which_calls_are_read_back():
    assert template_takes_tools(QWEN) and parser_for(QWEN) is not None
    assert not template_takes_tools(SMOLLM2) and parser_for(SMOLLM2) is None
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = {"default": SMOLLM2, "tool_use": QWEN}
    assert template_source(tokenizer, True) == QWEN and template_source(tokenizer, False) == SMOLLM2
    tokenizer.chat_template = SMOLLM2
    settings = tool_settings([WEATHER], None, None)
    with pytest.raises(ToolError) as caught:
        tool_parser(tokenizer, settings, [{"role": "user", "content": "hi"}], "smollm2")
    assert caught.value.param == "tools" and caught.value.code == "tools_not_supported"
    assert "without tool support" in caught.value.message
    turns = chat_messages(history({"role": "user", "content": "hi"}, CALLED,
                                  {"role": "tool", "content": "x", "tool_call_id": "call_1"}))
    with pytest.raises(ToolError) as caught:
        tool_parser(tokenizer, None, turns, "smollm2")
    assert caught.value.param == "messages[1]"
    assert tool_parser(tokenizer, tool_settings([WEATHER], "none", None), [{"role": "user", "content": "x"}],
                       "smollm2") is None  # "none": nothing rendered, nothing to parse
    tokenizer.chat_template = None  # no template at all: the chat endpoint's own 400 (no_chat_template)
    assert tool_parser(tokenizer, settings, [{"role": "user", "content": "hi"}], "gemma3-270m") is None


def test_the_qwen_template_renders_the_tools_and_the_tool_turns():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = QWEN
    turns = chat_messages(history({"role": "user", "content": "Paris?"}, CALLED,
                                  {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}))
    text = tokenizer.apply_chat_template(turns, tools=read_tools([WEATHER]), add_generation_prompt=True,
                                         tokenize=False)
    assert "<tools>\n" + json.dumps(WEATHER) + "\n</tools>" in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<tool_response>\nsunny\n</tool_response>" in text and text.endswith("<|im_start|>assistant\n")


def header_tokenizer(alias: str):
    """The tokenizer `lookahead serve` loads for ``alias`` (its GGUF's header directory), if this machine has
    built it (a GGUF loaded once); else the test is skipped."""
    from transformers import AutoTokenizer

    header = default_cache_dir() / "headers" / alias
    if not (header / "tokenizer.json").is_file():
        pytest.skip(f"no header directory for {alias} here (built when its GGUF is first loaded)")
    return AutoTokenizer.from_pretrained(str(header))


def test_qwen_calls_survive_its_own_tokenizer_token_by_token():
    tokenizer = header_tokenizer("qwen2.5-coder-1.5b")
    template = template_source(tokenizer, True)
    assert template is not None and template_takes_tools(template)
    messages = [{"role": "user", "content": "Weather in Paris and the time?"}]
    factory = tool_parser(tokenizer, tool_settings([WEATHER, TIME], None, None), messages, "qwen")
    assert factory is not None
    prompt = tokenizer.apply_chat_template(messages, tools=read_tools([WEATHER, TIME]), add_generation_prompt=True,
                                           tokenize=True, return_dict=True)["input_ids"]
    text = ('I will check. \u00e9t\u00e9\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert tokenizer.convert_tokens_to_ids("<tool_call>") in ids  # the tag is one token, and not a special one
    decoded, reply = ReplyText(tokenizer, prompt), ToolReply(factory(frozenset({"get_weather", "get_time"}), None))
    deltas = [d for token in ids for d in reply.feed(decoded.push([token])[0])]
    deltas += reply.feed(decoded.finish()[0]) + reply.finish()
    assert "".join(d.get("content", "") for d in deltas) == "I will check. \u00e9t\u00e9"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply.calls] == \
        [("get_weather", {"city": "Zürich"}), ("get_time", {})]
    assert reply.finish_reason("stop") == "tool_calls"


def test_smollm2s_template_takes_no_tools():
    tokenizer = header_tokenizer("smollm2-135m")
    with pytest.raises(ToolError) as caught:
        tool_parser(tokenizer, tool_settings([WEATHER], None, None), [{"role": "user", "content": "hi"}], "smollm2")
    assert caught.value.code == "tools_not_supported"


# ------------------------------------------------------------------ the server


@pytest.fixture(scope="module")
def served():
    model = tiny_model("llama")
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = QWEN
    engine = Engine(LookaheadGenerator(model, tokenizer, LookaheadConfig()), max_batch=2, max_queue=4)
    engine.start()
    server = ServerThread(create_app(engine, MODEL, api_key=KEY, stop_engine=True)).start()
    yield {"url": server.url, "model": model, "tokenizer": tokenizer}
    server.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served["url"] + "/v1", api_key=KEY, max_retries=0, timeout=20.0)


@pytest.fixture(scope="module")
def http(served):
    with httpx.Client(base_url=served["url"], headers={"Authorization": f"Bearer {KEY}"}, timeout=20.0) as c:
        yield c


def rendered_ids(served, messages: list[dict], tools: list[dict] | None) -> list[int]:
    encoded = served["tokenizer"].apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                                      tokenize=True, return_dict=True)
    return list(encoded["input_ids"])


def greedy_text(served, ids: list[int], new: int) -> str:
    out = reference(served["model"], torch.tensor([ids]), new)[0, len(ids):].tolist()
    return served["tokenizer"].decode(out, skip_special_tokens=True)


def test_a_request_with_tools_renders_them_and_decodes_exactly(served, client):
    messages = [{"role": "user", "content": "Weather_in_Paris?"}]
    ids = rendered_ids(served, messages, [WEATHER])
    assert len(ids) > len(rendered_ids(served, messages, None))  # the tools are in the prompt
    text = greedy_text(served, ids, 20)
    reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=20)
    assert reply.usage.prompt_tokens == len(ids)  # the prompt the model saw is the template's, with the tools
    assert reply.choices[0].message.content == text and text  # a random model calls nothing: its text, exactly
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].finish_reason in ("stop", "length")
    stream = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=20,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)
    assert chunks[-1].usage.prompt_tokens == len(ids)


def test_logprobs_with_tools_come_once_per_token_streamed_or_not(served, client):
    messages = [{"role": "user", "content": "Weather?"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=12,
                                           logprobs=True)
    assert len(whole.choices[0].logprobs.content) == whole.usage.completion_tokens
    entries, text = [], ""
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=12,
                                                logprobs=True, stream=True):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            entries.extend(choice.logprobs.content if choice.logprobs is not None else [])
    assert text == whole.choices[0].message.content
    expected = whole.choices[0].logprobs.content
    assert [e.token for e in entries] == [e.token for e in expected]
    # (a token's logprob may differ in its last bits between two runs: the steps' row counts differ)
    assert [e.logprob for e in entries] == pytest.approx([e.logprob for e in expected], abs=1e-4)


def test_tool_choice_none_renders_no_tools(served, client):
    messages = [{"role": "user", "content": "Hi!"}]
    ids = rendered_ids(served, messages, None)
    reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], tool_choice="none",
                                           max_tokens=8)
    assert reply.usage.prompt_tokens == len(ids)
    assert reply.choices[0].message.content == greedy_text(served, ids, 8)


def test_a_history_with_tool_turns_is_rendered(served, client):
    messages = [{"role": "user", "content": "Paris?"}, CALLED,
                {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}]
    turns = chat_messages(history(*messages))
    ids = rendered_ids(served, turns, [WEATHER])
    reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=8)
    assert reply.usage.prompt_tokens == len(ids)
    assert reply.choices[0].message.content == greedy_text(served, ids, 8)


def test_bad_tool_requests_are_400s_and_the_server_goes_on(served, client, http):
    base = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for extra, param in [({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
                         ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]},
                          "tools[0].function.parameters"),
                         ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                          "tool_choice.function.name"),
                         ({"tool_choice": "required"}, "tool_choice"),
                         ({"messages": [{"role": "user", "content": "hi"}, CALLED, {"role": "tool", "content": "x"}]},
                          "messages[2].tool_call_id")]:
        error = error_of(http.post("/v1/chat/completions", json={**base, **extra}), 400)
        assert error["param"] == param, error
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=base["messages"], tool_choice="required")
    assert caught.value.body["param"] == "tool_choice"
    assert client.chat.completions.create(model=MODEL, messages=base["messages"], max_tokens=2).choices


def test_a_template_without_tool_support_is_a_400(served, http):
    tokenizer = served["tokenizer"]
    tokenizer.chat_template = SMOLLM2
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER], "max_tokens": 2}
        error = error_of(http.post("/v1/chat/completions", json=body), 400)
        assert error["param"] == "tools" and error["code"] == "tools_not_supported"
        assert f"'{MODEL}' has a chat template without tool support" in error["message"]
        body["messages"] = [{"role": "user", "content": "hi"}, CALLED,
                            {"role": "tool", "content": "x", "tool_call_id": "call_1"}]
        del body["tools"]
        error = error_of(http.post("/v1/chat/completions", json=body), 400)
        assert error["param"] == "messages[1]" and error["code"] == "tools_not_supported"
        body["messages"] = [{"role": "user", "content": "hi"}]
        assert http.post("/v1/chat/completions", json=body).status_code == 200
        tokenizer.chat_template = None  # (a base model's GGUF, Gemma 3 270M's: no chat template at all)
        error = error_of(http.post("/v1/chat/completions", json={**body, "tools": [WEATHER]}), 400)
        assert error["code"] == "no_chat_template"
    finally:
        tokenizer.chat_template = QWEN


class ScriptedEngine(Engine):
    """The real engine, except that every request is answered with ``script``'s tokens (the text a model
    that calls a tool writes) instead of decoding: what the server makes of a model's call, seen through
    HTTP and the openai client (a random model never calls)."""

    script: list[int] = []

    def submit_all(self, completions):  # noqa: ANN001, ANN201 (the engine's own signature)
        tickets = []
        for completion in completions:  # (each of a request's n choices)
            ticket = Ticket("scripted", completion, asyncio.get_running_loop())
            for token in self.script:
                ticket.send(Event([token]))
            ticket.close("stop", len(completion.prompt), len(self.script))
            tickets.append(ticket)
        return tickets


@pytest.fixture(scope="module")
def scripted():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = QWEN
    engine = ScriptedEngine(LookaheadGenerator(tiny_model("llama"), tokenizer, LookaheadConfig()))
    server = ServerThread(create_app(engine, MODEL)).start()  # (no decode thread: submit answers)
    yield engine, openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=20.0)
    server.stop()


def test_a_models_calls_reach_the_openai_client_whole_and_streamed(scripted):
    engine, client = scripted
    # (no spaces: the character-level tokenizer has no token for one)
    text = ('Checking.<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>'
            '<tool_call>{"name":"get_time","arguments":{}}</tool_call>')
    engine.script = engine.tokenizer(text, add_special_tokens=False)["input_ids"] + [engine.tokenizer.eos_token_id]
    messages = [{"role": "user", "content": "Weather?"}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, TIME])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == \
        [("function", "get_weather", {"city": "Paris"}), ("function", "get_time", {})]
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", c.id) for c in choice.message.tool_calls)
    content, calls, reasons = "", {}, []
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, TIME], stream=True):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"id": call.id, "name": "", "arguments": ""})
            entry["name"] += call.function.name or ""
            entry["arguments"] += call.function.arguments or ""
        reasons.append(chunk.choices[0].finish_reason)
    assert content == "Checking." and reasons[-1] == "tool_calls" and set(reasons[:-1]) == {None}
    assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())] == \
        [("get_weather", {"city": "Paris"}), ("get_time", {})]
    one = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, TIME],
                                         parallel_tool_calls=False)
    assert [c.function.name for c in one.choices[0].message.tool_calls] == ["get_weather"]
    two = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, TIME], n=2)
    assert [(c.index, c.finish_reason, [t.function.name for t in c.message.tool_calls]) for c in two.choices] == \
        [(i, "tool_calls", ["get_weather", "get_time"]) for i in range(2)]
    assert len({t.id for c in two.choices for t in c.message.tool_calls}) == 4  # each call its own id
    per_choice: dict[int, list] = {}
    finishes: dict[int, list] = {}
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, TIME], n=2,
                                                stream=True):
        for choice in chunk.choices:
            per_choice.setdefault(choice.index, []).extend((t.index, t.function.name) for t in
                                                           choice.delta.tool_calls or [])
            finishes.setdefault(choice.index, []).extend([choice.finish_reason] if choice.finish_reason else [])
    assert per_choice == {i: [(0, "get_weather"), (1, "get_time")] for i in range(2)}
    assert finishes == {0: ["tool_calls"], 1: ["tool_calls"]}
    plain = client.chat.completions.create(model=MODEL, messages=messages)  # no tools: the text as written
    assert plain.choices[0].message.content == text and plain.choices[0].finish_reason == "stop"
    assert plain.choices[0].message.tool_calls is None
