"""Predicted Outputs (proposers/prediction.py): the alignment on hand-written arrays; greedy with a
prediction (right, edited in the middle, wrong, longer, shorter) equal to model.generate over EOS and
max_new_tokens edges; a right prediction counted as accepted and taking fewer forward passes; the
real server answering with the usage details through the real openai client; ``--prediction-file``;
every bad prediction refused naming the field and the fix."""

from __future__ import annotations

import functools
import json

import httpx
import numpy as np
import openai
import pytest
import torch
from click.testing import CliRunner

from conftest import VOCAB, reference, save_model_dir, tiny_model, tiny_tokenizer
from lookahead import LookaheadConfig, LookaheadGenerator
from lookahead.cli.main import main
from lookahead.errors import GenerateInputError
from lookahead.proposers.prediction import Alignment, chain_nodes, realign
from lookahead.serve.app import create_app
from lookahead.serve.engine import Engine
from test_serve import KEY, TEMPLATE, WAIT_S, ServerThread

NEVER = [VOCAB + 1000]  # an EOS id that never occurs
NEW = 48


def ids(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


# ------------------------------------------------------------------ the alignment, by hand


def test_realign_finds_the_longest_suffix_then_the_occurrence_nearest_after_where_it_was_lost():
    predicted = ids(5, 6, 7, 5, 6, 8)
    assert realign(predicted, ids(1, 9, 5, 6), 4, 0) == (2, 2)  # "5 6" twice: the first at or after 0
    assert realign(predicted, ids(1, 7, 5, 6), 4, 0) == (5, 3)  # "7 5 6" once: the longer match wins
    assert realign(predicted, ids(1, 9, 5, 6), 4, 3) == (5, 2)  # lost at 3: the "5 6" after it
    repeated = ids(1, 2, 9, 1, 2, 8, 1, 2, 7)
    assert realign(repeated, ids(4, 1, 2), 3, 9) == (8, 2)  # nothing after 9: the nearest before
    assert realign(predicted, ids(3, 4), 2, 0) == (-1, 0)  # 4 occurs nowhere
    assert realign(predicted, ids(3, 8), 2, 0) == (-1, 0)  # 8 only at the end: nothing would follow it
    assert realign(predicted, ids(6), 1, 0) == (2, 1)  # a one-token text matches one token


def test_chain_nodes_follow_the_row_from_the_root():
    tokens, parents = [4, 5, 6, 9], [-1, 0, 0, 2]
    assert chain_nodes(tokens, parents, [4, 6, 9, 1]) == [0, 2, 3]
    assert chain_nodes(tokens, parents, [4, 5]) == [0, 1]
    assert chain_nodes(tokens, parents, [5]) == []  # 5 is no child of the root
    assert chain_nodes([], [], [4]) == []


def test_an_edit_in_the_middle_costs_its_tokens_and_the_prediction_goes_on_after_it():
    alignment = Alignment(ids(10, 11, 12, 13, 14, 15, 16, 17, 18, 19))
    assert alignment.row(3).tolist() == [10, 11, 12] and alignment.label() == 0  # the start
    seq = ids(1, 2, 10, 11, 12, 50, 51, 15, 16)  # prompt [1 2]; "13 14" edited into "50 51"
    alignment.follow(seq, 2, 5)
    assert alignment.position == 3 and alignment.run == 3
    alignment.follow(seq, 5, 7)
    assert alignment.position == -1 and alignment.row(4).shape == (0,)  # 50, 51 occur nowhere: nothing proposed
    alignment.follow(seq, 7, 9)  # 15 realigns (one token matched), 16 follows
    assert alignment.position == 7 and alignment.run == 2
    assert alignment.row(5).tolist() == [17, 18, 19] and alignment.label() == 2  # runs of 2: class 1 + 1
    assert alignment.accepted == 4  # 10 11 12 and 16 (15 was matched by realigning, not while aligned)
    alignment.offer(3, 4)  # 13 14 15 16 were fed to the model
    assert alignment.rejected == 3  # 13 14 15 never matched; 16 did


def test_a_token_that_breaks_the_alignment_is_realigned_on_the_spot():
    alignment = Alignment(ids(3, 4, 5, 3, 4, 6, 7))
    seq = ids(9, 3, 4, 6, 7)  # prompt [9]; the output skips "5 3 4"
    alignment.follow(seq, 1, 5)
    assert alignment.position == 7 and alignment.accepted == 3  # 3 4, then 7 after realigning on "3 4 6"
    assert alignment.matched.tolist() == [True, True, False, False, False, False, True]


# ------------------------------------------------------------------ exactness on tiny models


@functools.lru_cache(maxsize=None)
def model_for(arch: str):
    return tiny_model(arch)


def prompt() -> torch.Tensor:
    return torch.randint(3, VOCAB, (1, 13), generator=torch.Generator().manual_seed(7))


@functools.lru_cache(maxsize=None)
def plain(arch: str, new: int = NEW, eos: tuple[int, ...] = tuple(NEVER)) -> torch.Tensor:
    return reference(model_for(arch), prompt(), new, eos_token_id=list(eos))


def predictions(output: torch.Tensor) -> dict[str, torch.Tensor | list[int]]:
    """Predictions of ``output`` [n]: right, edited in the middle, wrong, longer and shorter."""
    n = output.shape[0]
    wrong = torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(99))
    edit = torch.cat([output[:n // 3], torch.tensor([3, 4, 5, 6, 7]), output[n // 3 + 3:]])  # 3 replaced by 5
    return {"right": output, "edit": edit, "wrong": wrong, "longer": torch.cat([output, output[:20], wrong[:9]]),
            "shorter": output[:n // 2].tolist()}


def with_prediction(arch: str, prediction, new: int = NEW, eos=NEVER, config: LookaheadConfig | None = None):
    gen = LookaheadGenerator(model_for(arch), config=config or LookaheadConfig())
    out = gen.generate(prompt(), max_new_tokens=new, eos_token_id=list(eos), prediction=prediction)
    assert gen.last_stats is not None
    return out, gen.last_stats


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen3"])
def test_greedy_with_any_prediction_equals_generate(arch):
    ref = plain(arch)
    new = ref[0, prompt().shape[1]:]
    for name, prediction in predictions(new).items():
        for config in (LookaheadConfig(), LookaheadConfig(window=3, ngram=3, max_tree_nodes=12)):
            out, stats = with_prediction(arch, prediction, config=config)
            assert torch.equal(out, ref), f"{arch}: a {name} prediction changed the output"
            assert stats.new_tokens == NEW and sum(stats.accepted) == NEW
            fed = len(prediction)
            assert 0 <= stats.accepted_prediction_tokens <= min(fed, NEW)
            assert stats.accepted_prediction_tokens + stats.rejected_prediction_tokens <= fed
            if name in ("right", "longer"):
                assert stats.accepted_prediction_tokens == NEW, name
            if name == "shorter":
                assert stats.accepted_prediction_tokens == fed


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_max_new_tokens_and_eos_inside_a_predicted_run(arch):
    full = plain(arch)[0, prompt().shape[1]:]
    for new in (1, 2, 7, 31):  # the prediction runs on past every one of these
        out, stats = with_prediction(arch, full, new)
        assert torch.equal(out, plain(arch, new)), f"{arch}: max_new_tokens={new}"
        assert stats.new_tokens == new and stats.accepted_prediction_tokens == new
        assert stats.rejected_prediction_tokens == 0  # nothing past the budget is fed
    checked = 0
    for at in (5, 17, 30):  # an EOS id the output holds first at ``at``: it stops there
        token = int(full[at])
        if token in full[:at].tolist():
            continue
        ref = plain(arch, NEW, (token,))
        assert ref.shape[1] == prompt().shape[1] + at + 1
        out, stats = with_prediction(arch, full, NEW, [token])
        assert torch.equal(out, ref), f"{arch}: EOS at {at}"
        assert stats.accepted_prediction_tokens == at + 1
        checked += 1
    assert checked, "no EOS could be placed inside the output: the test would check nothing"


def test_a_right_prediction_is_accepted_and_takes_fewer_forward_passes():
    ref = plain("llama")
    new = ref[0, prompt().shape[1]:]
    config = LookaheadConfig()
    without = with_prediction("llama", None, config=config)[1]
    out, stats = with_prediction("llama", new, config=config)
    assert torch.equal(out, ref)
    assert (stats.accepted_prediction_tokens, stats.rejected_prediction_tokens) == (NEW, 0)
    assert (without.accepted_prediction_tokens, without.rejected_prediction_tokens) == (0, 0)
    assert stats.steps < without.steps, (stats.steps, without.steps)
    wrong = with_prediction("llama", predictions(new)["wrong"], config=config)[1]
    assert wrong.rejected_prediction_tokens > 0 and wrong.accepted_prediction_tokens < NEW // 4


def test_seeded_sampling_with_a_prediction_draws_the_plain_loops_tokens():
    """A sampled token depends on its seed and its position only (verify/sampling.py): the prediction
    changes how many forward passes the text takes, never the text."""
    def sampled(prediction, config: LookaheadConfig):
        gen = LookaheadGenerator(model_for("llama"), config=config)
        out = gen.generate(prompt(), max_new_tokens=32, do_sample=True, temperature=0.8, eos_token_id=NEVER,
                           generator=torch.Generator().manual_seed(5), prediction=prediction)
        return out, gen.last_stats

    plain_loop, _ = sampled(None, LookaheadConfig(window=1, candidates=0))
    first, without = sampled(None, LookaheadConfig())
    again, stats = sampled(plain_loop[0, prompt().shape[1]:], LookaheadConfig())
    assert torch.equal(first, plain_loop) and torch.equal(again, plain_loop)
    assert (stats.accepted_prediction_tokens, stats.rejected_prediction_tokens) == (32, 0)
    assert stats.steps < without.steps


def test_custom_generate_takes_a_prediction():
    import lookahead

    model = model_for("llama")
    ref = plain("llama")
    with torch.inference_mode():
        out = model.generate(prompt(), attention_mask=torch.ones_like(prompt()), max_new_tokens=NEW,
                             eos_token_id=NEVER, do_sample=False, return_dict_in_generate=True,
                             custom_generate=lookahead.custom_generate, prediction=ref[0, prompt().shape[1]:])
    assert torch.equal(out.sequences, ref)
    assert (out.stats.accepted_prediction_tokens, out.stats.rejected_prediction_tokens) == (NEW, 0)


def test_a_batch_takes_one_prediction_per_row():
    model = model_for("llama")
    first = prompt()
    second = torch.randint(3, VOCAB, (1, 9), generator=torch.Generator().manual_seed(8))
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), second], dim=1)
    batch, mask = torch.cat([first, padded]), torch.cat([torch.ones_like(first), (padded != 0).long()])
    refs = [reference(model, p, 24, eos_token_id=NEVER)[0, p.shape[1]:] for p in (first, second)]
    gen = LookaheadGenerator(model, config=LookaheadConfig())
    out = gen.generate(batch, attention_mask=mask, max_new_tokens=24, eos_token_id=NEVER,
                       prediction=[refs[0], None])
    assert torch.equal(out[0, first.shape[1]:], refs[0]) and torch.equal(out[1, batch.shape[1]:], refs[1])
    assert gen.last_stats.accepted_prediction_tokens == 24  # row 0's prediction; row 1 had none


def test_a_text_prediction_goes_through_the_tokenizer():
    tokenizer = tiny_tokenizer()
    ref = plain("llama")
    new = ref[0, prompt().shape[1]:].tolist()
    text = tokenizer.decode(new)
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == new, "the text does not give the ids back"
    gen = LookaheadGenerator(model_for("llama"), tokenizer, LookaheadConfig())
    out = gen.generate(prompt(), max_new_tokens=NEW, eos_token_id=NEVER, prediction=text)
    assert torch.equal(out, ref) and gen.last_stats.accepted_prediction_tokens == NEW


@pytest.mark.parametrize("prediction, words", [
    ("", "prediction is empty text"),
    ([], "prediction is an empty list"),
    (3.5, "prediction is a float: prediction takes the predicted output as text"),
    ({"type": "content"}, "prediction is a dict"),
    ([1.5, 2.0], "prediction holds values that are no token ids"),
    (torch.ones(2, 3, dtype=torch.long), "must be 1-D integer token ids"),
    (torch.ones(3), "must be 1-D integer token ids"),
    ([5, VOCAB], f"outside the vocabulary [0, {VOCAB})"),
    ([[5, 6], [7]], "prediction holds 2 entries for a batch of 1 rows"),
    ([5] * 1100, "shorten the prediction to at most 1011 tokens"),
])
def test_bad_predictions_name_the_argument_and_the_fix(prediction, words):
    gen = LookaheadGenerator(model_for("llama"), tiny_tokenizer(), LookaheadConfig())
    with pytest.raises(GenerateInputError) as caught:
        gen.generate(prompt(), max_new_tokens=4, prediction=prediction)
    assert words in str(caught.value)


def test_text_without_a_tokenizer_and_one_prediction_for_a_batch_are_refused():
    gen = LookaheadGenerator(model_for("llama"), config=LookaheadConfig())
    with pytest.raises(GenerateInputError, match="no tokenizer"):
        gen.generate(prompt(), max_new_tokens=4, prediction="abc")
    with pytest.raises(GenerateInputError, match="pass a list of 2 predictions"):
        gen.generate(torch.cat([prompt(), prompt()]), max_new_tokens=4, prediction=[5, 6])


# ------------------------------------------------------------------ the server


@pytest.fixture(scope="module")
def served():
    model = tiny_model("llama")
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = TEMPLATE
    engine = Engine(LookaheadGenerator(model, tokenizer, LookaheadConfig()), max_batch=2)
    engine.start()
    server = ServerThread(create_app(engine, "tiny", api_key=KEY, stop_engine=True)).start()
    yield {"url": server.url, "model": model, "tokenizer": tokenizer}
    server.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served["url"] + "/v1", api_key=KEY, max_retries=0, timeout=WAIT_S)


def greedy_text(served, prompt_ids: list[int], new: int) -> tuple[str, list[int]]:
    out = reference(served["model"], torch.tensor([prompt_ids]), new)[0, len(prompt_ids):].tolist()
    return served["tokenizer"].decode(out, skip_special_tokens=True), out


def test_chat_with_a_prediction_answers_the_same_with_the_usage_details(served, client):
    messages = [{"role": "user", "content": "Rewrite:a=1;b=2"}]
    prompt_ids = list(served["tokenizer"].apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                              return_dict=True)["input_ids"])
    text, out = greedy_text(served, prompt_ids, 40)
    predicted = served["tokenizer"](text, add_special_tokens=False)["input_ids"]
    assert predicted and out[:len(predicted)] == predicted, "the answer's text does not give its ids back"
    plain_reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=40)
    details = plain_reply.usage.completion_tokens_details
    assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == (0, 0)
    reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=40,
                                           prediction={"type": "content", "content": text})
    assert reply.choices[0].message.content == text == plain_reply.choices[0].message.content
    details = reply.usage.completion_tokens_details
    assert details.accepted_prediction_tokens == len(predicted)
    assert details.rejected_prediction_tokens == 0
    edited = text[:len(text) // 2] + "XYZ" + text[len(text) // 2 + 2:]
    chunks = list(client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=40, stream=True, stream_options={"include_usage": True},
        prediction={"type": "content", "content": [{"type": "text", "text": edited[:5]},
                                                   {"type": "text", "text": edited[5:]}]}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    details = chunks[-1].usage.completion_tokens_details
    assert 0 < details.accepted_prediction_tokens < len(predicted)


def test_completions_take_a_prediction_too(served, client):
    prompt = "def_f(x):return"
    prompt_ids = served["tokenizer"](prompt)["input_ids"]
    text, _ = greedy_text(served, prompt_ids, 20)
    reply = client.completions.create(model="tiny", prompt=prompt, max_tokens=20,
                                      extra_body={"prediction": {"type": "content", "content": text}})
    assert reply.choices[0].text == text
    assert reply.usage.completion_tokens_details.accepted_prediction_tokens > 0


@pytest.mark.parametrize("prediction, param, words", [
    ("just text", "prediction", "must be an object"),
    ({"type": "text", "content": "a"}, "prediction.type", 'must be "content"'),
    ({"type": "content", "content": ""}, "prediction.content", "is empty"),
    ({"type": "content", "content": []}, "prediction.content", "empty list"),
    ({"type": "content"}, "prediction.content", "got nothing"),
    ({"type": "content", "content": [{"type": "image_url"}]}, "prediction.content[0]", "text part"),
    ({"type": "content", "content": "a", "extra": 1}, "prediction.extra", "not a field of a prediction"),
    ({"type": "content", "content": "a" * 1100}, "prediction", "shorten the prediction to at most"),
])
def test_bad_predictions_are_400_naming_the_field(served, prediction, param, words):
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/completions", {"prompt": "hi"})):
        response = httpx.post(served["url"] + path, json={**body, "max_tokens": 4, "prediction": prediction},
                              headers={"Authorization": f"Bearer {KEY}"}, timeout=WAIT_S)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param and words in error["message"], error


# ------------------------------------------------------------------ the CLI


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model_dir(tmp_path_factory.mktemp("tiny-llama"), tiny_model("llama"))


def generate(model_dir: str, *args: str):
    return CliRunner().invoke(main, ["generate", "--model", model_dir, "--prompt", "w3 w4 w5 w9 w3", "--no-chat",
                                     "--max-new-tokens", "16", "--json", *args])


def test_prediction_file_gives_the_same_answer_and_counts_it(model_dir, tmp_path):
    result = generate(model_dir)
    assert result.exit_code == 0, result.output
    plain_run = json.loads(result.stdout)
    assert plain_run["text"] and plain_run["accepted_prediction_tokens"] == 0
    path = tmp_path / "predicted.txt"
    path.write_text(plain_run["text"], encoding="utf-8")
    result = generate(model_dir, "--prediction-file", str(path))
    assert result.exit_code == 0, result.output
    predicted_run = json.loads(result.stdout)
    assert predicted_run["text"] == plain_run["text"]
    assert predicted_run["accepted_prediction_tokens"] > 0
    assert "prediction:" in result.stderr and "tokens accepted" in result.stderr


def test_prediction_files_that_cannot_work_get_one_line(model_dir, tmp_path):
    empty, binary = tmp_path / "empty.txt", tmp_path / "binary.txt"
    empty.write_text("  \n", encoding="utf-8")
    binary.write_bytes(b"w3 \xff\xfe w4")
    for path, words in ((tmp_path / "missing.txt", "pass a readable text file"), (empty, "is empty"),
                        (binary, "is not UTF-8 text")):
        result = generate(model_dir, "--prediction-file", str(path))
        assert result.exit_code == 2 and words in result.stderr, result.output
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output
