"""Stop strings through `specgen serve`, under the command line's rule (app/stops.py, the rule --stop
follows): a request's `stop` on every generating route is one string or a list of them, each
non-empty, at most 16 of at most 256 characters; anything else is a one-line 400 naming `stop`, what
was expected and what was found. `serve --stop` gives the stop strings of a request naming none,
and /props reports them where llama-server does (default_generation_settings.params.stop). A real
server process on smollm2."""

import json

import pytest

from harness import call, server

pytestmark = pytest.mark.real

STOP = " 6"  # the server's own stop string (serve --stop): "1, 2, 3," goes on " 4, 5, 6"
ROUTES = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "Count: 1, 2, 3,"}], "max_tokens": 4},
          "/v1/completions": {"prompt": "1, 2, 3,", "max_tokens": 4},
          "/completion": {"prompt": "1, 2, 3,", "n_predict": 4}}


@pytest.fixture(scope="module")
def served():
    return server("--method", "plain", "--stop", STOP)


def post(served, path, body):
    status, _, raw = call(served, "POST", path, body)
    return status, json.loads(raw)


@pytest.mark.parametrize("stop,message", [
    ("", "stop expects a non-empty stop string, found an empty one"),
    (["4,", ""], "stop expects a non-empty stop string, found an empty one"),
    ([1], "stop expects text or a list of texts, found [1]"),
    ({"text": "4,"}, 'stop expects text or a list of texts, found {"text": "4,"}'),
    (True, "stop expects text or a list of texts, found true"),
    ([f"w{i}" for i in range(17)], "stop expects at most 16 stop strings, found 17"),
    (["x" * 257], "stop expects a stop string of at most 256 characters, found 257"),
], ids=["empty", "empty-in-list", "number", "object", "bool", "too-many", "too-long"])
def test_a_stop_the_command_line_would_refuse_is_a_400_naming_it(served, stop, message):
    for route, body in ROUTES.items():
        status, r = post(served, route, {**body, "stop": stop})
        assert status == 400 and r["error"]["param"] == "stop", (route, r)
        assert r["error"]["message"].startswith(message) and "\n" not in r["error"]["message"], (route, r)
    status, r = post(served, "/completion", {**ROUTES["/completion"], "stop": ["4,"], "temperature": 0})
    assert status == 200 and r["stop_type"] == "word"  # the next request is answered


def test_sixteen_stop_strings_and_duplicates_are_taken(served):
    stops = ["never said"] * 2 + [f"w{i}" for i in range(13)] + [" 5"]
    status, r = post(served, "/completion", {"prompt": "1, 2, 3,", "n_predict": 8, "temperature": 0, "stop": stops})
    assert status == 200 and r["stopping_word"] == " 5" and r["content"] == " 4,", r


def test_serve_stop_is_the_default_and_props_report_it(served):
    status, _, raw = call(served, "GET", "/props")
    assert status == 200 and json.loads(raw)["default_generation_settings"]["params"]["stop"] == [STOP]
    status, r = post(served, "/completion", {"prompt": "1, 2, 3,", "n_predict": 12, "temperature": 0})
    assert status == 200 and r["stopping_word"] == STOP and r["generation_settings"]["stop"] == [STOP], r
    status, r = post(served, "/completion", {"prompt": "1, 2, 3,", "n_predict": 12, "temperature": 0, "stop": [" 5"]})
    assert r["stopping_word"] == " 5" and r["generation_settings"]["stop"] == [" 5"], r  # the request's, in its place
