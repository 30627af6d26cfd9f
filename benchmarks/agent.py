"""The ``agent`` workload of ``lookahead bench-serve``: multi-turn tool-call conversations over a small fixed
set of fake tools whose results come from a deterministic fake world (the same call gives the same result,
in every conversation and against every server), so the same calls and results recur across conversations.

    tool           parameters (JSON schema)                 result (JSON text)
    get_weather    city: one of CITIES                       the city's temperature, conditions, wind
    search_files   pattern: one of PATTERNS (a glob)         the fake repository's paths matching it
    read_file      path: one of the repository's paths       the file's text
    run_tests      module: one of the test modules           passed / failed counts and the failures

The fake world is a tiny Python project (``tinycache``: an LRU cache with a parser and a CLI, FILES) and a
weather table (WEATHER). Every parameter is an enum, so a call constrained to its schema (tool_choice
"required") names a thing the world holds, and the same few calls come back in many conversations. A call
the world cannot answer (an unknown tool, arguments that are no JSON object or miss a parameter, a value
outside the enum: possible on an unconstrained "auto" turn) gets ``{"error": ...}``, deterministically too.

TASKS is the fixed list of user tasks; ``agent_requests`` makes the first ``limit`` of them into the
entries bench-serve replays, each with the plan its conversation follows (``AgentPlan``: MAX_TURNS
requests at most, tool_choice per turn TURN_CHOICES; benchmarks/conversation.py drives it).
"""

from __future__ import annotations

import fnmatch
import json
from typing import Any

from lookahead.benchmarks.conversation import AgentPlan

MAX_TURNS = 4  # requests per conversation at most
# tool_choice per turn: the first turn must call a tool (the call constrained to the tools' JSON schemas);
# later turns may call again or answer (an answer ends the conversation); the last turn's calls are not run.
TURN_CHOICES: tuple[str, ...] = ("required", "auto", "auto", "auto")

SYSTEM_PROMPT = ("You are an assistant with tools for a small Python project (tinycache) and for the weather. "
                 "Call a tool whenever you need a fact; once you have the facts, answer briefly.")

CITIES: tuple[str, ...] = ("Paris", "London", "Tokyo", "Sydney", "Cairo", "Oslo")
WEATHER: dict[str, dict[str, Any]] = {
    "Paris": {"temperature_c": 14, "conditions": "light rain", "wind_kmh": 18},
    "London": {"temperature_c": 11, "conditions": "rain", "wind_kmh": 24},
    "Tokyo": {"temperature_c": 21, "conditions": "clear", "wind_kmh": 9},
    "Sydney": {"temperature_c": 25, "conditions": "sunny", "wind_kmh": 15},
    "Cairo": {"temperature_c": 31, "conditions": "dry and sunny", "wind_kmh": 12},
    "Oslo": {"temperature_c": 3, "conditions": "snow", "wind_kmh": 20},
}
FILES: dict[str, str] = {
    "README.md": "# tinycache\n\nA small LRU cache for Python with a command line.\n\nRun the tests with pytest.\n",
    "pyproject.toml": "[project]\nname = \"tinycache\"\nversion = \"0.3.0\"\ndependencies = []\n",
    "tinycache/__init__.py": "from .cache import LRUCache\n\n__all__ = [\"LRUCache\"]\n",
    "tinycache/cache.py": (
        "from collections import OrderedDict\n\n\nclass LRUCache:\n    def __init__(self, capacity):\n"
        "        self.capacity = capacity\n        self.items = OrderedDict()\n\n    def get(self, key):\n"
        "        if key not in self.items:\n            return None\n        self.items.move_to_end(key)\n"
        "        return self.items[key]\n\n    def put(self, key, value):\n        self.items[key] = value\n"
        "        if len(self.items) > self.capacity:\n            self.items.popitem(last=True)\n"),
    "tinycache/parser.py": (
        "def parse_size(text):\n    \"\"\"'10' -> 10, '2k' -> 2000.\"\"\"\n    text = text.strip().lower()\n"
        "    if text.endswith(\"k\"):\n        return int(text[:-1]) * 1000\n    return int(text)\n"),
    "tinycache/cli.py": (
        "import sys\n\nfrom .config import load_config\nfrom .parser import parse_size\n\n\ndef main(argv):\n"
        "    config = load_config()\n    size = parse_size(argv[1]) if len(argv) > 1 else config[\"size\"]\n"
        "    print(f\"cache size {size}\")\n    return 0\n"),
    "tinycache/config.py": (
        "import json\nimport os\n\n\ndef load_config(path=\"tinycache.json\"):\n"
        "    if not os.path.exists(path):\n        return {\"size\": 128}\n    with open(path) as f:\n"
        "        return json.load(f)\n"),
    "tests/test_cache.py": (
        "from tinycache import LRUCache\n\n\ndef test_get_missing():\n    assert LRUCache(2).get(\"a\") is None\n\n\n"
        "def test_evicts_least_recent():\n    cache = LRUCache(2)\n    cache.put(\"a\", 1)\n    cache.put(\"b\", 2)\n"
        "    cache.get(\"a\")\n    cache.put(\"c\", 3)\n    assert cache.get(\"b\") is None\n"),
    "tests/test_parser.py": (
        "from tinycache.parser import parse_size\n\n\ndef test_plain():\n    assert parse_size(\"10\") == 10\n\n\n"
        "def test_kilo():\n    assert parse_size(\"2k\") == 2000\n\n\ndef test_mega():\n"
        "    assert parse_size(\"1m\") == 1000000\n"),
    "tests/test_cli.py": (
        "from tinycache.cli import main\n\n\ndef test_default_size(capsys):\n    assert main([\"tinycache\"]) == 0\n"
        "    assert \"128\" in capsys.readouterr().out\n"),
}
PATTERNS: tuple[str, ...] = ("*.py", "tests/test_*.py", "*.md", "*.toml", "*config*", "tinycache/*")
TEST_RESULTS: dict[str, dict[str, Any]] = {
    "tests/test_cache.py": {"passed": 1, "failed": 1, "failures": [
        "test_evicts_least_recent: assert cache.get('b') is None; got 2 (put evicted 'c', the newest item)"]},
    "tests/test_parser.py": {"passed": 2, "failed": 1, "failures": [
        "test_mega: ValueError: invalid literal for int() with base 10: '1m'"]},
    "tests/test_cli.py": {"passed": 1, "failed": 0, "failures": []},
}


def _function(name: str, description: str, parameter: str, about: str, values: tuple[str, ...]) -> dict[str, Any]:
    """One OpenAI tool entry with a single required string parameter limited to ``values``."""
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {parameter: {"type": "string", "description": about,
                                                                    "enum": list(values)}},
                       "required": [parameter], "additionalProperties": False}}}


TOOLS: tuple[dict[str, Any], ...] = (
    _function("get_weather", "The current weather in a city.", "city", "The city.", CITIES),
    _function("search_files", "The paths in the tinycache repository that match a glob pattern.", "pattern",
              "A glob pattern such as *.py.", PATTERNS),
    _function("read_file", "The text of one file of the tinycache repository.", "path",
              "The file's path in the repository.", tuple(FILES)),
    _function("run_tests", "Run one test module of the tinycache repository with pytest.", "module",
              "The test module's path.", tuple(TEST_RESULTS)),
)

TASKS: tuple[tuple[str, str], ...] = (  # (id, the user's task)
    ("weather-paris", "What is the weather in Paris right now?"),
    ("warmer-city", "Which is warmer at the moment, Tokyo or Sydney?"),
    ("cache-tests", "Run the cache tests and tell me whether they pass."),
    ("parser-failure", "Run the parser tests and explain which test fails and why."),
    ("explain-get", "Read tinycache/cache.py and explain what LRUCache.get does."),
    ("config-default", "What cache size does tinycache use when there is no config file? Check the code."),
    ("cli-tests", "Run the CLI tests; if one fails, read the CLI module to find the cause."),
    ("rain-london", "Is it raining in London? If it is, tell me whether Cairo is dry."),
    ("readme", "Find the Markdown files of the repository and summarize the README."),
    ("walk", "Compare the weather in Oslo and Paris and tell me which city is better for a walk."),
    ("eviction-bug", "The eviction in tinycache looks wrong. Find the cache module, read it and point at the bug."),
    ("test-files", "List the test files of the repository, then run the parser tests."),
)


def run_tool(name: str, arguments: str) -> str:
    """The fake tool ``name`` called with ``arguments`` (JSON text of an object): its result as JSON text, the
    same for the same call every time; ``{"error": ...}`` for a call the fake world cannot answer."""
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return _result({"error": f"arguments are not JSON: {arguments[:80]!r}"})
    if not isinstance(args, dict):
        return _result({"error": "arguments must be a JSON object"})
    tools = {"get_weather": ("city", _weather), "search_files": ("pattern", _search),
             "read_file": ("path", _read), "run_tests": ("module", _tests)}
    if name not in tools:
        return _result({"error": f"no tool named {name!r}; tools: {', '.join(tools)}"})
    parameter, answer = tools[name]
    value = args.get(parameter)
    if not isinstance(value, str):
        return _result({"error": f"{name} needs the string argument {parameter!r}"})
    return _result(answer(value))


def _weather(city: str) -> dict[str, Any]:
    known = WEATHER.get(city)
    return {"city": city, **known} if known else {"error": f"no weather for {city!r}; cities: {', '.join(CITIES)}"}


def _search(pattern: str) -> dict[str, Any]:
    return {"pattern": pattern, "matches": [path for path in FILES if fnmatch.fnmatch(path, pattern)]}


def _read(path: str) -> dict[str, Any]:
    return {"path": path, "content": FILES[path]} if path in FILES else {"error": f"no file {path!r}"}


def _tests(module: str) -> dict[str, Any]:
    known = TEST_RESULTS.get(module)
    return {"module": module, **known} if known else {"error": f"no test module {module!r}"}


def _result(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False)


def agent_plan() -> AgentPlan:
    """How every agent conversation runs: TURN_CHOICES (MAX_TURNS turns at most), results from run_tool."""
    return AgentPlan(choices=TURN_CHOICES, execute=run_tool)


def agent_requests(limit: int | None = None) -> list[tuple[str, list[dict[str, Any]], dict[str, Any], AgentPlan]]:
    """The first ``limit`` TASKS as bench-serve entries: (id, the system and user messages, the request fields
    every turn sends (the tools), the conversation's plan)."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative integer or None, got {limit!r}")
    plan = agent_plan()
    return [(ident, [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task}],
             {"tools": [json.loads(json.dumps(tool)) for tool in TOOLS]}, plan)
            for ident, task in TASKS[:limit]]
