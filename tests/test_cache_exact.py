"""The prompt cache stays exact in long conversations: past n_ctx, alternating conversations, cache_prompt
false in between, sliding-window models. Each warm answer is checked against a cold one (a fresh KV),
first on a fake whose KV lives in cells as llama.cpp's does (a cell out of position order changes the
logits, as it changes attention's sum), then on the real models through the server's own runner."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

import pytest

from fakes import FakeModel
from harness import generated
from specgen.core.engine import TokenEvent
from specgen.core.kv import PromptCache
from specgen.core.logprobs import TokenLogprob
from specgen.core.protocol import Batch
from specgen.core.sampling import SamplingParams
from specgen.core.stats import RunStats
from specgen.drafting.lookup import LookupDrafter

LOOPY = {(3, 4): 5, (4, 5): 3, (5, 3): 4}  # a text that repeats: lookup drafts, and some drafts fail


@dataclass
class Cell:
    pos: int
    tok: int
    seqs: set[int] = field(default_factory=set)


class CellContext:
    """llama.cpp's unified KV cache as specgen's build runs it: `n_ctx` cells; the head only moves on,
    wrapping round to the first usable cell; with a sliding window of `n_swa`, a cell the window has left
    is usable again when the head comes round, and reusing it drops its sequence's positions up to its
    own (llama_kv_cache::apply_ubatch). A token's logits read its sequence's visible cells in cell order,
    as attention sums them: a cell out of position order, or a position missing, changes them."""

    def __init__(self, model: FakeModel, n_ctx: int, n_swa: int = 0, n_seq_max: int = 8, n_batch: int = 8):
        self.model, self.n_ctx, self.n_swa = model, n_ctx, n_swa
        self.n_seq_max, self.n_batch, self.n_threads = n_seq_max, n_batch, 1
        self.n_vocab, self.columns = model.n_vocab, None
        self.clear()

    def clear(self) -> None:
        self.cells: list[Cell | None] = [None] * self.n_ctx
        self.head = self.cells_written = 0
        self.wrapped = False

    def _seq(self, seq: int) -> list[Cell]:
        return [c for c in self.cells if c is not None and seq in c.seqs]

    def _usable(self, cell: Cell | None) -> bool:
        if cell is None:
            return True
        if not self.n_swa or len(cell.seqs) != 1:
            return False
        return max(c.pos for c in self._seq(next(iter(cell.seqs)))) + 1 - cell.pos >= self.n_swa

    def _place(self, tok: int, pos: int, seqs: tuple[int, ...]) -> None:
        for step in range(self.n_ctx):
            i = (self.head + step) % self.n_ctx
            if self._usable(self.cells[i]):
                break
        else:
            raise AssertionError("context full")
        self.wrapped |= i < self.head
        old = self.cells[i]
        if old is not None:  # a cell the window left: its sequence loses every position up to it
            self.seq_rm(next(iter(old.seqs)), 0, old.pos + 1)
        self.cells[i], self.head = Cell(pos, tok, set(seqs)), i + 1

    def _history(self, seq: int, pos: int) -> tuple[int, ...]:
        return tuple(c.tok for c in self._seq(seq) if c.pos < pos and not (self.n_swa and pos - c.pos >= self.n_swa))

    def decode(self, batch: Batch):
        import numpy as np

        assert len(batch) <= self.n_batch
        for tok, pos, seqs in zip(batch.tokens, batch.positions, batch.seq_ids):
            self._place(tok, pos, seqs)
        self.cells_written += len(batch)
        rows = [self.model.logits_for(self._history(seqs[0], pos) + (tok,))
                for tok, pos, seqs, want in zip(batch.tokens, batch.positions, batch.seq_ids, batch.logits) if want]
        return np.array(rows, dtype=np.float32).reshape(len(rows), self.n_vocab)

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        hi = float("inf") if p1 < 0 else p1
        for i, c in enumerate(self.cells):
            if c is not None and max(p0, 0) <= c.pos < hi and (seq_id < 0 or seq_id in c.seqs):
                c.seqs = set() if seq_id < 0 else c.seqs - {seq_id}
                self.cells[i] = c if c.seqs else None
        return True  # the head stays (specgen's build)

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        hi = float("inf") if p1 < 0 else p1
        for c in self._seq(src):
            if max(p0, 0) <= c.pos < hi:
                c.seqs.add(dst)

    def seq_keep(self, seq_id: int) -> None:
        self.cells = [Cell(c.pos, c.tok, {seq_id}) if c is not None and seq_id in c.seqs else None
                      for c in self.cells]

    def seq_pos_min(self, seq_id: int) -> int:
        return min((c.pos for c in self._seq(seq_id)), default=-1)

    def seq_save(self, seq_id: int) -> bytes | None:
        if self.n_swa:  # as backend.py: a sliding-window model keeps one slot
            return None
        return json.dumps([(c.pos, c.tok) for c in self._seq(seq_id)]).encode()  # in cell order

    def seq_load(self, seq_id: int, state: bytes, n_cells: int) -> bool:
        self.clear()
        for pos, tok in json.loads(state):
            self._place(tok, pos, (seq_id,))
        self.cells_written = n_cells
        return True


@dataclass
class Run:
    tokens: list[int]
    stats: RunStats


def run(model, ctx, prompt, max_tokens, cache, cache_prompt=True) -> Run:
    """A greedy generation with lookup drafting (its rejected drafts leave cells empty)."""
    done = generated(model, ctx, prompt, max_tokens, SamplingParams(), LookupDrafter(), cache=cache,
                     cache_prompt=cache_prompt)
    return Run(done.tokens, done.stats)


def room(ctx, prompt: list[int]) -> int:
    """The cells a cold start has after `prompt` before its cache wraps round."""
    return ctx.n_ctx - (len(prompt) - 1)


def new_talk(rng: random.Random, c: int) -> list[int]:
    return [0, 2 + c] + [rng.randrange(2, 12) for _ in range(rng.randrange(8, 24))]


@pytest.mark.parametrize("n_swa, budget", [(0, 0), (0, 1 << 20), (24, 0)])
def test_long_random_conversations_answer_as_a_cold_cache(n_swa, budget):
    """Three conversations growing past the context, interleaved at random, some requests with
    cache_prompt false, on one warm cache: every answer a cold cache gives, token for token,
    wherever the cold run used at most half the cells it had left (more, and a warm run that kept a
    prefix may wrap round where the cold one does not: kv.py)."""
    model = FakeModel(n_vocab=12, sharpness=1.5, script=LOOPY)
    n_ctx, rng = 96, random.Random(10 + n_swa + budget)
    warm, cache = CellContext(model, n_ctx, n_swa), PromptCache(min_keep=3, budget=budget)
    talks = [new_talk(rng, c) for c in range(3)]
    checked = kept = 0
    for turn in range(300):
        c = rng.randrange(3) if rng.random() < 0.4 else turn % 3
        talk = talks[c] + [rng.randrange(2, 12) for _ in range(rng.randrange(1, 6))]
        if len(talk) > n_ctx - 24:
            talk = new_talk(rng, c)
        got = run(model, warm, talk, rng.randrange(1, 8), cache, cache_prompt=rng.random() > 0.1)
        cold_ctx = CellContext(model, n_ctx, n_swa)
        cold = run(model, cold_ctx, talk, got.stats.n_tokens, PromptCache(reuse=False))
        if cold_ctx.cells_written - (len(talk) - 1) <= room(cold_ctx, talk) // 2:
            assert got.tokens == cold.tokens, f"turn {turn}"
            checked += 1
        kept += got.stats.n_cached
        talks[c] = talk + got.tokens[:rng.randrange(len(got.tokens) + 1)]  # the answer resent, or part of it
    assert checked > 250 and kept > 1500, (checked, kept)


def test_a_cache_that_wrapped_round_is_not_kept():
    """Once the head came round to cells left empty (by rejected drafts, by a dropped tail), cells are
    out of position order: even a prompt that shares all of the live prefix reads it again."""
    model = FakeModel(n_vocab=12, sharpness=1.5, script=LOOPY)
    ctx, cache = CellContext(model, 64), PromptCache(min_keep=3)
    talk = [0, 2] + [3, 4, 5, 6, 7, 8, 9, 10, 11, 2] * 4 + [3, 4]  # 44 tokens
    run(model, ctx, talk, 1, cache)
    ctx.head, ctx.cells_written = 6, 70  # later runs' cells, dropped since: the head came round
    got = run(model, ctx, talk, 4, cache)
    assert got.stats.n_cached == 0
    assert got.tokens == run(model, CellContext(model, 64), talk, 4, PromptCache(reuse=False)).tokens


def test_a_prefix_is_not_kept_where_its_prefill_would_wrap_round():
    """The head 40 cells along, 12 tokens kept: reading 29 more would take cells 40..63, then come
    round to the empty cells after the kept ones."""
    model = FakeModel(n_vocab=12, sharpness=1.5, script=LOOPY)
    ctx, cache = CellContext(model, 64), PromptCache(min_keep=3)
    talk = [0, 2, 3, 4, 5, 6, 7, 8, 9, 3, 4, 5]
    run(model, ctx, talk, 1, cache)
    ctx.head = ctx.cells_written = 40  # drafts took cells 12..39 and were dropped
    longer = talk + list(range(2, 12)) * 3  # 42 tokens
    got = run(model, ctx, longer, 4, cache)
    assert got.stats.n_cached == 0
    assert got.tokens == run(model, CellContext(model, 64), longer, 4, PromptCache(reuse=False)).tokens


def test_a_saved_prefix_that_shares_little_is_not_put_back():
    """Putting back a long saved prefix puts the head at its end: keeping only its first tokens, the head
    leads a cold start's by the rest, as a live prefix's would (the same rule applies)."""
    model = FakeModel(n_vocab=12, sharpness=1.5, script=LOOPY)
    ctx, cache = CellContext(model, 64), PromptCache(min_keep=3, budget=1 << 20)
    long_talk = [0, 2, 3, 4, 5, 6] + [7, 8, 9, 10, 11] * 8  # 46 tokens
    run(model, ctx, long_talk, 1, cache)
    run(model, ctx, [0, 9, 9, 9, 9, 9, 9], 1, cache)  # another conversation: the long one is saved
    assert len(cache.saved) == 1
    other = [0, 2, 3, 4, 5, 6, 11, 10] + [2, 3] * 14  # shares 6 tokens with it, 36 long
    got = run(model, ctx, other, 4, cache)
    assert got.stats.n_cached == 0
    assert got.tokens == run(model, CellContext(model, 64), other, 4, PromptCache(reuse=False)).tokens


def test_a_cache_that_lost_early_positions_keeps_nothing():
    """Where the context says sequence 0 no longer holds position 0 (seq_pos_min: a sliding-window
    cache reuses the cells its window left), nothing is kept, however much the prompt shares; nor is
    such a prefix saved to be put back."""
    model = FakeModel(n_vocab=12, sharpness=1.5, script=LOOPY)
    ctx = CellContext(model, 64, n_swa=16)

    class Dropped:  # the same cells, reported without positions 0..4
        def __getattr__(self, name):
            return getattr(ctx, name)

        def seq_pos_min(self, seq_id):
            return 5

    cache = PromptCache(min_keep=3, budget=1 << 20)
    talk = [0, 2, 3, 4, 5, 6, 7, 8, 9, 3, 4, 5]
    run(model, ctx, talk, 2, cache)
    assert run(model, ctx, talk, 1, cache).stats.n_cached == len(talk) - 1
    assert run(model, Dropped(), talk, 1, cache).stats.n_cached == 0
    cache.min_keep, ctx.seq_save = 1, lambda seq_id: b"state"
    run(model, Dropped(), [0, 9], 1, cache, cache_prompt=False)
    assert cache.saved == []


# -- real models, through the server's runner -----------------------------------------------------

WORDS = ("the agent booked a room in Porto for two nights and asked about breakfast the weather in Oslo was cold "
         "and wet so the trip moved to May refunds take a day one change is free call the shop before nine").split()
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CHOICES = (None, "auto", "none", "required")  # None: no tools offered


@dataclass
class Turn:
    """One request of a random conversation: its messages, tool_choice, max_tokens and cache_prompt."""

    history: tuple
    text: str
    choice: str | None
    max_tokens: int
    cache_prompt: bool


def random_turn(rng: random.Random, history: tuple) -> Turn:
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(6, 80)))
    return Turn(history, text, rng.choice(CHOICES), rng.randrange(3, 10), rng.random() > 0.15)


@dataclass
class Answer:
    bits: list[TokenLogprob]  # each token with its log-probability (its row's bits)
    text: str
    stats: RunStats


def answer(runner, turn: Turn, model) -> Answer:
    """The answer to `turn` as the server's runner writes it."""
    from specgen.app.ask import ask_for
    from specgen.app.prompts import Prompt
    from specgen.app.structured import offered_tools, read_tools

    tools = None if turn.choice is None else [WEATHER]
    prompt = Prompt(0, turn.text, turn.history, tools=read_tools(tools, turn.choice),
                    offered=offered_tools(tools, turn.choice))
    ask = ask_for(model, prompt, runner.chat, "compact", max_tokens=turn.max_tokens, logprobs=0,
                  cache_prompt=turn.cache_prompt)
    stats = RunStats()
    events = [e for e in runner.stream(ask, stats) if isinstance(e, TokenEvent)]
    return Answer([e.logprob for e in events], "".join(e.text for e in events), stats)


@pytest.mark.real
@pytest.mark.parametrize("name, n_ctx, longest", [("smollm2", 512, 384), ("gemma", 768, 512)])
def test_long_random_conversations_give_a_cold_servers_bits(request, name, n_ctx, longest):
    """Two conversations alternating at random, growing until they start over (past `longest` tokens),
    the cache's cells taken many times over, with tool_choice switching (no tools, auto, none,
    required) and cache_prompt false now and then, on one warm runner as `specgen serve` has it
    (smollm2 with host memory for saved prefixes; gemma has sliding-window layers, n_swa 512): every
    token and its log-probability are a cold server's, wherever the cold run used at most half the
    cells it had left (kv.py). Seeded; lookup drafting (deterministic, its failed drafts leave holes)."""
    from specgen.app.config import RunConfig
    from specgen.app.prompts import Message
    from specgen.app.runner import Runner
    from specgen.app.session import open_session
    from specgen.drafting import methods as M

    model = request.getfixturevalue(name)
    cfg = RunConfig(target=name, draft=None, method="lookup", ctx=n_ctx, store=False)
    warm = Runner(cfg, open_session(cfg.loading, [M.get("lookup")], model), PromptCache(budget=(256 << 20) * (name == "smollm2")))
    cold = Runner(cfg, open_session(cfg.loading, [M.get("lookup")], model), PromptCache(reuse=False))
    rng = random.Random(67)
    histories: list[tuple] = [(), ()]
    c = checked = read = kept = 0
    for i in range(24):
        c = c if rng.random() < 0.7 else 1 - c  # runs of turns of one conversation, then the other's
        turn = random_turn(rng, histories[c])
        got = answer(warm, turn, model)
        n_prompt, n_cached = got.stats.n_prompt, got.stats.n_cached
        read, kept = read + n_prompt, kept + n_cached
        if n_cached:  # (keeping nothing, the warm run was a cold one: a cleared cache, read whole)
            want = answer(cold, turn, model)
            if cold.session.target_ctx.cells_written - (n_prompt - 1) <= (n_ctx - (n_prompt - 1)) // 2:
                assert got.bits == want.bits, (i, n_cached)
                checked += 1
        histories[c] = turn.history + (Message("user", turn.text), Message("assistant", got.text))
        if n_prompt > longest:  # the conversation outgrew the context: it starts over
            histories[c] = ()
    assert warm.session.target_ctx.n_ctx == n_ctx  # (llama.cpp rounds a context up to 256 cells)
    assert read > 6 * n_ctx and kept > 2 * n_ctx and checked >= 8, (read, kept, checked)


@pytest.mark.real
def test_a_sliding_window_cache_that_came_round_has_dropped_positions(gemma):
    """What kv.holds_from_start reads: 700 positions in cells 0..699, the last 50 dropped (a shorter
    prompt), 100 more read from the head at 700: the head comes round to cell 0, whose position 0
    gemma's sliding window (512) has left, and llama.cpp reuses that cell, dropping position 0 and
    more. (A cache without a window would have only the empty cells 650..699 to use: every position
    kept, out of order.)"""
    from specgen.core.kv import evaluate, holds_from_start

    ctx = gemma.new_context(768, n_batch=512, n_threads=2)  # (the bits do not matter here: n_batch decodes)
    text = gemma.tokenize(" ".join(WORDS * 30), add_special=True, parse_special=False)
    evaluate(ctx, text[:700], last_logits=False)
    ctx.seq_rm(0, 650, -1)
    assert ctx.seq_pos_min(0) == 0 and holds_from_start(ctx)
    evaluate(ctx, text[650:750], start_pos=650, last_logits=False)
    assert ctx.cells_written == 800 > ctx.n_ctx == 768
    assert ctx.seq_pos_min(0) > 0 and not holds_from_start(ctx)
