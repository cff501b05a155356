"""A token tree on a real model (test_backend.py, test_device_check.py): a small tree as a parent
array, each branch its own sequence id, and the reference each node's logits are checked against."""

from __future__ import annotations

import numpy as np

# A tree as a parent array, parents before children: root 0 (the last prompt token), two children,
# and three leaves. Each root-to-leaf branch is one sequence id (1..3); seq 0 holds the prompt.
PARENTS = [-1, 0, 0, 1, 1, 2]
LEAF_SEQ = {3: 1, 4: 2, 5: 3}


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def tree_tokens(model) -> tuple[list[int], list[int]]:
    prompt = model.tokenize("The best way to learn a new language is", add_special=True)
    words = [model.tokenize(w, add_special=False)[0] for w in (" to", " by", " practice", " speak", " reading")]
    return prompt[:-1], [prompt[-1], *words]


def node_seqs(node: int) -> tuple[int, ...]:
    """Sequence ids of every branch (leaf) whose root-to-leaf path passes through `node`."""
    out = []
    for leaf, seq in LEAF_SEQ.items():
        v = leaf
        while v != -1 and v != node:
            v = PARENTS[v]
        if v == node:
            out.append(seq)
    return tuple(out)


def path_to(node: int) -> list[int]:
    path = []
    while node != -1:
        path.append(node)
        node = PARENTS[node]
    return path[::-1]


def fresh_logits(model, committed: list[int], path: list[int], pad_to: int,
                 then: int | None = None) -> np.ndarray:
    """The reference: `committed + path` alone in a fresh context, in batches of the same shapes as
    the tree run (llama.cpp picks different kernels for different batch sizes, which moves logits by
    ~1e-2 on quantized weights and would hide the attention check in noise). Padding tokens sit in
    a separate sequence, which `path` cannot see. With `then`, returns the logits after one more
    single-token decode of `then`."""
    from specgen.core.kv import evaluate
    from specgen.core.protocol import Batch

    ctx = model.new_context(256, n_seq_max=2)
    evaluate(ctx, committed, last_logits=False)
    ctx.seq_cp(0, 1, -1, -1)
    n_past = len(committed)
    batch = Batch()
    for k, tok in enumerate(path):
        batch.add(tok, n_past + k, (0,), True)
    for k in range(pad_to - len(path)):
        batch.add(path[0], n_past + k, (1,), True)
    out = ctx.decode(batch)[len(path) - 1].copy()  # rows are views into ctx, freed on return
    if then is None:
        return out
    return ctx.decode(Batch([then], [n_past + len(path)], [(0,)], [True]))[0].copy()
