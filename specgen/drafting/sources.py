"""The vocabulary of model-free drafting, shared by the lookup drafter, the other texts it drafts
from (history.py) and the planner that learns how often each kind of node is accepted."""

from __future__ import annotations

from dataclasses import dataclass

MAX_MATCH = 64  # match lengths are measured up to this many tokens

# Where a drafted node came from: this text (lookup, loop), the draft model, and the other texts
# nearest first (history.py): this process's earlier texts, the persistent store, a user corpus.
# A lookup continuation is a "loop" when its match overlaps itself (the text's end has repeated at
# least twice): a greedy base model that has repeated a line twice nearly always goes on, where a
# copied passage ends sooner. Learned apart, loops earn the long chains that pay on steep curves.
# (A match of at least LOOP_MIN_MATCH tokens: "\n\n" after "\n" is no loop.)
LOOKUP_NODE, LOOP_NODE, DRAFT_MODEL_NODE = "lookup", "loop", "draft"
PROCESS, STORE, CORPUS = "history", "store", "corpus"
LOOP_MIN_MATCH = 8

# A match's continuation is as good as the text's other occurrences of the same n-gram (its last
# LookupDrafter.max_n tokens) say: SuffixDecoding's frequency counts. After a 3-token match the next
# token was right 92% of the time when the n-gram's 2-4 earlier occurrences all went on with it, 65%
# when it had occurred once, and 10-45% when they disagreed (gemma 270M Q4_K_M, 120 Spec-Bench
# prompts, every position). Under a long match a split n-gram is where copies part (a template's
# numbers, names): it was right 73%, 97%, 86% and 93% of the time after 10-14, 15-23, 24-39 and 40+
# matched tokens, against 97-99.6% for the other classes. Each class is learned apart, so a text
# whose copies part at the same places (a table's years) learns where.
SINGLE, UNANIMOUS, MAJORITY, MINORITY = range(4)  # occurred once; all agree; more than half; half or less


@dataclass(frozen=True)
class Continuation:
    """What followed an earlier occurrence of the text's last `match_len` tokens, in `source`."""

    tokens: list[int]
    source: str
    match_len: int
