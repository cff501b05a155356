"""llama-server's own routes and shapes, for the clients written against it (llama.cpp's web UI,
SillyTavern's and Continue's llama.cpp modes): /props, /tokenize, /detokenize, /apply-template,
/metrics in Prometheus text, /completion's response and stream; and CORS for browser clients."""

from __future__ import annotations

import math
import time
from typing import Callable

from specgen import __version__
from specgen.app import samplers
from specgen.app.ask import Ask, sampling_values
from specgen.app.config import Defaults
from specgen.app.runner import render_prompt
from specgen.core.protocol import Model
from specgen.core.stats import RunStats
from specgen.errors import SpecgenError
from specgen.serve.logprob_shapes import EmittedLogprob, native_probabilities
from specgen.serve.marks import Piece
from specgen.serve.requests import Request, RequestError, chat_request
from specgen.serve.worker import Done, Worker

SEED_RANDOM = 4294967295  # llama-server's "no seed given"


def timings(done: Done) -> dict:
    s = done.stats
    read = s.n_prompt - s.n_cached  # llama-server's prompt_n: the tokens the prefill read; cache_n: kept
    return {"cache_n": s.n_cached, "prompt_n": read, "prompt_ms": round(s.prefill_s * 1000, 3),
            "prompt_per_token_ms": round(_per(s.prefill_s * 1000, read), 3),
            "prompt_per_second": round(_rate(read, s.prefill_s), 3), "predicted_n": s.n_tokens,
            "predicted_ms": round(s.decode_s * 1000, 3),
            "predicted_per_token_ms": round(_per(s.decode_s * 1000, s.n_tokens), 3),
            "predicted_per_second": round(s.tokens_per_s, 3),
            # The drafters' (as llama-server's), and the grammar's forced tokens apart (core/stats.py).
            "draft_n": s.drafted, "draft_n_accepted": s.accepted, "draft_n_forced": s.forced_drafted,
            "draft_n_forced_accepted": s.forced_accepted}


def _per(ms: float, n: int) -> float:
    return ms / n if n else 0.0


def speculative(method: str, s: RunStats) -> dict:
    """specgen's own numbers; `accepted_by`: accepted tokens by source (forced, lookup, draft, ...);
    τ and acceptance are the drafters', forced tokens counted apart (core/stats.py)."""
    return {"method": method, "target_calls": s.target_calls, "mean_accepted": round(s.mean_accepted, 4),
            "acceptance_rate": round(s.acceptance_rate, 4), "steps": dict(s.choices),
            "accepted_by": dict(s.accepted_by), "forced_drafted": s.forced_drafted,
            "forced_accepted": s.forced_accepted,
            **({} if s.seed is None else {"seed": s.seed})}  # the sampled run's seed: replays its text


# llama-server's sampling settings that specgen does not implement, each at the value that turns it off.
LLAMA_OFF = {
    "typical_p": 1.0, "top_n_sigma": -1.0, "dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "xtc_probability": 0.0,
    "xtc_threshold": 0.1, "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1,
    "dry_sequence_breakers": ["\n", ":", "\"", "*"], "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1,
    "n_keep": 0, "n_discard": 0, "ignore_eos": False, "min_keep": 0, "grammar": "", "timings_per_token": False,
    "adaptive_target": -1.0, "adaptive_decay": 0.9,  # llama.cpp's adaptive-p sampler, off
}


def params(defaults: Defaults, default_max_tokens: int | None, request: Request | None = None,
           ask: Ask | None = None) -> dict:
    """Sampling settings as llama-server reports them: specgen's own (the server's defaults, or the
    Ask a request ran: ask.sampling_values names them as llama-server does), and every setting it
    does not implement at the value that turns it off."""
    s = defaults.sampling if ask is None else ask.sampling
    n_predict = default_max_tokens if request is None or request.max_tokens is None else request.max_tokens
    own = {**sampling_values(s), "seed": SEED_RANDOM if s.seed is None else s.seed,
           "logit_bias": [[t, b if math.isfinite(b) else False] for t, b in s.penalties.bias]}
    stops = defaults.stop if ask is None else ask.stop  # a request's replace serve --stop's (worker.Slot.ask)
    return {
        "n_predict": -1 if n_predict is None else n_predict, **LLAMA_OFF, **own,
        "stop": list(stops), "max_tokens": -1 if n_predict is None else n_predict,
        "stream": bool(request and request.stream), "n_probs": request.logprobs or 0 if request is not None else 0,
        "samplers": list(request.sampling.samplers) if request is not None and request.sampling.samplers is not None
        else samplers.reported(sampling_values(s)),
    }


def props(worker: Worker, model_id: str, method: str) -> dict:
    """GET /props: what llama.cpp's web UI reads at start (context size, defaults, chat template)."""
    slot, target = worker.slot, worker.slot.session.target
    token = getattr(target, "token_text", None)
    return {
        "default_generation_settings": {
            "id": 0, "id_task": -1, "n_ctx": worker.n_ctx, "speculative": True, "is_processing": worker.busy,
            "params": params(slot.defaults, worker.default_max_tokens), "prompt": "",
            "next_token": {"has_next_token": True, "has_new_line": False, "n_remain": -1, "n_decoded": 0,
                           "stopping_word": ""}},
        "total_slots": 1, "model_alias": model_id, "model_path": target.source_path,
        "chat_template": target.chat_template or "", "chat_template_caps": {},
        "bos_token": token(target.bos).decode("utf-8", "replace") if token else "",
        "eos_token": token(target.eos).decode("utf-8", "replace") if token and hasattr(target, "eos") else "",
        "modalities": {"vision": False, "audio": False}, "build_info": f"specgen {__version__} ({method})",
        "is_sleeping": False,
    }


def _flag(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise RequestError(400, f"{name} expects true or false, found {value!r}"[:120], name)
    return value


def tokenize(model: Model, body: dict) -> dict:
    """POST /tokenize: {"content", "add_special" (false), "parse_special" (true), "with_pieces"
    (false)} -> {"tokens": [ids]} or [{"id", "piece"}] (a piece that is not whole UTF-8: its bytes)."""
    content = body.get("content")
    if not isinstance(content, str):
        raise RequestError(400, f"content expects a string, found {type(content).__name__}", "content")
    tokens = model.tokenize(content, add_special=_flag(body, "add_special", False),
                           parse_special=_flag(body, "parse_special", True))
    if not _flag(body, "with_pieces", False):
        return {"tokens": tokens}
    out = []
    for t in tokens:
        raw = _bytes(model, t)
        try:
            piece: str | list[int] = raw.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(raw)
        out.append({"id": t, "piece": piece})
    return {"tokens": out}


def detokenize(model: Model, body: dict) -> dict:
    """POST /detokenize: {"tokens": [ids]} -> {"content": text}."""
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise RequestError(400, f"tokens expects a list of token ids, found {str(tokens)[:60]}", "tokens")
    bad = [t for t in tokens if not 0 <= t < model.n_vocab]
    if bad:
        raise RequestError(400, f"tokens expects ids in [0, {model.n_vocab}), found {bad[0]}", "tokens")
    return {"content": b"".join(_bytes(model, t) for t in tokens).decode("utf-8", "replace")}


def apply_template(model: Model, defaults: Defaults, body: dict) -> dict:
    """POST /apply-template: a chat request's `messages` (and `tools`) as the text the model would
    read, through its chat template and the server's --system, without generating: {"prompt": text}."""
    request = chat_request(body, model.chat_template)
    try:
        return {"prompt": render_prompt(model, request.prompt, bool(model.chat_template), defaults.system)}
    except SpecgenError as e:
        raise RequestError(400, str(e), "messages") from None


def _bytes(model: Model, token: int) -> bytes:
    """A token's text; a special token (whose piece is empty) as the vocabulary writes it."""
    raw = model.piece(token)
    if not raw and hasattr(model, "token_text"):
        raw = model.token_text(token)
    return raw


def metrics(worker: Worker) -> str:
    """GET /metrics: llama-server's metric names where they exist, then specgen's own."""
    m, t = worker.metrics, worker.metrics.total
    counters = [
        ("prompt_tokens_total", "Number of prompt tokens processed", t.n_prompt - t.n_cached),
        ("prompt_tokens_cached_total", "Prompt tokens reused from the prompt cache (not processed)", t.n_cached),
        ("prompt_seconds_total", "Total time spent processing prompts", t.prefill_s),
        ("tokens_predicted_total", "Number of generation tokens processed", t.n_tokens),
        ("tokens_predicted_seconds_total", "Total time spent generating tokens", t.decode_s),
        ("n_decode_total", "Target decodes after prefill (one per speculative step)", t.target_calls),
        ("n_tokens_max", "Largest observed sequence length (prompt + generation)", m.tokens_max),
        ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", t.drafted),
        ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model",
         t.accepted),
    ]
    gauges = [
        ("prompt_tokens_seconds", "Average prompt throughput in tokens/s", _rate(t.n_prompt, t.prefill_s)),
        ("predicted_tokens_seconds", "Average generation throughput in tokens/s", _rate(t.n_tokens, t.decode_s)),
        ("requests_processing", "Number of requests processing", int(worker.busy)),
        ("requests_deferred", "Number of requests deferred", worker.deferred),
        ("n_busy_slots_per_decode", "Average number of busy slots per decode (one slot)", int(t.target_calls > 0)),
    ]
    lines: list[str] = []

    def add(prefix: str, kind: str, name: str, text: str, samples: list[tuple[str, float]]) -> None:
        lines.extend([f"# HELP {prefix}:{name} {text}", f"# TYPE {prefix}:{name} {kind}"])
        lines.extend(f"{prefix}:{name}{labels} {_num(v)}" for labels, v in samples)

    for name, text, value in counters:
        add("llamacpp", "counter", name, text, [("", value)])
    for name, text, value in gauges:
        add("llamacpp", "gauge", name, text, [("", value)])
    add("specgen", "counter", "requests_total", "Generations finished", [("", m.requests)])
    add("specgen", "counter", "requests_failed_total", "Generations that ended in an error", [("", m.failed)])
    add("specgen", "counter", "accepted_tokens_total", "Accepted drafted tokens by source (forced, lookup, "
        "history, draft, ...)", [(f'{{source="{k}"}}', v) for k, v in sorted(t.accepted_by.items())])
    add("specgen", "counter", "forced_tokens_total", "Tokens a grammar forced, drafted free (not in spec_decode_*)",
        [('{state="drafted"}', t.forced_drafted), ('{state="accepted"}', t.forced_accepted)])
    add("specgen", "counter", "steps_total", "Target decodes by the drafter's choice",
        [(f'{{choice="{k}"}}', v) for k, v in sorted(t.choices.items())])
    return "\n".join(lines) + "\n"


def _rate(n: float, s: float) -> float:
    return n / s if s > 0 else 0.0


def _num(v: float) -> str:
    return str(v) if isinstance(v, int) else f"{v:.6g}"


class NativeReply:
    """llama-server's /completion shapes: one object with `content`, `stop`, `tokens_predicted`,
    `timings`; streamed as `data: {"content": piece, "stop": false}` lines, then the whole object
    (content "") with `stop: true`, and no [DONE]."""

    kind = "completion"
    terminator = None

    def __init__(self, model_id: str, method: str, request: Request, settings: Callable[[Ask], dict], n_ctx: int):
        self.model, self.method, self.request = request.model or model_id, method, request
        self.settings, self.n_ctx = settings, n_ctx
        self.created = int(time.time())

    def opening(self) -> list[dict]:
        return []

    def chunk(self, piece: str, logprobs: tuple[EmittedLogprob, ...] = ()) -> dict:
        out = {"index": 0, "content": piece, "tokens": [], "stop": False, "id_slot": 0}
        if self.request.logprobs is not None:
            out["completion_probabilities"] = native_probabilities(list(logprobs))
        return out

    def piece(self, piece: Piece) -> dict:
        """A streamed piece: its text, the ids of its tokens (as llama-server streams them) and specgen's object."""
        return {**self.chunk(piece.text, piece.logprobs), "tokens": list(piece.tokens), "specgen": piece.extension()}

    def whole(self, done: Done) -> dict:
        s = done.stats
        stop_type = "limit" if done.finish_reason == "length" else "word" if done.stopping_word else "eos"
        return {"index": 0, "content": done.text, "tokens": [], "id_slot": 0, "stop": True, "model": self.model,
                "tokens_predicted": s.n_tokens, "tokens_evaluated": s.n_prompt,
                "generation_settings": {**self.settings(done.ask), "n_ctx": self.n_ctx, "model": self.model,
                                        **({} if s.seed is None else {"seed": s.seed})},
                "prompt": self.request.prompt.text, "has_new_line": "\n" in done.text,
                "truncated": done.finish_reason == "length" and s.n_prompt + s.n_committed >= self.n_ctx - 1,
                "stop_type": stop_type, "stopping_word": done.stopping_word, "tokens_cached": done.stats.n_cached,
                "timings": timings(done), "speculative": speculative(self.method, s),
                **({"completion_probabilities": native_probabilities(list(done.logprobs))}
                   if self.request.logprobs is not None else {})}

    def closing(self, done: Done) -> list[dict]:
        last = {**self.whole(done), "content": ""}
        last.pop("completion_probabilities", None)  # each token's went with its own chunk
        return [last]


class Cors:
    """CORS for browser clients, as pure ASGI (streams pass through untouched): a preflight OPTIONS
    is answered 204 with the methods and the headers it asks for; every response gets
    Access-Control-Allow-Origin. `origins`: "*" allows any; else only those listed (none: every
    preflight is refused, and no response lets a page of another origin read it)."""

    METHODS = "GET, POST, OPTIONS"

    def __init__(self, app, origins: tuple[str, ...] = ()):
        self.app, self.origins = app, tuple(o.rstrip("/") for o in origins)

    def _allowed(self, origin: str | None) -> str | None:
        if "*" in self.origins:
            return "*"
        return origin if origin is not None and origin.rstrip("/") in self.origins else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        allow = self._allowed(headers.get("origin"))
        cors = [] if allow is None else [(b"access-control-allow-origin", allow.encode("latin-1"))]
        if allow not in (None, "*"):
            cors.append((b"vary", b"Origin"))
        if scope["method"] == "OPTIONS":
            if allow is None:
                return await _plain(send, 403, b"cross-origin calls from this origin are off: allow it with specgen serve --cors ORIGIN", [])
            asked = headers.get("access-control-request-headers", "Authorization, Content-Type")
            return await _plain(send, 204, b"", cors + [
                (b"access-control-allow-methods", self.METHODS.encode()),
                (b"access-control-allow-headers", asked.encode("latin-1")),
                (b"access-control-max-age", b"86400")])

        async def send_with_cors(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *cors]}
            await send(message)

        await self.app(scope, receive, send_with_cors)


async def _plain(send, status: int, body: bytes, headers: list) -> None:
    extra = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": [*headers, *(extra if body else [])]})
    await send({"type": "http.response.body", "body": body})
