"""`specgen bench --suite agent`: agent loops driven through real servers, as a framework drives them.

Each user turn is two requests, each resending the whole conversation: the call (the tools,
`tool_choice: "required"`), then, after the tool's canned result as a `tool` message, the answer
(`tool_choice: "auto"`). Every row is a server (specgen serve with one method, with or without its
prompt cache; llama-server with its cache, and with its speculative decoding); every row gets the
same requests: a request's history is built from the reference row's (constrained plain's) earlier
answers, and rows take each request in turn, so drift in the machine's speed hits them alike.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from specgen.bench.agent_http import ChatCompletion, Server, chat
from specgen.bench.agent_suite import AgentConversation, call_valid, tool_result
from specgen.drafting.methods import JUMP

BASELINE = "plain --no-prompt-cache"  # constrained plain, every prompt read whole: the reference
CALL, ANSWER = "call", "answer"
WARMUP = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "temperature": 0}


@dataclass(frozen=True)
class Row:
    name: str
    command: list[str]  # the server's command line, less --port
    engine: str  # "specgen" or "llama-server"


def specgen_rows(target: str, threads: int, ctx: int, draft: str | None = None) -> list[Row]:
    """The baseline, plain with its cache, jump-forward and auto (with `draft` where given)."""
    base = [sys.executable, "-m", "specgen", "serve", "-m", target, "--no-store", "--threads", str(threads), "--ctx", str(ctx)]
    return [Row(BASELINE, [*base, "--method", "plain", "--no-prompt-cache"], "specgen"),
            Row("plain", [*base, "--method", "plain"], "specgen"),
            Row(JUMP, [*base, "--method", JUMP], "specgen"),
            Row("auto", [*base, "--method", "auto", *(["-d", draft] if draft else [])], "specgen")]


def llama_server_rows(binary: Path, model: Path, threads: int, ctx: int, spec_types: Sequence[str],
                      draft: Path | None = None, draft_label: str | None = None,
                      template: Path | None = None) -> list[Row]:
    """llama-server with its prompt cache (cache_prompt, on by default; one slot, so one cache), and
    once per speculative type; a draft-* type loads `draft`; `template` replaces the model's chat
    template (--chat-template-file)."""
    base = [str(binary), "-m", str(model), "--jinja", "-np", "1", "-t", str(threads), "-c", str(ctx), "--no-warmup",
            *(["--chat-template-file", str(template)] if template else [])]
    rows = [Row("llama-server", base, "llama-server")]
    for spec in spec_types:
        with_draft = spec.startswith("draft") and draft is not None
        name = f"llama-server {spec}" + (f" (draft {draft_label or draft.name})" if with_draft else "")
        rows.append(Row(name, [*base, "--spec-type", spec, *(["--model-draft", str(draft)] if with_draft else [])],
                        "llama-server"))
    return rows


@dataclass
class Exchange:
    """One request, sent to every row: its turn, kind, and each row's reply."""
    prompt_id: str
    turn: int  # from 1
    kind: str  # CALL or ANSWER
    replies: dict[str, ChatCompletion] = field(default_factory=dict)


ANSWER_CHOICES = ("auto", "none")  # the answers' tool_choice (--answer-tool-choice)


def request_body(conv: AgentConversation, messages: list[dict], kind: str, max_tokens: int,
                 answer_choice: str = "auto") -> dict:
    return {"messages": messages, "tools": list(conv.tools), "tool_choice": "required" if kind == CALL else answer_choice,
            "temperature": 0, "max_tokens": max_tokens}


def run_conversation(conv: AgentConversation, servers: dict[str, Server], max_tokens: int, turns: int | None = None,
                     on_exchange: Callable[[Exchange], None] = lambda e: None,
                     answer_max_tokens: int | None = None, answer_choice: str = "auto") -> list[Exchange]:
    """Every turn of `conv` (the first `turns`), each request sent to every row, the reference first;
    the conversation goes on from the reference's replies. Where the reference's call request
    ends without a call (its text cut by max_tokens, say), there is nothing to run and the turn
    ends there, as in a framework's loop. `answer_max_tokens`: the answers' own limit [max_tokens];
    `answer_choice`: their tool_choice (auto, or none as frameworks ask for a last answer in text)."""
    messages: list[dict] = [{"role": "system", "content": conv.system}]
    out = []
    for t, user in enumerate(conv.turns[:turns], 1):
        messages.append({"role": "user", "content": user})
        for kind in (CALL, ANSWER):
            limit = max_tokens if kind == CALL or answer_max_tokens is None else answer_max_tokens
            body = request_body(conv, messages, kind, limit, answer_choice)
            exchange = Exchange(conv.prompt_id, t, kind, {name: chat(s.url, body) for name, s in servers.items()})
            out.append(exchange)
            on_exchange(exchange)
            reference = exchange.replies[BASELINE]
            messages.append(reference.message())
            for i, call in enumerate(reference.runnable):  # a call a framework would run: the tool's result
                messages.append({"role": "tool", "tool_call_id": f"call_{i}", "name": call["name"],
                                 "content": tool_result(conv, call["name"], call["arguments"])})
            if not reference.runnable:  # (a request ending in an assistant message would continue it)
                break
    return out


def start_all(rows: Sequence[Row], log_dir: Path) -> dict[str, Server]:
    """Every row's server started (loading side by side), then each waited for and warmed up on a
    request of its own (no tools, nothing any conversation begins with)."""
    servers = {r.name: Server(r.name, r.command, log_dir / f"server-{i}.log") for i, r in enumerate(rows)}
    env = dict(os.environ)
    try:
        for row, server in zip(rows, servers.values()):
            lib = str(Path(row.command[0]).parent)
            server.start({**env, "LD_LIBRARY_PATH": f"{lib}:{env.get('LD_LIBRARY_PATH', '')}"}
                         if row.engine == "llama-server" else env)
        for server in servers.values():
            server.wait_ready()
            chat(server.url, WARMUP)
    except BaseException:
        stop_all(servers)
        raise
    return servers


def stop_all(servers: dict[str, Server]) -> None:
    for server in servers.values():
        server.stop()


def reply_text(content: str | None, calls: Sequence[dict]) -> str:
    """A reply as one text (its content, then a line per call), which `bench-report --publish` hashes."""
    return "\n".join([content or "", *(json.dumps(c, ensure_ascii=False) for c in calls)])


def reply_record(conv: AgentConversation, exchange: Exchange, row: str) -> dict:
    r = exchange.replies[row]
    base = exchange.replies[BASELINE]
    valid = [call_valid(conv, c["name"], c["arguments"]) for c in r.calls]
    return {"prompt_id": exchange.prompt_id, "turn": exchange.turn, "kind": exchange.kind, "row": row,
            **asdict(r), "text": reply_text(r.content, r.calls), "calls_valid": sum(valid),
            "call_made": bool(r.calls) and all(valid), "identical": r.same_as(base)}
