"""Vocabulary-subset drafts (FR-Spec): a draft whose output layer covers only the tokens its target
writes most, so its most expensive layer shrinks with it. The target still verifies over its whole
vocabulary, so output stays lossless (vocab.SubsetContext).

A cut GGUF keeps every token the tokenizer needs at load (control tokens but the `<unusedN>`
placeholders, user-defined tokens, byte tokens) plus the most frequent normal tokens; the tokenizer
arrays are subset and re-indexed, the special-token ids remapped, and the embedding (and an untied
output matrix) sliced by whole rows: each row is quantized on its own, so raw bytes slice for any
quantization type. The map back to the target's ids goes into the GGUF's specgen.* metadata.
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
from typing import Callable, Iterable, Sequence

import numpy as np

from .errors import ModelError
from .costs import CostCurve
from .kv import evaluate
from .protocol import Batch, Context, Model
from .vocab import SUBSET_IDS_KEY, SUBSET_UNK_KEY

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # llama.cpp's token types
ROW_TENSORS = ("token_embd.weight", "output.weight")  # one row per vocabulary entry
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
HEAD_CHOICES = (None, "Q4_0")  # tried when --head is not given (None: the quantization type's own)
VOCAB_CHOICES = (None, 65536, 32768)  # tried when --vocab is not given (None: no cut)
COST_ROUNDS = 12  # timed draft tokens per candidate, in turns; the fastest counts


def _gpt2_byte_chars() -> set[str]:
    """The 256 characters GPT-2-style BPE vocabularies spell bytes with (llama.cpp looks them up at load)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in printable]
    return {chr(b) for b in printable} | {chr(256 + i) for i in range(len(extra))}


def kept_ids(token_types: np.ndarray, tokens: list[str], ranked: Iterable[int], n_normal: int,
             byte_level: bool = False) -> np.ndarray:
    """Every token the tokenizer needs (and, for a byte-level BPE vocabulary, its 256 byte
    characters), plus the first `n_normal` other normal tokens of `ranked` (most frequent first):
    sorted target ids."""
    byte_chars = _gpt2_byte_chars() if byte_level else set()
    needed = [i for i, (t, text) in enumerate(zip(token_types, tokens))
              if (t != NORMAL and not (t in (CONTROL, UNUSED) and text.startswith("<unused")))
              or (t == NORMAL and text in byte_chars)]
    normal: list[int] = []
    for i in ranked:
        if len(normal) == n_normal:
            break
        if token_types[i] == NORMAL:
            normal.append(int(i))
    return np.array(sorted(set(needed) | set(normal)), dtype=np.int64)


def cut_vocabulary(src: Path, dst: Path, keep: np.ndarray) -> None:
    """Write `src` with its vocabulary cut to the target ids `keep` (sorted); see the module doc."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(src)
    n_vocab = len(reader.get_field("tokenizer.ggml.tokens").data)
    if len(keep) == 0 or keep[0] < 0 or keep[-1] >= n_vocab or np.any(np.diff(keep) <= 0):
        raise ModelError(f"a vocabulary cut needs sorted, distinct ids in 0..{n_vocab - 1}")
    new_id = np.full(n_vocab, -1, dtype=np.int64)
    new_id[keep] = np.arange(len(keep))
    unk_field = reader.get_field("tokenizer.ggml.unknown_token_id")
    unk = int(new_id[unk_field.contents()]) if unk_field is not None else 0
    if unk < 0:
        raise ModelError(f"{src.name}: the cut must keep the unknown token {unk_field.contents()}")

    writer = GGUFWriter(dst, arch=reader.get_field("general.architecture").contents(), endianess=reader.endianess)
    kept_text = None
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        value = field.contents()
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            value = [value[i] for i in keep]
            kept_text = value if key == "tokenizer.ggml.tokens" else kept_text
        elif key.startswith("tokenizer.ggml.") and key.endswith("_token_id"):
            if new_id[value] < 0:
                raise ModelError(f"{src.name}: the cut must keep {key.removeprefix('tokenizer.ggml.')} {value}")
            value = int(new_id[value])
        elif key.endswith(".vocab_size"):
            value = len(keep)
        elif key == "tokenizer.ggml.merges":
            continue  # written below, once the kept token texts are known
        writer.add_key_value(key, value, vtype, sub_type=sub_type)
    merges = reader.get_field("tokenizer.ggml.merges")
    if merges is not None:  # BPE: a merge is usable only if both parts and the result are kept
        have = set(kept_text or [])
        writer.add_array("tokenizer.ggml.merges", [m for m in merges.contents()
                                                   if all(p in have for p in m.split(" ", 1)) and m.replace(" ", "", 1) in have])
    writer.add_array(SUBSET_IDS_KEY, [int(i) for i in keep])
    writer.add_uint32(SUBSET_UNK_KEY, unk)

    write_tensors(writer, [(t.name, t.data[keep] if t.name in ROW_TENSORS else t.data, t.tensor_type)
                           for t in reader.tensors])


def write_tensors(writer, tensors: list[tuple[str, np.ndarray, object]]) -> None:
    """Finish a GGUFWriter whose metadata is set: (name, raw data, GGML type) per tensor, in order."""
    for name, data, ttype in tensors:
        writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, ttype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data, _ in tensors:
        writer.write_tensor_data(np.ascontiguousarray(data))
    writer.close()


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
        p = np.exp(x)
        p /= p.sum(axis=1, keepdims=True)
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
            for off in range(0, len(tokens), ctx.n_batch):
                batch = Batch()
                for j, tok in enumerate(tokens[off:off + ctx.n_batch]):
                    batch.add(tok, off + j, (i - first,), True)
                drawn = count(np.full(len(batch), fold), ctx.decode(batch))
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
        for off in range(0, len(tokens) - 1, ctx.n_batch):
            batch = Batch()
            for j, tok in enumerate(tokens[off:min(off + ctx.n_batch, len(tokens) - 1)]):
                batch.add(tok, off + j, (0,), off + j >= start - 1)
            rows = ctx.decode(batch)
            if len(rows):
                best = np.argmax(rows, axis=1)
                out.extend(int(t) for t in (best if ctx.columns is None else ctx.columns[best]))
    return out


@dataclass(frozen=True)
class Candidate:
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


SELF = "self"  # `-d self`: the target's own derived draft


def self_draft(target_spec: str, qtype: str | None = None, vocab: int | None = None, head: str | None = None,
               corpus: Sequence[Path] = ()) -> Path:
    """The derived draft of a target given as a path or models.txt name (derived on first use)."""
    from . import models

    path = models.resolve(target_spec)
    return derive_self_draft(path, models.describe(target_spec, path)["sha256"], qtype, vocab, head, corpus)


def self_draft_path(target_spec: str, qtype: str | None = None, vocab: int | None = None,
                    head: str | None = None) -> Path:
    """Where self_draft() keeps that derivation (whether or not it has run): it names what this
    version of specgen derives, so a draft derived by an earlier one is told apart."""
    from . import models

    path = models.resolve(target_spec)
    return derived_path(path, models.describe(target_spec, path)["sha256"], qtype, vocab, head, [])


def derived_path(target: Path, target_sha256: str, qtype: str | None, vocab: int | None, head: str | None,
                 texts: Sequence[str]) -> Path:
    """The cache file of one derivation: named by its options and keyed by everything it reads."""
    from .models import drafts_dir

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
    from . import backend
    from .render import count_progress, note, spinner

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
            with spinner(f"deriving a draft of {target.name}: llama.cpp quantize -> {t}"
                         + (f", embedding/output {h}" if h else "")):
                backend.quantize(target, path, t, head_type=h)
        first = quantized[bodies[0]]
        with count_progress(len(prompts), f"counting the tokens it uses ({len(prompts)} prompts)") as done:
            usage = count_use(backend.LlamaModel(first), prompts, texts, on_prompt=done)
        table = TokenTable.read(first)  # quantizing leaves the tokenizer as it was
        vocabs = [vocab] if vocab else [v for v in VOCAB_CHOICES if v is None or v < 0.75 * table.n_normal]
        chosen = Candidate(*bodies[0], vocabs[0])
        if len(bodies) * len(vocabs) > 1:
            candidates = choose(backend.LlamaModel(target), quantized, table, vocabs, usage, Path(tmp))
            for c in candidates:
                note(f"  {c.label}: {1000 * c.cost_s:.1f} ms/token, agreement {c.agreement:.3f}, "
                     f"chain {c.speed:.1f} tok/s (modelled)")
            chosen = max(candidates, key=lambda c: c.speed)
            note(f"chose {chosen.label}")
        body = quantized[(chosen.qtype, chosen.head)]
        if chosen.vocab is None:
            os.replace(body, dst)
        else:
            cut = Path(tmp) / "cut.gguf"
            with spinner(f"cutting its vocabulary to the {chosen.vocab} tokens it uses most"):
                cut_vocabulary(body, cut, table.keep(usage.ranked(), chosen.vocab))
            os.replace(cut, dst)
    return dst


def candidate_bodies(qtype: str | None, head: str | None) -> list[tuple[str, str | None]]:
    """The (quantization type, head type) pairs to derive: what is given, else every choice."""
    return [(t, h) for t in ([qtype] if qtype else TYPE_CHOICES)
            for h in ([head] if head else [h for h in HEAD_CHOICES if h != t])]


def choose(target: Model, quantized: dict[tuple[str, str | None], Path], table: TokenTable,
           vocabs: Sequence[int | None], usage: Usage, tmp: Path) -> list[Candidate]:
    """Measure every (type, head type) x vocabulary size: c_q(1), greedy agreement with the target on the
    held-out continuations (vocabularies ranked without them), and the chain speed both give with
    the target's measured cost curve."""
    from . import backend
    from .render import count_progress
    from .session import cost_curve
    from .vocab import SubsetContext

    target_ctx = target.new_context(1024, n_seq_max=2, n_batch=64)
    target_curve = cost_curve(target, target_ctx)
    reference = greedy_predictions(target_ctx, usage.texts)
    del target_ctx
    ranked = usage.ranked(everything=False)
    found: list[tuple[Candidate, Context]] = []
    with count_progress(len(quantized) * len(vocabs), "measuring the candidates") as done:
        for (t, h), src in quantized.items():
            for v in vocabs:
                path = src
                if v is not None:
                    path = tmp / f"candidate-{t}-{h}-{v}.gguf"
                    cut_vocabulary(src, path, table.keep(ranked, v))
                model = backend.LlamaModel(path)
                ctx = model.new_context(1024, n_batch=64)
                if model.subset_of_target is not None:
                    ctx = SubsetContext(ctx, model.subset_of_target, target.n_vocab)
                agreement = float(np.mean(np.array(greedy_predictions(ctx, usage.texts)) == reference))
                found.append((Candidate(t, h, v, agreement=agreement), ctx))
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
    from .drafters import softmax

    ctx.clear()
    evaluate(ctx, context, last_logits=False)
    batch = Batch()
    batch.add(context[-1], len(context), (0,), True)
    started = time.perf_counter()
    np.argmax(softmax(ctx.decode(batch)[0]))
    return time.perf_counter() - started


@dataclass(frozen=True)
class TokenTable:
    """A GGUF's tokenizer arrays as a cut reads them. Read once per derivation: a large
    vocabulary is hundreds of thousands of strings, and every quantized candidate shares it."""

    types: np.ndarray
    tokens: list[str]
    byte_level: bool

    @classmethod
    def read(cls, path: Path) -> "TokenTable":
        from gguf import GGUFReader

        reader = GGUFReader(path)
        return cls(np.array(reader.get_field("tokenizer.ggml.token_type").contents()),
                   reader.get_field("tokenizer.ggml.tokens").contents(),
                   reader.get_field("tokenizer.ggml.model").contents() == "gpt2")

    @property
    def n_normal(self) -> int:
        return int(np.sum(self.types == NORMAL))

    def keep(self, ranked: np.ndarray, n_normal: int) -> np.ndarray:
        """kept_ids for this vocabulary."""
        return kept_ids(self.types, self.tokens, ranked, n_normal, self.byte_level)
