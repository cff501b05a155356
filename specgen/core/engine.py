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

import numpy as np

from specgen.errors import PromptError
from specgen.core.constraint import Constraint
from specgen.core.kv import COMMITTED_SEQ, INVARIANT_ROWS, PromptCache, keep_branch, prefill, reread, wraps_soon
from specgen.core.logprobs import TokenLogprob, token_logprob
from specgen.core.penalties import Scoring
from specgen.core.protocol import Batch, Context, Drafter, Model
from specgen.core.sampling import Sampler, SamplingParams
from specgen.core.stats import RunStats
from specgen.core.tree import DraftTree
from specgen.core.verify import RowNeeded, TargetRows, Verdict, choose, verify


@dataclass(frozen=True)
class GenerationRequest:
    prompt_tokens: list[int]
    max_tokens: int
    sampling: SamplingParams
    # The output must match it (core/constraint.py): every target row is masked along its path.
    constraint: Constraint | None = None
    # Log-probabilities of each emitted token and of its `logprobs` likeliest alternatives
    # (core/logprobs.py); None: not computed.
    logprobs: int | None = None
    # False: the prompt is read whole, whatever a prompt cache holds (llama-server's cache_prompt).
    cache_prompt: bool = True


@dataclass(frozen=True)
class TokenEvent:
    token: int
    text: str  # may be "" while a multi-byte character is incomplete
    from_draft: bool
    # Where the token came from: "target" (the target's own, a bonus or plain step), "forced" (a
    # grammar forced it), else the drafter's choice for the step that proposed it ("lookup", ...).
    source: str = "target"
    logprob: TokenLogprob | None = None  # when the request asked for logprobs


@dataclass(frozen=True)
class FinishEvent:
    reason: str  # "length" (max tokens or context full) | "stop" (end-of-generation token)
    tail: str = ""  # bytes of an unfinished UTF-8 character, flushed as replacement text
    stats: RunStats | None = None  # the run's counters, final


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


def tree_batch(tree: DraftTree, n_past: int, seq_ids: list[tuple[int, ...]],
               logits: list[bool] | None = None) -> Batch:
    """Node i at position n_past + depth(i) in every branch through it; logits for every node
    (or where `logits[i]`)."""
    batch = Batch()
    for i, (tok, depth, ids) in enumerate(zip(tree.tokens, tree.depths(), seq_ids)):
        batch.add(tok, n_past + depth, ids, True if logits is None else logits[i])
    return batch


def rows_needed(tree: DraftTree) -> list[bool]:
    """Which nodes' logits verification reads: not those with a child the grammar forced (where it
    allows one token, greedy decoding's choice is that token whatever the row says). The output
    layer then runs on the other rows alone: on gemma's 262k-token vocabulary most of a row's cost."""
    forced_parent = {p for c, p in enumerate(tree.parents) if c in tree.forced}
    return [i not in forced_parent for i in range(len(tree.tokens))]


class SparseRows:
    """The rows of the nodes decoded with logits, by node; None for the others."""

    def __init__(self, rows: np.ndarray, needed: list[bool]):
        self._at = {node: k for k, node in enumerate(i for i, want in enumerate(needed) if want)}
        self._rows = rows

    def __getitem__(self, node: int):
        k = self._at.get(node)
        return None if k is None else self._rows[k]


def generate(model: Model, ctx: Context, request: GenerationRequest, stats: RunStats,
             drafter: Drafter | None = None, cache: PromptCache | None = None) -> Iterator[Event]:
    """Each step: the drafter proposes a tree rooted at the last committed token; the target
    verifies it in one decode; the accepted path and one token of the target's own (the bonus)
    are committed. Without a drafter every tree is the root alone: plain decoding.

    `cache`: what `ctx` held after the last generation; the common prefix is not read again. It is
    told what the KV holds at each event (a caller may stop at any), and forgets between events:
    an error midway leaves the KV unknown."""
    tokens = request.prompt_tokens
    check_prompt_fits(len(tokens), ctx)
    clock = time.perf_counter
    t0 = clock()
    keep = 0 if cache is None else cache.reusable(tokens, ctx, take=request.cache_prompt)
    if cache is not None:
        cache.forget()
    # With a cache, decodes whose every token gets the same bits in any batch; without, the size
    # that reads this model's prompts fastest (backend.prompt_chunk; None: n_batch).
    chunk = getattr(ctx, "prompt_chunk", None) if cache is None else INVARIANT_ROWS
    keep = prefill(ctx, tokens, keep, chunk)
    sampler = Sampler(request.sampling)
    stats.seed = None if request.sampling.greedy else sampler.seed
    if (choose_with := getattr(ctx, "choose_with", None)) is not None:
        choose_with(sampler)  # a screened target's rows are made exact for this rule (llama/screen.py)
    if drafter is not None:
        drafter.reset(list(tokens), sampler)  # a draft model prefills the prompt too (whole: it keeps no cache)
    stats.prefill_s, stats.n_prompt, stats.n_cached = clock() - t0, len(tokens), keep
    text = list(tokens)  # the prompt and the committed tokens

    scoring = Scoring(request.sampling.penalties, tokens)
    decoder = TextDecoder(model)
    n_past = len(tokens) - 1  # the root (last committed token) sits at n_past
    root = tokens[-1]
    reason = "length"
    t0 = clock()
    last_stretch = False  # no room left to re-read into: plain steps, one cell each (kv.wraps_soon)
    while stats.n_tokens < request.max_tokens and n_past + 1 < ctx.n_ctx:
        if not last_stretch and (soon := wraps_soon(ctx, n_past)) is not None:
            if soon or ctx.cells_written > n_past:  # (wraps_soon answers only where cells are counted)
                reread(ctx, text, len(tokens), n_past, chunk)  # before the head comes round (kv.py)
                stats.rereads += 1
            last_stretch = not soon
        # 1. Draft. Tokens beyond what may still be emitted (or fit, in the context or in one
        # batch) would be wasted work.
        if drafter is None or last_stretch:
            tree = None
        else:
            room = min(request.max_tokens - stats.n_tokens, ctx.n_ctx - n_past - 1, ctx.n_batch) - 1
            t_draft = clock()
            tree = drafter.propose(max(0, room))
            stats.draft_s += clock() - t_draft
            stats.choices[drafter.last_choice] += 1

        # 2. Verify in one target decode.
        if tree is None or tree.n_drafted == 0:
            # Nothing drafted: a plain step, without tree bookkeeping or KV edits (on a small
            # model every tenth of a millisecond here is a percent of plain decoding's speed).
            rows = scoring.rows(ctx.decode(Batch([root], [n_past], [(COMMITTED_SEQ,)], [True])))
            verdict = Verdict([], [choose(sampler, rows[0], n_past + 1, request.constraint)])
        else:
            verdict, rows = verify_tree(ctx, tree, n_past, sampler, request.constraint, scoring,
                                        all_rows=request.logprobs is not None)
        stats.target_calls += 1
        n_past += len(verdict.path) + 1

        # 3. Commit the accepted tokens and the bonus token, up to an end-of-generation token.
        committed = committed_of(model, verdict.tokens, request.max_tokens - stats.n_tokens)
        root = committed[-1]
        scoring.commit(committed)
        text.extend(committed)
        if drafter is not None and not last_stretch:
            t_draft = clock()
            drafter.observe(verdict, committed)  # under a grammar, it may mark more nodes forced (forced.py)
            stats.draft_s += clock() - t_draft
        count_step(stats, tree, verdict, drafter)
        events = []
        nodes = [0, *verdict.path]  # token i was chosen from node i's row
        for i, token in enumerate(committed):
            stats.n_committed += 1
            if model.is_eog(token):
                reason = "stop"
                break
            stats.n_tokens += 1
            logprob = None if request.logprobs is None else token_logprob(rows[nodes[i]], token, request.logprobs)
            events.append(TokenEvent(token, decoder(token), from_draft=i < len(verdict.path),
                                     source=token_source(tree, verdict, i, drafter), logprob=logprob))
        stats.decode_s += clock() - t0
        if request.constraint is not None and reason != "stop" and request.constraint.stopped():
            reason = "stop"  # the grammar is complete: only end-of-generation could follow
        # The KV holds the text before the root, and a step cut short by max_tokens evaluated more.
        if cache is not None:
            cache.hold(text, n_past)
        yield from events  # time spent by the consumer (rendering) is not decode time
        if cache is not None:
            cache.forget()
        t0 = clock()
        if reason == "stop":
            break
    stats.decode_s += clock() - t0
    if cache is not None:
        cache.hold(text, n_past)
    yield FinishEvent(reason, decoder.flush(), stats)


def committed_of(model: Model, tokens: list[int], room: int) -> list[int]:
    """The step's tokens that join the text: up to its first end-of-generation token (kept), or
    `room` tokens of text."""
    out = []
    for token in tokens:
        out.append(token)
        if model.is_eog(token) or len(out) >= room:
            break
    return out


def count_step(stats: RunStats, tree: DraftTree | None, verdict: Verdict, drafter: Drafter | None) -> None:
    """One step's drafted and accepted nodes: the drafters' and, apart, the grammar's forced ones (stats.py)."""
    n_accepted = len(verdict.path)
    if tree is not None and tree.n_drafted:
        n_forced = sum(1 for v in verdict.path if v in tree.forced)
        n_accepted -= n_forced
        stats.drafted += tree.n_drafted - len(tree.forced)
        stats.forced_drafted += len(tree.forced)
        stats.forced_accepted += n_forced
        for source, n in (("forced", n_forced), (drafter.last_choice, n_accepted)):
            if n:
                stats.accepted_by[source] += n
    stats.accepted += n_accepted
    stats.accepted_lengths[n_accepted] += 1


def token_source(tree: DraftTree | None, verdict: Verdict, i: int, drafter: Drafter | None) -> str:
    """Who proposed the i-th committed token of a step (see TokenEvent.source)."""
    if tree is None or drafter is None or i >= len(verdict.path):
        return "target"
    return "forced" if verdict.path[i] in tree.forced else drafter.last_choice


def verify_tree(ctx: Context, tree: DraftTree, n_past: int, sampler: Sampler, constraint: Constraint | None,
                scoring: Scoring, all_rows: bool = False) -> tuple[Verdict, TargetRows]:
    """One target decode for the whole tree (branch j is sequence j; branch 0 is the committed
    sequence 0), the walk that picks the accepted path, and a KV cache that keeps only that path.
    Returns the verdict and the rows the walk read (each node's, adjusted along its own path)."""
    seq_ids = tree.branch_seq_ids(first_seq=COMMITTED_SEQ)
    n_branches = max(max(ids) for ids in seq_ids) + 1
    if n_branches > ctx.n_seq_max:
        raise ValueError(f"tree has {n_branches} branches, context allows {ctx.n_seq_max}")

    def decoded(needed: list[bool] | None) -> TargetRows:
        for seq in range(1, n_branches):
            ctx.seq_cp(COMMITTED_SEQ, seq, -1, -1)
        rows = ctx.decode(tree_batch(tree, n_past, seq_ids, needed))
        return scoring.rows(rows, tree) if needed is None else SparseRows(rows, needed)

    # Greedy under a grammar, nothing else reading rows (penalties, a bias that may ban a forced
    # token, logprobs): no logits for nodes whose child the grammar forces.
    sparse = constraint is not None and sampler.params.greedy and scoring.pen is None and not all_rows
    needed = rows_needed(tree) if sparse else None
    rows = decoded(None if needed is None or all(needed) else needed)
    start = constraint.position() if constraint is not None else 0
    try:
        verdict = verify(tree, rows, sampler, n_past, constraint)
    except RowNeeded:  # the grammar allowed a choice after all (never seen): decode the tree again, every row
        constraint.rollback(constraint.position() - start)
        for seq in range(n_branches):
            ctx.seq_rm(seq, n_past, -1)
        rows = decoded(None)
        verdict = verify(tree, rows, sampler, n_past, constraint)
    keep_branch(ctx, seq_ids[verdict.last_node][0], n_past + len(verdict.path))
    return verdict, rows
