"""Penalties, min_p, logit_bias and logprobs through `specgen serve` as OpenAI's own client sends
them (a real server process on smollm2, `auto`): each acts, out-of-range values are a 400 naming the
field, logprobs come in OpenAI's chat and completions shapes (and llama-server's
completion_probabilities), streamed chunks carry their own tokens' and agree with the whole answer."""

import json
import math
import urllib.request

import pytest

from harness import server

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.real

ASK = [{"role": "user", "content": "Name three colours."}]
REPEAT = [{"role": "user", "content": "Write the word cat twenty times, separated by commas."}]


@pytest.fixture(scope="module")
def served():
    return server("--repeat-last-n", "32", "--min-p", "0.01")


def chat(served, messages=ASK, **kw):
    return served.client.chat.completions.create(model="m", messages=messages, max_tokens=kw.pop("max_tokens", 12),
                                                 temperature=kw.pop("temperature", 0), **kw)


def answer(served, **kw):
    return chat(served, REPEAT, max_tokens=24, **kw).choices[0].message.content


def test_chat_logprobs_whole_and_streamed_agree(served):
    r = chat(served, logprobs=True, top_logprobs=5)
    entries = r.choices[0].logprobs.content
    assert "".join(e.token for e in entries) == r.choices[0].message.content
    for e in entries:
        tops = [t.logprob for t in e.top_logprobs]
        assert len(tops) == 5 and tops == sorted(tops, reverse=True) and e.top_logprobs[0].token == e.token
        assert e.logprob == pytest.approx(tops[0]) and sum(map(math.exp, tops)) <= 1 + 1e-6
    streamed = [e for c in chat(served, logprobs=True, top_logprobs=5, stream=True)
                if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in entries]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in entries], abs=1e-4)
    twenty = chat(served, logprobs=True, top_logprobs=20, max_tokens=2).choices[0].logprobs.content[0]
    assert len(twenty.top_logprobs) == 20
    with pytest.raises(openai.BadRequestError, match=r"top_logprobs expects a value in \[0, 20\], found 21"):
        chat(served, logprobs=True, top_logprobs=21)
    assert chat(served).choices[0].logprobs is None  # not asked, not sent


def test_completions_logprobs_whole_and_streamed_agree(served):
    ask = dict(model="m", prompt="One, two, three,", max_tokens=8, temperature=0, logprobs=3)
    r = served.client.completions.create(**ask)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text and len(lp.token_logprobs) == len(lp.tokens)
    assert lp.text_offset == [sum(map(len, lp.tokens[:i])) for i in range(len(lp.tokens))]
    assert all(len(top) == 3 and max(top.values()) == pytest.approx(p) for top, p in zip(lp.top_logprobs,
                                                                                         lp.token_logprobs))
    tokens, offsets = [], []
    for c in served.client.completions.create(**ask, stream=True):
        if c.choices and c.choices[0].logprobs:
            tokens += c.choices[0].logprobs.tokens
            offsets += c.choices[0].logprobs.text_offset
    assert tokens == lp.tokens and offsets == lp.text_offset


def test_logprobs_stop_at_a_stop_string(served):
    full = chat(served, logprobs=True).choices[0].message.content
    cut = full[4:7]
    r = chat(served, logprobs=True, stop=[cut])
    shown = "".join(e.token for e in r.choices[0].logprobs.content)
    assert r.choices[0].message.content == full[:full.find(cut)]
    assert shown.startswith(r.choices[0].message.content) and len(shown) < full.find(cut) + len(cut)


def test_penalties_bias_and_min_p_act(served):
    base = answer(served)
    assert answer(served, presence_penalty=2.0) != base
    assert answer(served, frequency_penalty=2.0) != base
    assert answer(served, extra_body={"repeat_penalty": 1.8}) != base
    assert answer(served, extra_body={"repeat_penalty": 1.8, "repeat_last_n": 0}) == base
    first = served.post("/tokenize", json.dumps({"content": base}).encode())[1]["tokens"][0]
    piece = served.post("/detokenize", json.dumps({"tokens": [first]}).encode())[1]["content"]
    assert not answer(served, logit_bias={str(first): -100}).startswith(piece)
    # min_p 1 keeps only the likeliest token: sampling at a high temperature is greedy again.
    assert answer(served, temperature=1.5, seed=3, extra_body={"min_p": 1.0}) == base


@pytest.mark.parametrize("fields,words", [
    ({"presence_penalty": 2.5}, "presence_penalty expects a value in [-2, 2], found 2.5"),
    ({"frequency_penalty": -3}, "frequency_penalty expects a value in [-2, 2], found -3"),
    ({"logit_bias": {"999999": 1}}, "logit_bias expects token ids in [0, 49152), found 999999"),
    ({"logit_bias": {"42": 101}}, "logit_bias expects biases in [-100, 100]"),
    ({"extra_body": {"repeat_penalty": 0}}, "repeat_penalty expects a value in (0, 10], found 0"),
    ({"extra_body": {"min_p": 1.5}}, "min_p expects a value in [0, 1], found 1.5"),
    ({"top_logprobs": 3}, "top_logprobs expects logprobs: true beside it"),
])
def test_out_of_range_values_are_refused_by_name(served, fields, words):
    with pytest.raises(openai.BadRequestError) as e:
        chat(served, **fields)
    assert words in e.value.body["message"]


def test_llama_server_completion_probabilities_and_props(served):
    body = {"prompt": "One, two, three,", "n_predict": 6, "temperature": 0, "n_probs": 2, "repeat_penalty": 1.2}
    status, whole, _ = served.post("/completion", json.dumps(body).encode())
    probs = whole["completion_probabilities"]
    assert status == 200 and "".join(p["token"] for p in probs) == whole["content"]
    assert all(len(p["top_logprobs"]) == 2 and isinstance(p["id"], int) for p in probs)
    settings = whole["generation_settings"]
    assert settings["repeat_penalty"] == 1.2 and settings["repeat_last_n"] == 32 and settings["n_probs"] == 2
    chunks = [json.loads(line[len("data: "):]) for line in _raw(served, "/completion", {**body, "stream": True})
              .decode().split("\n\n") if line.startswith("data: ")]
    assert [p for c in chunks[:-1] for p in c["completion_probabilities"]] == probs
    params = json.loads(_raw(served, "/props"))["default_generation_settings"]["params"]
    assert params["repeat_last_n"] == 32 and params["min_p"] == 0.01 and params["repeat_penalty"] == 1.0


def _raw(served, path, body=None) -> bytes:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(served.url + path, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.read()


def test_a_sampled_reply_names_its_seed_and_the_seed_replays_it_streamed_or_not(served):
    """No seed given: the server draws one and says which (speculative.seed); that seed gives the
    same text again, whole or streamed, since every method samples plain's text (core/race.py)."""
    first = chat(served, REPEAT, max_tokens=24, temperature=1.0)
    seed = first.model_extra["speculative"]["seed"]
    assert isinstance(seed, int) and 0 <= seed < 2**32
    again = chat(served, REPEAT, max_tokens=24, temperature=1.0, seed=seed)
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.model_extra["speculative"]["seed"] == seed
    streamed = chat(served, REPEAT, max_tokens=24, temperature=1.0, seed=seed, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == \
        first.choices[0].message.content
    other = chat(served, REPEAT, max_tokens=24, temperature=1.0)
    assert other.model_extra["speculative"]["seed"] != seed  # a fresh seed per request
