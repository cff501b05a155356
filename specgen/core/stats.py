"""Per-run counters and the numbers derived from them (the stats line and the --json record).

Forced tokens (where a grammar allows one continuation, core/constraint.py) are counted apart from
what the drafters proposed: the mask allows only them, so they are accepted as surely as plain
decoding under the grammar would write them, and counting them as drafts would credit drafting with
what the grammar decided (77% "accepted" at T = 0.7 where the drafters' own was about 60%). A
drafter's node equal to the forced token at its place is forced too. So `drafted`, `accepted`,
`acceptance_rate` and τ (`mean_accepted`) are the drafters' alone, and `forced_drafted`,
`forced_accepted` count the grammar's: the trunk of each step's tree (what the grammar forces
where the step starts) and the accepted drafter nodes where its path ran into a forced stretch
(drafting/forced.py). A drafter's node in a rejected branch stays the drafter's even where the
grammar would have forced it (finding out would cost a grammar walk per node).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class RunStats:
    n_prompt: int = 0  # prompt tokens (read by the prefill, or n_cached of them kept from a prompt cache)
    n_cached: int = 0  # prompt tokens whose KV a prompt cache kept (core/kv.py PromptCache)
    n_tokens: int = 0  # tokens emitted as text (a final stop token is not text)
    n_committed: int = 0  # tokens the target committed, a final stop token included
    target_calls: int = 0  # target decodes after prefill
    rereads: int = 0  # times the committed text was read anew before the cache's head came round (kv.reread)
    drafted: int = 0  # draft tree nodes the drafters proposed, root and forced nodes excluded
    accepted: int = 0  # of those, nodes on accepted paths
    prefill_s: float = 0.0
    decode_s: float = 0.0
    draft_s: float = 0.0
    accepted_lengths: Counter = field(default_factory=Counter)  # accepted drafted tokens per step (forced excluded)
    choices: Counter = field(default_factory=Counter)  # steps per drafter choice (auto: plain/lookup/...)
    # Accepted tokens by where they came from: "forced" (a grammar's one continuation: the
    # forced_accepted tokens), else the step's drafter choice (lookup, draft, history, ...).
    accepted_by: Counter = field(default_factory=Counter)
    forced_drafted: int = 0  # tree nodes a grammar forced (not in `drafted`)
    forced_accepted: int = 0  # of those, nodes on accepted paths (not in `accepted`)
    seed: int | None = None  # a sampled run's seed (the one given, or the fresh one drawn): replays its text

    def add(self, other: "RunStats") -> None:
        """Fold in the counters of another run (e.g. the next turn of a conversation)."""
        # One seed replays the whole only if every part ran with it.
        self.seed = other.seed if self.target_calls == 0 else (self.seed if self.seed == other.seed else None)
        for name in ("n_prompt", "n_cached", "n_tokens", "n_committed", "target_calls", "drafted", "accepted",
                     "prefill_s", "decode_s", "draft_s", "forced_drafted", "forced_accepted"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.accepted_lengths.update(other.accepted_lengths)
        self.choices.update(other.choices)
        self.accepted_by.update(other.accepted_by)

    @property
    def acceptance_rate(self) -> float:
        """The drafters' acceptance: accepted over drafted, forced tokens in neither."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        """τ, the drafters' tokens per target call: tokens committed per target call (each call's
        accepted drafts and the target's own bonus token) less the forced tokens committed. Plain
        decoding and jump-forward (forced tokens alone, methods.py) have τ = 1.0; what drafting adds
        is τ - 1. The one definition of τ: every table, record and stream shows this."""
        return (self.n_committed - self.forced_accepted) / self.target_calls if self.target_calls else 1.0

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def draft_share(self) -> float:
        return self.draft_s / self.decode_s if self.decode_s > 0 else 0.0

    def record_fields(self) -> dict:
        """The numbers of a --json record (names are a contract: scripts depend on them)."""
        return {
            "n_tokens": self.n_tokens,
            "target_calls": self.target_calls,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted": round(self.mean_accepted, 4),
            "prefill_s": round(self.prefill_s, 4),
            "decode_s": round(self.decode_s, 4),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "accepted_by": dict(self.accepted_by),
            "forced_drafted": self.forced_drafted,
            "forced_accepted": self.forced_accepted,
            "n_prompt": self.n_prompt,
            "n_cached": self.n_cached,
            **({} if self.seed is None else {"seed": self.seed}),
        }

    def line(self) -> str:
        """One human line, e.g. `128 tok · 31.5 tok/s · 41 target calls · τ 3.12 · accepted 79% ...`;
        under a grammar `forced A/D` (forced tokens accepted/drafted), apart from τ and acceptance."""
        parts = [f"{self.n_tokens} tok", f"{self.tokens_per_s:.1f} tok/s",
                 f"{self.target_calls} target calls", f"τ {self.mean_accepted:.2f}"]
        if self.drafted:
            parts.append(f"accepted {self.acceptance_rate:.0%} ({self.accepted}/{self.drafted})")
            parts.append(f"draft {self.draft_share:.0%} of time")
        if self.forced_drafted:
            parts.append(f"forced {self.forced_accepted}/{self.forced_drafted}")
        if len(self.choices) > 1:
            total = sum(self.choices.values())
            shares = ", ".join(f"{k} {v / total:.0%}" for k, v in self.choices.most_common())
            parts.append(f"steps: {shares}")
            parts.append(f"mean tree {self.drafted / max(1, self.target_calls):.1f}")
        parts.append(f"prefill {self.prefill_s:.2f} s" + (f" (cached {self.n_cached})" if self.n_cached else ""))
        if self.seed is not None:
            parts.append(f"seed {self.seed}")
        return " · ".join(parts)
