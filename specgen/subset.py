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
import tempfile
from importlib import resources
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from .errors import ModelError
from .protocol import Model
from .vocab import SUBSET_IDS_KEY, SUBSET_UNK_KEY

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # llama.cpp's token types
ROW_TENSORS = ("token_embd.weight", "output.weight")  # one row per vocabulary entry
DERIVE_VERSION = 1  # bump when what a derived draft contains changes
DEFAULT_TYPE, DEFAULT_VOCAB = "Q2_K", 32768
RANK_TOKENS = 96  # tokens the model writes after each ranking prompt


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

    data = {t.name: (t.data[keep] if t.name in ROW_TENSORS else t.data) for t in reader.tensors}
    for tensor in reader.tensors:
        rows = data[tensor.name]
        writer.add_tensor_info(tensor.name, rows.shape, rows.dtype, rows.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(np.ascontiguousarray(data[tensor.name]))
    writer.close()


def rank_by_use(model: Model, prompts: Sequence[str], corpus: Sequence[str] = (), max_tokens: int = RANK_TOKENS,
                on_prompt: Callable[[], None] = lambda: None) -> np.ndarray:
    """Token ids, most used first: counted in the prompts, in what `model` writes after each of
    them (greedy: its own words, in the languages it writes), and in `corpus`. Ties (and tokens
    never seen) keep id order, which tokenizers roughly sort by frequency already."""
    from .engine import GenerationRequest, TokenEvent, generate
    from .sampling import SamplingParams
    from .stats import RunStats

    counts = np.zeros(model.n_vocab, dtype=np.int64)
    ctx = model.new_context(1024, n_seq_max=1)
    for text in prompts:
        tokens = model.tokenize(text)
        request = GenerationRequest(tokens, max_tokens, SamplingParams())
        written = [e.token for e in generate(model, ctx, request, RunStats()) if isinstance(e, TokenEvent)]
        np.add.at(counts, tokens + written, 1)
        on_prompt()
    for text in corpus:
        np.add.at(counts, model.tokenize(text, add_special=False), 1)
    return np.argsort(-counts, kind="stable")


def ranking_prompts() -> list[str]:
    """The shipped multilingual prompt set (prose, code, maths, translation, tables)."""
    text = resources.files("specgen").joinpath("suites/vocabulary.jsonl").read_text(encoding="utf-8")
    return [json.loads(line)["prompt"] for line in text.splitlines() if line.strip()]


SELF = "self"  # `-d self`: the target's own derived draft


def self_draft(target_spec: str, qtype: str = DEFAULT_TYPE, vocab: int = DEFAULT_VOCAB,
               corpus: Sequence[Path] = ()) -> Path:
    """The derived draft of a target given as a path or models.txt name (derived on first use)."""
    from . import models

    path = models.resolve(target_spec)
    return derive_self_draft(path, models.describe(target_spec, path)["sha256"], qtype, vocab, corpus)


def derive_self_draft(target: Path, target_sha256: str, qtype: str = DEFAULT_TYPE, vocab: int = DEFAULT_VOCAB,
                      corpus: Sequence[Path] = ()) -> Path:
    """A draft derived from `target`: quantized to `qtype`, its vocabulary cut to the `vocab` normal
    tokens it writes most (see rank_by_use). Cached by the target's sha256 and the options."""
    from . import backend
    from .host import specgen_home
    from .render import count_progress, spinner

    texts = []
    for path in corpus:
        try:
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
        except OSError as e:
            raise ModelError(f"cannot read corpus file {path}: {e.strerror}") from None
    prompts = ranking_prompts()
    key = hashlib.sha256(json.dumps([DERIVE_VERSION, target_sha256, qtype, vocab, prompts, RANK_TOKENS,
                                     [hashlib.sha256(t.encode()).hexdigest() for t in texts]]).encode()).hexdigest()
    dst = specgen_home() / "drafts" / f"{target.stem}-{qtype.lower()}-v{vocab}-{key[:12]}.gguf"
    if dst.is_file():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="specgen-draft-", dir=dst.parent) as tmp:
        quantized, cut = Path(tmp) / "quantized.gguf", Path(tmp) / "cut.gguf"
        with spinner(f"deriving a draft of {target.name}: llama.cpp quantize -> {qtype}"):
            backend.quantize(target, quantized, qtype)
        model = backend.LlamaModel(quantized)
        with count_progress(len(prompts), f"ranking its vocabulary by what it writes ({len(prompts)} prompts)") as done:
            ranked = rank_by_use(model, prompts, texts, on_prompt=done)
        from gguf import GGUFReader

        reader = GGUFReader(quantized)
        byte_level = reader.get_field("tokenizer.ggml.model").contents() == "gpt2"
        keep = kept_ids(np.array(reader.get_field("tokenizer.ggml.token_type").contents()),
                        reader.get_field("tokenizer.ggml.tokens").contents(), ranked, vocab, byte_level)
        del reader, model
        with spinner(f"cutting its vocabulary to {len(keep)} tokens"):
            cut_vocabulary(quantized, cut, keep)
        os.replace(cut, dst)
    return dst
