"""What the tests share, loaded or started once per test run: the test models by name; models and
sessions (`model`, `session`); `specgen serve` processes, one per model and flags (`server`), stopped
when the run ends; what a method writes (`tokens_of` and `run_of` through a Runner on a session,
`generated` through the engine on any model and context, fakes included); raw HTTP to a server.

Test modules import what they share from here (and from fakes.py, clihelp.py, chisquare.py,
invariance.py, token_tree.py), never from one another. tests/conftest.py offers the models and
servers as session fixtures too."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import signal
import socket
import string
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path


SMOLLM2 = "smollm2-135m-instruct-q4_1"
SMOLLM2_F32 = "smollm2-135m-instruct-f32"
GEMMA = "gemma-3-270m-q4_k_m"
GEMMA_F32 = "gemma-3-270m-f32"
HERMES = "smollm2-135m-instruct-hermes"  # smollm2 with a shipped Hermes-style tool template


# --- models and sessions, loaded once per run ---------------------------------------------------------


@functools.cache
def model(name: str):
    """The LlamaModel of a models.txt name or a path, loaded once per test run (read-only use: a
    test that changes a model's attributes undoes it, e.g. with monkeypatch)."""
    from specgen.llama.backend import LlamaModel
    from specgen.models import resolve as models

    return LlamaModel(name if Path(str(name)).is_file() else models.resolve(name))


@functools.cache
def session(target: str = SMOLLM2_F32, draft: str | None = SMOLLM2, screen: bool = False, gpu_layers: int = 0):
    """target and draft loaded once per test run, with contexts for every method they can run
    (those needing a draft only with one), auto's cost curves from the calibration cache and no
    persistent store of past texts (auto still drafts from this process's earlier texts: a test
    must not count on a session that has seen nothing). `screen`: the target may be its screened
    copy (greedy runs only: a screened row is exact at its argmax)."""
    from specgen.app.config import RunConfig
    from specgen.app.session import load_session
    from specgen.drafting import methods as M

    names = [m for m in M.NAMES if draft is not None or M.get(m).draft != M.NEEDS_DRAFT]
    cfg = RunConfig(target=target, draft=draft, store=False, gpu_layers=gpu_layers, draft_gpu_layers=gpu_layers)
    return load_session(cfg.loading, names, store_default=False, screen=screen)


@dataclass
class Run:
    """What one generation emitted: its events (the finish event last, unless the caller stopped
    early) and its stats."""
    events: list
    stats: object

    @property
    def token_events(self) -> list:
        from specgen.core.engine import TokenEvent

        return [e for e in self.events if isinstance(e, TokenEvent)]

    @property
    def tokens(self) -> list[int]:
        return [e.token for e in self.token_events]

    @property
    def text(self) -> str:
        return "".join(e.text for e in self.token_events)

    @property
    def finish(self):
        return self.events[-1]

    @property
    def reason(self) -> str:
        return self.events[-1].reason


def run_of(method: str, prompt, *, target: str = SMOLLM2_F32, draft: str | None = SMOLLM2, n: int = 32,
           chat: bool = False, logprobs: int | None = None, on=None, **settings) -> Run:
    """`method` on `prompt` (a text or an app.prompts.Prompt) through a Runner, as the CLI and the
    server run it, on session(target, draft) or the session `on`; the prompt as it is (`chat`
    False) or through the model's chat template (None: when it has one). `settings`: RunConfig's
    fields (temperature, seed, repeat_penalty, json_layout, ...)."""
    from specgen.app.config import RunConfig
    from specgen.app.prompts import Prompt
    from specgen.app.runner import Runner
    from specgen.core.stats import RunStats

    on = on if on is not None else session(target, draft)
    cfg = RunConfig(target=target, draft=draft, method=method, max_tokens=n, chat=chat, store=False, **settings)
    runner = Runner(cfg, on)
    item = prompt if isinstance(prompt, Prompt) else Prompt(0, prompt)
    stats = RunStats()
    return Run(list(runner.stream(runner.ask(item, logprobs=logprobs), stats)), stats)


def tokens_of(method: str, prompt, **kw) -> list[int]:
    """The tokens `method` writes for `prompt` (run_of's arguments)."""
    return run_of(method, prompt, **kw).tokens


def generated(model, ctx, prompt: list[int], n: int, sampling=None, drafter=None, *, cache=None,
              stop_after: int | None = None, stats=None, **request) -> Run:
    """One generation through the engine (core/engine.py) on any model and context, fakes included:
    `request` is GenerationRequest's other fields (constraint, logprobs, cache_prompt). With
    `stop_after`, the caller stops after that many tokens (the generator is closed); `stats`: the
    RunStats to count into (a fresh one if None)."""
    from specgen.core.engine import GenerationRequest, TokenEvent, generate
    from specgen.core.sampling import SamplingParams
    from specgen.core.stats import RunStats

    stats = RunStats() if stats is None else stats
    events = generate(model, ctx, GenerationRequest(prompt, n, sampling or SamplingParams(), **request), stats,
                      drafter, cache)
    out, count = [], 0
    for event in events:
        out.append(event)
        count += isinstance(event, TokenEvent)
        if count == stop_after:
            events.close()
            break
    return Run(out, stats)


# --- `specgen serve`, a real process -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`specgen serve -m MODEL --no-store ARGS` in a subprocess, ready when /health answers; `client`
    is OpenAI's own Python client for it, `post` a raw POST (with the API key, when there is one,
    unless the caller's headers say otherwise). `log`: a file for its stderr, which a test reads."""

    def __init__(self, *args, api_key=None, model=SMOLLM2, log: Path | None = None):
        import openai

        self.port = free_port()
        self.api_key, self.log = api_key, log
        key = ["--api-key", api_key] if api_key else []
        out = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE) if log is None else \
            dict(stdout=subprocess.DEVNULL, stderr=log.open("w"))
        self.proc = subprocess.Popen([sys.executable, "-m", "specgen", "serve", "-m", model, "--no-store",
                                      "--port", str(self.port), *key, *args], text=True, **out)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 120
        while True:  # ready when /health answers; a poll with a deadline, not a guessed delay
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited: {self.log.read_text() if log else self.proc.stderr.read()}")
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.proc.kill()
                    raise AssertionError(f"the server did not answer {self.url}/health within 120 s") from None
                time.sleep(0.1)
        self.client = openai.OpenAI(base_url=self.url + "/v1", api_key=api_key or "none", max_retries=0)

    @property
    def key_header(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def post(self, path, body: bytes, headers=None):
        """(status, parsed JSON, headers) of a raw POST."""
        req = urllib.request.Request(self.url + path, data=body, method="POST",
                                     headers={"Content-Type": "application/json", **self.key_header, **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read()), r.headers
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read()), e.headers

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


_servers: dict[tuple, Server] = {}


def server(*args, api_key=None, model=SMOLLM2) -> Server:
    """The one server of this test run started with these flags (started on first use, stopped by
    stop_servers() when the run ends). Tests on a shared server see what earlier requests left in it
    (its prompt cache, auto's earlier texts): a test that needs a server of its own starts a Server."""
    key = (model, api_key, args)
    found = _servers.get(key)
    if found is None or found.proc.poll() is not None:
        found = _servers[key] = Server(*args, api_key=api_key, model=model)
    return found


def stop_servers() -> None:
    """Stops every shared server; each must exit cleanly (0) on SIGTERM."""
    codes = {}
    while _servers:
        key, served = _servers.popitem()
        codes[key] = served.stop()
    assert all(code == 0 for code in codes.values()), codes


def call(served, method, path, body=None, headers=None):
    """(status, headers, body bytes) of one raw request (no API key unless `headers` has one)."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(served.url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def events(raw: bytes) -> list[str]:
    """The data of each server-sent event in a streamed body."""
    return [line[len("data: "):] for line in raw.decode().split("\n\n") if line.startswith("data: ")]


def streamed_calls(stream) -> tuple[dict[int, dict], str | None]:
    """A streamed answer's tool calls joined from their OpenAI fragments ({index: {"name",
    "arguments"}}), and its finish_reason."""
    calls, reason = {}, None
    for chunk in stream:
        for delta in chunk.choices[0].delta.tool_calls or []:
            entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            entry["name"] += delta.function.name or ""
            entry["arguments"] += delta.function.arguments or ""
        reason = chunk.choices[0].finish_reason or reason
    return calls, reason


# --- requests shared by modules -----------------------------------------------------------------------

# "Hello, world" (or "Hi, world": the model's choice ends a step), then one of 30 words of letters,
# each a right-recursive rule of 27 alternatives: compiled fine, but the first mask after ", world"
# makes llguidance's parser walk more than its 50000 items per mask step, a limit it reports by an
# error state (and an end-only mask).
TOO_WIDE = "\n".join(['root ::= ("Hello" | "Hi") ", world" t', "t ::= " + " | ".join(f"x{i}" for i in range(30))] + [
    f"x{i} ::= " + " | ".join(f'"{c}" x{i}' for c in string.ascii_lowercase) + ' | "."' for i in range(30)]) + "\n"

# tool_choice_switches' loop: the weather, then the time (a second required argument).
LOOP_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather now in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "hours24": {"type": "boolean"}},
                       "required": ["city", "hours24"]}}}]
LOOP_ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def kept_and_read(reply, before) -> tuple[bool, int, int]:
    """Whether the reply's request kept the whole previous prompt from the cache, the prompt tokens
    it read, and the tokens new to it: its prompt less the previous prompt and reply."""
    t = reply.model_extra["timings"]
    held = before["prompt_n"] + before["cache_n"]
    return t["cache_n"] >= held, t["prompt_n"], t["prompt_n"] + t["cache_n"] - held - before["predicted_n"]


def tool_choice_switches(server, tools=None, asked=None) -> None:
    """One tool loop whose requests switch tool_choice (required, none, a named function), streaming,
    stop strings and sampling: each keeps the whole previous prompt and reads what is new to it, and
    of the previous reply at most what its text reads as in other tokens (a grammar may have written
    `"}` `}` where the text reads `"` `}}`); after a text answer, at most its last token (issue 67:
    `none` dropped the tools block and the whole conversation was read again)."""
    tools, asked = tools or LOOP_TOOLS, asked or LOOP_ASK
    ask = dict(model="m", tools=tools, max_tokens=48, parallel_tool_calls=False, temperature=0)
    r = server.client.chat.completions.create(messages=asked, tool_choice="required", **ask)
    call = r.choices[0].message
    assert call.tool_calls, call
    messages = [*asked, call.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "18 C and sunny"}]
    before = r.model_extra["timings"]
    r = server.client.chat.completions.create(messages=messages, tool_choice="none", stop=["\n\n"],
                                              **{**ask, "max_tokens": 12})
    kept, read, new = kept_and_read(r, before)
    assert kept and read <= new + before["predicted_n"], (kept, read, new)
    messages += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": "And the time there?"}]
    before = r.model_extra["timings"]
    stream = server.client.chat.completions.create(
        messages=messages, stream=True, tool_choice={"type": "function", "function": {"name": "get_time"}},
        **{**ask, "temperature": 0.7, "seed": 3})
    last = [c for c in stream if c.model_extra.get("timings")][-1]
    kept, read, new = kept_and_read(last, before)
    assert kept and read <= new + 1, (kept, read, new)



@contextlib.contextmanager
def serve_directory(directory: Path):
    """A quiet local HTTP server for `directory`; yields its base URL (URL pulls without internet)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(directory), **kw)

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}"
    finally:
        httpd.shutdown()


def penalized(pen, *args, **kwargs):
    """A SamplingParams carrying core's Penalties `pen` in its own fields (the bounds table's names)."""
    from specgen.core.sampling import SamplingParams

    return SamplingParams(*args, repeat_penalty=pen.repeat, repeat_last_n=pen.last_n, frequency_penalty=pen.frequency,
                          presence_penalty=pen.presence, logit_bias=pen.bias, **kwargs)


# --- published pages (test_bench_report.py, test_bench_report_binding.py) -----------------------

# The pages with bench tables whose every figure is bound (or exempt, or under History): `specgen
# bench-report --check` passes on each.
CHECKED_PAGES = ["README.md", "docs/measurements.md"]


# --- requests the server tests share (test_serve_routes.py, test_fuzz_bodies.py) ----------------

KEY = {"Authorization": "Bearer sesame"}
ASK = [{"role": "user", "content": "Name three colours."}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
# A request each route answers 200.
VALID = {**dict.fromkeys(("/v1/chat/completions", "/chat/completions"), {"messages": ASK, "max_tokens": 2}),
         **dict.fromkeys(("/v1/completions", "/completions", "/completion"), {"prompt": "1, 2,", "max_tokens": 2}),
         "/apply-template": {"messages": ASK}, "/tokenize": {"content": "hi"}, "/detokenize": {"tokens": [1]},
         **dict.fromkeys(("/v1/embeddings", "/embeddings", "/embedding"), {"input": "hi"})}


def post(served, path, body, headers=KEY):
    """POST a JSON body; (status, the parsed JSON reply)."""
    status, _, raw = call(served, "POST", path, body, headers)
    return status, json.loads(raw)
