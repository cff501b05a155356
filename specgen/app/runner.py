"""Running prompts on a session: one method each, the prompt rendered (chat template or plain turns),
its events streamed to the caller, gathered into a Completion, and its --json record."""

from __future__ import annotations

import contextlib
import json
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

from specgen.app.ask import Ask, Overrides, ask_for, check_vocabulary, tools_format
from specgen.app.config import Defaults, RunConfig
from specgen.app.prompts import Prompt
from specgen.app.session import TARGET_OUTPUTS, TARGET_SEQS, Session
from specgen.app.stops import StopText
from specgen.app.structured import (GENERIC, ToolAnswer, call_history, generic_messages, generic_system_prompt,
                                    parse_answer)
from specgen.core.constraint import ConstraintSpec
from specgen.core.engine import Event, FinishEvent, GenerationRequest, TokenEvent, generate
from specgen.core.kv import PromptCache
from specgen.core.protocol import Drafter, Model
from specgen.core.sampling import SamplingParams
from specgen.core.stats import RunStats
from specgen.drafting import methods as M
from specgen.drafting.calls import CallRecord, CallSource
from specgen.drafting.forced import ConstrainedDrafter
from specgen.errors import ConfigError, ConstraintError


def use_chat(defaults: Defaults, model: Model) -> bool:
    """--chat/--no-chat, defaulting to on exactly when the GGUF carries a chat template."""
    return defaults.chat if defaults.chat is not None else bool(model.chat_template)


def render_prompt(model: Model, prompt: Prompt, chat: bool, system: str | None = None) -> str:
    """The prompt as text: through the chat template, or (base models) the turns joined by blank
    lines. Every function the request offers is listed, whatever tool_choice (or a response format)
    says, so that the loop's requests read as one prefix (the prompt cache keeps it): given to a
    template that renders tools, else in a system message (structured.py), where a history's calls,
    results and answers are written as that format shows them. A last assistant message is
    continued (prefill), as llama-server does."""
    messages = prompt.messages(system)
    functions = prompt.listed
    tools = None
    if tools_format(model, chat) == GENERIC:
        messages = generic_messages(messages, tools_listed=bool(functions))
        if functions:
            messages = _with_system(messages, generic_system_prompt(functions))
    elif functions:
        tools = [{"type": "function", "function": f} for f in functions]
    if not chat:
        return "\n\n".join(m["content"] for m in messages)
    prefill = messages.pop()["content"] if messages[-1]["role"] == "assistant" else ""
    if prefill and (prompt.constraint is not None or prompt.tools is not None):
        raise ConstraintError("a conversation that ends with an assistant message (continued as a prefill) cannot "
                              "also ask for response_format or tools: expected one or the other")
    if prompt.template_vars:  # chat_template_kwargs: the template's own variables, as llama-server passes them
        variables = {name: json.loads(value) for name, value in prompt.template_vars}
        return model.format_chat(messages, tools, **variables) + prefill
    return model.format_chat(messages, tools) + prefill


def _with_system(messages: list[dict], text: str) -> list[dict]:
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": f"{text}\n\n{messages[0]['content']}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def encode_prompt(model: Model, prompt: Prompt, chat: bool, system: str | None = None) -> list[int]:
    """Prompt tokens (render_prompt's text; special tokens parsed in a chat template's text, and in a
    raw prompt that asks for it: Prompt.parse_special)."""
    text = render_prompt(model, prompt, chat, system)
    if not chat:
        return model.tokenize(text, add_special=True, parse_special=prompt.parse_special)
    tokens = model.tokenize(text, add_special=True, parse_special=True)
    # Templates usually write the BOS text themselves; tokenizing with add_special adds another.
    if len(tokens) >= 2 and tokens[0] == tokens[1] == model.bos:
        tokens = tokens[1:]
    return tokens


@dataclass
class Completion:
    """One prompt run to its end (or interrupted)."""

    prompt_index: int
    text: str
    stats: RunStats
    finish_reason: str  # length | stop | interrupted
    stopping_word: str = ""  # the stop string that ended the text, if one did
    ask: Ask | None = None  # what ran (record() reports its sampling)


@dataclass(frozen=True)
class Step:
    """One event as a Transcript passed it: its piece starts at `at` in the text, `text` is what
    the event lets be shown (held back while a stop string may be forming), `sent` how much was
    shown before it."""

    event: Event
    text: str
    at: int
    sent: int


class Transcript:
    """An Ask's events gathered into its Completion as they come (an interrupted run keeps what
    was shown), under the Ask's stop strings (app/stops.py: the text ends before the first one).
    The one loop both edges cut text in: the command line (cli/generate.run_to_sink) and the server
    (serve/worker.py) each follow() the events through one."""

    def __init__(self, ask: Ask):
        self.ask, self.prompt_index, self.stats = ask, ask.prompt.index, RunStats()
        self.pieces: list[str] = []  # every piece as the engine gave it
        self.stop = StopText(ask.stop)
        self.reason = "interrupted"

    def add(self, event: Event) -> None:
        piece = event.text if isinstance(event, TokenEvent) else event.tail
        self.pieces.append(piece)
        self.stop.feed(piece)
        if isinstance(event, FinishEvent):
            self.stop.flush()
            self.reason = event.reason
        if self.stop.hit:
            self.reason = "stop"

    def completion(self) -> Completion:
        done = self.reason != "interrupted"  # else what was shown: held-back text never was
        return Completion(self.ask.prompt.index, self.stop.text if done else self.stop.text[:self.stop.sent],
                          self.stats, self.reason, self.stop.word, self.ask)

    def follow(self, events: Iterator[Event], cancelled: Callable[[], bool] = lambda: False) -> Iterator[Step]:
        """`events`, each added as it passes, as Steps; a stop string ends them, or `cancelled()`
        before an event is added (the stream closed: the engine stops)."""
        try:
            for event in events:
                if cancelled():
                    break
                at, sent = len(self.stop.text), self.stop.sent
                self.add(event)
                yield Step(event, self.stop.text[sent:self.stop.sent], at, sent)
                if self.stop.hit:
                    break
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[Transcript]:
        """Ctrl-C inside raises Interrupted with what was committed: wherever it lands, in the
        decoding loop or in the caller's rendering between two events."""
        try:
            yield self
        except Interrupted:
            raise
        except KeyboardInterrupt:
            raise Interrupted(self.completion()) from None


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run; `partial` keeps what was generated (finished outputs are never lost)."""

    def __init__(self, partial: Completion):
        super().__init__()
        self.partial = partial


def check_bias(sampling: SamplingParams, target: Model) -> None:
    """logit_bias names tokens of the target's vocabulary (ask.check_vocabulary, the command line's words)."""
    check_vocabulary(sampling.penalties.bias, target.n_vocab, "logit bias", target.name, ban="-inf")


def check_rows(ask: Ask, target: Model) -> None:
    """A screened target's rows are exact only at their argmax (llama/screen.py): an Ask that needs
    more (Ask.needs_exact_rows) is refused on one, naming what needs them."""
    why = ask.why_exact_rows
    if why is None or target.screen is None:
        return
    error = ConstraintError if ask.constraint is not None else ConfigError
    verb = "need" if why in ("logprobs", "penalties and logit bias") else "needs"
    raise error(f"{why} {verb} the target loaded without screening "
                "(load_session(..., screen=False))")


@dataclass
class Learned:
    """What a runner learns across prompts for one (chat, sampling): a measured method's drafter
    (None: the method's drafters are made fresh per prompt) and which call-aware values pay."""

    drafter: Drafter | None
    calls: CallRecord


LEARNED_KEPT = 8  # (chat, sampling) pairs whose learning a runner keeps (a server sees many)


class Runner:
    """One method on a session, running Asks. auto's planner lives as long as the runner: what it
    learns about acceptance carries over prompts (per chat and sampling). `prompt_cache`: what the
    session's target context holds (one per context, shared by every runner on it): a prompt's
    common prefix with it is not read again. `cfg` gives the method and the request defaults
    (RunConfig.defaults: the command line's, a config file's, the server's) every Ask starts from."""

    def __init__(self, cfg: RunConfig, session: Session, prompt_cache: PromptCache | None = None):
        self.cfg = cfg
        self.defaults = cfg.defaults  # what each Ask starts from; the rest of cfg was read at load
        self.session = session
        self.prompt_cache = prompt_cache
        self.method = M.get(cfg.method)
        self.chat = use_chat(self.defaults, session.target)
        self._learned: OrderedDict[tuple[bool, SamplingParams, bool], Learned] = OrderedDict()

    def ask(self, prompt: Prompt, max_tokens: int | None = None, logprobs: int | None = None,
            overrides: Overrides = Overrides(), stop: tuple[str, ...] | None = None, chat: bool | None = None,
            cache_prompt: bool = True) -> Ask:
        """`prompt` as an Ask: the one builder every edge calls. This runner's settings (the command
        line's, a config file's, the server's) with what the edge gave for this generation in their
        place: its sampling `overrides`, `max_tokens`, `stop` strings (None: the prompt's own, else
        the runner's), `chat` (None: the runner's)."""
        d = self.defaults
        stop = stop if stop is not None else d.stop if prompt.stop is None else prompt.stop
        return ask_for(self.session.target, prompt, self.chat if chat is None else chat, d.json_layout,
                       sampling=overrides.over(d.sampling), max_tokens=d.max_tokens if max_tokens is None else max_tokens,
                       logprobs=logprobs,
                       stop=stop, cache_prompt=cache_prompt)

    def _learning(self, ask: Ask) -> Learned:
        # What is learned holds for any seed; a seeded Ask's planner learns apart (from the fixed curves).
        key = (ask.chat, replace(ask.sampling, seed=None), ask.plans_from_curves)
        if key not in self._learned:
            inputs = self.session.drafter_inputs(self.method, ask.sampling, ask.plans_from_curves)
            kept = self.method.drafter(inputs) if self.method.measured else None
            self._learned[key] = Learned(kept, CallRecord())
            while len(self._learned) > LEARNED_KEPT:
                self._learned.popitem(last=False)
        self._learned.move_to_end(key)
        return self._learned[key]

    def prompt_text(self, prompt: Prompt) -> str:
        """The text this runner's model reads for `prompt` (what another tool must be given)."""
        return render_prompt(self.session.target, prompt, self.chat, self.defaults.system)

    def constraint_for(self, prompt: Prompt) -> ConstraintSpec | None:
        """What this runner's answer to `prompt` must match (another tool must be given it too)."""
        return self.ask(prompt).constraint

    def stream(self, ask: Ask, stats: RunStats | None = None) -> Iterator[Event]:
        """The typed events of one Ask: a TokenEvent per committed token, then a FinishEvent with
        the stats (`stats`, updated in place as the run goes, if given). Before the FinishEvent the
        drafter is told the text is done: later prompts (and, with the store, later runs) may draft
        from it."""
        target = self.session.target
        check_bias(ask.sampling, target)
        check_rows(ask, target)
        tokens = encode_prompt(target, ask.prompt, ask.chat, self.defaults.system)
        constraint = None if ask.constraint is None else target.constrain(ask.constraint)
        request = GenerationRequest(tokens, ask.max_tokens, ask.sampling, constraint, ask.logprobs, ask.cache_prompt)
        learned = self._learning(ask)
        drafter = learned.drafter if self.method.measured else self.method.drafter(
            self.session.drafter_inputs(self.method, ask.sampling))  # fresh per prompt
        ctx = self.session.context_for(self.method, ask.plans_from_curves)
        if constraint is not None and drafter is not None:
            drafter = ConstrainedDrafter(drafter, constraint, max_nodes=TARGET_OUTPUTS, max_leaves=TARGET_SEQS,
                                         calls=self._call_source(ask, len(tokens), learned.calls))
        for event in generate(target, ctx, request, stats if stats is not None else RunStats(), drafter,
                              self.prompt_cache):
            if isinstance(event, FinishEvent) and drafter is not None:
                drafter.finish_text()
            yield event

    def _call_source(self, ask: Ask, context: int, calls: CallRecord) -> CallSource | None:
        """Call-aware drafting (drafting/calls.py), where the method does it and tools are offered;
        priced on the target's cost curve after the prompt's `context` tokens, where it has one."""
        prompt = ask.prompt
        if not self.method.call_aware or prompt.tools is None:
            return None
        target = self.session.target
        costs = self.session.costs_for(ask.plans_from_curves) if self.method.measured else None
        calls.cost = None if costs is None else costs.given(context)
        history = call_history(prompt.messages(self.defaults.system), prompt.tools, tools_format(target, ask.chat))
        return CallSource(history, lambda text: target.tokenize(text, add_special=False, parse_special=False),
                          target.piece, calls)

    def answer(self, ask: Ask, text: str) -> ToolAnswer | None:
        """With tools: the text as content and tool calls (None without tools)."""
        if ask.prompt.tools is None:
            return None
        return parse_answer(text, tools_format(self.session.target, ask.chat), ask.prompt.tools)

    def run(self, ask: Ask) -> Completion:
        """Run an Ask to the end (or its stop string). Ctrl-C raises Interrupted carrying the partial completion."""
        with Transcript(ask).interruptible() as transcript:
            for _ in transcript.follow(self.stream(ask, transcript.stats)):
                pass
        return transcript.completion()

    def record(self, result: Completion) -> dict[str, Any]:
        """The --json record (field names are a contract: scripts depend on them)."""
        return {
            "prompt_index": result.prompt_index,
            "text": result.text,
            "method": self.cfg.method,
            "target": self.session.target_label,
            "draft": self.session.draft_label,
            "temperature": (self.defaults if result.ask is None else result.ask).sampling.temperature,
            **result.stats.record_fields(),
            "finish_reason": result.finish_reason,
            **({"stopping_word": result.stopping_word} if result.stopping_word else {}),
        }
