"""`response_format` on the real server (serve/structured.py), talked to with the real openai client and
httpx: json_schema and json_object constrain chat and completions, with speculation, to exactly the
constrained plain answer (model.generate with the same grammar mask), streamed or not; the output is
JSON valid for the schema; every bad format is a 400 naming the field and the fix. tool_choice "required"
or a named function makes the reply calls of the tools in Qwen2.5's <tool_call> format (its own chat
template): exactly one with parallel_tool_calls false, one or more with it true (the grammar tested on
hand-written text; through the server, the calls equal the constrained plain answer's)."""

from __future__ import annotations

import json
import threading
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
from lookahead.serve.structured import CALL_TAGS, call_schema, tool_constraint
from lookahead.serve.toolcalls import parser_for
from lookahead.serve.toolreply import ToolReply, tool_message
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


def test_a_constraint_compiles_off_the_event_loop(served, http, monkeypatch):
    """While a request's grammar compiles (held here on an event), the server still answers: the compile runs
    in a worker thread, not on the loop every stream's chunks go through; the request then answers as usual."""
    expected = constrained_text(served, chat_ids(served), SCHEMA, 80)
    generator = served["generator"]
    compile_grammar = generator.grammar
    compiling, release = threading.Event(), threading.Event()

    def held(response_format, tokenizer=None):
        compiling.set()
        release.wait(WAIT_S)
        return compile_grammar(response_format, tokenizer)

    monkeypatch.setattr(generator, "grammar", held)
    replies = []
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 80, "response_format": JSON_SCHEMA}
    asking = threading.Thread(target=lambda: replies.append(http.post("/v1/chat/completions", json=body)))
    asking.start()
    try:
        assert compiling.wait(WAIT_S), "the request never reached its compile"
        with httpx.Client(base_url=served["url"], timeout=10) as other:
            assert other.get("/health").status_code == 200  # (a loop held by the compile would time this out)
    finally:
        release.set()
        asking.join(WAIT_S)
    assert replies and replies[0].status_code == 200, replies
    assert replies[0].json()["choices"][0]["message"]["content"] == expected


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


def forced_call_text(tooled, tools: list[dict], choice, parallel: bool | None = False, new: int = 120) -> str:
    """The constrained plain answer (model.generate under the call's grammar: one call, or one or more with
    ``parallel``) on the rendered prompt."""
    settings = tool_settings(tools, choice, parallel)
    encoded = tooled["tokenizer"].apply_chat_template(ASK, tools=tools, add_generation_prompt=True, tokenize=True,
                                                      return_dict=True)
    call = TaggedCall(call_schema(settings), *CALL_TAGS, most=None if settings.parallel else 1)
    return constrained_text(tooled, list(encoded["input_ids"]), call, new)


def test_a_named_tool_choice_makes_the_reply_that_call(tooled):
    choice = {"type": "function", "function": {"name": "get_time"}}
    expected = forced_call_text(tooled, [CITY, CLOCK], choice)
    reply = tooled["client"].chat.completions.create(model=MODEL, messages=ASK, tools=[CITY, CLOCK],
                                                     tool_choice=choice, max_tokens=120, parallel_tool_calls=False)
    calls = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls" and len(calls) == 1
    assert calls[0].function.name == "get_time" and json.loads(calls[0].function.arguments)["zone"] in ("UTC", "CET")
    call = json.loads(expected[len("<tool_call>"):-len("</tool_call>")].strip())
    assert json.loads(calls[0].function.arguments) == call["arguments"]  # the constrained plain answer's call


def test_tool_choice_required_makes_the_reply_a_call_streamed_too(tooled):
    expected = json.loads(forced_call_text(tooled, [CITY, CLOCK], "required")[len("<tool_call>"):-len("</tool_call>")])
    stream = tooled["client"].chat.completions.create(model=MODEL, messages=ASK, tools=[CITY, CLOCK],
                                                      tool_choice="required", max_tokens=120, stream=True,
                                                      parallel_tool_calls=False)
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


# ------------------------------------------------------------------ tool_choice "required" with parallel calls

# (the tiny tokenizer writes no space: its calls' JSON is compact; a real one's reads as templates write it)
WEATHER_CALL = '<tool_call>{"name":"get_weather","arguments":{"city":"Rome","days":true}}</tool_call>'
TIME_CALL = '<tool_call>\n{"name":"get_time","arguments":{"zone":"UTC"}}\n</tool_call>'


def accepts(grammar, text: str) -> bool:
    """Whether ``text`` is a whole reply the grammar takes (accepted, and the grammar complete after it)."""
    import xgrammar

    matcher = xgrammar.GrammarMatcher(grammar.compiled)
    return matcher.accept_string(text) and matcher.is_completed()


@pytest.mark.parametrize("text, parallel, named", [  # (whether it takes it: in parallel; in one; named get_time)
    (WEATHER_CALL, True, False),
    (TIME_CALL, True, True),
    (WEATHER_CALL + TIME_CALL, True, False),
    (WEATHER_CALL + "\n" + TIME_CALL, True, False),
    (TIME_CALL + "\n" + TIME_CALL + TIME_CALL, True, True),
    ("", False, False),
    ("Sure." + TIME_CALL, False, False),
    (TIME_CALL + "\nDone.", False, False),
    (TIME_CALL + "\n\n" + TIME_CALL, False, False),
    (TIME_CALL + "\n", False, False),
    ('<tool_call>{"name":"get_time","arguments":{"zone":"PST"}}</tool_call>', False, False),
    ('<tool_call>{"name":"get_time","arguments":{"zone":"UTC"}}', False, False),
])
def test_the_required_grammar_takes_one_call_or_several_as_parallel_tool_calls_says(served, text, parallel, named):
    """parallel_tool_calls true: one or more calls (an optional newline between two); false: exactly one; a
    named function: one or more calls, each to it. Nothing else: no text around the calls, no bad argument."""
    def grammar(choice, allowed):
        return tool_constraint(served["generator"], tool_settings([CITY, CLOCK], choice, allowed))

    single = text.count("<tool_call>") == 1
    assert accepts(grammar("required", None), text) == parallel  # (parallel_tool_calls left out: true)
    assert accepts(grammar("required", True), text) == parallel
    assert accepts(grammar("required", False), text) == (parallel and single)
    named_choice = {"type": "function", "function": {"name": "get_time"}}
    assert accepts(grammar(named_choice, True), text) == named
    assert accepts(grammar(named_choice, False), text) == (named and single)


def test_parallel_calls_the_grammar_takes_are_read_back_each_with_its_id():
    text = WEATHER_CALL + "\n" + TIME_CALL
    factory = parser_for(QWEN)
    assert factory is not None
    names = frozenset({"get_weather", "get_time"})
    message = tool_message(ToolReply(factory(names, None)), text)
    assert message["content"] is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == \
        [("get_weather", {"city": "Rome", "days": True}), ("get_time", {"zone": "UTC"})]
    assert len({c["id"] for c in message["tool_calls"]}) == 2
    one = tool_message(ToolReply(factory(names, 1)), text)  # parallel_tool_calls false: the first call only
    assert [c["function"]["name"] for c in one["tool_calls"]] == ["get_weather"]


SHORT = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
PICK = {"type": "function", "function": {"name": "g", "parameters": {
    "type": "object", "properties": {"x": {"enum": [1, 2]}}, "required": ["x"]}}}
NEW_CALLS = 190  # room for three such calls and the start of a fourth


def reference_calls(text: str) -> tuple[str | None, list[tuple[str, dict]]]:
    """(content, calls as (name, arguments)) of a reply's text, read by the server's own parser."""
    factory = parser_for(QWEN)
    assert factory is not None
    message = tool_message(ToolReply(factory(frozenset({"f", "g"}), None)), text)
    return message["content"], [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                                for c in message.get("tool_calls", [])]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "g"}}])
def test_required_with_parallel_calls_through_the_server_equals_the_constrained_plain_answer(tooled, choice):
    """The tiny random model, constrained to calls, goes on calling until max_tokens (it never picks its EOS
    after a call), so the reply holds several whole calls and the cut start of one more, as content, and
    ends with "length"; it is the constrained plain answer's, whole and streamed, each call with its own id
    and, streamed, its own index."""
    expected_text = forced_call_text(tooled, [SHORT, PICK], choice, parallel=True, new=NEW_CALLS)
    content, calls = reference_calls(expected_text)
    assert len(calls) >= 2, expected_text  # (what this test is for: several calls in one reply)
    if isinstance(choice, dict):
        assert {name for name, _ in calls} == {"g"}
    reply = tooled["client"].chat.completions.create(model=MODEL, messages=ASK, tools=[SHORT, PICK],
                                                     tool_choice=choice, max_tokens=NEW_CALLS)
    message = reply.choices[0].message
    got = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]
    assert got == calls and message.content == content
    assert len({c.id for c in message.tool_calls}) == len(calls)
    cut = len(tooled["tokenizer"](expected_text, add_special_tokens=False)["input_ids"]) == NEW_CALLS
    assert reply.choices[0].finish_reason == ("length" if cut else "tool_calls")
    stream = tooled["client"].chat.completions.create(model=MODEL, messages=ASK, tools=[SHORT, PICK],
                                                      tool_choice=choice, max_tokens=NEW_CALLS, stream=True)
    streamed: dict[int, dict] = {}
    for chunk in stream:
        for delta in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            entry = streamed.setdefault(delta.index, {"id": delta.id, "name": "", "arguments": ""})
            entry["name"] += delta.function.name or ""
            entry["arguments"] += delta.function.arguments or ""
    assert sorted(streamed) == list(range(len(calls)))
    assert [(streamed[i]["name"], json.loads(streamed[i]["arguments"])) for i in range(len(calls))] == calls
    assert len({entry["id"] for entry in streamed.values()}) == len(calls)
    two = tooled["client"].chat.completions.create(model=MODEL, messages=ASK, tools=[SHORT, PICK], n=2,
                                                   tool_choice=choice, max_tokens=NEW_CALLS)  # (greedy: alike)
    assert [c.index for c in two.choices] == [0, 1]
    for each in two.choices:
        assert [(c.function.name, json.loads(c.function.arguments)) for c in each.message.tool_calls] == calls
    assert len({c.id for each in two.choices for c in each.message.tool_calls}) == 2 * len(calls)


def spaced_tokenizer():
    """A character-level tokenizer like the tiny one, with a space (id 3) before '!'."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2}
    vocab.update({chr(32 + i): 3 + i for i in range(94)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<pad>"))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def test_a_forced_call_is_written_as_templates_write_calls_where_the_tokenizer_writes_a_space():
    """(", " and ": ": transformers' tojson, how a template writes the call back into the next request's history)"""
    from lookahead.call.grammar import Grammars

    settings = tool_settings([CLOCK], "required", False)
    call = TaggedCall(call_schema(settings), *CALL_TAGS, most=1)
    spaced = Grammars(spaced_tokenizer(), 97)
    assert spaced.call_separators() == (", ", ": ")
    grammar = spaced.compile(call)
    assert accepts(grammar, '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>')
    assert not accepts(grammar, '<tool_call>\n{"name":"get_time","arguments":{"zone":"UTC"}}\n</tool_call>')
    assert Grammars(tiny_tokenizer(), 96).call_separators() == (",", ":")  # no space to write


def test_a_forced_tag_is_proposed_as_its_added_token_and_spelled_in_characters():
    """(xgrammar's jump-forward tokens take the longest tokens, an added <tool_call> token; a model may write the
    tag in characters, as Qwen2.5-Coder-0.5B does under a forced call, and then the spelled row is the one it
    takes)"""
    import numpy as np

    from lookahead.call.grammar import Grammars
    from lookahead.proposers.grammar import ForcedTokens

    tokenizer = spaced_tokenizer()
    tokenizer.add_tokens(["<tool_call>"])
    tag = tokenizer.convert_tokens_to_ids("<tool_call>")
    grammar = Grammars(tokenizer, tag + 1).compile(TaggedCall(call_schema(tool_settings([CLOCK], "required", False)),
                                                              *CALL_TAGS, most=1))
    assert grammar.spell is not None and grammar.spell("<tool_call>") == [tokenizer.convert_tokens_to_ids(c)
                                                                         for c in "<tool_call>"]
    source = ForcedTokens(grammar, [2], 40)
    prompt = np.array([5, 6], dtype=np.int64)
    source.begin(prompt, 2)
    cands = source.propose(prompt, 2, 4, np.zeros((2, 40)))
    rows = {tokenizer.decode(cands.tokens[g, :cands.lens[g]]) for g in range(cands.count)}
    assert cands.count == 2 and rows == {"<tool_call>"}  # (the same text: one added token, and in characters)
    assert sorted(int(n) for n in cands.lens) == [1, len("<tool_call>")]


def newline_tokenizer():
    """``spaced_tokenizer``'s characters and a newline (id 97), then <tool_call> as an added token (id 98)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2}
    vocab.update({chr(32 + i): 3 + i for i in range(94)})
    vocab["\n"] = 97
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<pad>"))
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    tokenizer.add_tokens(["<tool_call>"])
    return tokenizer


def test_a_forced_tag_is_also_proposed_through_the_newline_templates_write_after_it():
    """(the grammar allows a newline after <tool_call> and forces the call's JSON after it: the spelled tag, the
    newline and that JSON are one row, the text a template writes and a model that follows it takes)"""
    import numpy as np

    from lookahead.call.grammar import Grammars
    from lookahead.proposers.grammar import ForcedTokens

    tokenizer = newline_tokenizer()
    assert tokenizer.convert_tokens_to_ids("<tool_call>") == 98
    grammar = Grammars(tokenizer, 99).compile(TaggedCall(call_schema(tool_settings([CLOCK], "required", False)),
                                                         *CALL_TAGS, most=1))
    source = ForcedTokens(grammar, [2], 64)
    prompt = np.array([5, 6], dtype=np.int64)
    source.begin(prompt, 2)
    cands = source.propose(prompt, 2, 4, np.zeros((2, 64)))
    rows = [tokenizer.decode(cands.tokens[g, :cands.lens[g]]) for g in range(cands.count)]
    assert cands.count == 2 and int(cands.tokens[0, 0]) == 98  # xgrammar's (the added token), and spelled:
    assert rows[1] == '<tool_call>\n{"name": "get_time", "arguments": {"zone": "'  # (through the newline)
    assert all(int(t) < 98 for t in cands.tokens[1, :cands.lens[1]])  # (in characters)
    # the grammar takes every row (the target's mask decides which one it follows)
    import xgrammar

    for g in range(cands.count):
        matcher = xgrammar.GrammarMatcher(grammar.compiled)
        assert all(matcher.accept_token(int(t)) for t in cands.tokens[g, :cands.lens[g]])


def test_longest_rows_leave_out_what_another_row_begins_with():
    from lookahead.proposers.grammar import longest_rows

    assert longest_rows([[1, 2], [], [1, 2, 3], [4], [4]]) == [[1, 2, 3], [4]]
    assert longest_rows([[5], [6, 7]]) == [[5], [6, 7]]
    assert longest_rows([[], []]) == []
