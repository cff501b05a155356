"""A scripted fake model and context implementing specgen.protocol, with real per-sequence KV.

The fake's next-token logits are a deterministic function of the whole token history of the
sequence a token is evaluated in, so a context that attends to the wrong KV entries (a wrong
sequence id, a stale branch) produces different logits, exactly as a real model would.
"""

from __future__ import annotations

import hashlib

import numpy as np

from specgen.core.protocol import Batch, VocabInfo


class FakeModel:
    def __init__(self, n_vocab: int = 32, eos: int = 1, bos: int = 0, sharpness: float = 3.0,
                 script: dict[tuple[int, ...], int] | None = None, chat_template: str | None = None):
        self.path = self.source_path = "fake.gguf"
        self.screen = None  # no screened output layer (screen.py)
        self.name = "fake"
        self.n_vocab = n_vocab
        self.n_ctx_train = 4096
        self.bos, self.eos = bos, eos
        self.sharpness = sharpness
        # history suffix -> forced next token (argmax), to script a model's behaviour
        self.script = script or {}
        self.chat_template = chat_template
        self.can_rollback = True  # False: as a recurrent/hybrid model, whose state cannot be cut back
        self.subset_of_target = None

    def logits_for(self, history: tuple[int, ...]) -> np.ndarray:
        digest = hashlib.blake2b(repr(history).encode(), digest_size=8).digest()
        rng = np.random.default_rng(int.from_bytes(digest, "little"))
        logits = rng.normal(0.0, self.sharpness, self.n_vocab).astype(np.float32)
        logits[self.eos] -= 4.0  # rare unless scripted
        for suffix, token in self.script.items():
            if history[-len(suffix):] == suffix:
                logits[token] = logits.max() + 5.0
        return logits

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        body = [2 + (ord(c) % (self.n_vocab - 2)) for c in text]
        return ([self.bos] if add_special else []) + body

    def piece(self, token: int) -> bytes:
        return b"" if token in (self.bos, self.eos) else f"<{token}>".encode()

    def is_eog(self, token: int) -> bool:
        return token == self.eos

    def vocab_info(self, sample_ids) -> VocabInfo:
        return VocabInfo(1, self.n_vocab, self.bos, self.eos,
                         tuple((i, self.piece(i)) for i in sample_ids if i < self.n_vocab))

    def format_chat(self, messages, tools=None) -> str:
        """A stand-in template: each message on a line of its own, role first."""
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages)

    def constrain(self, spec) -> "FakeConstraint":
        """spec.text: JSON, a list of patterns, each a list of token-id lists (FakeConstraint)."""
        import json

        return FakeConstraint([[set(pos) for pos in p] for p in json.loads(spec.text)], self.n_vocab, self.eos)

    def new_context(self, n_ctx: int, n_seq_max: int = 1, n_batch: int = 512, n_threads=None,
                    n_outputs: int = 1) -> "FakeContext":
        return FakeContext(self, n_ctx, n_seq_max, n_batch)


class FakeContext:
    def __init__(self, model: FakeModel, n_ctx: int = 256, n_seq_max: int = 1, n_batch: int = 64):
        self.model = model
        self.n_ctx, self.n_seq_max, self.n_batch = n_ctx, n_seq_max, n_batch
        self.n_threads = 1
        self.n_vocab, self.columns = model.n_vocab, None
        self.kv: dict[int, dict[int, int]] = {}  # seq id -> {position: token}
        self.calls: list[Batch] = []
        self.cells_written = 0  # as backend.py's: tokens decoded since the last clear()

    def _history(self, seq: int, pos: int) -> tuple[int, ...]:
        cells = self.kv.get(seq, {})
        missing = [p for p in range(pos) if p not in cells]
        if missing:
            raise AssertionError(f"seq {seq} has no KV at positions {missing[:5]} before {pos}")
        return tuple(cells[p] for p in range(pos))

    def decode(self, batch: Batch) -> np.ndarray:
        assert len(batch) <= self.n_batch, "batch larger than n_batch"
        self.calls.append(batch)
        self.cells_written += len(batch)
        rows = []
        for tok, pos, seqs, want in zip(batch.tokens, batch.positions, batch.seq_ids, batch.logits):
            assert pos < self.n_ctx, "context full"
            assert all(0 <= s < self.n_seq_max for s in seqs), f"seq ids {seqs} outside n_seq_max"
            histories = {self._history(s, pos) for s in seqs}
            assert len(histories) == 1, f"token at pos {pos} shared by sequences with different pasts"
            for s in seqs:
                self.kv.setdefault(s, {})[pos] = tok
            if want:
                rows.append(self.model.logits_for(histories.pop() + (tok,)))
        return np.array(rows, dtype=np.float32).reshape(len(rows), self.model.n_vocab)

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        hi = float("inf") if p1 < 0 else p1
        seqs = list(self.kv) if seq_id < 0 else [seq_id]
        for s in seqs:
            self.kv[s] = {p: t for p, t in self.kv.get(s, {}).items() if not (max(p0, 0) <= p < hi)}
        return True

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        hi = float("inf") if p1 < 0 else p1
        cells = self.kv.setdefault(dst, {})
        cells.update({p: t for p, t in self.kv.get(src, {}).items() if max(p0, 0) <= p < hi})

    def seq_keep(self, seq_id: int) -> None:
        self.kv = {seq_id: self.kv.get(seq_id, {})}

    def clear(self) -> None:
        self.kv = {}
        self.cells_written = 0

    def seq_save(self, seq_id: int) -> bytes | None:
        import json

        return json.dumps(sorted(self.kv.get(seq_id, {}).items())).encode()

    def seq_load(self, seq_id: int, state: bytes, n_cells: int) -> bool:
        import json

        self.clear()
        self.kv[seq_id] = {p: t for p, t in json.loads(state)}
        self.cells_written = n_cells
        return True


class NoisyDraft(FakeModel):
    """A draft for `target`: the target's logits plus deterministic noise, so it agrees often."""

    def __init__(self, target: FakeModel, noise: float = 1.0):
        super().__init__(target.n_vocab, target.eos, target.bos, target.sharpness, target.script)
        self.target, self.noise = target, noise

    def logits_for(self, history: tuple[int, ...]) -> np.ndarray:
        digest = hashlib.blake2b(b"draft" + repr(history).encode(), digest_size=8).digest()
        rng = np.random.default_rng(int.from_bytes(digest, "little"))
        return self.target.logits_for(history) + rng.normal(0.0, self.noise, self.n_vocab).astype(np.float32)


class SubsetDraft(FakeModel):
    """A NoisyDraft of `target` whose vocabulary is the subset `keep` of the target's (FR-Spec):
    draft id i is target token keep[i]; target tokens outside reach it as `unk`, and it knows
    nothing of them (its view of the history is as lossy as a real cut draft's)."""

    def __init__(self, target: FakeModel, keep: list[int], noise: float = 1.0, unk: int = 0):
        from specgen.core.vocab import SubsetMap

        super().__init__(len(keep), keep.index(target.eos), keep.index(target.bos), target.sharpness)
        self.noisy = NoisyDraft(target, noise)
        self.keep = np.array(keep, dtype=np.int64)
        self.subset_of_target = SubsetMap(self.keep, unk)
        self.name = "subset-draft"

    def logits_for(self, history: tuple[int, ...]) -> np.ndarray:
        return self.noisy.logits_for(tuple(int(self.keep[t]) for t in history))[self.keep]

    def piece(self, token: int) -> bytes:
        return self.noisy.piece(int(self.keep[token]))


class FakeConstraint:
    """core.constraint.Constraint over a finite language: each pattern is a list of token sets (one
    per position); a text matches a pattern position by position. EOS (the model's) is allowed
    exactly where a live pattern is complete; forced tokens follow while one token alone may come."""

    def __init__(self, patterns: list[list[set[int]]], n_vocab: int, eos: int):
        self.patterns, self.n_vocab, self.eos = patterns, n_vocab, eos
        self.consumed: list[int] = []
        self.masks_computed = 0

    def _alive(self, tokens: list[int]) -> list[list[set[int]]]:
        if tokens and tokens[-1] == self.eos:
            return []
        return [p for p in self.patterns if len(p) >= len(tokens) and all(t in s for t, s in zip(tokens, p))]

    def _next(self, tokens: list[int]) -> set[int]:
        if tokens and tokens[-1] == self.eos:
            return {self.eos}  # stopped: only end-of-generation (a drafted one may be walked past)
        alive = self._alive(tokens)
        nxt = set().union(*(p[len(tokens)] for p in alive if len(p) > len(tokens)))
        if any(len(p) == len(tokens) for p in alive):
            nxt.add(self.eos)
        return nxt

    def allowed(self) -> np.ndarray:
        self.masks_computed += 1
        mask = np.zeros(self.n_vocab, dtype=bool)
        mask[sorted(self._next(self.consumed))] = True
        return mask

    def consume(self, token: int) -> None:
        assert token in self._next(self.consumed), f"token {token} not allowed after {self.consumed}"
        self.consumed.append(int(token))

    def rollback(self, n: int) -> None:
        del self.consumed[len(self.consumed) - n:]

    def valid_prefix(self, tokens: list[int]) -> int:
        seq = list(self.consumed)
        for i, t in enumerate(tokens):
            if t not in self._next(seq):
                return i
            seq.append(t)
        return len(tokens)

    def forced(self) -> list[int]:
        seq, out = list(self.consumed), []
        while True:
            nxt = self._next(seq)
            if len(nxt) != 1 or self.eos in nxt:
                return out
            out.append(nxt.pop())
            seq.append(out[-1])

    def stopped(self) -> bool:
        return self._next(self.consumed) <= {self.eos}

    def position(self) -> int:
        return len(self.consumed)


# --- bench on the fake backend (test_bench.py, test_bench_constrained.py) ------------------------------

def question_lines(n_per_category):
    """A synthetic question file in Spec-Bench's format (ids numbered like Spec-Bench's)."""
    import json

    lines, qid = [], 81
    for cat in ["writing", "roleplay", "translation", "rag"]:
        for _ in range(n_per_category):
            turns = ["first turn", "second turn"] if cat in ("writing", "roleplay") else ["only turn"]
            lines.append(json.dumps({"question_id": qid, "category": cat, "turns": turns}))
            qid += 1
    return "\n".join(lines)


def trial(pid, group, method, tps, text="same", repeat=0, calls=10, committed=20):
    """One bench trial of `tps` tokens in one second."""
    from specgen.bench import run, suites
    from specgen.core.stats import RunStats

    s = RunStats(n_tokens=int(tps), decode_s=1.0, target_calls=calls, n_committed=committed, drafted=8, accepted=4)
    return run.Trial(suites.BenchPrompt(group, pid, ("x",)), method, repeat, text, s, "length")


def _flat():
    from specgen.costs.curve import CostCurve

    return CostCurve([1, 2, 4, 8, 16, 32], [0.010, 0.0105, 0.011, 0.012, 0.014, 0.018], "test")


FLAT = _flat()


def _fake_methods():
    from specgen.drafting.methods import NAMES

    return ("plain", *(m for m in NAMES if m != "plain"))  # every method in the table


FAKE_METHODS = _fake_methods()


def fake_session(with_draft: bool, n_ctx: int = 512):
    """A session on the fake backend as the loader builds it, with fixed synthetic cost curves."""
    from dataclasses import replace

    from specgen.app.config import RunConfig
    from specgen.app.session import open_session
    from specgen.drafting.methods import METHODS

    target = FakeModel(n_vocab=24, sharpness=4.0)
    draft = NoisyDraft(target, noise=0.5) if with_draft else None
    cfg = RunConfig(target="fake", draft="fake-draft" if draft else None, chat=False, ctx=n_ctx)
    curves = lambda model, ctx: replace(FLAT, seconds=[s / 4 for s in FLAT.seconds]) if model is draft else replace(FLAT)  # noqa: E731
    methods = [METHODS[m] for m in FAKE_METHODS if with_draft or m not in ("chain", "tree", "staged")]
    return open_session(cfg.loading, methods, target, draft, curves), cfg
