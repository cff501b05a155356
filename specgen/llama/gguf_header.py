"""A GGUF's header read directly: the metadata values and tensor types a caller names, without
decoding the rest. gguf's GGUFReader builds a numpy view of every field first, which on a
262,144-token vocabulary is seconds of Python per file, paid by every load of a vocabulary-cut
draft; here the tokenizer's string arrays are stepped over by their lengths alone."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specgen.errors import ModelError

MAGIC = b"GGUF"
STRING, ARRAY = 8, 9
# GGUF value types with a fixed size: numpy dtype (little-endian), as gguf's GGUFValueType numbers them.
FIXED = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
         12: "<f8"}


@dataclass
class Header:
    """What was asked for: `values[key]` (a Python scalar, a str, a numpy array for numeric arrays or
    a list of str), `keys` (every metadata key, in file order), `counts[key]` (every array's length),
    `tensor_types[name]` (ggml type ids)."""

    keys: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    tensor_types: dict[str, int] = field(default_factory=dict)


def read_header(path: Path | str, wanted: tuple[str, ...] = (), tensors: bool = False) -> Header:
    """The metadata values named in `wanted` (absent keys are left out), every key's name, and with
    `tensors` each tensor's type. A ModelError naming the file where it is not a GGUF."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return _parse(m, set(wanted), tensors)
    except (OSError, ValueError, struct.error, IndexError) as e:
        raise ModelError(f"cannot read {path} as a GGUF: {e}") from None


def _parse(buf: mmap.mmap, wanted: set[str], tensors: bool) -> Header:
    if bytes(buf[:4]) != MAGIC:
        raise ValueError(f"expected the magic {MAGIC!r}, found {bytes(buf[:4])!r}")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version < 2:
        raise ValueError(f"expected GGUF version 2 or later, found {version}")
    at, out = 24, Header()
    for _ in range(n_kv):
        key, at = _string(buf, at)
        (vtype,), at = struct.unpack_from("<I", buf, at), at + 4
        out.keys.append(key)
        if vtype == ARRAY:
            out.counts[key] = struct.unpack_from("<Q", buf, at + 4)[0]
        value, at = _value(buf, at, vtype, key in wanted)
        if key in wanted:
            out.values[key] = value
    for _ in range(n_tensors if tensors else 0):
        name, at = _string(buf, at)
        (n_dims,), at = struct.unpack_from("<I", buf, at), at + 4
        at += 8 * n_dims
        (ttype,), at = struct.unpack_from("<I", buf, at), at + 4 + 8  # type, then the data's offset
        out.tensor_types[name] = ttype
    return out


def _string(buf: mmap.mmap, at: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, at)
    return buf[at + 8:at + 8 + n].decode("utf-8", errors="replace"), at + 8 + n


def _value(buf: mmap.mmap, at: int, vtype: int, keep: bool) -> tuple[Any, int]:
    """One value from `at`, and where the next begins; None where it is not kept."""
    if vtype in FIXED:
        size = np.dtype(FIXED[vtype]).itemsize
        value = np.frombuffer(buf[at:at + size], FIXED[vtype])[0].item() if keep else None
        return (bool(value) if vtype == 7 and keep else value), at + size
    if vtype == STRING:
        text, end = _string(buf, at)
        return (text if keep else None), end
    if vtype != ARRAY:
        raise ValueError(f"expected a GGUF value type 0-12, found {vtype}")
    etype, count = struct.unpack_from("<IQ", buf, at)
    at += 12
    if etype in FIXED:
        size = np.dtype(FIXED[etype]).itemsize
        data = np.frombuffer(buf[at:at + size * count], FIXED[etype]).copy() if keep else None
        return data, at + size * count
    if etype == STRING:
        items = []
        for _ in range(count):
            (n,) = struct.unpack_from("<Q", buf, at)
            if keep:
                items.append(buf[at + 8:at + 8 + n].decode("utf-8", errors="replace"))
            at += 8 + n
        return (items if keep else None), at
    raise ValueError(f"expected arrays of numbers or strings, found elements of type {etype}")
