"""Target/draft vocabulary compatibility: draft token ids must mean the same text to the target.

SubsetMap (a vocabulary-subset draft's map to target ids) is defined with the seams, in protocol.py.
"""

from __future__ import annotations

import numpy as np

from specgen.errors import ModelError
from specgen.core.protocol import Batch, Context, Model, SubsetMap, VocabInfo

# Vocab sizes may differ by padding rows (e.g. Qwen2.5 7B 152064 vs 0.5B 151936) without any
# difference in the tokens both can produce.
MAX_VOCAB_SIZE_DIFF = 128
N_SAMPLES = 2048


def sample_ids(n_vocab: int) -> list[int]:
    """Every id of the first 256 (special and byte tokens) plus an even spread over the rest."""
    head = list(range(min(256, n_vocab)))
    step = max(1, (n_vocab - 256) // N_SAMPLES)
    return head + list(range(256, n_vocab, step))


def check_compatible(target: VocabInfo, draft: VocabInfo, target_name: str, draft_name: str) -> None:
    """Raise ModelError naming the first check that fails (type, size, BOS/EOS, token text)."""
    prefix = f"draft {draft_name} does not match target {target_name}:"
    if target.vocab_type != draft.vocab_type:
        raise ModelError(f"{prefix} vocabulary type {draft.vocab_type} vs {target.vocab_type}")
    if abs(target.n_vocab - draft.n_vocab) > MAX_VOCAB_SIZE_DIFF:
        raise ModelError(f"{prefix} vocabulary size {draft.n_vocab} vs {target.n_vocab} "
                         f"(expected within {MAX_VOCAB_SIZE_DIFF})")
    if (target.bos, target.eos) != (draft.bos, draft.eos):
        raise ModelError(f"{prefix} BOS/EOS ids {draft.bos}/{draft.eos} vs {target.bos}/{target.eos}")
    draft_text = dict(draft.samples)
    for token, text in target.samples:
        if token in draft_text and draft_text[token] != text:
            raise ModelError(f"{prefix} token {token} is {draft_text[token]!r} in the draft but {text!r} "
                             "in the target")


# GGUF metadata of a subset draft: its map to the target's ids and its unknown token.
SUBSET_IDS_KEY, SUBSET_UNK_KEY = "specgen.app.selfdraft.target_ids", "specgen.app.selfdraft.unk"  # GGUF keys: derived drafts carry them


def check_subset(target: Model, draft: Model, subset: SubsetMap, target_name: str, draft_name: str) -> None:
    """A subset draft is usable when every draft id's text is its target id's text (the map agrees
    with both tokenizers) and BOS/EOS map onto the target's."""
    prefix = f"draft {draft_name} (a vocabulary subset) does not match target {target_name}:"
    ids = subset.target_ids
    if len(ids) != draft.n_vocab or (len(ids) and (ids.min() < 0 or ids.max() >= target.n_vocab)):
        raise ModelError(f"{prefix} its map has {len(ids)} ids for {draft.n_vocab} draft tokens, expected one "
                         f"target id in 0..{target.n_vocab - 1} each")
    for role, d, t in (("BOS", draft.bos, target.bos), ("EOS", draft.eos, target.eos)):
        if 0 <= d < len(ids) and ids[d] != t:
            raise ModelError(f"{prefix} its {role} {d} maps to target id {ids[d]}, expected {t}")
    # Every id, not a sample: the map is what makes such a draft, and one wrong entry would
    # silently cost acceptance (0.16 s for gemma's whole 262k vocabulary).
    drafted = dict(draft.vocab_info(range(draft.n_vocab)).samples)
    wanted = dict(target.vocab_info([int(ids[i]) for i in drafted]).samples)
    for i, text in drafted.items():
        if wanted.get(int(ids[i])) != text:
            raise ModelError(f"{prefix} draft token {i} is {text!r} but maps to target token {int(ids[i])}, "
                             f"which is {wanted.get(int(ids[i]))!r}")


class SubsetContext:
    """A subset draft's context seen in target ids: batches are translated to draft ids, and the
    logits columns are the subset's target ids (`columns`): the draft races over those ids alone
    (the target chooses from its whole vocabulary, so a token outside them is a bonus). Everything else (KV edits
    by sequence id) passes through: positions and sequences do not depend on the vocabulary."""

    def __init__(self, ctx: Context, subset: SubsetMap, n_target: int):
        self.inner, self.subset, self.n_vocab = ctx, subset, n_target
        self.columns = subset.target_ids
        self._to_draft = np.full(n_target, subset.unk, dtype=np.int64)
        self._to_draft[subset.target_ids] = np.arange(len(subset.target_ids))

    def decode(self, batch: Batch) -> np.ndarray:
        mapped = Batch([int(t) for t in self._to_draft[batch.tokens]], batch.positions, batch.seq_ids, batch.logits)
        return self.inner.decode(mapped)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)
