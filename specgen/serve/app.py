"""The HTTP face: OpenAI's routes and response shapes (plus llama-server's `timings` and a
`speculative` object), llama-server's own routes (routes.py), embeddings (embeddings.py), the chat
page at / (static/index.html), server-sent events for streams (each piece with where its tokens came
from: marks.py), an API key, CORS, body and queue limits."""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from pathlib import Path
from typing import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from specgen.app.callstream import CallHead
from specgen.serve import ecosystem, fields, routes
from specgen.serve.embeddings import Embeddings
from specgen.serve.logprob_shapes import EmittedLogprob, chat_content, completion_logprobs
from specgen.serve.marks import Piece
from specgen.serve.body import RequestError, body_json
from specgen.serve.requests import Request, chat_request, check_vocabulary, completion_request
from specgen.serve.routes import NativeReply, speculative, timings
from specgen.serve.worker import Done, Job, Worker, sampling_notes

MAX_BODY = 8 << 20  # bytes: a long prompt fits many times over; anything bigger is a mistake
DRAIN_LIMIT = 8 * MAX_BODY  # past this a body is not even read to its end
RETRY_AFTER_S = 1
STARTED = int(time.time())  # /metrics' Process-Start-Time-Unix, as llama-server sends
PAGE = Path(__file__).parent / "static" / "index.html"
PAGE_POLICY = "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'"  # nothing from elsewhere


def error_response(e: RequestError) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if e.status == 503 else None
    return JSONResponse(error_body(e), status_code=e.status, headers=headers)


def error_body(e: RequestError) -> dict:
    return {"error": {"message": e.message, "type": e.kind, "param": e.param, "code": e.code}}


def usage(done: Done) -> dict:
    s = done.stats
    return {"prompt_tokens": s.n_prompt, "completion_tokens": s.n_tokens, "total_tokens": s.n_prompt + s.n_tokens,
            "prompt_tokens_details": {"cached_tokens": s.n_cached}}


class Api:
    """Routes over one Worker; `model_id` is what /v1/models lists and responses name; `cors`: the
    origins browsers may call from ("*": any; none: cross-origin calls are refused)."""

    # The routes that take a JSON body -> the method answering each; the fields each knows: fields.ROUTES.
    POSTED = {"/v1/chat/completions": "chat", "/chat/completions": "chat", "/v1/completions": "completions",
              "/completions": "completions", "/completion": "completion", "/tokenize": "tokenize",
              "/detokenize": "detokenize", "/apply-template": "apply_template", "/v1/embeddings": "embeddings",
              "/embeddings": "embeddings", "/embedding": "embeddings"}

    def __init__(self, worker: Worker, model_id: str, method: str, api_key: str | None = None,
                 cors: tuple[str, ...] = ()):
        self.worker, self.model_id, self.method, self.api_key = worker, model_id, method, api_key
        self.target = worker.slot.session.target
        self.embedder = Embeddings(self.target, model_id, worker.n_ctx)
        post, key = ["POST"], self._keyed
        self.app = routes.Cors(Starlette(routes=[
            Route("/", self.page), Route("/health", self.health), Route("/v1/health", self.health),
            Route("/v1/models", key(self.models)), Route("/models", key(self.models)),
            Route("/v1/models/{model_id:path}", key(self.model)),
            Route("/props", key(self.props)), Route("/metrics", key(self.metrics)),
            *(Route(path, key(self._posted(getattr(self, name), path)), methods=post)
              for path, name in self.POSTED.items()),
        ], exception_handlers={HTTPException: self._http_error}), cors)

    async def _http_error(self, request: HttpRequest, exc: HTTPException) -> Response:
        return error_response(RequestError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}"))

    def _keyed(self, handler: Callable) -> Callable:
        """The handler behind the API key (every route but /health); a refused request is a 4xx."""
        async def route(request: HttpRequest) -> Response:
            try:
                self._authorized(request)
                return await handler(request)
            except RequestError as e:
                return error_response(e)
        return route

    def _posted(self, handler: Callable, path: str) -> Callable:
        """The handler with its body read, every field checked against the route's (fields.ROUTES):
        OpenAI's routes refuse a field they do not know, llama-server's ignore it (ecosystem.py);
        the answer's headers and the log name what was ignored or could not act."""
        native = path in ecosystem.NATIVE
        known = fields.ROUTES[path]

        async def route(request: HttpRequest) -> Response:
            body = body_json(await _body(request), known, native)
            response = await handler(request, body)
            said = ecosystem.say(request.method, path, body.ignored or [], body.notes)
            response.headers.update(said)
            return response
        return route

    def _authorized(self, request: HttpRequest) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        anthropic = request.headers.get("x-api-key")  # Anthropic's clients (llama-server takes it too)
        if not (hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode())
                or anthropic is not None and hmac.compare_digest(anthropic.encode(), self.api_key.encode())):
            raise RequestError(401, "expected the header Authorization: Bearer <the server's --api-key> "
                                    "(or X-Api-Key: <key>)", kind="authentication_error")

    async def page(self, request: HttpRequest) -> Response:
        """The chat page (static/index.html): it calls the API from the browser, with the key it is given."""
        return HTMLResponse(PAGE.read_bytes(),
                            headers={"Content-Security-Policy": PAGE_POLICY, "Cache-Control": "no-cache"})

    async def health(self, request: HttpRequest) -> Response:
        return JSONResponse({"status": "ok"})

    def _model_card(self) -> dict:
        t = self.target
        return {"id": self.model_id, "object": "model", "created": 0, "owned_by": "specgen",
                "meta": {"n_vocab": t.n_vocab, "n_ctx_train": t.n_ctx_train, "n_ctx": self.worker.n_ctx}}

    async def models(self, request: HttpRequest) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: HttpRequest) -> Response:
        asked = request.path_params["model_id"]
        if asked != self.model_id:
            raise RequestError(404, f"model {asked!r} not found: this server serves {self.model_id!r}", "model",
                               kind="not_found_error")
        return JSONResponse(self._model_card())

    async def props(self, request: HttpRequest) -> Response:
        return JSONResponse(routes.props(self.worker, self.model_id, self.method))

    async def tokenize(self, request: HttpRequest, body: dict) -> Response:
        return JSONResponse(routes.tokenize(self.target, body))

    async def detokenize(self, request: HttpRequest, body: dict) -> Response:
        return JSONResponse(routes.detokenize(self.target, body))

    async def apply_template(self, request: HttpRequest, body: dict) -> Response:
        return JSONResponse(routes.apply_template(self.target, self.worker.slot.defaults, body))

    async def metrics(self, request: HttpRequest) -> Response:
        response = PlainTextResponse(routes.metrics(self.worker), media_type="text/plain; version=0.0.4")
        # Spelt as llama-server spells it (Starlette would lower-case it; some clients compare exactly).
        response.raw_headers.append((b"Process-Start-Time-Unix", str(STARTED).encode()))
        return response

    async def embeddings(self, request: HttpRequest, body: dict) -> Response:
        """/v1/embeddings in OpenAI's shape; /embedding and /embeddings in llama-server's."""
        native = request.url.path != "/v1/embeddings"
        return JSONResponse(await asyncio.to_thread(self.embedder.run, body, native))

    async def chat(self, request: HttpRequest, body: dict) -> Response:
        return await self._generate(body, chat_request, "chat.completion")

    async def completions(self, request: HttpRequest, body: dict) -> Response:
        return await self._generate(body, completion_request, "text_completion")

    async def completion(self, request: HttpRequest, body: dict) -> Response:
        """llama-server's native /completion."""
        return await self._generate(body, completion_request, "completion")

    def _reply(self, kind: str, request: Request) -> OpenAIReply | NativeReply:
        if kind != "completion":
            return OpenAIReply(kind, self.model_id, self.method, request)
        w = self.worker
        return NativeReply(self.model_id, self.method, request,
                           lambda ask: routes.params(w.slot.defaults, w.default_max_tokens, request, ask), w.n_ctx)

    async def _generate(self, body: dict, parse: Callable[..., Request], kind: str) -> Response:
        request = parse(body, self.target.chat_template)
        check_vocabulary(request, self.target.n_vocab)
        body.notes.extend(sampling_notes(self.worker.slot.defaults, request))
        job = self.worker.submit(request, asyncio.get_running_loop())
        reply = self._reply(kind, request)
        try:
            # A request refused by the model (a prompt too long for the context) is refused before
            # a stream's 200: the first piece decides.
            first = await job.events.get()
            if isinstance(first, RequestError):
                raise first
            if request.stream:
                return StreamingResponse(self._events(job, reply, first), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
            done = first
            if not isinstance(done, Done):
                async for done in _pieces(job):
                    pass  # the pieces are shown whole at the end: only the Done is kept
        except RequestError as e:
            job.cancelled.set()
            return error_response(e)
        except BaseException:
            job.cancelled.set()  # the client went away while it waited: nothing more is owed to it
            raise
        return JSONResponse(reply.whole(done))

    async def _events(self, job: Job, reply: OpenAIReply | NativeReply, first: Piece | Done) -> AsyncIterator[str]:
        async def items() -> AsyncIterator[Piece | Done]:
            yield first
            if not isinstance(first, Done):
                async for item in _pieces(job):
                    yield item

        try:
            for chunk in reply.opening():
                yield _sse(chunk)
            async for item in items():
                for chunk in [reply.piece(item)] if isinstance(item, Piece) else reply.closing(item):
                    yield _sse(chunk)
        except RequestError as e:
            yield _sse(error_body(e))
        finally:
            job.cancelled.set()  # a client that went away stops its generation at the next step
        if reply.terminator:
            yield reply.terminator


async def _body(http: HttpRequest) -> bytes:
    """The request body, at most MAX_BODY bytes. A bigger one is read to its end before the 413
    (unless it is absurd), so that the client, still sending, can read the answer."""
    declared = http.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > DRAIN_LIMIT:
        raise RequestError(413, f"expected a request body of at most {MAX_BODY} bytes, found {declared}")
    body, size = bytearray(), 0
    async for chunk in http.stream():
        size += len(chunk)
        if size <= MAX_BODY:
            body += chunk
        elif size > DRAIN_LIMIT:
            break
    if size > MAX_BODY:
        raise RequestError(413, f"expected a request body of at most {MAX_BODY} bytes, found {size} or more")
    return bytes(body)


async def _pieces(job: Job) -> AsyncIterator[Piece | Done]:
    """The job's text pieces, then its Done; a RequestError the worker put is raised."""
    while True:
        item = await job.events.get()
        if isinstance(item, RequestError):
            raise item
        yield item
        if isinstance(item, Done):
            return


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


class OpenAIReply:
    """One response's shapes: OpenAI's chat.completion / text_completion, whole or as chunks."""

    terminator = "data: [DONE]\n\n"

    def __init__(self, kind: str, model_id: str, method: str, request: Request):
        self.kind, self.method, self.request = kind, method, request
        self.model = request.model or model_id
        self.id = ("chatcmpl-" if kind == "chat.completion" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _head(self, object_name: str) -> dict:
        return {"id": self.id, "object": object_name, "created": self.created, "model": self.model}

    def _choice(self, content: str | dict, finish_reason: str | None, whole: bool,
                logprobs: tuple[EmittedLogprob, ...] | None = None) -> dict:
        if self.kind == "chat.completion":
            key = "message" if whole else "delta"
            body = {"role": "assistant", "content": content} if whole else content
            return {"index": 0, key: body, "finish_reason": finish_reason, "logprobs": self._logprobs(logprobs)}
        return {"index": 0, "text": content, "finish_reason": finish_reason, "logprobs": self._logprobs(logprobs)}

    def _logprobs(self, items: tuple[EmittedLogprob, ...] | None) -> dict | None:
        """The tokens' log-probabilities in this API's shape; None where none were asked (or none here)."""
        if self.request.logprobs is None or items is None:
            return None
        return chat_content(list(items)) if self.kind == "chat.completion" else completion_logprobs(list(items))

    def _extras(self, done: Done) -> dict:
        return {"timings": timings(done), "speculative": speculative(self.method, done.stats)}

    def whole(self, done: Done) -> dict:
        choice = self._choice(done.text, done.finish_reason, True, done.logprobs)
        if done.answer is not None and self.kind == "chat.completion":
            choice["message"]["content"] = done.answer.content
            if done.answer.calls:
                choice["message"]["tool_calls"] = [c.openai() for c in done.answer.calls]
        return {**self._head(self.kind), "choices": [choice], "usage": usage(done), **self._extras(done)}

    def opening(self) -> list[dict]:
        return [self.chunk({"role": "assistant", "content": ""})] if self.kind == "chat.completion" else []

    def closing(self, done: Done) -> list[dict]:
        """A stream's end: a tool answer's chunks, the chunk with finish_reason, the usage if asked."""
        return [*self.answer_chunks(done), self.last(done), *([self.usage_chunk(done)] if self.request.include_usage
                                                              else [])]

    def answer_chunks(self, done: Done) -> list[dict]:
        """With tools, the whole answer at its end where none of it was streamed as it was written
        (a text cut before its branch showed): its content, then each call as OpenAI streams one."""
        if done.answer is None or done.streamed:
            return []
        out = [self.chunk({"content": done.answer.content})] if done.answer.content else []
        for i, call in enumerate(done.answer.calls):
            head = call.openai(i)
            out.append(self.chunk({"tool_calls": [{**head, "function": {"name": call.name, "arguments": ""}}]}))
            out.append(self.chunk({"tool_calls": [{"index": i, "function": {"arguments": call.arguments}}]}))
        return out

    def chunk(self, piece: str | dict, logprobs: tuple[EmittedLogprob, ...] | None = None) -> dict:
        name = "chat.completion.chunk" if self.kind == "chat.completion" else "text_completion"
        content = ({"content": piece} if isinstance(piece, str) else piece) if self.kind == "chat.completion" else piece
        return {**self._head(name), "choices": [self._choice(content, None, False, logprobs)]}

    def piece(self, piece: Piece) -> dict:
        """A chunk of streamed text, with specgen's extension: the text by source, tok/s and τ so far.
        With tools: the content, and the calls' fragments as OpenAI streams them (the head: index,
        id, type, name and empty arguments; then the arguments' text in pieces)."""
        if not piece.calls:
            return {**self.chunk(piece.text, piece.logprobs), "specgen": piece.extension()}
        fragments = [{"index": f.index, "id": f.id, "type": "function", "function": {"name": f.name, "arguments": ""}}
                     if isinstance(f, CallHead) else {"index": f.index, "function": {"arguments": f.text}}
                     for f in piece.calls]
        delta = {**({"content": piece.text} if piece.text else {}), "tool_calls": fragments}
        return {**self.chunk(delta), "specgen": piece.extension()}

    def last(self, done: Done) -> dict:
        """The chunk that ends the choice: its finish_reason, and the numbers local clients read."""
        chunk = self.chunk({} if self.kind == "chat.completion" else "")
        chunk["choices"][0]["finish_reason"] = done.finish_reason
        return {**chunk, **self._extras(done)}

    def usage_chunk(self, done: Done) -> dict:
        """stream_options.include_usage: a last chunk with no choices and the usage."""
        return {**self.chunk(""), "choices": [], "usage": usage(done)}
