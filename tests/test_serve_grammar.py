"""`response_format` on the real server (serve/structured.py), talked to with the real openai client and
httpx: json_schema and json_object constrain chat and completions, with speculation, to exactly the
constrained plain answer (model.generate with the same grammar mask), streamed or not; the output is
JSON valid for the schema; every bad format is a 400 naming the field and the fix. tool_choice "required"
or a named function makes the reply one call of a tool in Qwen2.5's <tool_call> format (its own chat
template), equal to the constrained plain answer's call."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
import torch
from transformers.generation import LogitsProcessorList

from conftest import tiny_model, tiny_tokenizer
from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.call.grammar import TaggedCall
from lookahead.serve.app import create_app
from lookahead.serve.engine import Engine
from lookahead.serve.structured import CALL_TAGS, call_schema
from lookahead.serve.tools import tool_settings
from lookahead.verify.grammar import GrammarMask
from test_serve import KEY, MODEL, TEMPLATE, WAIT_S, ServerThread, error_of

pytest.importorskip("xgrammar")

EOS = 2  # the tiny model's generation_config eos (the tiny tokenizer's </s>)
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "kind", "tags"],
          "properties": {"ok": {"type": "boolean"}, "kind": {"enum": ["red", "blue", "green"]},
                         "tags": {"type": "array", "items": {"enum": ["x", "yy"]}, "maxItems": 3}}}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
MESSAGES = [{"role": "user", "content": 'Answer_in_JSON:{"ok":true,"kind":"blue","tags":["x"]}'}]


def serving(template: str):
    """A tiny model served on a loopback port with ``template`` as its chat template, until the module ends:
    yields its url, model, tokenizer, generator and an openai client."""
    model = tiny_model("llama")
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = template
    generator = LookaheadGenerator(model, tokenizer, LookaheadConfig())
    engine = Engine(generator, max_batch=2, max_queue=4)
    engine.start()
    server = ServerThread(create_app(engine, MODEL, api_key=KEY, stop_engine=True)).start()
    yield {"url": server.url, "model": model, "tokenizer": tokenizer, "generator": generator,
           "client": openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=WAIT_S)}
    server.stop()


@pytest.fixture(scope="module")
def served():
    yield from serving(TEMPLATE)


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served["url"] + "/v1", api_key=KEY, max_retries=0, timeout=WAIT_S)


@pytest.fixture(scope="module")
def http(served):
    with httpx.Client(base_url=served["url"], headers={"Authorization": f"Bearer {KEY}"}, timeout=WAIT_S) as c:
        yield c


def constrained_text(served, ids: list[int], response_format, new: int) -> str:
    """model.generate's greedy answer on ``ids`` under the grammar's mask (the constrained plain loop)."""
    grammar = served["generator"].grammar(response_format)
    mask = GrammarMask(grammar, [EOS], len(ids))
    prompt = torch.tensor([ids])
    with torch.inference_mode():
        out = served["model"].generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                                       do_sample=False, eos_token_id=EOS, logits_processor=LogitsProcessorList([mask]))
    return served["tokenizer"].decode(out[0, len(ids):].tolist(), skip_special_tokens=True)


def chat_ids(served) -> list[int]:
    encoded = served["tokenizer"].apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                                      return_dict=True)
    return list(encoded["input_ids"])


def test_chat_json_schema_equals_the_constrained_plain_answer(served, client):
    expected = constrained_text(served, chat_ids(served), SCHEMA, 80)
    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=80,
                                           response_format=JSON_SCHEMA)
    content = reply.choices[0].message.content
    assert content == expected and reply.choices[0].finish_reason == "stop"
    value = json.loads(content)
    assert set(value) == {"ok", "kind", "tags"} and value["kind"] in ("red", "blue", "green")


def test_chat_json_schema_streamed_is_the_same_text(served, client):
    expected = constrained_text(served, chat_ids(served), SCHEMA, 80)
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=80, stream=True,
                                            response_format=JSON_SCHEMA)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == expected


def test_completions_json_object_starts_an_object_and_equals_the_plain_answer(served, http):
    prompt = "Say:"
    ids = list(served["tokenizer"](prompt)["input_ids"])
    expected = constrained_text(served, ids, "json_object", 24)
    free = http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 24})
    response = http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 24,
                                                  "response_format": {"type": "json_object"}})
    assert response.status_code == 200, response.text
    text = response.json()["choices"][0]["text"]
    assert text == expected and text.startswith("{")
    assert not free.json()["choices"][0]["text"].startswith("{"), "the model writes '{' anyway: vacuous"


def test_response_format_text_is_free_text(served, client):
    free = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12)
    text = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12,
                                          response_format={"type": "text"})
    assert text.choices[0].message.content == free.choices[0].message.content


@pytest.mark.parametrize("response_format, param, words", [
    ({"type": "yaml"}, "response_format.type", "json_schema"),
    ("json", "response_format.type", "json_object"),
    ({"type": "json_schema"}, "response_format.json_schema", "send the JSON schema"),
    ({"type": "json_schema", "json_schema": {"name": "a"}}, "response_format.json_schema.schema", "missing"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "objec"}}},
     "response_format.json_schema.schema", "no JSON schema type"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object", "properties": {
        "p": {"type": "strin"}}}}}, "response_format.json_schema.schema.properties.p", "no JSON schema type"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "string", "pattern": "(("}}},
     "response_format.json_schema.schema", "grammar engine rejects"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": {"$ref": "#/$defs/missing"}}},
     "response_format.json_schema.schema", "grammar engine rejects"),
    ({"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": "yes"}},
     "response_format.json_schema.strict", "true or false"),
])
def test_bad_response_formats_are_400s_naming_the_field(http, response_format, param, words):
    for path, body in (("/v1/chat/completions", {"messages": MESSAGES}), ("/v1/completions", {"prompt": "Say:"})):
        response = http.post(path, json={"model": MODEL, "max_tokens": 4, "response_format": response_format, **body})
        error = error_of(response, 400)
        assert error["param"] == param and words in error["message"], error
        assert "/project/" not in error["message"]  # the engine's source location is not the client's business


# ------------------------------------------------------------------ tool_choice "required" / named

QWEN = (Path(__file__).parent / "fixtures" / "qwen2.5_chat_template.jinja").read_text()
CITY = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "boolean"}},
    "required": ["city", "days"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}}
ASK = [{"role": "user", "content": "Weather?"}]


@pytest.fixture(scope="module")
def tooled():
    yield from serving(QWEN)


def forced_call_text(tooled, tools: list[dict], choice) -> str:
    """The constrained plain answer (model.generate under the call's grammar) on the rendered prompt."""
    settings = tool_settings(tools, choice, None)
    encoded = tooled["tokenizer"].apply_chat_template(ASK, tools=tools, add_generation_prompt=True, tokenize=True,
                                                      return_dict=True)
    return constrained_text(tooled, list(encoded["input_ids"]), TaggedCall(call_schema(settings), *CALL_TAGS), 120)


def test_a_named_tool_choice_makes_the_reply_that_call(tooled):
    choice = {"type": "function", "function": {"name": "get_time"}}
    expected = forced_call_text(tooled, [CITY, CLOCK], choice)
    reply = tooled["client"].chat.completions.create(model=MODEL, messages=ASK, tools=[CITY, CLOCK],
                                                     tool_choice=choice, max_tokens=120)
    calls = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls" and len(calls) == 1
    assert calls[0].function.name == "get_time" and json.loads(calls[0].function.arguments)["zone"] in ("UTC", "CET")
    call = json.loads(expected[len("<tool_call>"):-len("</tool_call>")].strip())
    assert json.loads(calls[0].function.arguments) == call["arguments"]  # the constrained plain answer's call


def test_tool_choice_required_makes_the_reply_a_call_streamed_too(tooled):
    expected = json.loads(forced_call_text(tooled, [CITY, CLOCK], "required")[len("<tool_call>"):-len("</tool_call>")])
    stream = tooled["client"].chat.completions.create(model=MODEL, messages=ASK, tools=[CITY, CLOCK],
                                                      tool_choice="required", max_tokens=120, stream=True)
    names, arguments, finish = [], "", None
    for chunk in stream:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                names += [delta.function.name] if delta.function.name else []
                arguments += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls" and names == [expected["name"]]
    assert json.loads(arguments) == expected["arguments"]


def test_a_tool_call_and_a_response_format_together_are_a_400(tooled):
    with pytest.raises(openai.BadRequestError) as caught:
        tooled["client"].chat.completions.create(model=MODEL, messages=ASK, tools=[CITY], tool_choice="required",
                                                 response_format={"type": "json_object"}, max_tokens=4)
    assert caught.value.body["param"] == "response_format"
