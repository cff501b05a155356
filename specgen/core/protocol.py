"""The seams of specgen: what a model, a context and a drafter offer, and nothing more.

`llama/backend.py` implements Model and Context over llama.cpp; tests implement them with fakes;
`drafting/` implements Drafter. Everything else (engine, sampling, verification, stats, rendering)
only sees these types. p = the target's distribution, q = the draft's, everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from specgen.core.constraint import Constraint, ConstraintSpec
from specgen.core.sampling import Sampler
from specgen.core.tree import DraftTree
from specgen.core.verify import Verdict


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


@dataclass(frozen=True)
class SubsetMap:
    """A draft whose vocabulary is a subset of its target's (FR-Spec: the target's most frequent
    tokens): draft id i stands for target id `target_ids[i]`; a target token outside the subset
    reaches the draft as the draft's `unk`."""

    target_ids: np.ndarray  # int64, one per draft id, strictly within the target's vocabulary
    unk: int


class LogitsPatch(Protocol):
    """Corrects a decode's logits rows from the hidden states they came from (a screened target's
    output layer: llama/screen.py)."""

    def patch(self, logits: np.ndarray, hidden: np.ndarray) -> None: ...


class Model(Protocol):
    path: str
    name: str
    n_vocab: int
    n_ctx_train: int
    bos: int
    chat_template: str | None  # the GGUF's Jinja chat template (instruct models), None for base models
    # Whether part of a sequence can be dropped (llama_memory_seq_rm): false for recurrent and
    # hybrid models, whose state rejected drafts would corrupt.
    can_rollback: bool
    # A draft derived with a frequency-ranked vocabulary: which target token each of its ids is
    # (SubsetMap); None for a model with its own full vocabulary.
    subset_of_target: SubsetMap | None
    # A target loaded from its screened copy (llama/screen.py): `path` is the copy, `source_path`
    # the model it was made from, `screen` what patches its logits rows; else source_path == path
    # and screen is None.
    source_path: str
    screen: LogitsPatch | None

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]: ...

    def piece(self, token: int) -> bytes: ...

    def is_eog(self, token: int) -> bool: ...

    def vocab_info(self, sample_ids: Sequence[int]) -> VocabInfo: ...

    def format_chat(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        """The messages rendered with the model's chat template (raises ModelError without one);
        `tools`: OpenAI's tool list, for templates that render it."""
        ...

    def constrain(self, spec: ConstraintSpec) -> Constraint:
        """A matcher for `spec` over this model's vocabulary (raises ConstraintError if refused)."""
        ...

    def new_context(self, n_ctx: int, n_seq_max: int = 1, n_batch: int = 512,
                    n_threads: int | None = None, n_outputs: int = 1) -> "Context": ...


class Context(Protocol):
    n_ctx: int
    n_seq_max: int
    n_batch: int
    n_threads: int
    n_vocab: int  # tokens are ids below this (a subset draft takes and names target ids)
    # The token each logits column stands for: None when column i is token i. A vocabulary-subset
    # draft (vocab.SubsetContext) returns one column per draft token, the subset's target ids: its
    # q lives on the subset, and a drafter reads only those columns (4x fewer than gemma's 262k).
    columns: np.ndarray | None

    def decode(self, batch: Batch) -> np.ndarray:
        """Evaluate `batch`; return float32 logits, one row per token with logits=True, in order."""
        ...

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> bool: ...

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None: ...

    def seq_keep(self, seq_id: int) -> None: ...

    def clear(self) -> None: ...

    # A prompt cache's saved prefixes (kv.PromptCache); optional: a context without them keeps one.
    def seq_save(self, seq_id: int) -> bytes | None: ...

    def seq_load(self, seq_id: int, state: bytes, n_cells: int) -> bool: ...

    # The smallest position a sequence still holds (-1: empty); optional: a context without it is
    # taken to keep every position (kv.holds_from_start: a sliding window may drop the first ones).
    def seq_pos_min(self, seq_id: int) -> int: ...

    # How a screened target's rows will be chosen (llama/screen.py); optional: without it, rows are
    # exact where the argmax needs.
    def choose_with(self, sampler: Sampler) -> None: ...


class Drafter(Protocol):
    """Proposes a token tree from the committed text and learns from each verification (the
    transformers candidate-generator shape: propose, then a feedback hook). "No proposal" is a tree
    with only the root, which verifies as one step of plain decoding."""

    last_choice: str  # what the last proposal was (stats: steps per choice)

    def reset(self, tokens: list[int], sampler: Sampler | None = None) -> None:
        """Start a new text: `tokens` is the prompt; its last token is the first root. `sampler`:
        the run's own (its seed), for drafters that choose as the target will."""

    def propose(self, max_depth: int) -> DraftTree:
        """A tree rooted at the last committed token, at most `max_depth` drafted tokens deep."""

    def observe(self, verdict: Verdict, committed: list[int]) -> None:
        """Feedback after verification; `committed` are the tokens that joined the text."""

    def finish_text(self) -> None:
        """The text is done: a drafter that drafts from other texts may keep it for later ones."""
