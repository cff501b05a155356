"""A draft token tree as a parent array in parents-before-children order (as in Medusa/EAGLE).

Node 0 is the root: the last committed token, not yet evaluated by the target. Every other node is
a drafted token. Each root-to-leaf branch becomes one llama.cpp sequence id when verified.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DraftTree:
    tokens: list[int]
    parents: list[int]
    q: list[float] = field(default_factory=list)  # draft probability of each node (root: 1.0)
    # Nodes a grammar forces (core/constraint.py): deterministic drafts, counted apart in the stats.
    forced: set[int] = field(default_factory=set)

    @classmethod
    def root_only(cls, root: int) -> "DraftTree":
        """The tree of "no proposal": verifying it is one step of plain decoding."""
        return cls([root], [-1], [1.0])

    @classmethod
    def chain(cls, root: int, tokens: list[int], q: list[float] | None = None) -> "DraftTree":
        tree = cls.root_only(root)
        for i, tok in enumerate(tokens):
            tree.add(tok, i, q[i] if q else 1.0)
        return tree

    def add(self, token: int, parent: int, q: float = 1.0) -> int:
        if not 0 <= parent < len(self.tokens):
            raise ValueError(f"parent {parent} must be an existing node (0..{len(self.tokens) - 1})")
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.q.append(q)
        return len(self.tokens) - 1

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_drafted(self) -> int:
        return len(self.tokens) - 1

    def depths(self) -> list[int]:
        depth = [0] * len(self)
        for i in range(1, len(self)):
            depth[i] = depth[self.parents[i]] + 1
        return depth

    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in self.tokens]
        for i in range(1, len(self)):
            kids[self.parents[i]].append(i)
        return kids

    def leaves(self) -> list[int]:
        kids = self.children()
        return [i for i in range(len(self)) if not kids[i]]

    def branch_seq_ids(self, first_seq: int = 0) -> list[tuple[int, ...]]:
        """For each node, the sequence ids of the branches through it; leaf j's branch is first_seq + j."""
        ids: list[list[int]] = [[] for _ in self.tokens]
        for j, leaf in enumerate(self.leaves()):
            v = leaf
            while v != -1:
                ids[v].append(first_seq + j)
                v = self.parents[v]
        return [tuple(sorted(x)) for x in ids]

    def subtree(self, keep: list[int]) -> tuple["DraftTree", dict[int, int]]:
        """The tree restricted to `keep` (ancestor-closed, root included), re-indexed parents-first.

        Returns the new tree and the map old index -> new index.
        """
        new_index: dict[int, int] = {0: 0}
        out = DraftTree.root_only(self.tokens[0])
        for old in sorted(set(keep) - {0}):  # parents have smaller indices than their children
            new_index[old] = out.add(self.tokens[old], new_index[self.parents[old]], self.q[old])
        out.forced = {new_index[o] for o in self.forced if o in new_index}
        return out, new_index

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's first child down to `node` (the root itself excluded)."""
        path = []
        while node > 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]
