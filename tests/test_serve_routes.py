"""`specgen serve` as llama-server's clients call it: its own routes (/completion, /props, /tokenize,
/detokenize, /metrics, the OpenAI routes without /v1), CORS, local servers' limits, and every request
field OpenAI and llama-server document for chat completions, each acting or refused by name. A real
server process on the real smollm2 model, driven over raw HTTP."""

import json
import time

import pytest

from specgen.serve import fields
from specgen.serve.ecosystem import IGNORED_HEADER, NATIVE, NOTES_HEADER
from harness import ASK, KEY, VALID, WEATHER, Server as Served, call, events, post

pytestmark = pytest.mark.real

CTX = 160  # the small server's --ctx (llama.cpp rounds it up: /props says what it holds)
SCHEMA = {"type": "object", "properties": {"c": {"enum": ["red", "blue"]}}, "required": ["c"]}


@pytest.fixture(scope="module")
def server():
    served = Served("--cors", "*", api_key="sesame")
    yield served
    served.stop()


@pytest.fixture(scope="module")
def plain_server():
    """Served as a user first starts it: no flags."""
    served = Served("--method", "plain", "--ctx", str(CTX))
    yield served
    served.stop()


@pytest.fixture(scope="module")
def small():
    """A plain server with a small context, browsers allowed from one origin only."""
    served = Served("--method", "plain", "--ctx", str(CTX), "--cors-origin", "http://good.test")
    yield served
    served.stop()


@pytest.fixture(scope="module")
def baseline(server):
    status, r = post(server, "/v1/chat/completions", {"messages": ASK, "max_tokens": 8, "temperature": 0})
    assert status == 200 and r["choices"][0]["message"]["content"], r
    return r["choices"][0]["message"]["content"]


def chat(server, **fields):
    return post(server, "/v1/chat/completions", {"messages": ASK, "max_tokens": 8, "temperature": 0, **fields})


# --- llama-server's routes --------------------------------------------------------------------


def test_health_models_and_the_routes_without_v1(server, baseline):
    for path in ("/health", "/v1/health"):
        status, _, raw = call(server, "GET", path)  # no key needed
        assert status == 200 and json.loads(raw) == {"status": "ok"}
    model_id = None
    for path in ("/v1/models", "/models"):
        status, _, raw = call(server, "GET", path, headers=KEY)
        listed = json.loads(raw)["data"]
        assert status == 200 and len(listed) == 1 and listed[0]["meta"]["n_ctx"] == 4096
        model_id = listed[0]["id"]
    status, _, raw = call(server, "GET", f"/v1/models/{model_id}", headers=KEY)
    assert status == 200 and json.loads(raw)["id"] == model_id
    status, _, raw = call(server, "GET", "/v1/models/gpt-4o", headers=KEY)
    assert status == 404 and "not found" in json.loads(raw)["error"]["message"]
    status, r = post(server, "/chat/completions", {"messages": ASK, "max_tokens": 8, "temperature": 0})
    assert status == 200 and r["choices"][0]["message"]["content"] == baseline
    status, r = post(server, "/completions", {"prompt": "1, 2, 3,", "max_tokens": 4, "temperature": 0})
    assert status == 200 and r["object"] == "text_completion" and r["usage"]["completion_tokens"] == 4


def test_props_say_what_the_web_ui_reads(server):
    status, _, raw = call(server, "GET", "/props", headers=KEY)
    props = json.loads(raw)
    assert status == 200 and props["total_slots"] == 1 and props["model_path"].endswith(".gguf")
    assert "<|im_start|>" in props["chat_template"] and props["build_info"].startswith("specgen")
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == 4096
    params = settings["params"]
    assert params["n_predict"] == -1 and params["temperature"] == 0 and params["min_p"] == 0
    assert params["repeat_penalty"] == 1 and params["presence_penalty"] == 0
    # Every default /props reports is accepted back as a request (the web UI sends its settings).
    status, r = chat(server, **{**params, "max_tokens": 8, "n_predict": 8})
    assert status == 200, r


def test_tokenize_and_detokenize_round_trip(server):
    text = "Hello world, ¿qué tal?"
    status, r = post(server, "/tokenize", {"content": text})
    assert status == 200 and all(isinstance(t, int) for t in r["tokens"])
    ids = r["tokens"]
    status, back = post(server, "/detokenize", {"tokens": ids})
    assert status == 200 and back == {"content": text}
    status, r = post(server, "/tokenize", {"content": text, "with_pieces": True})
    assert [t["id"] for t in r["tokens"]] == ids
    assert "".join(p["piece"] if isinstance(p["piece"], str) else bytes(p["piece"]).decode("latin-1")
                   for p in r["tokens"]).startswith("Hello world")
    status, special = post(server, "/tokenize", {"content": "<|im_start|>hi"})
    assert len(special["tokens"]) < len(post(server, "/tokenize", {"content": "<|im_start|>hi",
                                                                  "parse_special": False})[1]["tokens"])
    status, r = post(server, "/detokenize", {"tokens": [10**9]})
    assert status == 400 and "tokens" in r["error"]["message"]


def test_native_completion_whole_and_streamed(server):
    body = {"prompt": "1, 2, 3,", "n_predict": 12, "temperature": 0, "stop": [" 6"]}
    status, whole = post(server, "/completion", body)
    assert status == 200 and whole["stop"] is True and whole["stop_type"] == "word" and whole["stopping_word"] == " 6"
    assert " 4" in whole["content"] and " 6" not in whole["content"]
    assert whole["tokens_predicted"] == whole["timings"]["predicted_n"] > 0
    assert whole["tokens_evaluated"] == whole["timings"]["prompt_n"] + whole["tokens_cached"] > 0
    assert whole["tokens_cached"] == whole["timings"]["cache_n"]
    assert whole["generation_settings"]["n_ctx"] == 4096 and whole["speculative"]["target_calls"] >= 1
    status, openai_style = post(server, "/v1/completions", {"prompt": "1, 2, 3,", "max_tokens": 12, "temperature": 0,
                                                            "stop": [" 6"]})
    assert openai_style["choices"][0]["text"] == whole["content"]

    status, headers, raw = call(server, "POST", "/completion", {**body, "stream": True}, KEY)
    lines = [json.loads(e) for e in events(raw)]
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream") and b"[DONE]" not in raw
    assert all(x["stop"] is False and "content" in x for x in lines[:-1])
    # (how many tokens were decoded past the stop string depends on the drafts: not compared)
    assert lines[-1]["stop"] is True and lines[-1]["stop_type"] == "word" and lines[-1]["tokens_predicted"] > 0
    assert "".join(x["content"] for x in lines) == whole["content"]

    status, limited = post(server, "/completion", {"prompt": "Once upon a time", "n_predict": 5, "temperature": 0})
    assert limited["stop_type"] == "limit" and limited["tokens_predicted"] == 5
    status, r = post(server, "/completion", {"prompt": [1, 2, 3]})
    assert status == 400 and r["error"]["param"] == "prompt"
    status, r = post(server, "/completion", {"prompt": "Is the sky blue? Answer:", "n_predict": 8,
                                             "grammar": 'root ::= " yes" | " no"'})
    assert status == 200 and r["content"] in (" yes", " no")
    status, r = post(server, "/completion", {"prompt": "Colour as JSON:", "n_predict": 24, "json_schema": SCHEMA})
    assert status == 200 and json.loads(r["content"])["c"] in ("red", "blue")


def _metrics(served) -> dict[str, float]:
    status, headers, raw = call(served, "GET", "/metrics", headers=KEY)
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    out = {}
    for line in raw.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_count_requests_tokens_and_accepted_drafts(server):
    before = _metrics(server)
    status, r = post(server, "/completion", {"prompt": "a b c a b c a b c a b c", "n_predict": 16, "temperature": 0})
    after = _metrics(server)
    assert after["specgen:requests_total"] == before["specgen:requests_total"] + 1
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == r["tokens_predicted"]
    assert after["llamacpp:prompt_tokens_total"] - before["llamacpp:prompt_tokens_total"] == \
        r["tokens_evaluated"] - r["tokens_cached"]
    assert after["llamacpp:prompt_tokens_cached_total"] - before["llamacpp:prompt_tokens_cached_total"] == \
        r["tokens_cached"]
    accepted = after["llamacpp:spec_decode_num_accepted_tokens_total"] - \
        before["llamacpp:spec_decode_num_accepted_tokens_total"]
    assert accepted == r["timings"]["draft_n_accepted"] > 0  # a repetitive text: lookup drafts it
    by_source = {k: v for k, v in after.items() if k.startswith("specgen:accepted_tokens_total{")}
    # Accepted tokens by source: the drafters' (llama.cpp's counter) and a grammar's forced ones.
    assert sum(by_source.values()) == after["llamacpp:spec_decode_num_accepted_tokens_total"] + \
        after['specgen:forced_tokens_total{state="accepted"}']
    assert after["llamacpp:n_decode_total"] - before["llamacpp:n_decode_total"] == r["speculative"]["target_calls"]
    assert after["llamacpp:requests_processing"] == 0 and after["llamacpp:requests_deferred"] == 0
    assert after["llamacpp:n_busy_slots_per_decode"] == 1
    _, headers, _ = call(server, "GET", "/metrics", headers=KEY)
    assert 0 < time.time() - int(headers["Process-Start-Time-Unix"]) < 3600
    t = r["timings"]  # llama-server's derived figures, as its web UI shows them
    assert t["predicted_per_token_ms"] == pytest.approx(t["predicted_ms"] / t["predicted_n"], abs=1e-3)
    assert t["prompt_per_token_ms"] == pytest.approx(t["prompt_ms"] / t["prompt_n"], abs=1e-3)
    assert t["prompt_per_second"] == pytest.approx(1000 / t["prompt_per_token_ms"], rel=1e-2)


def test_every_route_but_health_needs_the_key(server):
    for method, path in (("GET", "/props"), ("GET", "/metrics"), ("GET", "/models"), ("POST", "/tokenize"),
                         ("POST", "/completion"), ("POST", "/chat/completions")):
        status, _, raw = call(server, method, path, {} if method == "POST" else None)
        assert status == 401 and "Authorization" in json.loads(raw)["error"]["message"], path
    status, _, raw = call(server, "GET", "/props", headers={"X-Api-Key": "sesame"})  # Anthropic's header
    assert status == 200 and json.loads(raw)["total_slots"] == 1
    status, _, raw = call(server, "GET", "/props", headers={"X-Api-Key": "sesame2"})
    assert status == 401


# --- CORS ------------------------------------------------------------------------------------


def test_cors_star_lets_any_origin_call(server):
    asked = "authorization, content-type, x-stainless-os, x-stainless-retry-count"
    status, headers, raw = call(server, "OPTIONS", "/v1/chat/completions", headers={
        "Origin": "http://app.test", "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": asked})
    assert status == 204 and raw == b""  # no key needed for a preflight
    assert headers["Access-Control-Allow-Origin"] == "*"
    assert "POST" in headers["Access-Control-Allow-Methods"] and "GET" in headers["Access-Control-Allow-Methods"]
    assert headers["Access-Control-Allow-Headers"] == asked
    origin = {"Origin": "http://app.test"}
    for method, path, body, headers_, want in (
            ("GET", "/v1/models", None, KEY, 200), ("GET", "/health", None, {}, 200),
            ("POST", "/v1/chat/completions", {"messages": ASK, "max_tokens": 2, "stream": True}, KEY, 200),
            ("POST", "/completion", {"prompt": "hi", "n_predict": 2}, {}, 401),
            ("GET", "/nothing", None, KEY, 404)):
        status, headers, _ = call(server, method, path, body, {**headers_, **origin})
        assert status == want and headers["Access-Control-Allow-Origin"] == "*", (path, status)


def test_cors_is_off_unless_asked(plain_server):
    """Without --cors no page of another site may call the server from a browser: a preflight is
    refused in one line that names the flag, and no answer carries Access-Control-Allow-Origin."""
    preflight = {"Origin": "http://app.test", "Access-Control-Request-Method": "POST"}
    status, headers, raw = call(plain_server, "OPTIONS", "/v1/chat/completions", headers=preflight)
    assert status == 403 and b"--cors" in raw and headers.get("Access-Control-Allow-Origin") is None
    status, headers, _ = call(plain_server, "GET", "/v1/models", headers={"Origin": "http://app.test"})
    assert status == 200 and headers.get("Access-Control-Allow-Origin") is None


def test_cors_origin_limits_browsers_to_the_origins_given(small):
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    status, headers, _ = call(small, "OPTIONS", "/v1/completions", headers={"Origin": "http://good.test", **preflight})
    assert status == 204 and headers["Access-Control-Allow-Origin"] == "http://good.test"
    assert headers["Vary"] == "Origin"
    status, headers, _ = call(small, "OPTIONS", "/v1/completions", headers={"Origin": "http://evil.test", **preflight})
    assert status == 403 and headers.get("Access-Control-Allow-Origin") is None
    status, headers, _ = call(small, "GET", "/v1/models", headers={"Origin": "http://evil.test"})
    assert status == 200 and headers.get("Access-Control-Allow-Origin") is None
    status, headers, _ = call(small, "GET", "/v1/models", headers={"Origin": "http://good.test"})
    assert headers["Access-Control-Allow-Origin"] == "http://good.test"


# --- limits as local servers have them -------------------------------------------------------


def test_any_number_of_stop_strings(server, baseline):
    cut = baseline[3:6]
    stops = [f"never{i}" for i in range(9)] + [cut]
    status, r = chat(server, stop=stops)
    assert status == 200 and r["choices"][0]["finish_reason"] == "stop"
    assert r["choices"][0]["message"]["content"] == baseline[:baseline.find(cut)]


@pytest.mark.parametrize("limit", [{"max_tokens": -1}, {}, {"max_tokens": 10**6}, {"n_predict": -1}])
def test_no_limit_runs_until_the_context_ends(small, limit):
    n_ctx = json.loads(call(small, "GET", "/props")[2])["default_generation_settings"]["n_ctx"]
    assert CTX <= n_ctx < 4096
    status, r = post(small, "/v1/completions", {"prompt": "Count: 1, 2, 3, 4,", "temperature": 0, **limit}, {})
    assert status == 200 and r["choices"][0]["finish_reason"] == "length", r
    used = r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"]
    assert n_ctx - 2 <= used <= n_ctx


def test_a_model_that_stops_ends_a_request_without_a_limit(server):
    status, r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hi."}],
                                                      "temperature": 0, "max_tokens": -1})
    assert status == 200 and r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] < 200


def test_n_above_one_is_refused_as_llama_server_refuses_it(server):
    status, r = chat(server, n=2)
    assert status == 400 and r["error"]["param"] == "n" and "only one completion choice" in r["error"]["message"]
    assert chat(server, n=1)[0] == 200


def test_reasoning_format_auto_is_accepted_where_the_template_has_no_reasoning(server, baseline):
    status, r = chat(server, reasoning_format="auto")  # smollm2's template writes no <think>: auto parses nothing
    assert status == 200 and _content(r) == baseline


# --- every documented field acts or is refused -----------------------------------------------

# OpenAI's chat.completions.create parameters, and llama-server's (its /completion options, which
# its /v1/chat/completions takes too, and the chat-only ones its README lists).
OPENAI_FIELDS = (
    "messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
    "max_completion_tokens", "max_tokens", "metadata", "modalities", "n", "parallel_tool_calls", "prediction",
    "presence_penalty", "prompt_cache_key", "prompt_cache_retention", "reasoning_effort", "response_format",
    "safety_identifier", "seed", "service_tier", "stop", "store", "stream", "stream_options", "temperature",
    "tool_choice", "tools", "top_logprobs", "top_p", "user", "verbosity", "web_search_options")
LLAMA_SERVER_FIELDS = (
    "temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p", "min_p", "n_predict", "n_indent",
    "n_keep", "n_cmpl", "n_cache_reuse", "stream", "stop", "typical_p", "repeat_penalty", "repeat_last_n",
    "presence_penalty", "frequency_penalty", "dry_multiplier", "dry_base", "dry_allowed_length",
    "dry_penalty_last_n", "dry_sequence_breakers", "xtc_probability", "xtc_threshold", "mirostat", "mirostat_tau",
    "mirostat_eta", "grammar", "json_schema", "seed", "ignore_eos", "logit_bias", "n_probs", "min_keep",
    "t_max_predict_ms", "id_slot", "cache_prompt", "return_tokens", "samplers", "timings_per_token",
    "return_progress", "sse_ping_interval", "post_sampling_probs", "response_fields", "lora", "top_n_sigma",
    "chat_template_kwargs", "reasoning_effort", "reasoning_format", "reasoning_control", "generation_prompt",
    "parse_tool_calls", "parallel_tool_calls", "n_discard", "continue_final_message")

# Refused: (a value that asks for something, the neutral value accepted silently).
REFUSED = {
    "typical_p": (0.5, 1), "typ_p": (0.5, 1), "top_n_sigma": (1.0, -1), "dynatemp_range": (0.5, 0), "mirostat": (2, 0),
    "dry_multiplier": (0.8, 0), "xtc_probability": (0.5, 0), "post_sampling_probs": (True, False),
    "min_keep": (5, 0), "ignore_eos": (True, False), "n": (2, 1), "n_cmpl": (2, 1), "best_of": (2, 1),
    "echo": (True, False), "suffix": ("x", ""), "input_prefix": ("x", ""), "input_suffix": ("x", ""),
    "n_indent": (4, 0),
    "t_max_predict_ms": (100, 0), "functions": ([WEATHER["function"]], []), "function_call": ("auto", "none"),
    "parse_tool_calls": (False, True), "continue_final_message": (False, True),
    "audio": ({"voice": "alloy", "format": "wav"}, None), "modalities": (["text", "audio"], ["text"]),
    "prediction": ({"type": "content", "content": "Red"}, None), "reasoning_effort": ("low", None),
    "verbosity": ("low", None), "web_search_options": ({"search_context_size": "low"}, None),
    "chat_template_kwargs": ({"enable_thinking": False}, {}), "return_tokens": (True, False),
    "response_fields": (["content"], []), "lora": ([{"id": 0, "scale": 0.5}], []), "id_slot": (3, -1),
    "reasoning_format": ("deepseek", "none"), "reasoning_control": (True, False), "generation_prompt": ("x", ""),
    "add_generation_prompt": (False, True), "grammar_lazy": (True, False),
    "grammar_triggers": ([{"type": "word", "value": "x"}], []), "preserved_tokens": (["<x>"], []),
    "verbose": (True, False), "adaptive_target": (0.5, -1),
}
CHECKED = ("reasoning_format",)  # read by requests.py, refused there unless neutral
# Asked of a model that writes no reasoning (smollm2), these change nothing and are answered, with a
# note in X-Specgen-Notes (serve/ecosystem.py): as llama-server answers them there.
NOTED = ("chat_template_kwargs", "reasoning_control", "reasoning_effort", "reasoning_format")
# Tune a refused setting: no effect while it is neutral; with it on, the 400 names it.
DEPENDENT = {"dynatemp_exponent": (2.0, "dynatemp_range"),
             "mirostat_tau": (3.0, "mirostat"), "mirostat_eta": (0.2, "mirostat"), "dry_base": (2.0, "dry_multiplier"),
             "dry_allowed_length": (4, "dry_multiplier"), "dry_penalty_last_n": (32, "dry_multiplier"),
             "dry_sequence_breakers": (["\n"], "dry_multiplier"), "xtc_threshold": (0.2, "xtc_probability"),
             "adaptive_decay": (0.5, "adaptive_target")}
# Never change the text.
INERT = {"user": "u1", "metadata": {"k": "v"}, "store": True, "service_tier": "default", "safety_identifier": "s",
         "prompt_cache_key": "k", "prompt_cache_retention": "24h", "n_keep": 10,
         "n_discard": 5, "n_cache_reuse": 256, "timings_per_token": True, "return_progress": True,
         "sse_ping_interval": 5, "backend_sampling": True}


def test_samplers_are_followed_as_llama_server_follows_them(server):
    """llama-server's `samplers` (names, or a string of their letters) is followed: what it leaves
    out does not act and the note says so; a sampler specgen lacks is refused by name only where the
    request turns it on; an order specgen cannot follow (penalties after a truncation) is a 400."""
    body = {"prompt": "The three primary colors are", "n_predict": 8, "temperature": 1.5, "top_p": 0.6, "seed": 3}
    status, r = post(server, "/completion", {**body, "samplers": "pt"})  # top_p, then temperature
    assert status == 200 and r["generation_settings"]["samplers"] == ["top_p", "temperature"], r
    assert post(server, "/completion", {**body, "samplers": ["top_p", "temperature"]})[1]["content"] == r["content"]
    status, r = post(server, "/completion", {**body, "samplers": ["typ_p", "temperature"], "typical_p": 0.5})
    assert status == 400 and r["error"]["param"] == "typical_p", r
    status, headers, _ = call(server, "POST", "/completion", {**body, "samplers": ["temperature"], "typical_p": 0.5},
                              KEY)
    assert status == 200 and "typical_p 0.5 changed nothing: samplers leaves out typ_p" in headers[NOTES_HEADER]
    status, headers, _ = call(server, "POST", "/v1/chat/completions",
                              {"messages": ASK, "max_tokens": 4, "temperature": 0, "seed": 1, "samplers": ["top_k"]}, KEY)
    assert status == 200 and "temperature 0 changed nothing: samplers leaves out temperature" in headers[NOTES_HEADER]
    status, r = post(server, "/completion", {**body, "top_k": 40, "repeat_penalty": 1.3,
                                             "samplers": ["top_k", "penalties", "temperature"]})
    assert status == 400 and r["error"]["param"] == "samplers" and "penalties after top_k" in r["error"]["message"], r
    for bad in (3, ["top_k", 1], ["infill"]):
        status, r = post(server, "/v1/completions", {"prompt": "Hi", "max_tokens": 2, "samplers": bad})
        assert status == 400 and r["error"]["param"] == "samplers" and "\n" not in r["error"]["message"], r


def _content(r):
    return r["choices"][0]["message"]["content"]


def _sampled(server, **fields):
    return [_content(chat(server, temperature=1.5, max_tokens=12, seed=seed, **fields)[1]) for seed in (1, 2, 3, 4)]


def acts_temperature(server, baseline):
    assert any(not text.startswith(baseline) for text in _sampled(server))


def acts_top_k(server, baseline):
    assert all(text.startswith(baseline) for text in _sampled(server, top_k=1))


def acts_top_p(server, baseline):
    assert all(text.startswith(baseline) for text in _sampled(server, top_p=0.001))


def acts_samplers(server, baseline):
    """llama.cpp's order: the nucleus before temperature (llama.cpp's default) is narrower at T 1.5
    than after it (specgen's own chain, which a request without `samplers` gets)."""
    own = _sampled(server, top_p=0.6)
    assert _sampled(server, top_p=0.6, samplers=["temperature", "top_p"]) == own
    assert _sampled(server, top_p=0.6, samplers=["top_p", "temperature"]) != own


def acts_seed(server, baseline):
    texts = _sampled(server)
    assert len(set(texts)) > 1 and _sampled(server) == texts  # seeds differ; the same seed repeats


def acts_max_tokens(server, baseline):
    assert chat(server, max_tokens=3)[1]["usage"]["completion_tokens"] == 3


def acts_max_completion_tokens(server, baseline):
    status, r = post(server, "/v1/chat/completions", {"messages": ASK, "temperature": 0, "max_completion_tokens": 2})
    assert r["usage"]["completion_tokens"] == 2


def acts_n_predict(server, baseline):
    status, r = post(server, "/v1/chat/completions", {"messages": ASK, "temperature": 0, "n_predict": 4})
    assert r["usage"]["completion_tokens"] == 4


def acts_stop(server, baseline):
    cut = baseline[3:6]
    assert _content(chat(server, stop=cut)[1]) == baseline[:baseline.find(cut)]


def acts_stream(server, baseline):
    status, headers, raw = call(server, "POST", "/v1/chat/completions",
                                {"messages": ASK, "max_tokens": 8, "temperature": 0, "stream": True}, KEY)
    chunks = [json.loads(e) for e in events(raw) if e != "[DONE]"]
    assert headers["Content-Type"].startswith("text/event-stream") and events(raw)[-1] == "[DONE]"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == baseline


def acts_stream_options(server, baseline):
    status, headers, raw = call(server, "POST", "/v1/chat/completions", {
        "messages": ASK, "max_tokens": 8, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}},
        KEY)
    last = json.loads(events(raw)[-2])
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 8


REPEAT = [{"role": "user", "content": "Write the word cat twenty times, separated by commas."}]


def _repeated(server, **fields):
    """The answer to a prompt that invites repetition, 24 tokens, greedy."""
    status, r = post(server, "/v1/chat/completions", {"messages": REPEAT, "max_tokens": 24, "temperature": 0,
                                                      **fields})
    assert status == 200, r
    return _content(r)


def acts_repeat_penalty(server, baseline):
    assert _repeated(server, repeat_penalty=1.8) != _repeated(server)


def acts_repeat_last_n(server, baseline):
    assert _repeated(server, repeat_penalty=1.8, repeat_last_n=0) == _repeated(server)  # 0: no window, no penalty
    assert _repeated(server, repeat_penalty=1.8, repeat_last_n=2) != _repeated(server, repeat_penalty=1.8)


def acts_penalty_last_n(server, baseline):  # llama.cpp's other name for repeat_last_n
    assert _repeated(server, repeat_penalty=1.8, penalty_last_n=2) == _repeated(server, repeat_penalty=1.8,
                                                                                 repeat_last_n=2)
    assert _repeated(server, repeat_penalty=1.8, penalty_last_n=2) != _repeated(server, repeat_penalty=1.8)


def acts_presence_penalty(server, baseline):
    assert _repeated(server, presence_penalty=2) != _repeated(server)


def acts_frequency_penalty(server, baseline):
    assert _repeated(server, frequency_penalty=2) != _repeated(server)


def acts_min_p(server, baseline):
    assert all(text.startswith(baseline) for text in _sampled(server, min_p=0.99))


def acts_logit_bias(server, baseline):
    first = post(server, "/tokenize", {"content": baseline})[1]["tokens"][0]
    piece = post(server, "/detokenize", {"tokens": [first]})[1]["content"]
    for bias in ({str(first): -100}, [[first, False]]):  # OpenAI's object, llama-server's pairs
        status, r = chat(server, logit_bias=bias)
        assert status == 200 and not _content(r).startswith(piece), r


def _logprobs(r):
    return r["choices"][0]["logprobs"]["content"]


def acts_logprobs(server, baseline):
    status, r = chat(server, logprobs=True)
    entries = _logprobs(r)
    assert "".join(e["token"] for e in entries) == baseline == _content(r)
    assert all(e["logprob"] <= 0 and e["top_logprobs"] == [] and bytes(e["bytes"]).decode() == e["token"]
               for e in entries)


def acts_top_logprobs(server, baseline):
    entries = _logprobs(chat(server, logprobs=True, top_logprobs=3)[1])
    for e in entries:  # greedy: the chosen token is the likeliest
        tops = [t["logprob"] for t in e["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and e["top_logprobs"][0]["token"] == e["token"]
    status, r = chat(server, logprobs=True, top_logprobs=21)
    assert status == 400 and r["error"]["param"] == "top_logprobs" and "[0, 20]" in r["error"]["message"], r


def acts_n_probs(server, baseline):
    entries = _logprobs(chat(server, n_probs=2)[1])  # llama-server's name: the same numbers
    assert "".join(e["token"] for e in entries) == baseline and all(len(e["top_logprobs"]) == 2 for e in entries)


def _color(r):
    return json.loads(_content(r))["c"] in ("red", "blue")


def acts_response_format(server, baseline):
    assert _color(chat(server, max_tokens=24, response_format={
        "type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}})[1])


def acts_json_schema(server, baseline):
    assert _color(chat(server, max_tokens=24, json_schema=SCHEMA)[1])


def acts_grammar(server, baseline):
    assert _content(chat(server, grammar='root ::= "yes" | "no"')[1]) in ("yes", "no")


def acts_tools(server, baseline):
    r = chat(server, max_tokens=48, tools=[WEATHER], tool_choice="required")[1]
    assert r["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def acts_tool_choice(server, baseline):
    r = chat(server, max_tokens=48, tools=[WEATHER], tool_choice={"type": "function",
                                                                   "function": {"name": "get_weather"}})[1]
    assert r["choices"][0]["finish_reason"] == "tool_calls"


TWO_CITIES = [{"role": "user", "content": "What is the weather in Rome and in Paris? Call the tool for each city."}]


def acts_parallel_tool_calls(server, baseline):
    """false: one call at most in the answer (with tool_choice required: exactly one)."""
    status, r = post(server, "/v1/chat/completions", {"messages": TWO_CITIES, "max_tokens": 96, "temperature": 0,
                                                      "tools": [WEATHER], "tool_choice": "required",
                                                      "parallel_tool_calls": False})
    assert status == 200 and len(r["choices"][0]["message"]["tool_calls"]) == 1, r
    status, r = chat(server, parallel_tool_calls="no")
    assert status == 400 and r["error"]["param"] == "parallel_tool_calls" and "true or false" in r["error"]["message"]


def acts_cache_prompt(server, baseline):
    """false: the whole prompt is read (nothing kept), the same answer (tests/test_prompt_cache.py)."""
    status, r = chat(server, cache_prompt=False)
    assert status == 200 and r["timings"]["cache_n"] == 0 and _content(r) == baseline
    status, r = chat(server, cache_prompt="no")
    assert status == 400 and r["error"]["param"] == "cache_prompt" and "true or false" in r["error"]["message"]


def acts_model(server, baseline):
    assert chat(server, model="my-model")[1]["model"] == "my-model"


def acts_messages(server, baseline):
    other = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Write a haiku."}],
                                                  "max_tokens": 8, "temperature": 0})[1]
    assert _content(other) != baseline


ACTS = {name[len("acts_"):]: f for name, f in globals().items() if name.startswith("acts_")}
CHAT_FIELDS = fields.ROUTES["/v1/chat/completions"]
EVERY_FIELD = sorted(CHAT_FIELDS)


def test_every_documented_field_is_known_and_classified_once():
    """The chat route's table (fields.py) holds every field OpenAI and llama-server document; each is
    read by requests.py (and tested to act here), or refused, dependent or inert in fields.py, once."""
    assert set(OPENAI_FIELDS) | set(LLAMA_SERVER_FIELDS) <= CHAT_FIELDS
    real = [CHAT_FIELDS - set(fields.REFUSED) - set(fields.DEPENDENT) - set(fields.INERT), set(fields.REFUSED),
            set(fields.DEPENDENT), set(fields.INERT)]
    for name in CHAT_FIELDS:
        assert sum(name in k for k in real) == 1, name
    # This file's values cover the real tables exactly: every field of the chat route is sent below.
    assert set(ACTS) | set(CHECKED) == real[0]
    assert set(REFUSED) == set(fields.REFUSED) | set(CHECKED)
    assert {k: (t,) for k, (_, t) in DEPENDENT.items()} == fields.DEPENDENT
    assert set(INERT) == set(fields.INERT)


@pytest.mark.parametrize("name", EVERY_FIELD)
def test_each_field_acts_or_is_refused_by_name(server, baseline, name):
    if name in ACTS:
        ACTS[name](server, baseline)
    elif name in NOTED:  # smollm2's template writes no reasoning and reads no such variable: said, not refused
        asks, neutral = REFUSED[name]
        status, headers, raw = call(server, "POST", "/v1/chat/completions",
                                    {"messages": ASK, "max_tokens": 8, "temperature": 0, name: asks}, KEY)
        assert status == 200 and _content(json.loads(raw)) == baseline, raw
        assert headers.get(NOTES_HEADER) and "\n" not in headers[NOTES_HEADER], dict(headers)
    elif name in REFUSED:
        asks, neutral = REFUSED[name]
        status, r = chat(server, **{name: asks})
        assert status == 400 and r["error"]["param"] == name and name in r["error"]["message"], r
        status, r = chat(server, **{name: neutral})  # asks for nothing: accepted, and changes nothing
        assert status == 200 and _content(r) == baseline, r
    elif name in DEPENDENT:
        value, tunes = DEPENDENT[name]
        status, r = chat(server, **{name: value})
        assert status == 200 and _content(r) == baseline, r
        status, r = chat(server, **{name: value, tunes: REFUSED[tunes][0]})
        assert status == 400 and r["error"]["param"] == tunes, r
    else:
        status, r = chat(server, **{name: INERT[name]})
        assert status == 200 and _content(r) == baseline, r


# --- a field a route does not know is refused by name ------------------------------------------

# VALID (harness): a request each route answers 200.
# A value of each field the routes read that asks for nothing beyond the request's own (fields.py's
# refused, dependent and inert ones: their neutral values above).
NEUTRAL = {"messages": ASK, "prompt": "1, 2,", "model": "m", "max_tokens": 4, "max_completion_tokens": 4,
           "n_predict": 4, "temperature": 0, "top_p": 1, "top_k": 40, "min_p": 0, "seed": 1, "repeat_penalty": 1,
           "repeat_last_n": 64, "penalty_last_n": 64, "presence_penalty": 0, "frequency_penalty": 0,
           "logit_bias": {}, "stop": [], "stream": False, "stream_options": {}, "logprobs": False,
           "top_logprobs": 0, "n_probs": 0, "response_format": {"type": "text"}, "json_schema": None, "grammar": "",
           "tools": [], "tool_choice": "none", "parallel_tool_calls": True, "content": "hi", "add_special": False,
           "parse_special": True, "with_pieces": False, "tokens": [1], "input": "hi", "encoding_format": "float",
           "dimensions": None, "embd_normalize": 2, "cache_prompt": True, "samplers": ["penalties", "top_k", "temperature"],
           **{k: neutral for k, (_, neutral) in REFUSED.items()}, **{k: v for k, (v, _) in DEPENDENT.items()}, **INERT}


def test_a_misspelt_field_is_refused_by_name_on_every_openai_route_and_named_on_llama_servers(server):
    """OpenAI's routes refuse a field they do not know; llama-server's own routes ignore it, as
    llama-server does, and name it in X-Specgen-Ignored-Fields (serve/ecosystem.py)."""
    assert set(VALID) == set(fields.ROUTES)
    for path, body in VALID.items():
        assert post(server, path, body)[0] == 200, path
        if path in NATIVE:
            status, headers, raw = call(server, "POST", path, {**body, "temprature": 0.5}, KEY)
            assert status == 200 and headers.get(IGNORED_HEADER) == "temprature", (path, raw, dict(headers))
            continue
        status, r = post(server, path, {**body, "temprature": 0.5})
        e = r["error"]
        assert status == 400 and e["param"] == "temprature" and e["code"] == "unknown_parameter", (path, r)
        assert e["type"] == "invalid_request_error" and \
            e["message"].startswith("Unrecognized request argument supplied: temprature"), (path, r)
    status, r = chat(server, temprature=0.5)  # the chat route knows temperature: the message says so
    assert r["error"]["message"] == "Unrecognized request argument supplied: temprature (did you mean temperature?)"
    status, r = post(server, "/v1/chat/completions", {"messages": ASK, "max_tokens": 2, "temprature": 0.5, "xyz": 1})
    assert status == 400 and r["error"]["param"] == "temprature", r
    assert r["error"]["message"] == ("Unrecognized request arguments supplied: temprature (did you mean "
                                     "temperature?), xyz")


def test_a_reader_cannot_read_a_field_its_route_does_not_declare():
    """Every read goes through the route's table: a field read and not declared would be refused as
    unknown when sent, so the read itself raises (any request a test sends would show it)."""
    from specgen.serve.body import body_json

    body = body_json(b'{"content": "hi"}', fields.ROUTES["/tokenize"])
    assert body.get("content") == "hi" and body.get("add_special", False) is False
    with pytest.raises(LookupError, match="'temperature'"):
        body.get("temperature")
    with pytest.raises(LookupError, match="'tokens'"):
        body["tokens"]


def test_every_declared_field_at_a_neutral_value_is_accepted(server):
    """Each route's table (fields.ROUTES) sent whole, every field at a value that asks for nothing."""
    for path, known in fields.ROUTES.items():
        assert known <= set(NEUTRAL), (path, known - set(NEUTRAL))
        status, r = post(server, path, {name: NEUTRAL[name] for name in known})
        assert status == 200, (path, r)


def test_apply_template_gives_the_text_a_chat_request_reads(server):
    status, r = post(server, "/apply-template", {"messages": ASK})
    assert status == 200 and r["prompt"].endswith("<|im_start|>assistant\n") and "Name three colours." in r["prompt"]
    status, tokens = post(server, "/tokenize", {"content": r["prompt"], "add_special": True})
    status, chat_r = chat(server, max_tokens=1)
    assert len(tokens["tokens"]) == chat_r["usage"]["prompt_tokens"]  # the very text the model reads
    status, r = post(server, "/apply-template", {"messages": []})
    assert status == 400 and r["error"]["param"] == "messages"
