"""`specgen serve` as clients use it: a real server in a subprocess on the real smollm2 model, driven
by OpenAI's own Python client (and raw HTTP where the client hides what is checked)."""

import json
import socket
import subprocess
import sys
import threading

import pytest

from clihelp import assert_one_line_error, specgen
from harness import SMOLLM2, Server, server  # noqa: F401 (server: a fixture)

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.real

QUESTION = "Name three colours."




@pytest.fixture(scope="module")
def auto():
    """auto as a client starts it, behind an API key (shared with other modules: harness.server)."""
    return server(api_key="sesame")


@pytest.fixture(scope="module")
def plain():
    return server("--method", "plain")


def generate(*args):
    proc = subprocess.run([sys.executable, "-m", "specgen", "generate", "-m", SMOLLM2, "--no-store", *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.removesuffix("\n")


def test_chat_completion_carries_usage_timings_and_speculation(auto):
    r = auto.client.chat.completions.create(model="x", messages=[{"role": "user", "content": QUESTION}],
                                            max_tokens=24, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content and r.choices[0].finish_reason in ("stop", "length")
    extra = r.model_extra
    assert extra["timings"]["predicted_n"] == r.usage.completion_tokens <= 24
    # llama-server's prompt_n: the tokens read; cache_n: kept from the last request (the prompt cache)
    assert extra["timings"]["prompt_n"] + extra["timings"]["cache_n"] == r.usage.prompt_tokens > 0
    assert extra["timings"]["cache_n"] == r.usage.prompt_tokens_details.cached_tokens
    assert 0 <= extra["timings"]["draft_n_accepted"] <= extra["timings"]["draft_n"]
    assert extra["speculative"]["method"] == "auto" and extra["speculative"]["target_calls"] >= 1


def test_a_stream_says_the_same_text_and_ends_with_usage(auto):
    whole = auto.client.chat.completions.create(model="x", messages=[{"role": "user", "content": QUESTION}],
                                                max_tokens=24, temperature=0, seed=7)
    chunks = list(auto.client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": QUESTION}], max_tokens=24, temperature=0, seed=7,
        stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1 and "timings" in finishing[0].model_extra
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert text == whole.choices[0].message.content


def test_greedy_text_through_the_server_equals_generate(plain):
    r = plain.client.chat.completions.create(model="x", messages=[{"role": "user", "content": QUESTION}],
                                             max_tokens=24, temperature=0)
    assert r.choices[0].message.content == generate("--method", "plain", "-n", "24", QUESTION)
    c = plain.client.completions.create(model="x", prompt="def add(a, b):", max_tokens=20, temperature=0)
    assert c.choices[0].text == generate("--method", "plain", "--no-chat", "-n", "20", "def add(a, b):")


def test_stop_strings_are_never_shown(auto):
    args = dict(model="x", prompt="1, 2, 3, 4,", max_tokens=40, temperature=0, stop=[" 7", "zzz"])
    c = auto.client.completions.create(**args)
    assert c.choices[0].finish_reason == "stop" and " 7" not in c.choices[0].text and " 6" in c.choices[0].text
    streamed = "".join(x.choices[0].text for x in auto.client.completions.create(**args, stream=True) if x.choices)
    assert streamed == c.choices[0].text


def test_max_tokens_ends_the_answer(auto):
    c = auto.client.completions.create(model="x", prompt="Once upon a time", max_tokens=5, temperature=0)
    assert c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 5


def test_four_clients_at_once_each_get_a_whole_answer(plain):
    want = generate("--method", "plain", "--no-chat", "-n", "16", "The capital of France is")
    got = [None] * 4

    def ask(i):
        got[i] = plain.client.completions.create(model="x", prompt="The capital of France is", max_tokens=16,
                                                 temperature=0).choices[0].text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    [t.start() for t in threads]
    [t.join(timeout=120) for t in threads]
    assert got == [want] * 4


def test_a_client_that_drops_leaves_the_server_clean(plain):
    stream = plain.client.completions.create(model="x", prompt="Write a long story about a dragon.",
                                             max_tokens=300, temperature=0, stream=True)
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()
    c = plain.client.completions.create(model="x", prompt="def add(a, b):", max_tokens=20, temperature=0)
    assert c.choices[0].text == generate("--method", "plain", "--no-chat", "-n", "20", "def add(a, b):")


@pytest.mark.parametrize("path, body, headers, status, words", [
    ("/v1/chat/completions", b"{bad", {}, 400, "expected a JSON object as the request body"),
    ("/v1/chat/completions", b'{"messages": []}', {}, 400, "messages expects a non-empty list"),
    ("/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "hi"}], "n": 2}).encode(), {},
     400, "n is not supported"),
    ("/v1/completions", json.dumps({"prompt": "hi", "temperature": "hot"}).encode(), {}, 400,
     "temperature expects a number"),
    ("/v1/completions", json.dumps({"prompt": "word " * 9000}).encode(), {}, 400, "but the context holds"),
    ("/v1/completions", b'{"prompt": "hi"}', {"Authorization": "Bearer wrong"}, 401, "Authorization: Bearer"),
    ("/v1/completions", b" " * (9 << 20), {}, 413, "at most"),
    ("/v1/nothing", b"{}", {}, 404, "Not Found"),
])
def test_bad_requests_get_a_4xx_that_says_why(auto, path, body, headers, status, words):
    key = {} if "Authorization" in headers else {"Authorization": "Bearer sesame"}
    got, data, _ = auto.post(path, body, {**key, **headers})
    assert got == status and words in data["error"]["message"], data
    assert "Traceback" not in json.dumps(data)


def test_a_full_queue_answers_503_and_sigterm_ends_the_server(tmp_path):
    served = Server("--method", "plain", "--max-queue", "0", "--host", "0.0.0.0")  # its own: it is stopped here
    long = iter(served.client.completions.create(model="x", prompt="Write a long story.", max_tokens=400,
                                                 temperature=0, stream=True))
    next(chunk for chunk in long if chunk.choices and chunk.choices[0].text)  # its first text: it is decoding now
    status, data, headers = served.post("/v1/completions", b'{"prompt": "hi", "max_tokens": 2}')
    for _ in long:  # the long one goes on to its end
        pass
    assert status == 503 and headers["Retry-After"] and "busy" in data["error"]["message"]
    assert served.stop() == 0
    err = served.proc.stderr.read()
    assert "without --api-key" in err and "Traceback" not in err


def test_a_port_in_use_is_one_line_before_the_model_loads():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert_one_line_error(specgen("serve", "-m", SMOLLM2, "--port", str(port)),
                              f"cannot listen on 127.0.0.1:{port}: Address already in use")


def test_a_streamed_prompt_too_long_for_the_context_is_a_400_before_the_stream(auto):
    with pytest.raises(openai.BadRequestError, match="but the context holds"):
        auto.client.completions.create(model="x", prompt="word " * 9000, max_tokens=4, stream=True)
    assert auto.client.completions.create(model="x", prompt="1, 2, 3,", max_tokens=4).choices[0].text


def test_a_later_request_drafts_from_an_earlier_answer(auto):
    ask = dict(model="x", messages=[{"role": "user", "content": "List the planets of the solar system."}],
               max_tokens=48, temperature=0)
    first = auto.client.chat.completions.create(**ask)
    again = auto.client.chat.completions.create(**ask)
    steps = again.model_extra["speculative"]["steps"]
    assert steps.get("history", 0) > 0, steps  # this process's earlier texts, the first answer among them
    assert again.model_extra["speculative"]["mean_accepted"] > first.model_extra["speculative"]["mean_accepted"]
