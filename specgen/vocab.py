"""Target/draft vocabulary compatibility: draft token ids must mean the same text to the target."""

from __future__ import annotations

from .errors import ModelError
from .protocol import VocabInfo

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
