"""Constraints over a llama.cpp vocabulary, by llguidance (JSON Schema, GBNF, Lark, regex).

llguidance builds its tokenizer from the model's vocabulary (0.4 s for smollm2's 49k tokens, ~3 s
for gemma's 262k): once per loaded model, kept beside it. Every end-of-generation token of the
model is one of the tokenizer's EOS tokens, so each is allowed exactly where the grammar accepts.
A matcher per text; masks are filled into one preallocated bitmask (~45 us a row).
"""

from __future__ import annotations

import json
import threading
import warnings
from typing import Any

import numpy as np

from specgen.core.constraint import ConstraintSpec
from specgen.errors import ConstraintError

# JSON layouts (core/constraint.py LAYOUTS), as llguidance's JSON compiler options.
JSON_OPTIONS = {"compact": {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "},
                "free": {"whitespace_flexible": True, "whitespace_pattern": r"(?: |\n{1,2}[ \t]{0,20})"}}
ANY_OBJECT = {"type": "object"}

_LOCK = threading.Lock()
_TOKENIZERS: dict[int, Any] = {}  # id(model) -> LLTokenizer (the model holds it alive: see tokenizer())


def _llg():
    try:
        import llguidance
        import llguidance.llamacpp  # noqa: F401
        import llguidance.numpy  # noqa: F401
    except ImportError as e:  # pragma: no cover - a dependency of specgen
        raise ConstraintError(f"constrained output needs the llguidance package: {e}") from None
    return llguidance


def tokenizer(model) -> Any:
    """The model's llguidance tokenizer, built on first use and kept on the model."""
    cached = getattr(model, "_llg_tokenizer", None)
    if cached is not None:
        return cached
    llg = _llg()
    with _LOCK:
        cached = getattr(model, "_llg_tokenizer", None)
        if cached is None:
            eog = [t for t in range(model.n_vocab) if model.is_eog(t)] or [model.eos]
            with warnings.catch_warnings():  # its adapter calls a llama.cpp function deprecated by name only
                warnings.simplefilter("ignore", DeprecationWarning)
                cached = llg.llamacpp.lltokenizer_from_vocab(model.vocab_ptr, n_vocab=model.n_vocab, eos_token=eog)
            model._llg_tokenizer = cached
    return cached


def grammar_text(spec: ConstraintSpec) -> str:
    """The llguidance grammar for a spec; ConstraintError (one line) when it cannot be read."""
    llg = _llg()
    try:
        if spec.kind == "json_object":
            return llg.LLMatcher.grammar_from_json_schema(ANY_OBJECT, defaults=JSON_OPTIONS[spec.layout])
        if spec.kind == "json_schema":
            schema = json.loads(spec.text) if isinstance(spec.text, str) else spec.text
            if not isinstance(schema, dict):
                raise ConstraintError(f"a JSON schema must be a JSON object, found {type(schema).__name__}")
            return llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS[spec.layout])
        if spec.kind == "regex":
            return llg.LLMatcher.grammar_from_regex(spec.text)
        if spec.kind == "lark" and "%json" in spec.text:  # inline schemas (tool calls) take the layout too
            return llg.LLMatcher.grammar_from_lark(spec.text.replace("%json {", "%json " + _x_guidance(spec.layout)))
        return llg.grammar_from("gbnf" if spec.kind == "gbnf" else "lark", spec.text)
    except json.JSONDecodeError as e:
        raise ConstraintError(f"JSON schema: expected JSON, found an error at line {e.lineno} column {e.colno}: "
                              f"{e.msg}") from None
    except ValueError as e:
        raise ConstraintError(f"{spec.kind} grammar: {_one_line(e)}") from None


def _x_guidance(layout: str) -> str:
    """The opening of an inline schema that carries the layout's options (llguidance reads a
    schema's "x-guidance" key): `%json {` becomes `%json {"x-guidance": {...},`."""
    return "{" + json.dumps({"x-guidance": JSON_OPTIONS[layout]})[1:-1] + ","


class GuidanceConstraint:
    """core.constraint.Constraint over an llguidance matcher. The matcher's error state (a limit of
    its lexer or parser hit, a token it refused) is sticky and reads as an end-only mask: each call
    that could meet it raises a ConstraintError instead, so an answer is never cut short as "stop"."""

    def __init__(self, model, spec: ConstraintSpec):
        llg = _llg()
        self.n_vocab = model.n_vocab
        tok = tokenizer(model)
        self.matcher = llg.LLMatcher(tok, grammar_text(spec), log_level=0)
        if self.matcher.is_error():
            raise ConstraintError(f"{spec.kind} refused by the grammar compiler: {_one_line(self.matcher.get_error())}")
        self._bits = llg.numpy.allocate_token_bitmask(1, self.n_vocab)
        self._fill = llg.numpy.fill_next_token_bitmask
        self._allowed: np.ndarray | None = None
        self._position = 0  # consume() calls: the output's length so far
        # End-of-generation tokens consumed once stopped: llguidance takes them as no-ops and its
        # rollback does not count them, where Constraint.rollback counts consume() calls.
        self._idle = 0

    def allowed(self) -> np.ndarray:
        if self._allowed is None:
            self._fill(self.matcher, self._bits, 0)
            self._check()
            bits = np.unpackbits(self._bits[0].view(np.uint8), bitorder="little")
            self._allowed = bits[:self.n_vocab].view(bool)
        return self._allowed

    def consume(self, token: int) -> None:
        self._allowed = None
        self._idle += self.matcher.is_stopped()
        ok = self.matcher.consume_token(int(token))
        self._check()
        if not ok:  # pragma: no cover - a refusal without an error state
            raise ConstraintError(f"the grammar engine refused token {token} at output token {self._position + 1}")
        self._position += 1

    def rollback(self, n: int) -> None:
        """Take back the last n consume() calls; a ConstraintError (one line) where llguidance cannot."""
        self._allowed = None
        at, self._position = self._position, self._position - n
        idle = min(n, self._idle)
        self._idle, n = self._idle - idle, n - idle
        if n and not self.matcher.rollback(n):
            raise ConstraintError(f"the grammar engine could not take back {n} tokens at output token {at}: "
                                  f"{self._reason()}")

    def valid_prefix(self, tokens: list[int]) -> int:
        n = self.matcher.validate_tokens([int(t) for t in tokens]) if tokens else 0
        self._check()
        return n

    def forced(self) -> list[int]:
        tokens = list(self.matcher.compute_ff_tokens())
        self._check()
        return tokens

    def stopped(self) -> bool:
        self._check()
        return self.matcher.is_stopped()

    def position(self) -> int:
        return self._position

    def _check(self) -> None:
        if self.matcher.is_error():
            raise ConstraintError(f"the grammar engine failed at output token {self._position + 1}: {self._reason()}")

    def _reason(self) -> str:
        """The matcher's error, one line, without the parser state it appends (tokens, counters: a page of it)."""
        return _one_line(str(self.matcher.get_error() or "no reason given").split("<state>")[0])


def _one_line(e: object) -> str:
    text = " ".join(str(e).split())
    return text[:300] + ("..." if len(text) > 300 else "")
