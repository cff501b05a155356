"""Generation loop: prefill, then steps that each end in one target decode, streamed as typed events.

The caller consumes `TokenEvent`s as they are committed and one final `FinishEvent`; `RunStats` is
updated in place, so a caller interrupted mid-run still has the partial numbers.

KV layout (shared with the speculative methods): the committed text lives in sequence 0; the last
committed token is "pending" (not yet evaluated) and is the root of every step's batch. Plain
decoding is the step whose tree is just that root.
"""

from __future__ import annotations

import codecs
import time
from dataclasses import dataclass
from typing import Iterator, Union

from .errors import PromptError
from .protocol import Batch, Context, Model
from .sampling import Sampler, SamplingParams
from .stats import RunStats

COMMITTED_SEQ = 0


@dataclass(frozen=True)
class GenerationRequest:
    prompt_tokens: list[int]
    max_tokens: int
    sampling: SamplingParams


@dataclass(frozen=True)
class TokenEvent:
    token: int
    text: str  # may be "" while a multi-byte character is incomplete
    from_draft: bool


@dataclass(frozen=True)
class FinishEvent:
    reason: str  # "length" (max tokens or context full) | "stop" (end-of-generation token)
    tail: str = ""  # bytes of an unfinished UTF-8 character, flushed as replacement text


Event = Union[TokenEvent, FinishEvent]


class TextDecoder:
    """Turns token pieces into text incrementally: a UTF-8 character may span several tokens."""

    def __init__(self, model: Model):
        self.model = model
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, token: int) -> str:
        return self._utf8.decode(self.model.piece(token))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


def check_prompt_fits(n_prompt: int, ctx: Context) -> None:
    if n_prompt == 0:
        raise PromptError("empty prompt: expected some text, got 0 tokens")
    if n_prompt >= ctx.n_ctx:
        raise PromptError(f"prompt is {n_prompt} tokens but the context holds {ctx.n_ctx}: "
                          f"use --ctx {n_prompt + 256} or more")


def prefill(ctx: Context, tokens: list[int]) -> None:
    """Put every prompt token but the last in sequence 0; the last one is the first step's root."""
    ctx.clear()
    head = tokens[:-1]
    for off in range(0, len(head), ctx.n_batch):
        batch = Batch()
        for j, tok in enumerate(head[off:off + ctx.n_batch]):
            batch.add(tok, off + j, (COMMITTED_SEQ,), False)
        ctx.decode(batch)


def generate_plain(model: Model, ctx: Context, request: GenerationRequest, stats: RunStats) -> Iterator[Event]:
    """Plain autoregressive decoding: one target decode and one draw from p per token."""
    tokens = request.prompt_tokens
    check_prompt_fits(len(tokens), ctx)
    clock = time.perf_counter
    t0 = clock()
    prefill(ctx, tokens)
    stats.prefill_s = clock() - t0

    sampler = Sampler(request.sampling)
    decoder = TextDecoder(model)
    pending, n_past = tokens[-1], len(tokens) - 1
    reason = "length"
    t0 = clock()
    while stats.n_tokens < request.max_tokens:
        if n_past + 1 >= ctx.n_ctx:
            break  # context full: stop like max tokens
        logits = ctx.decode(Batch([pending], [n_past], [(COMMITTED_SEQ,)], [True]))[0]
        stats.target_calls += 1
        n_past += 1
        token = sampler.sample(logits)
        stats.n_committed += 1
        if model.is_eog(token):
            reason = "stop"
            break
        stats.n_tokens += 1
        pending = token
        event = TokenEvent(token, decoder(token), from_draft=False)
        stats.decode_s += clock() - t0
        yield event  # time spent by the consumer (rendering) is not decode time
        t0 = clock()
    stats.decode_s += clock() - t0
    yield FinishEvent(reason, decoder.flush())
