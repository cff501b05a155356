"""The persistent store of one tokenizer's past texts, trustworthy when damaged: a bad byte costs the
texts it lands in, never the healthy ones before or after it, and never a silent store of garbage ids.

$SPECGEN_HOME/history/<tokenizer>.v2.store is a header, FILE_HEADER (8 magic bytes, then the
format version as a little-endian uint32), then one record per text:

    RECORD_MAGIC u32 | n_tokens u32 | crc32 u32 | n_tokens token ids (uint32)

all little-endian; the crc32 (zlib) covers the n_tokens field and the token bytes. A reader checks
every record; on a bad one (wrong magic, a length past the end, a crc mismatch, a truncated tail) it
scans ahead for the next magic that starts a record with a valid crc, so a damaged part costs only
the bytes it spans. It then says so in one warning naming the file and rewrites the file with the
healthy records alone. A file with neither our header nor one valid record is not a store: it is set
aside as NAME.bad and a new store starts.

Writers append one record per text under an exclusive lock (several specgen processes may write at
once), so a crash can leave at most a truncated last record, which the reader drops; the store is
cut to its newest STORE_KEEP tokens when it passes STORE_MAX.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterable, Iterator, Sequence

import numpy as np

from specgen.files import replacing, set_aside
from specgen.reporter import reporter, write_failed

SEPARATOR = 0xFFFFFFFF  # between texts; never a token id
STORE_MAX, STORE_KEEP = 1_000_000, 500_000  # tokens: the store is cut to its newest STORE_KEEP
FORMAT_VERSION = 2
FILE_HEADER = b"SPECGENH" + struct.pack("<I", FORMAT_VERSION)  # 12 bytes: records stay 4-aligned
RECORD_MAGIC = 0xF7E3C1A5  # above any token id, so token data hardly ever looks like a record start
RECORD_HEAD = struct.Struct("<III")  # magic, n_tokens, crc32
MAGIC_BYTES = struct.pack("<I", RECORD_MAGIC)


def join(texts: Iterable[Sequence[int]]) -> np.ndarray:
    """The texts as one token array, SEPARATOR after each (what History indexes)."""
    parts: list[np.ndarray] = []
    for text in texts:
        parts += [np.asarray(text, dtype=np.uint32), np.array([SEPARATOR], dtype=np.uint32)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint32)


def store_path(home: Path, vocab_key: str) -> Path:
    # .v2: the raw uint32 files of earlier versions (<key>.u32) are never read as records
    return home / "history" / f"{vocab_key}.v2.store"


# --- the format ----------------------------------------------------------------------------------


def encode(tokens: Sequence[int]) -> bytes:
    """One text as a record."""
    body = np.asarray(tokens, dtype="<u4").tobytes()
    count = struct.pack("<I", len(body) // 4)
    return MAGIC_BYTES + count + struct.pack("<I", zlib.crc32(body, zlib.crc32(count))) + body


@dataclass
class Record:
    tokens: np.ndarray
    end: int  # offset just past it


def record_at(data: bytes, pos: int) -> Record | None:
    """The record starting at `pos`, or None when no whole, intact record starts there."""
    if pos + RECORD_HEAD.size > len(data):
        return None
    magic, n, crc = RECORD_HEAD.unpack_from(data, pos)
    start, end = pos + RECORD_HEAD.size, pos + RECORD_HEAD.size + 4 * n
    if magic != RECORD_MAGIC or end > len(data):
        return None
    body = memoryview(data)[start:end]
    if zlib.crc32(body, zlib.crc32(data[pos + 4:pos + 8])) != crc:
        return None
    return Record(np.frombuffer(body, dtype="<u4").astype(np.uint32), end)


@dataclass
class Parsed:
    """What a store file holds: its healthy texts, oldest first, and what was skipped to find them."""

    texts: list[np.ndarray]
    skipped: int = 0  # damaged bytes (the header's, when it is not ours)
    headed: bool = True  # it starts with our header (or is empty, or a truncated header)

    @property
    def damaged(self) -> bool:
        return self.skipped > 0 or not self.headed

    @property
    def foreign(self) -> bool:
        """Not a store at all: neither our header nor one intact record."""
        return not self.headed and not self.texts


def parse(data: bytes) -> Parsed:
    headed = data.startswith(FILE_HEADER)
    found = Parsed([], headed=headed or FILE_HEADER.startswith(data))
    pos = len(FILE_HEADER) if headed else 0
    while pos < len(data):
        record = record_at(data, pos)
        if record is not None:
            found.texts.append(record.tokens)
            pos = record.end
            continue
        # Resynchronise: the next record start with a valid crc; bytes are scanned one by one,
        # since damage (or garbage appended) need not keep the records 4-aligned.
        after = data.find(MAGIC_BYTES, pos + 1)
        while after >= 0 and record_at(data, after) is None:
            after = data.find(MAGIC_BYTES, after + 1)
        after = len(data) if after < 0 else after
        found.skipped += after - pos
        pos = after
    return found


def newest(texts: list[np.ndarray], keep: int) -> list[np.ndarray]:
    """The newest whole texts that hold at most `keep` tokens, their separators counted."""
    kept, total = [], 0
    for text in reversed(texts):
        total += len(text) + 1
        if total > keep:
            break
        kept.append(text)
    return kept[::-1]


# --- the file ------------------------------------------------------------------------------------


class Store:
    """The persistent store of one tokenizer's past texts (see the module docstring)."""

    def __init__(self, path: Path, max_tokens: int = STORE_MAX, keep_tokens: int = STORE_KEEP):
        self.path, self.max_tokens, self.keep_tokens = path, max_tokens, keep_tokens
        self.failed = False  # a write failed: this run stops adding to the store (it said so once)

    def read(self) -> np.ndarray:
        """Every healthy text, joined (see `join`); a damaged file is said once and rewritten."""
        try:
            with self._locked("rb", fcntl.LOCK_SH) as f:
                found = parse(f.read())
            if found.damaged or found.foreign:
                found = self._repair()
        except FileNotFoundError:
            return np.zeros(0, dtype=np.uint32)
        except OSError as e:
            reporter().warn(f"cannot read the store of past generations {self.path}: {e.strerror or e}; "
                            "this run drafts without it")
            return np.zeros(0, dtype=np.uint32)
        return join(found.texts)

    def append(self, tokens: Sequence[int]) -> None:
        """Add a finished text. A write that fails (a full disk, a path that is a folder) is said once
        and leaves the store as it was: the text is never half in it."""
        if self.failed:
            return
        try:
            self._append(encode(tokens))
        except OSError as e:
            self.failed = True
            write_failed(self.path, e, "this run's texts are not added to the store of past generations")

    @contextlib.contextmanager
    def _locked(self, mode: str, lock: int) -> Iterator[IO[bytes]]:
        """The file opened unbuffered (a failed write fails at once) and locked; reopened when another
        process replaced it (a cut, a repair) while this one waited for the lock."""
        while True:
            with open(self.path, mode, buffering=0) as f:
                fcntl.flock(f, lock)
                if self._is_current(f):
                    yield f
                    return

    def _is_current(self, f: IO[bytes]) -> bool:
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(f.fileno())
        return (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino)

    def _append(self, record: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._locked("ab", fcntl.LOCK_EX) as f:
            end = f.seek(0, os.SEEK_END)
            blob = (b"" if end else FILE_HEADER) + record  # a new file gets its header in the same write
            try:
                view = memoryview(blob)
                while view:  # one os.write, but for a short write
                    view = view[os.write(f.fileno(), view):]
            except OSError:
                with contextlib.suppress(OSError):  # what reached the disk is part of a record: take it back
                    f.truncate(end)
                raise
            if (end + len(blob)) // 4 > self.max_tokens:
                self._cut()

    def _repair(self) -> Parsed:
        """Under the exclusive lock, read again (another process may have repaired it meanwhile),
        then set a foreign file aside or rewrite a damaged one with its healthy records alone."""
        with self._locked("rb", fcntl.LOCK_EX) as f:
            found = parse(f.read())
            if found.foreign:
                set_aside(self.path, "not a store of past generations (no store header, no intact text)")
            elif found.damaged:
                self._warn_damage(found)
                self._rewrite(found.texts)
        return Parsed([]) if found.foreign else found

    def _cut(self) -> None:
        """Keep the newest whole texts that hold keep_tokens (called holding the lock)."""
        found = parse(self.path.read_bytes())
        if found.damaged:
            self._warn_damage(found)
        self._rewrite(newest(found.texts, self.keep_tokens))

    def _rewrite(self, texts: list[np.ndarray]) -> None:
        """Atomically: a reader or writer waiting for the lock sees the old file or the new one."""
        try:
            with replacing(self.path, suffix=".tmp") as tmp:
                tmp.write_bytes(FILE_HEADER + b"".join(map(encode, texts)))
        except OSError as e:
            self.failed = True  # its writes would fail alike: said once, here
            write_failed(self.path, e, "its damaged parts are skipped again on each run, "
                         "and this run's texts are not added to it")

    def _warn_damage(self, found: Parsed) -> None:
        header = "" if found.headed else ", its header among them"
        reporter().warn(f"the store of past generations {self.path}: {found.skipped:,} damaged bytes skipped"
                        f"{header} ({len(found.texts):,} texts kept); rewriting it without them")
