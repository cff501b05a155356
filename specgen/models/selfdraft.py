"""Deriving a target's own draft (`-d self`, `specgen draft derive`): the target quantized, made to
write after a shipped prompt set, and its vocabulary cut to the tokens it used most (FR-Spec), so
its most expensive layer, the output layer, shrinks with it. The target still verifies over its
whole vocabulary, so output stays lossless (core/vocab.SubsetContext). Left open, the quantization
type, the output matrix's type and the vocabulary size are chosen by measurement on this machine.

The cut itself (which tokens a tokenizer needs, the GGUF rewrite) is llama/gguf.py's.
"""

from __future__ import annotations

import hashlib
import json
import os
import math
import tempfile
import time
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from specgen.models.curves import cost_curve
from specgen.models.manifest import drafts_dir
from specgen.core.kv import decode_chunks, evaluate
from specgen.core.protocol import Batch, Context, Model
from specgen.core.sampling import softmax
from specgen.core.vocab import SubsetContext
from specgen.costs.curve import CostCurve
from specgen.errors import ModelError
from specgen.llama.gguf import TokenTable, cut_vocabulary
from specgen.reporter import reporter

DERIVE_VERSION = 2  # bump when what a derived draft contains changes
# Tried when --type is not given. The body's type sets how often the draft agrees with its target
# more than what it costs, on a small model whose output layer is most of it: for gemma-3-270m F32
# (whole vocabulary) Q4_K_M agreed 0.987 at 11.2 ms a token, Q2_K 0.856 at 7.2 (Q4_0 head), and
# Q4_K_M modelled the faster chain. (That F32 is gemma's Q4_K_M upcast: its Q4_K_M draft is
# nearly itself.)
TYPE_CHOICES = ("Q2_K", "Q4_K_M")
RANK_TOKENS = 128  # tokens the model writes after each ranking prompt
RANK_TEMPERATURE, RANK_PARALLEL, RANK_PROMPT_TOKENS = 1.0, 16, 256
HOLD_OUT = 4  # every 4th ranking prompt judges the candidates instead of ranking
# Tried when --head is not given (None: the quantization type's own). Q4_1 has specgen's packed kernel
# (q4_1x16): gemma's 262,144-row output layer at 1 thread on an AVX-512 EPYC, 1 token, 2.9 ms
# against Q4_0's 4.4 and Q8_0's 6.8 (`specgen calibrate --kernels`). For gemma-3-270m F32 cut to
# 65,536 it was cheaper than Q4_K_M's own head (Q8_0), 4.0 ms a token against 4.7, but agreed less,
# 0.881 against 0.906, modelled the slower chain, and ran pair A at T=0.8 no faster
# (docs/measurements.md, 2026-11-29).
HEAD_CHOICES = (None, "Q4_0", "Q4_1")
VOCAB_CHOICES = (None, 65536, 32768)  # tried when --vocab is not given (None: no cut)
# A cut keeps whole groups of this many rows: specgen's packed layouts (q4_1x16, q5_0x16, q8_0x16)
# take a matrix only so (gemma's Q4_1 head cut to 65,964 rows: 1.45 ms a token; to 65,968: 0.77).
# Drafts cut before (DERIVE_VERSION 2 as well) stay: the same tokens but a few, their heads on the
# unpacked kernels (a derivation's choice between a whole and a cut vocabulary was close enough to
# go either way on 2026-11-29, so a forced re-derivation was not worth it).
CUT_ROWS = 16
COST_ROUNDS = 12  # timed draft tokens per candidate, in turns; the fastest counts


@dataclass
class Usage:
    """How a model uses its vocabulary over the ranking prompts (see count_use): expected counts
    per token over the prompts that rank (`fit`, with any corpus) and over every HOLD_OUT-th prompt
    (`held_out`), whose texts (prompt + continuation tokens, prompt length) judge the candidates."""

    fit: np.ndarray
    held_out: np.ndarray
    texts: list[tuple[list[int], int]]

    def ranked(self, everything: bool = True) -> np.ndarray:
        """Token ids, most used first; ties (tokens never seen) keep id order."""
        return np.argsort(-(self.fit + self.held_out if everything else self.fit), kind="stable")


def count_use(model: Model, prompts: Sequence[str], corpus: Sequence[str] = (), max_tokens: int = RANK_TOKENS,
              temperature: float = RANK_TEMPERATURE, parallel: int = RANK_PARALLEL, seed: int = 0,
              on_prompt: Callable[[], None] = lambda: None) -> Usage:
    """Count the tokens `model` itself uses. Each prompt is continued by the model (sampled, or
    greedy when held out; `parallel` prompts at a time in separate sequences of one context), and
    every position of prompt and continuation counts twice: the token there, and the model's whole
    next-token distribution p there. The expected count reaches the tokens a few thousand sampled ones miss
    (the capital letter opening a multiple-choice option, the rarer words of a language it
    writes). Corpus tokens count as read."""
    counts = np.zeros((2, model.n_vocab), dtype=np.float64)
    rng = np.random.default_rng(seed)
    encoded = [model.tokenize(text)[:RANK_PROMPT_TOKENS] for text in prompts]
    longest = max((len(t) for t in encoded), default=1)
    # Logits on every row: keep batches small, llama.cpp sizes its output buffer by n_batch rows.
    ctx = model.new_context(parallel * (longest + max_tokens) + 16, n_seq_max=parallel, n_batch=64)
    texts: list[tuple[list[int], int]] = []

    def count(fold: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Add each row's p to its fold's counts; return the next token of each row: drawn at
        `temperature` to rank (variety), greedy for held-out texts (what greedy drafting meets).
        float32 and one cumulative sum per row: numpy, not the model, is this loop's cost."""
        x = rows - rows.max(axis=1, keepdims=True)
        p = softmax(rows)
        for f in (0, 1):
            counts[f] += p[fold == f].sum(axis=0)
        if temperature != 1.0:
            p = np.exp(x / temperature)
        cdf = np.cumsum(p, axis=1)
        u = rng.random(len(p)) * cdf[:, -1]
        drawn = [min(int(np.searchsorted(row, v, side="right")), x.shape[1] - 1) for row, v in zip(cdf, u)]
        return np.where(fold == 1, np.argmax(x, axis=1), drawn)

    for first in range(0, len(encoded), parallel):
        group = {first + s: list(tokens) for s, tokens in enumerate(encoded[first:first + parallel])}
        ctx.clear()
        live: dict[int, int] = {}  # prompt index -> its next token
        for i, tokens in group.items():  # prefill: p at every position
            fold = int(i % HOLD_OUT == 0)
            np.add.at(counts[fold], tokens, 1)
            for rows in decode_chunks(ctx, tokens, seq_id=i - first):
                drawn = count(np.full(len(rows), fold), rows)
            live[i] = int(drawn[-1])
        written = {i: [] for i in group}
        for _ in range(max_tokens):  # one token for every live sequence per decode
            live = {i: tok for i, tok in live.items() if not model.is_eog(tok)}
            if not live:
                break
            batch = Batch()
            for i, tok in live.items():
                counts[int(i % HOLD_OUT == 0), tok] += 1
                batch.add(tok, len(group[i]) + len(written[i]), (i - first,), True)
                written[i].append(tok)
            drawn = count(np.array([int(i % HOLD_OUT == 0) for i in live]), ctx.decode(batch))
            live = {i: int(tok) for i, tok in zip(live, drawn)}
        for i, tokens in group.items():
            if i % HOLD_OUT == 0:
                texts.append((tokens + written[i], len(tokens)))
            on_prompt()
    for text in corpus:
        np.add.at(counts[0], model.tokenize(text, add_special=False), 1)
    return Usage(counts[0], counts[1], texts)


def greedy_predictions(ctx: Context, texts: Sequence[tuple[list[int], int]]) -> list[int]:
    """Teacher-forced argmax over every continuation token of `texts` (what greedy decoding would
    have written there), read in batches with logits on the continuation rows only."""
    out: list[int] = []
    for tokens, start in texts:
        ctx.clear()
        for rows in decode_chunks(ctx, tokens[:-1], logits_from=start - 1):
            if len(rows):
                best = np.argmax(rows, axis=1)
                out.extend(int(t) for t in (best if ctx.columns is None else ctx.columns[best]))
    return out


@dataclass(frozen=True)
class DraftVariant:
    """One way to derive the draft, and what it measured against the target."""

    qtype: str  # llama.cpp quantize type of the body
    head: str | None  # type of the embedding/output matrix; None: llama.cpp's choice for the draft's type
    vocab: int | None  # normal tokens kept; None: the whole vocabulary (no cut)
    cost_s: float = math.nan  # c_q(1): one draft token
    agreement: float = math.nan  # greedy agreement with the target on held-out continuations
    speed: float = math.nan  # modelled speed of a greedy chain, tokens/s (chain_speed)

    @property
    def label(self) -> str:
        return f"type {self.qtype}, head {self.head or 'default'}, vocabulary {self.vocab or 'whole'}"


def chain_speed(agreement: float, draft_s: float, target: CostCurve, max_depth: int = 16) -> float:
    """Tokens per second of a greedy chain of the best depth d, each drafted token accepted with
    probability `agreement` independently: E[tokens] = (1 - a^(d+1)) / (1 - a) per step of d draft
    decodes and one target decode of d + 1 rows. A ranking of candidates, not a prediction."""
    a = min(agreement, 0.999)
    return max((1 - a ** (d + 1)) / (1 - a) / (d * draft_s + target(d + 1)) for d in range(1, max_depth + 1))


def ranking_prompts() -> list[str]:
    """The shipped multilingual prompt set (prose, code, maths, translation, tables)."""
    text = resources.files("specgen").joinpath("suites/vocabulary.jsonl").read_text(encoding="utf-8")
    return [json.loads(line)["prompt"] for line in text.splitlines() if line.strip()]


def derived_path(target: Path, target_sha256: str, qtype: str | None, vocab: int | None, head: str | None,
                 texts: Sequence[str]) -> Path:
    """The cache file of one derivation: named by its options and keyed by everything it reads."""
    key = hashlib.sha256(json.dumps([DERIVE_VERSION, target_sha256, qtype, vocab, head, ranking_prompts(),
                                     RANK_TOKENS, [hashlib.sha256(t.encode()).hexdigest() for t in texts]]).encode())
    options = f"{(qtype or 'auto').lower()}-{head or 'auto'}-v{vocab or 'auto'}"
    return drafts_dir() / f"{target.stem}-{options}-{key.hexdigest()[:12]}.gguf"


def derive_self_draft(target: Path, target_sha256: str, qtype: str | None = None, vocab: int | None = None,
                      head: str | None = None, corpus: Sequence[Path] = ()) -> Path:
    """A draft derived from `target`: quantized to `qtype` (its embedding/output matrix in `head`),
    its vocabulary cut to the `vocab` normal tokens it uses most (see count_use). Left open, type,
    head and vocabulary are chosen by measurement (choose). Cached by the target's sha256 and the
    options."""
    from specgen.llama import backend, tools

    texts = []
    for path in corpus:
        try:
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
        except OSError as e:
            raise ModelError(f"cannot read corpus file {path}: {e.strerror}") from None
    prompts = ranking_prompts()
    dst = derived_path(target, target_sha256, qtype, vocab, head, texts)
    if dst.is_file():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    bodies = candidate_bodies(qtype, head)
    with tempfile.TemporaryDirectory(prefix="specgen-draft-", dir=dst.parent) as tmp:
        quantized = {(t, h): Path(tmp) / f"quantized-{t}-{h or 'default'}.gguf" for t, h in bodies}
        for (t, h), path in quantized.items():
            with reporter().spinner(f"deriving a draft of {target.name}: llama.cpp quantize -> {t}"
                         + (f", embedding/output {h}" if h else "")):
                tools.quantize(target, path, t, head_type=h)
        first = quantized[bodies[0]]
        with reporter().progress(f"counting the tokens it uses ({len(prompts)} prompts)", len(prompts)) as done:
            usage = count_use(backend.LlamaModel(first), prompts, texts, on_prompt=done)
        table = TokenTable.read(first)  # quantizing leaves the tokenizer as it was
        vocabs = [vocab] if vocab else [v for v in VOCAB_CHOICES if v is None or v < 0.75 * table.n_normal]
        chosen = DraftVariant(*bodies[0], vocabs[0])
        if len(bodies) * len(vocabs) > 1:
            candidates = choose(backend.LlamaModel(target), quantized, table, vocabs, usage, Path(tmp))
            for c in candidates:
                reporter().note(f"  {c.label}: {1000 * c.cost_s:.1f} ms/token, agreement {c.agreement:.3f}, "
                     f"chain {c.speed:.1f} tok/s (modelled)")
            chosen = max(candidates, key=lambda c: c.speed)
            reporter().note(f"chose {chosen.label}")
        body = quantized[(chosen.qtype, chosen.head)]
        if chosen.vocab is None:
            os.replace(body, dst)
        else:
            cut = Path(tmp) / "cut.gguf"
            with reporter().spinner(f"cutting its vocabulary to the {chosen.vocab} tokens it uses most"):
                cut_vocabulary(body, cut, kept_rows(table, usage.ranked(), chosen.vocab))
            os.replace(cut, dst)
    return dst


def kept_rows(table: TokenTable, ranked: np.ndarray, vocab: int) -> np.ndarray:
    """The target ids a cut to the `vocab` normal tokens used most keeps, with as many more of
    them as make the rows a whole number of CUT_ROWS groups."""
    keep = table.keep(ranked, vocab)
    while len(keep) % CUT_ROWS and vocab < table.n_normal:
        vocab += 1
        keep = table.keep(ranked, vocab)
    return keep


def candidate_bodies(qtype: str | None, head: str | None) -> list[tuple[str, str | None]]:
    """The (quantization type, head type) pairs to derive: what is given, else every choice."""
    return [(t, h) for t in ([qtype] if qtype else TYPE_CHOICES)
            for h in ([head] if head else [h for h in HEAD_CHOICES if h != t])]


def choose(target: Model, quantized: dict[tuple[str, str | None], Path], table: TokenTable,
           vocabs: Sequence[int | None], usage: Usage, tmp: Path) -> list[DraftVariant]:
    """Measure every (type, head type) x vocabulary size: c_q(1), greedy agreement with the target on the
    held-out continuations (vocabularies ranked without them), and the chain speed both give with
    the target's measured cost curve."""
    from specgen.llama import backend

    target_ctx = target.new_context(1024, n_seq_max=2, n_batch=64)
    target_curve = cost_curve(target, target_ctx)
    reference = greedy_predictions(target_ctx, usage.texts)
    del target_ctx
    ranked = usage.ranked(everything=False)
    found: list[tuple[DraftVariant, Context]] = []
    with reporter().progress("measuring the candidates", len(quantized) * len(vocabs)) as done:
        for (t, h), src in quantized.items():
            for v in vocabs:
                path = src
                if v is not None:
                    path = tmp / f"candidate-{t}-{h}-{v}.gguf"
                    cut_vocabulary(src, path, kept_rows(table, ranked, v))
                model = backend.LlamaModel(path)
                ctx = model.new_context(1024, n_batch=64)
                if model.subset_of_target is not None:
                    ctx = SubsetContext(ctx, model.subset_of_target, target.n_vocab)
                agreement = float(np.mean(np.array(greedy_predictions(ctx, usage.texts)) == reference))
                found.append((DraftVariant(t, h, v, agreement=agreement), ctx))
                done()
    # Costs last, in turns: a moment the machine is busy (writing the cuts out) then slows every
    # candidate alike instead of whichever was being timed.
    costs = np.full((COST_ROUNDS, len(found)), np.inf)
    for r in range(COST_ROUNDS):
        for i, (_, ctx) in enumerate(found):
            costs[r, i] = _decode_seconds(ctx, usage.texts[0][0][:32])
    best = costs.min(axis=0)
    return [replace(c, cost_s=float(s), speed=chain_speed(c.agreement, float(s), target_curve))
            for (c, _), s in zip(found, best)]


def _decode_seconds(ctx: Context, context: list[int]) -> float:
    """Seconds for one greedy draft token after `context`: one decode of one row with logits, and
    the drafter's work on that row (a softmax and an argmax over the draft's columns: on a small
    draft with a 262k vocabulary, a visible share)."""
    ctx.clear()
    evaluate(ctx, context, last_logits=False)
    batch = Batch()
    batch.add(context[-1], len(context), (0,), True)
    started = time.perf_counter()
    np.argmax(softmax(ctx.decode(batch)[0]))
    return time.perf_counter() - started
