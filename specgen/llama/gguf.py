"""GGUF surgery with llama.cpp's own gguf library: one writer for every copy specgen makes (a
vocabulary cut for -d self drafts, a screened target's new output layer, a models.txt `template:`
entry's new chat template), the tokenizer's arrays, and which tokens a cut must keep."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from specgen.core.vocab import SUBSET_IDS_KEY, SUBSET_UNK_KEY
from specgen.errors import ModelError
from specgen.llama.gguf_header import read_header

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # llama.cpp's token types
ROW_TENSORS = ("token_embd.weight", "output.weight")  # one row per vocabulary entry


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
    from gguf import GGUFReader

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

    kept_text: list[str] = []

    def cut(key: str, value):
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            value = [value[i] for i in keep]
            if key == "tokenizer.ggml.tokens":
                kept_text.extend(value)
        elif key.startswith("tokenizer.ggml.") and key.endswith("_token_id"):
            if new_id[value] < 0:
                raise ModelError(f"{src.name}: the cut must keep {key.removeprefix('tokenizer.ggml.')} {value}")
            value = int(new_id[value])
        elif key.endswith(".vocab_size"):
            value = len(keep)
        elif key == "tokenizer.ggml.merges":
            return SKIP  # written below, once the kept token texts are known
        return value

    writer = copy_metadata(reader, dst, cut)
    merges = reader.get_field("tokenizer.ggml.merges")
    if merges is not None:  # BPE: a merge is usable only if both parts and the result are kept
        have = set(kept_text)
        writer.add_array("tokenizer.ggml.merges", [m for m in merges.contents()
                                                   if all(p in have for p in m.split(" ", 1)) and m.replace(" ", "", 1) in have])
    writer.add_array(SUBSET_IDS_KEY, [int(i) for i in keep])
    writer.add_uint32(SUBSET_UNK_KEY, unk)

    write_tensors(writer, [(t.name, t.data[keep] if t.name in ROW_TENSORS else t.data, t.tensor_type)
                           for t in reader.tensors])


SKIP = object()  # copy_metadata's edit: leave this key out
CHAT_TEMPLATE_KEY = "tokenizer.chat_template"


def with_strings(src: Path, dst: Path, values: dict[str, str]) -> None:
    """Write `src` with the string metadata `values` set (replaced, or added after the others) and
    every tensor as it was: the same input gives the same bytes, so such a copy can be pinned."""
    from gguf import GGUFReader

    reader = GGUFReader(src)
    writer = copy_metadata(reader, dst, lambda key, value: values.get(key, value))
    for key, value in values.items():
        if reader.get_field(key) is None:
            writer.add_string(key, value)
    write_tensors(writer, [(t.name, t.data, t.tensor_type) for t in reader.tensors])


def copy_metadata(reader, dst: Path, edit: Callable[[str, Any], Any] | None = None):
    """A GGUFWriter for `dst` with every metadata key of `reader` (a GGUFReader), each value passed
    through `edit(key, value)` when given (SKIP leaves the key out); tensors come with write_tensors."""
    from gguf import GGUFValueType, GGUFWriter

    writer = GGUFWriter(dst, arch=reader.get_field("general.architecture").contents(), endianess=reader.endianess)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        value = field.contents() if edit is None else edit(key, field.contents())
        if value is not SKIP:
            writer.add_key_value(key, value, vtype, sub_type=field.types[-1] if vtype == GGUFValueType.ARRAY else None)
    return writer


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


@dataclass(frozen=True)
class TokenTable:
    """A GGUF's tokenizer arrays as a cut reads them. Read once per derivation: a large
    vocabulary is hundreds of thousands of strings, and every quantized candidate shares it."""

    types: np.ndarray
    tokens: list[str]
    byte_level: bool

    @classmethod
    def read(cls, path: Path) -> "TokenTable":
        keys = ("tokenizer.ggml.token_type", "tokenizer.ggml.tokens", "tokenizer.ggml.model")
        values = read_header(path, keys).values
        return cls(np.asarray(values[keys[0]]), values[keys[1]], values[keys[2]] == "gpt2")

    @property
    def n_normal(self) -> int:
        return int(np.sum(self.types == NORMAL))

    def keep(self, ranked: np.ndarray, n_normal: int) -> np.ndarray:
        """kept_ids for this vocabulary."""
        return kept_ids(self.types, self.tokens, ranked, n_normal, self.byte_level)
