"""The seam between specgen's algorithms and llama.cpp.

`backend.py` implements these protocols over llama.cpp; tests implement them with fakes. Everything
else in specgen (sampling, drafting, verification, stats, rendering) only sees these types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np


@dataclass
class Batch:
    """One `llama_decode` call: token i sits at `positions[i]` in every sequence of `seq_ids[i]`.

    A token shared by several tree branches carries all their sequence ids; `logits[i]` asks for
    that token's next-token logits. Parents come before children.
    """

    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    seq_ids: list[tuple[int, ...]] = field(default_factory=list)
    logits: list[bool] = field(default_factory=list)

    def add(self, token: int, pos: int, seq_ids: Sequence[int], logits: bool) -> None:
        self.tokens.append(int(token))
        self.positions.append(int(pos))
        self.seq_ids.append(tuple(seq_ids))
        self.logits.append(bool(logits))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_outputs(self) -> int:
        return sum(self.logits)


@dataclass(frozen=True)
class VocabInfo:
    """What must agree between a target and a draft model for their token ids to mean the same."""

    vocab_type: int
    n_vocab: int
    bos: int
    eos: int
    # (token id, token text) for a spread of ids below both models' vocab sizes.
    samples: tuple[tuple[int, bytes], ...]


class Model(Protocol):
    path: str
    name: str
    n_vocab: int
    n_ctx_train: int

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]: ...

    def piece(self, token: int) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...

    def vocab_info(self, sample_ids: Sequence[int]) -> VocabInfo: ...


class Context(Protocol):
    n_ctx: int
    n_seq_max: int
    n_batch: int

    def decode(self, batch: Batch) -> np.ndarray:
        """Evaluate `batch`; return float32 logits, one row per token with logits=True, in order."""
        ...

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> bool: ...

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None: ...

    def seq_keep(self, seq_id: int) -> None: ...

    def clear(self) -> None: ...
