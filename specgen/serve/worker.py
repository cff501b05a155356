"""One decode loop for the whole server: the models are not thread-safe, so requests run one at a
time in arrival order on a worker thread, each streaming its pieces back to the request's event
loop. A bounded number may wait; past it the server answers 503."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass, field

from specgen.app.ask import Ask, tools_format
from specgen.app.callstream import CallStream
from specgen.app.config import Defaults, RunConfig
from specgen.app.runner import Runner, Transcript
from specgen.app.structured import ToolAnswer
from specgen.app.session import Session
from specgen.core.engine import FinishEvent, TokenEvent
from specgen.core.kv import PromptCache
from specgen.core.stats import RunStats
from specgen.errors import SpecgenError
from specgen.serve.logprob_shapes import EmittedLogprob, Pending, emitted_logprob
from specgen.serve.marks import Live, Piece, Sources
from specgen.serve.requests import Request, RequestError

log = logging.getLogger("specgen.serve")


@dataclass(frozen=True)
class Done:
    ask: Ask  # what ran: the request's sampling, stop strings and limit over the server's
    text: str
    finish_reason: str  # stop | length | tool_calls
    stats: RunStats
    answer: ToolAnswer | None = None  # with tools: the text as content and calls
    stopping_word: str = ""  # the stop string that ended it, if one did
    logprobs: tuple[EmittedLogprob, ...] = ()  # every shown token's, when the request asked for them
    streamed: bool = False  # with tools: the answer went out as Pieces, as it was read (nothing more to send)


@dataclass
class Job:
    request: Request
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def put(self, item: object) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, item)


class Slot:
    """The server's one slot (llama-server's word): its one Runner on its one session (it keeps what
    auto learns per chat and sampling), and the server's settings that a request's Ask starts from.
    Its prompt cache is the session's one target context (`prompt_cache` False: nothing is reused,
    every prompt read as a cold cache reads it; `cache_bytes`: host memory for other conversations'
    prefixes, kv.PromptCache's budget)."""

    def __init__(self, cfg: RunConfig, session: Session, prompt_cache: bool = True, cache_bytes: int = 0):
        self.session = session
        self.cache = PromptCache(reuse=prompt_cache, budget=cache_bytes)
        self.runner = Runner(cfg, session, self.cache)
        self.defaults = self.runner.defaults  # what a request's Ask starts from

    def ask(self, request: Request, max_tokens: int) -> Ask:
        """The request as an Ask (Runner.ask, the one builder): its own sampling values and stop
        strings over the server's; a chat through the template where the model has one, a
        completion as raw text."""
        return self.runner.ask(request.prompt, max_tokens, request.logprobs, request.sampling, request.stop or None,
                               request.chat and bool(self.session.target.chat_template), request.cache_prompt)


def sampling_notes(defaults: Defaults, request: Request) -> list[str]:
    """What the request's `samplers` order turned off, said plainly; a 400 where specgen cannot
    follow it (checked before the request waits in line)."""
    try:
        return request.sampling.notes(defaults.sampling)
    except SpecgenError as e:
        raise RequestError(400, str(e), "samplers") from None


@dataclass
class Metrics:
    """Counters over the server's life, for /metrics (routes.py writes them as Prometheus text)."""

    requests: int = 0  # generations finished
    failed: int = 0  # generations that ended in an error
    tokens_max: int = 0  # the longest prompt + generation seen
    total: RunStats = field(default_factory=RunStats)  # every finished generation's counters, folded

    def add(self, s: RunStats) -> None:
        self.requests += 1
        self.tokens_max = max(self.tokens_max, s.n_prompt + s.n_committed)
        self.total.add(s)


class Worker:
    """`default_max_tokens`: a request's limit when it gives none (None: until the context ends)."""

    def __init__(self, slot: Slot, max_queue: int, default_max_tokens: int | None = None):
        self.slot, self.max_queue, self.default_max_tokens = slot, max_queue, default_max_tokens
        self.metrics = Metrics()
        self.busy = False  # a request is being decoded
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._waiting = 0  # submitted, not finished
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="specgen-decode", daemon=True)
        self._thread.start()

    def submit(self, request: Request, loop: asyncio.AbstractEventLoop) -> Job:
        with self._lock:
            if self._waiting >= self.max_queue + 1:  # the one decoding and max_queue waiting
                raise RequestError(503, f"the server is busy: {self.max_queue} requests are waiting already; "
                                        "retry shortly", kind="server_busy")
            self._waiting += 1
        job = Job(request, loop)
        self._jobs.put(job)
        return job

    @property
    def n_ctx(self) -> int:
        return self.slot.session.target_ctx.n_ctx

    @property
    def deferred(self) -> int:
        """Requests waiting behind the one decoded."""
        with self._lock:
            return max(0, self._waiting - self.busy)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            with self._lock:
                self.busy = True
            outcome: Done | RequestError | None = None
            try:
                if not job.cancelled.is_set():
                    outcome = self._generate(job)
                    self.metrics.add(outcome.stats)
            except SpecgenError as e:  # a prompt too long for the context, say
                self.metrics.failed += 1
                outcome = RequestError(400, str(e))
            except Exception as e:  # never a traceback to the client; the log has it
                self.metrics.failed += 1
                log.exception("generation failed")
                outcome = RequestError(500, f"generation failed: {type(e).__name__}", kind="server_error")
            finally:
                with self._lock:  # idle again before the client hears the outcome (/metrics agrees)
                    self._waiting -= 1
                    self.busy = False
            if outcome is not None:
                job.put(outcome)

    def _generate(self, job: Job) -> Done:
        """Run the request, putting each showable Piece of text; a cancelled job stops at the next step.
        The text is cut at its stop strings by the command line's loop (runner.Transcript)."""
        request, runner = job.request, self.slot.runner
        ask = self.slot.ask(request, self._limit(request))
        transcript = Transcript(ask)
        stats, stop = transcript.stats, transcript.stop
        if ask.max_tokens == 0:  # llama-server's n_predict 0: nothing to generate
            return Done(ask, "", "length", stats)
        # With tools the text is read as content and calls as it is written (callstream.py).
        tools = ask.prompt.tools
        calls = None if tools is None else CallStream(tools_format(runner.session.target, ask.chat), tools)
        pending, target = Pending(), runner.session.target
        events = runner.stream(ask, stats)
        sources = Sources()

        def show(text: str, sent: int, logprobs: tuple[EmittedLogprob, ...]) -> None:
            # text: stop.text[sent:sent + len(text)]
            if calls is not None:
                if text and (delta := calls.feed(stop.text[:stop.sent])):
                    job.put(Piece(delta.content, (), Live.of(stats), calls=delta.calls))
            elif text or logprobs:
                end = sent + len(text)
                job.put(Piece(text, sources.cut(stop.text, sent, end), Live.of(stats), sources.tokens(sent, end),
                              logprobs))

        try:
            for step in transcript.follow(events, job.cancelled.is_set):
                event = step.event
                if isinstance(event, TokenEvent):
                    if event.logprob is not None:
                        pending.add(emitted_logprob(target, event.logprob, step.at))
                    sources.add(step.at, event.source, event.token)
                    show(step.text, step.sent, tuple(pending.release(stop.sent)))
                elif isinstance(event, FinishEvent):
                    show(step.text, step.sent, tuple(pending.release(stop.sent, inclusive=not stop.hit)))
        finally:
            events.close()  # an early end (a stop string, a client gone): the next prefill starts clean
        reason = "length" if transcript.reason == "interrupted" else transcript.reason  # interrupted: cancelled
        answer = None if calls is None else self._answer(job, calls, stop.text, stats)
        if answer is not None and answer.calls and reason == "stop" and not stop.hit:
            reason = "tool_calls"  # the grammar ended the answer: its calls are whole (cut: "stop"/"length")
        return Done(ask, stop.text, reason, stats, answer, stop.word, tuple(pending.sent), calls is not None)

    @staticmethod
    def _answer(job: Job, calls: CallStream, text: str, stats: RunStats) -> ToolAnswer:
        """The tool answer as its stream read it, whole or cut (OpenAI answers a cut call as written):
        the last of it put as a Piece, so that a streamed reply and a whole one are the same answer."""
        if last := calls.finish(text):
            job.put(Piece(last.content, (), Live.of(stats), calls=last.calls))
        return calls.answer()

    def _limit(self, request: Request) -> int:
        """Tokens the request may generate: its max_tokens, else the server's default; -1 (or no
        default) means until the context ends, where the engine stops anyway."""
        limit = self.default_max_tokens if request.max_tokens is None else request.max_tokens
        return self.n_ctx if limit is None or limit < 0 else limit
