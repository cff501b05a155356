"""The agent bench's numbers: per row, over all requests and per turn and conversation; ratios
against the baseline row (constrained plain without the prompt cache)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

from specgen.bench.agent import BASELINE, CALL

ALL = None  # a summary over every turn


@dataclass(frozen=True)
class AgentRow:
    row: str
    turn: int | None  # None: every turn
    prompt_id: str | None  # None: every conversation
    n_requests: int
    wall_s: float  # the loop's time: every request's, end to end at the client
    ttft_call_s: float  # mean time to first token of the call requests (client)
    ttft_answer_s: float  # ... and of the answer requests
    decode_tokens: int
    decode_s: float
    tokens_per_s: float
    prompt_read: int  # prompt tokens the servers' prefill read
    prompt_cached: int  # ... and kept from their caches
    prefill_s: float
    identical: int  # requests whose reply equals the baseline's
    calls_valid: int  # call requests answered with calls that fit the tools' schemas
    call_requests: int
    errors: int
    # Against the baseline on the same requests: its wall time over this row's (higher: faster),
    # this row's decode speed over its, this row's time to first token over its (lower: sooner).
    speedup: float = 1.0
    decode_ratio: float = 1.0
    ttft_call_ratio: float = 1.0
    # The tokens new to each request, summed (new_tokens): what a prompt cache that kept all it
    # could would have read.
    prompt_new: int = 0


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _ttft(r: dict) -> float:
    return r["ttft_s"] if r["ttft_s"] is not None else r["wall_s"]


def _held_reply(r: dict) -> int:
    """The tokens of a reply that the next request's history holds as written: the row's reply
    where it was the baseline's, unless it was a call cut short (the history keeps that as other
    text: agent_http.ChatCompletion.message)."""
    cut_call = bool(r.get("calls")) and r.get("finish_reason") != "tool_calls"
    return r["completion_tokens"] if r["identical"] and not cut_call else 0


def new_tokens(records: Sequence[dict]) -> list[int]:
    """Per record, the tokens new to its request: its whole prompt (read and cached) less the same
    row's previous request of the conversation and the reply the history holds as written
    (_held_reply); a conversation's first request, all of it. Exact where each request's prompt
    begins with the last one's and its reply's tokens, as a prompt that stays one prefix does."""
    out, last = [], {}
    for r in records:
        whole = r["prompt_n"] + r["cache_n"]
        before = last.get((r["row"], r["prompt_id"]))
        held = 0 if before is None else before["prompt_n"] + before["cache_n"] + _held_reply(before)
        out.append(max(0, whole - held))
        last[(r["row"], r["prompt_id"])] = r
    return out


@dataclass(frozen=True)
class PromptTokens:
    """A row's prompt tokens read and those new to its requests (new_tokens)."""

    read: int
    new: int

    def __str__(self) -> str:
        return f"{self.read}/{self.new} ({self.read / max(self.new, 1):.2f}x)"


def past_the_first(records: Sequence[dict], row: str) -> PromptTokens:
    """`row`'s requests but each conversation's first (which may keep the template's head, or a
    whole system prompt and tools, from the conversation before): read, and new to each."""
    seen, read, new = set(), 0, 0
    for r, n in zip(records, new_tokens(records)):
        if r["row"] == row:
            if r["prompt_id"] in seen:
                read, new = read + r["prompt_n"], new + n
            seen.add(r["prompt_id"])
    return PromptTokens(read, new)


def row_of(records: Sequence[dict], row: str, turn: int | None, prompt_id: str | None) -> AgentRow | None:
    mine = [r for r in records if r["row"] == row and (turn is None or r["turn"] == turn)
            and (prompt_id is None or r["prompt_id"] == prompt_id)]
    if not mine:
        return None
    tokens, decode_s = sum(r["completion_tokens"] for r in mine), sum(r["decode_s"] for r in mine)
    calls = [r for r in mine if r["kind"] == CALL]
    return AgentRow(row, turn, prompt_id, len(mine), round(sum(r["wall_s"] for r in mine), 4),
                    round(_mean([_ttft(r) for r in calls]), 4),
                    round(_mean([_ttft(r) for r in mine if r["kind"] != CALL]), 4), tokens, round(decode_s, 4),
                    round(tokens / decode_s, 3) if decode_s > 0 else 0.0,
                    sum(r["prompt_n"] for r in mine), sum(r["cache_n"] for r in mine),
                    round(sum(r["prompt_s"] for r in mine), 4), sum(r["identical"] for r in mine),
                    sum(r["call_made"] for r in calls), len(calls), sum(r["error"] is not None for r in mine),
                    prompt_new=sum(r.get("prompt_new", 0) for r in mine))


def _ratios(row: AgentRow, base: AgentRow) -> AgentRow:
    from dataclasses import replace

    return replace(row, speedup=round(base.wall_s / row.wall_s, 4) if row.wall_s else 0.0,
                   decode_ratio=round(row.tokens_per_s / base.tokens_per_s, 4) if base.tokens_per_s else 0.0,
                   ttft_call_ratio=round(row.ttft_call_s / base.ttft_call_s, 4) if base.ttft_call_s else 0.0)


def summarize(records: Sequence[dict], rows: Sequence[str]) -> list[AgentRow]:
    """Each row over everything, then per turn, then per conversation; each with its ratios."""
    records = [{**r, "prompt_new": n} for r, n in zip(records, new_tokens(records))]
    turns = sorted({r["turn"] for r in records})
    convs = list(dict.fromkeys(r["prompt_id"] for r in records))
    out = []
    for turn, prompt_id in [(ALL, None), *((t, None) for t in turns), *((ALL, p) for p in convs)]:
        base = row_of(records, BASELINE, turn, prompt_id)
        for name in rows:
            row = row_of(records, name, turn, prompt_id)
            if row is not None and base is not None:
                out.append(_ratios(row, base))
    return out


def as_json(rows: Sequence[AgentRow]) -> list[dict]:
    return [asdict(r) for r in rows]


def loop_spread(records: Sequence[dict], row: str, over: str) -> tuple[float, float] | None:
    """A 90% bootstrap interval of `row`'s loop time over `over`'s (how many times as fast `over` ran
    the loop), conversations resampled whole with all their requests, seeded as summary.speedup_spread
    is; None where either row has no records or the conversations give no spread."""
    from specgen.bench.summary import speedup_spread

    theirs = {r["prompt_id"]: 0.0 for r in records if r["row"] == row}
    mine = {r["prompt_id"]: 0.0 for r in records if r["row"] == over}
    for r in records:
        for name, walls in ((row, theirs), (over, mine)):
            if r["row"] == name:
                walls[r["prompt_id"]] += r["wall_s"]
    convs = [c for c in theirs if c in mine]
    if len(convs) < 2:
        return None
    _, low, high, _ = speedup_spread([theirs[c] for c in convs], [mine[c] for c in convs], convs)
    return (low, high) if low < high else None
