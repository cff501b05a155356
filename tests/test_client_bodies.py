"""Real clients' request bodies, recorded from their sources into tests/data/client-bodies/ (each
file's "source" says which files and which settings), replayed against a real `specgen serve`:
each ecosystem's body read as its ecosystem reads it (docs/serve.md, "Whose rules a body follows").
OpenAI's routes still refuse a misspelt field by name; llama-server's own routes ignore a key they
do not know and name it in the X-Specgen-Ignored-Fields header and the server's log; a request for
reasoning on a model that writes none is answered, and says so; chat_template_kwargs reach the
chat template."""

import json
from pathlib import Path

import pytest

from harness import Server, call, events
from specgen.serve import fields

pytestmark = pytest.mark.real

BODIES = Path(__file__).parent / "data" / "client-bodies"
CLIENTS = {p.stem: json.loads(p.read_text()) for p in sorted(BODIES.glob("*.json"))}
CASES = [(name, i) for name, d in CLIENTS.items() for i in range(len(d["requests"]))]
LIMIT = 8  # the recorded token limits (300, 4096) cut to this; bodies without one get the server's -n
IGNORED, NOTES = "X-Specgen-Ignored-Fields", "X-Specgen-Notes"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Its own: its log (stderr) is a file the tests read."""
    served = Server("--method", "plain", "-n", str(LIMIT), log=tmp_path_factory.mktemp("serve") / "stderr.log")
    yield served
    served.stop()


def post(server, path: str, body: dict):
    """(status, headers, raw bytes)."""
    return call(server, "POST", path, body)


def _capped(body: dict) -> dict:
    return {**body, **{k: LIMIT for k in ("max_tokens", "n_predict", "max_completion_tokens")
                       if isinstance(body.get(k), int) and body[k] > LIMIT}}


def _text(route: str, body: dict, raw: bytes) -> str:
    """The answer's text, each shape checked whole (a stream's end included)."""
    if route == "/tokenize":
        tokens = json.loads(raw)["tokens"]
        assert tokens and all(isinstance(t, int) for t in tokens)
        return str(tokens)
    if not body.get("stream"):
        r = json.loads(raw)
        return r["content"] if route == "/completion" else r["choices"][0]["message"]["content"]
    streamed = events(raw)
    if route == "/completion":  # llama-server's stream: pieces, then the whole object with stop true, no [DONE]
        chunks = [json.loads(e) for e in streamed]
        assert chunks[-1]["stop"] is True and chunks[-1]["stop_type"] in ("eos", "limit", "word")
        return "".join(c["content"] for c in chunks)
    assert streamed[-1] == "[DONE]"
    chunks = [json.loads(e) for e in streamed[:-1]]
    assert [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    if body.get("stream_options", {}).get("include_usage"):
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


@pytest.mark.parametrize("client,index", CASES, ids=[f"{c}-{i}" for c, i in CASES])
def test_every_recorded_body_is_answered(server, client, index):
    request = CLIENTS[client]["requests"][index]
    route, body = request["route"], _capped(request["body"])
    status, headers, raw = post(server, route, body)
    assert status == 200, (client, raw[:300])
    text = _text(route, body, raw)
    assert text.strip(), (client, raw[:300])
    unknown = sorted(set(body) - fields.ROUTES[route] - {"thinking_budget_tokens"})
    named = [n for n in (headers.get(IGNORED) or "").split(", ") if n]
    if route.startswith("/v1/"):
        assert not unknown and not named  # OpenAI's routes: every key known (or the 400 above)
    else:
        assert set(unknown) <= set(named), (named, unknown)  # each key llama-server would ignore, named


def test_sillytavern_keys_of_other_backends_are_ignored_and_named(server):
    """SillyTavern's llama.cpp mode posts every backend's settings to /completion; llama-server
    ignores those it does not know, and so does specgen, naming them in the header and the log. Its
    sampler order (llama.cpp's default, temperature last) is followed; the names in it that
    llama-server does not know (tfs_z, typical_p) are skipped, as llama-server skips them, and said."""
    body = _capped(CLIENTS["sillytavern"]["requests"][0]["body"])
    status, headers, _ = post(server, "/completion", body)
    named = headers[IGNORED].split(", ")
    assert status == 200 and {"truncation_length", "top_a", "api_server", "typical"} <= set(named)
    assert "temperature" not in named and "n_predict" not in named and "samplers" not in named
    assert 'llama-server knows no sampler \\"tfs_z\\", \\"typical_p\\": skipped' in headers[NOTES], headers[NOTES]
    status, _, raw = post(server, "/completion", {**body, "stream": False})
    settings = json.loads(raw)["generation_settings"]
    assert settings["samplers"] == ["top_k", "top_p", "min_p", "temperature"], settings
    logged = [line for line in server.log.read_text().splitlines() if "POST /completion" in line]
    assert any("truncation_length" in line and "api_server" in line for line in logged), logged


def test_tokenize_ignores_a_model_key(server):
    status, headers, raw = post(server, "/tokenize", {"content": "hi there", "model": "llama"})
    assert status == 200 and json.loads(raw)["tokens"] and headers[IGNORED] == "model"
    assert any("POST /tokenize: ignored model" in line for line in server.log.read_text().splitlines())
    status, headers, _ = post(server, "/detokenize", {"tokens": [1, 2], "with_pieces": True})
    assert status == 200 and headers[IGNORED] == "with_pieces"


def test_a_misspelt_field_is_still_refused_on_openai_routes(server):
    """OpenAI's routes answer an unknown field as OpenAI does; llama-server's routes ignore it."""
    webui = CLIENTS["llamacpp-webui"]["requests"][0]["body"]
    for route, body in (("/v1/chat/completions", {**webui, "stream": False}),
                        ("/chat/completions", {"messages": webui["messages"]}),
                        ("/v1/completions", {"prompt": "1, 2,"})):
        status, _, raw = post(server, route, {**body, "max_tokens": 2, "temprature": 0.5})
        e = json.loads(raw)["error"]
        assert status == 400 and e["param"] == "temprature" and e["code"] == "unknown_parameter", (route, e)
        assert e["message"].startswith("Unrecognized request argument supplied: temprature"), e
    status, headers, _ = post(server, "/completion", {"prompt": "1, 2,", "n_predict": 2, "temprature": 0.5})
    assert status == 200 and headers[IGNORED] == "temprature"


def test_reasoning_asked_of_a_model_without_it_is_answered_and_said(server):
    """smollm2's template writes no reasoning: each way of asking for it asks for nothing here."""
    ask = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
    status, _, raw = post(server, "/v1/chat/completions", ask)
    plain = json.loads(raw)["choices"][0]["message"]["content"]
    asking = {"reasoning_format": "deepseek", "reasoning_control": True, "reasoning_effort": "high",
              "thinking_budget_tokens": 256, "chat_template_kwargs": {"enable_thinking": True}}
    for name, value in asking.items():
        status, headers, raw = post(server, "/v1/chat/completions", {**ask, name: value})
        assert status == 200 and json.loads(raw)["choices"][0]["message"]["content"] == plain, (name, raw)
        assert "writes no reasoning" in headers[NOTES] and name in headers[NOTES], (name, headers[NOTES])
    for name, value in (("reasoning_control", "yes"), ("thinking_budget_tokens", 1.5),
                        ("chat_template_kwargs", ["enable_thinking"]),
                        ("chat_template_kwargs", {"messages": []})):
        status, _, raw = post(server, "/v1/chat/completions", {**ask, name: value})
        assert status == 400 and json.loads(raw)["error"]["param"] == name, (name, raw)


def test_apply_template_takes_chat_template_kwargs(server):
    messages = [{"role": "user", "content": "Hi"}]
    status, headers, raw = post(server, "/apply-template", {"messages": messages,
                                                           "chat_template_kwargs": {"enable_thinking": False}})
    assert status == 200 and json.loads(raw)["prompt"].endswith("<|im_start|>assistant\n")
    assert "the chat template reads no enable_thinking" in headers[NOTES]


def test_chat_template_kwargs_reach_the_template(smollm2, monkeypatch):
    """The request's chat_template_kwargs are variables of the model's own template, as llama-server
    passes them (a template that reads enable_thinking, as Qwen 3's does)."""
    from specgen.app.runner import render_prompt
    from specgen.serve.body import body_json
    from specgen.serve.requests import chat_request

    monkeypatch.setattr(smollm2, "chat_template", "{% for m in messages %}{{ m['content'] }}{% endfor %}"
                        "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}")
    raw = {"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"enable_thinking": False}}
    request = chat_request(body_json(json.dumps(raw).encode(), fields.ROUTES["/v1/chat/completions"]),
                           smollm2.chat_template)
    assert render_prompt(smollm2, request.prompt, True) == "Hi<think></think>"
    del raw["chat_template_kwargs"]
    request = chat_request(body_json(json.dumps(raw).encode(), fields.ROUTES["/v1/chat/completions"]),
                           smollm2.chat_template)
    assert render_prompt(smollm2, request.prompt, True) == "Hi"


def test_reasoning_effort_reaches_a_reasoning_template_as_llama_server_passes_it(smollm2, monkeypatch):
    """On a template that writes reasoning, OpenAI's reasoning_effort is answered as llama-server
    answers it: "none" is the template's enable_thinking false (unless chat_template_kwargs say
    otherwise: those reach the template last), another level the template's reasoning_effort
    variable (the request's over chat_template_kwargs'); a template that reads neither is told
    nothing and the response's note says it changed nothing."""
    from specgen.app.runner import render_prompt
    from specgen.serve.body import body_json
    from specgen.serve.requests import chat_request

    thinks = ("{% for m in messages %}{{ m['content'] }}{% endfor %}<think>"
              "{% if enable_thinking is defined and not enable_thinking %}</think>{% endif %}"
              "{% if reasoning_effort is defined %}[{{ reasoning_effort }}]{% endif %}")
    monkeypatch.setattr(smollm2, "chat_template", thinks)
    fields_of_chat = fields.ROUTES["/v1/chat/completions"]

    def rendered(**given):
        body = body_json(json.dumps({"messages": [{"role": "user", "content": "Hi"}], **given}).encode(),
                         fields_of_chat)
        request = chat_request(body, smollm2.chat_template)
        return render_prompt(smollm2, request.prompt, True), request.notes

    assert rendered() == ("Hi<think>", ())
    assert rendered(reasoning_effort="none") == ("Hi<think></think>", ())
    assert rendered(reasoning_effort="high") == ("Hi<think>[high]", ())
    assert rendered(reasoning_effort="", chat_template_kwargs={"reasoning_effort": "low"})[0] == "Hi<think>[low]"
    assert rendered(reasoning_effort="high", chat_template_kwargs={"reasoning_effort": "low"})[0] == "Hi<think>[high]"
    assert rendered(reasoning_effort="none", chat_template_kwargs={"enable_thinking": True})[0] == "Hi<think>"
    monkeypatch.setattr(smollm2, "chat_template", "{% for m in messages %}{{ m['content'] }}{% endfor %}<think>")
    text, notes = rendered(reasoning_effort="low")
    assert text == "Hi<think>" and notes == ("the chat template reads no reasoning_effort: reasoning_effort low "
                                             "changed nothing",)
    with pytest.raises(Exception, match="reasoning_effort expects a string, found 3"):
        rendered(reasoning_effort=3)


def test_special_tokens_in_a_completion_prompt_are_parsed(server):
    """llama-server reads special-token text in /completion's and /v1/completions' prompts as those
    tokens (add_special and parse_special both true): Continue's llama.cpp provider sends a
    ChatML-rendered prompt there, and read as plain text it got an empty answer. /tokenize parses
    them unless told parse_special false."""
    body = CLIENTS["continue"]["requests"][0]["body"]
    prompt = body["prompt"]
    parsed = json.loads(post(server, "/tokenize", {"content": prompt})[2])["tokens"]  # parse_special true
    plain = json.loads(post(server, "/tokenize", {"content": prompt, "parse_special": False})[2])["tokens"]
    assert len(plain) > len(parsed)  # "<|im_start|>" as text is several tokens
    status, _, raw = post(server, "/completion", {**body, "stream": False, "n_predict": 4, "temperature": 0})
    answer = json.loads(raw)
    assert status == 200 and answer["tokens_evaluated"] == len(parsed) and answer["content"].strip(), answer
    status, _, raw = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 4, "temperature": 0})
    answer = json.loads(raw)
    assert status == 200 and answer["usage"]["prompt_tokens"] == len(parsed), answer
    assert answer["choices"][0]["text"].strip(), answer


def test_reasoning_effort_on_a_completion_is_what_llama_server_does_with_it(smollm2, monkeypatch):
    """A completion's prompt is raw text: no chat template renders it, so reasoning_effort cannot
    act there, whatever the model's template. llama-server's /completion ignores the key: specgen
    ignores it too and names it in X-Specgen-Ignored-Fields (any value). OpenAI's /v1/completions
    has no such field, and llama-server ignores it there: it is answered, the note saying it changed
    nothing (a wrong type is still a 400 naming it). Was a 400 on a <think> template."""
    from specgen.serve.body import body_json
    from specgen.serve.requests import RequestError, completion_request

    monkeypatch.setattr(smollm2, "chat_template", "{% for m in messages %}{{ m['content'] }}{% endfor %}<think>")
    for template in (smollm2.chat_template, None):  # a reasoning template, and one that writes none
        raw = json.dumps({"prompt": "1, 2,", "reasoning_effort": "high"}).encode()
        body = body_json(raw, fields.ROUTES["/v1/completions"])
        request = completion_request(body, template)
        assert request.notes == ("reasoning_effort changed nothing: a completion's prompt is raw text, which no "
                                 "chat template renders",), request.notes
        for value in ("high", 3):
            body = body_json(json.dumps({"prompt": "1, 2,", "reasoning_effort": value}).encode(),
                             fields.ROUTES["/completion"], native=True)
            request = completion_request(body, template)
            assert body.ignored == ["reasoning_effort"] and request.notes == (), (body.ignored, request.notes)
        body = body_json(json.dumps({"prompt": "1, 2,", "reasoning_effort": 3}).encode(),
                         fields.ROUTES["/v1/completions"])
        with pytest.raises(RequestError, match="reasoning_effort expects a string, found 3"):
            completion_request(body, template)
        body = body_json(json.dumps({"prompt": "1, 2,", "reasoning_effort": "none"}).encode(),
                         fields.ROUTES["/v1/completions"])
        assert completion_request(body, template).notes == ()
