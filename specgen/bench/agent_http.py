"""The agent bench's client side: servers started as subprocesses (specgen serve, llama-server),
and one streamed chat request timed as an agent framework sees it (urllib: no client library).

Time to first token is measured at the client: the first chunk that carries content or a tool
call. Both servers stream a call as they write it: its head (id, name) once it is known to be a
call (specgen: the name whole and offered, the arguments opened), then the arguments in pieces (specgen: app/callstream.py). The server's own `timings` give the tokens decoded, the decode time and the cache.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from specgen.errors import SpecgenError

START_TIMEOUT_S = 300  # a model load on a busy machine
REQUEST_TIMEOUT_S = 600


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """One server process, answering at `url` once /health says so."""
    name: str
    command: list[str]
    log: Path
    url: str = ""
    proc: subprocess.Popen | None = None

    def start(self, env: dict | None = None) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([*self.command, "--port", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)  # a Ctrl-C is the bench's to handle

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # llama-server answers 503 while it loads: ready at the first 200
            if self.proc.poll() is not None:
                raise SpecgenError(f"{self.name}: the server exited with code {self.proc.returncode}: "
                                   f"{_last_line(self.log)}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SpecgenError(f"{self.name}: no answer from {self.url}/health within {START_TIMEOUT_S} s")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _last_line(log: Path) -> str:
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1] if lines else "no output"


@dataclass
class ChatCompletion:
    """One request's answer and timings (client clock for ttft_s and wall_s; the server's for the rest)."""
    content: str | None = None
    calls: list[dict] = field(default_factory=list)  # {"name", "arguments"} (arguments: JSON text)
    finish_reason: str | None = None
    ttft_s: float | None = None
    wall_s: float = 0.0
    completion_tokens: int = 0
    decode_s: float = 0.0
    prompt_n: int = 0  # tokens the prefill read
    cache_n: int = 0  # tokens kept from the cache
    prompt_s: float = 0.0
    error: str | None = None
    target_calls: int | None = None  # specgen's: the target's decodes (its `speculative` numbers)
    forced_accepted: int | None = None  # ... and the tokens a grammar forced among those committed

    def same_as(self, other: "ChatCompletion") -> bool:
        """The same content and the same calls (names and arguments, as JSON values)."""
        return ((self.content or "") == (other.content or "") and len(self.calls) == len(other.calls)
                and all(a["name"] == b["name"] and _json(a["arguments"]) == _json(b["arguments"])
                        for a, b in zip(self.calls, other.calls)))

    @property
    def runnable(self) -> list[dict]:
        """The calls a framework can run: a reply that ended with its calls whole, each's arguments
        a JSON object (a call cut by max_tokens is streamed as far as it was written: not these)."""
        whole = self.finish_reason == "tool_calls" and all(isinstance(_json(c["arguments"]), dict)
                                                           for c in self.calls)
        return self.calls if whole else []

    def message(self) -> dict:
        """The assistant message a framework appends to the conversation; calls it cannot run are
        kept as the text they were written as (a history's calls must be whole JSON)."""
        if self.calls and not self.runnable:
            cut = [json.dumps({"name": c["name"]}, ensure_ascii=False)[:-1] + f', "arguments": {c["arguments"]}'
                   for c in self.calls]
            return {"role": "assistant", "content": "\n".join([*([self.content] if self.content else []), *cut])}
        out: dict = {"role": "assistant", "content": self.content}
        if self.calls:
            out["tool_calls"] = [{"id": f"call_{i}", "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}}
                                 for i, c in enumerate(self.calls)]
        return out


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def chat(url: str, body: dict) -> ChatCompletion:
    """POST a streamed /v1/chat/completions and read it to its end; an HTTP error is kept in the ChatCompletion."""
    data = json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}).encode()
    request = urllib.request.Request(url + "/v1/chat/completions", data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    reply, content, calls = ChatCompletion(), [], {}
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as stream:
            for raw in stream:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    reply.error = str(chunk["error"].get("message", chunk["error"]))
                _read_chunk(chunk, reply, content, calls, time.perf_counter() - started)
    except urllib.error.HTTPError as e:
        reply.error = f"HTTP {e.code}: {e.read()[:200].decode('utf-8', 'replace')}"
    except (OSError, ValueError) as e:  # the server went away, or sent what is not JSON
        reply.error = f"{type(e).__name__}: {e}"
    reply.wall_s = time.perf_counter() - started
    reply.content = "".join(content) or None
    reply.calls = [calls[i] for i in sorted(calls)]
    return reply


def _read_chunk(chunk: dict, reply: ChatCompletion, content: list, calls: dict, at_s: float) -> None:
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content"):
            content.append(delta["content"])
        for part in delta.get("tool_calls") or []:
            entry = calls.setdefault(part.get("index", 0), {"name": "", "arguments": ""})
            fn = part.get("function") or {}
            entry["name"] += fn.get("name") or ""
            entry["arguments"] += fn.get("arguments") or ""
        if reply.ttft_s is None and (delta.get("content") or delta.get("tool_calls")):
            reply.ttft_s = at_s
        reply.finish_reason = choice.get("finish_reason") or reply.finish_reason
    spec = chunk.get("speculative")
    if isinstance(spec, dict):
        reply.target_calls, reply.forced_accepted = spec.get("target_calls"), spec.get("forced_accepted")
    t = chunk.get("timings")
    if t:
        reply.completion_tokens = int(t.get("predicted_n", 0))
        reply.decode_s = float(t.get("predicted_ms", 0.0)) / 1000
        reply.prompt_n, reply.cache_n = int(t.get("prompt_n", 0)), int(t.get("cache_n", 0))
        reply.prompt_s = float(t.get("prompt_ms", 0.0)) / 1000
