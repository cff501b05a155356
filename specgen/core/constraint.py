"""Constrained output (a JSON Schema, a grammar): what verification asks of a constraint, and the pure
functions that apply one to logits rows and to draft trees.

The reference is plain constrained decoding: logits -> mask (tokens the grammar forbids get -inf)
-> temperature -> top-k -> top-p -> draw; greedy is the masked argmax. A speculative step stays
equal to it because verification masks the target's row at every node it visits with the grammar's
state along that node's own path (the matcher consumes each token the walk takes, so when the walk
ends it stands at the new committed state). Drafts are only proposals: a token the grammar forbids
has p = 0 under the mask and is never accepted, so pruning deterministic drafts by the grammar only
saves rows. Forced tokens (where the grammar allows one continuation) are drafts too, verified like
any other; the mask there allows their canonical tokenization alone, in plain decoding too, so they
are always accepted (drafting/forced.py) and counted apart from drafting's (core/stats.py).

`llama/grammar.py` implements Constraint with llguidance; tests use fakes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from specgen.core.tree import DraftTree
from specgen.errors import ConstraintError

KINDS = ("json_schema", "json_object", "gbnf", "lark", "regex")
# How JSON is laid out: "compact" fixes Python's json.dumps layout ({"a": 1, "b": [2]}), so every
# separator is forced (free drafts); "free" lets the model place whitespace as llama.cpp's
# converter does (a space, or one or two newlines and up to 20 spaces of indent).
LAYOUTS = ("compact", "free")


@dataclass(frozen=True)
class ConstraintSpec:
    """What the user asked the output to match: `kind` is one of KINDS; `text` the schema (JSON
    text), grammar or regex ("" for json_object: any JSON object); `layout` one of LAYOUTS (JSON)."""

    kind: str
    text: str = ""
    layout: str = "compact"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"constraint kind must be one of {', '.join(KINDS)}, found {self.kind!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"JSON layout must be one of {', '.join(LAYOUTS)}, found {self.layout!r}")


class Constraint(Protocol):
    """A matcher at the state after the committed tokens (and whatever was consumed since)."""

    def allowed(self) -> np.ndarray:
        """Bool mask over the vocabulary: the tokens that may come next. An end-of-generation
        token is allowed only where the grammar accepts; once it is stopped, only those are."""

    def consume(self, token: int) -> None:
        """Advance by one token (one that `allowed()` permits)."""

    def rollback(self, n: int) -> None:
        """Undo the last `n` consumed tokens."""

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of `tokens`, in order from the current state, the grammar allows (no move)."""

    def forced(self) -> list[int]:
        """The tokens the grammar forces next (its canonical tokenization, with the last tokens
        held back where a longer token could still merge): [] where it allows a choice."""

    def stopped(self) -> bool:
        """Nothing but end-of-generation may follow."""

    def position(self) -> int:
        """Tokens consumed so far: the index in the output of the token that comes next."""


def masked(row: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """A copy of a logits row with the forbidden tokens at -inf (the row may be a view that the next
    decode overwrites). Rows wider than the mask (padding columns) are forbidden past its end."""
    out = np.full(row.shape, -np.inf, dtype=row.dtype)
    n = min(row.shape[0], allowed.shape[0])
    np.copyto(out[:n], row[:n], where=allowed[:n])
    return out


def masked_argmax(row: np.ndarray, allowed: np.ndarray) -> int:
    """The greedy choice under the mask: the unmasked argmax when the grammar allows it (then no
    allowed token is larger, and no smaller id ties it), else the argmax of the masked row."""
    y = int(np.argmax(row))
    if y < allowed.shape[0] and allowed[y]:
        return y
    return int(np.argmax(masked(row, allowed)))


def banned_choice(row: np.ndarray, allowed: np.ndarray, y: int) -> bool:
    """Whether `y`, the best token under the mask, is one the grammar forbids or the row gives
    -inf: then every allowed token has -inf (logit_bias can ban them all), and any choice would
    leave the grammar."""
    return not (y < allowed.shape[0] and allowed[y]) or row[y] == -np.inf


def all_banned(allowed: np.ndarray, position: int) -> ConstraintError:
    """The error for a row whose every allowed token logit_bias set to -inf (what was allowed, by id)."""
    ids = np.flatnonzero(allowed)
    shown = ", ".join(map(str, ids[:8])) + (", ..." if len(ids) > 8 else "")
    return ConstraintError(f"logit_bias bans every token the grammar allows at output token {position + 1}: "
                           f"expected a finite logit for at least one of the {len(ids)} tokens it allows "
                           f"(ids {shown}), found -inf for all")


def prune(tree: DraftTree, constraint: Constraint) -> tuple[DraftTree, dict[int, int]]:
    """The tree without the nodes the grammar forbids along their own path (and what hangs below
    them): the masked target never chooses them. Returns the pruned tree and the map old index -> new index (subtree's)."""
    if tree.n_drafted == 0:
        return tree, {0: 0}
    keep = [0]
    for leaf in tree.leaves():
        path = tree.path_to(leaf)
        keep.extend(path[:constraint.valid_prefix([tree.tokens[v] for v in path])])
    keep = _closed(tree, set(keep))
    if len(keep) == len(tree):
        return tree, {i: i for i in range(len(tree))}
    return tree.subtree(sorted(keep))


def _closed(tree: DraftTree, keep: set[int]) -> set[int]:
    """`keep` with every ancestor of its nodes (a subtree must be ancestor-closed)."""
    out = set()
    for v in keep:
        while v >= 0 and v not in out:
            out.add(v)
            v = tree.parents[v]
    return out


@dataclass(frozen=True)
class Merged:
    """A drafter's tree with a forced chain merged in: `origin[i]` is node i's index in the
    drafter's tree, or None for a forced node the drafter did not propose."""

    tree: DraftTree
    origin: list[int | None]


def merge_forced(tree: DraftTree, forced: list[int], max_nodes: int, max_leaves: int) -> Merged:
    """The forced chain as the tree's trunk, with the drafter's nodes merged in as a trie (a node
    equal to the forced token at its place joins the trunk; others stay beside it). Drafter
    nodes beyond `max_nodes` or that would need more than `max_leaves` branches are left out,
    the trunk first kept whole. Forced nodes are deterministic and are recorded in `tree.forced`."""
    out = DraftTree.root_only(tree.tokens[0])
    origin: list[int | None] = [0]
    trunk = [0]
    for tok in forced[:max_nodes - 1]:
        trunk.append(out.add(tok, trunk[-1]))
        origin.append(None)
        out.forced.add(trunk[-1])
    where = {0: 0}  # drafter index -> merged index
    has_kids = {trunk[i]: True for i in range(len(trunk) - 1)}
    leaves = 1
    for v in range(1, len(tree)):
        parent = where.get(tree.parents[v])
        if parent is None:
            continue
        nxt = trunk.index(parent) + 1 if parent in trunk else len(trunk)
        if nxt < len(trunk) and out.tokens[trunk[nxt]] == tree.tokens[v]:
            where[v] = trunk[nxt]
            origin[trunk[nxt]] = v
            continue
        if len(out) >= max_nodes or (has_kids.get(parent) and leaves >= max_leaves):
            continue
        leaves += bool(has_kids.get(parent))
        has_kids[parent] = True
        where[v] = out.add(tree.tokens[v], parent, tree.q[v])
        origin.append(v)
    return Merged(out, origin)
