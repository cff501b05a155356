"""Whether a cached model is still the file models.txt names: its size and sha256, checked at each
use. Hashing gigabytes costs seconds, so each check leaves a record (NAME.verified: size, mtime,
sha256) and a file whose size and mtime still match its record is trusted without hashing."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from specgen import reporter
from specgen.models import manifest  # by module: tests count manifest.file_sha256 calls
from specgen.models.manifest import ModelEntry, is_sha256, manifest_path, models_dir
from specgen.errors import ModelError
from specgen.files import set_aside, write_text

RECORD_VERSION = 1

OK, MISMATCH, NOT_PULLED, UNCHECKED = "ok", "mismatch", "not pulled", "unchecked"


@dataclass(frozen=True)
class Record:
    """What a file was when its sha256 last matched: trusted while its size and mtime are unchanged."""
    size: int
    mtime_ns: int
    sha256: str

    def fits(self, st: os.stat_result, want: str) -> bool:
        return self.sha256 == want and self.size == st.st_size and self.mtime_ns == st.st_mtime_ns


@dataclass(frozen=True)
class Finding:
    """One entry's check: `status` is OK, MISMATCH, NOT_PULLED or UNCHECKED (no sha256 to check against)."""
    status: str
    what: str = "sha256"  # what differed: "sha256" or "size"
    expected: str = ""
    found: str = ""


def record_path(entry: ModelEntry) -> Path:
    return models_dir() / f"{entry.name}.verified"


def parse_record(text: bytes) -> Record:
    """A record file's content -> Record; ValueError says why it is not a valid one."""
    data = json.loads(text)  # JSONDecodeError and UnicodeDecodeError are ValueErrors
    if not isinstance(data, dict) or set(data) != {"version", "size", "mtime_ns", "sha256"}:
        raise ValueError("expected the keys version, size, mtime_ns and sha256")
    if data["version"] != RECORD_VERSION:
        raise ValueError(f"expected version {RECORD_VERSION}, found {data['version']!r}")
    if not all(type(data[k]) is int and data[k] >= 0 for k in ("size", "mtime_ns")):
        raise ValueError("expected whole numbers for size and mtime_ns")
    if not isinstance(data["sha256"], str) or not is_sha256(data["sha256"]):
        raise ValueError("expected a 64-hex-digit sha256")
    return Record(data["size"], data["mtime_ns"], data["sha256"])


def read_record(entry: ModelEntry) -> Record | None:
    """The entry's record, or None (absent; a damaged one is set aside and checked afresh)."""
    path = record_path(entry)
    try:
        text = path.read_bytes()
    except OSError:
        return None
    try:
        return parse_record(text)
    except ValueError as e:
        set_aside(path, f"not a valid record: {e}")
        return None


def write_record(entry: ModelEntry, st: os.stat_result, sha: str) -> None:
    """Remember that the file as `st` describes it has sha256 `sha`; a failed write costs a hash later."""
    path = record_path(entry)
    text = json.dumps({"version": RECORD_VERSION, **asdict(Record(st.st_size, st.st_mtime_ns, sha))})
    try:
        write_text(path, text + "\n")
    except OSError as e:
        reporter.write_failed(path, e, "the model is checked again next time")


def remember(entry: ModelEntry, sha: str) -> None:
    """After a pull or derivation (the sha256 was computed anyway): record the cached file."""
    write_record(entry, entry.path.stat(), sha)


def check(entry: ModelEntry, rehash: bool = False) -> Finding:
    """The cached file of `entry` against its size and sha256; `rehash` ignores the record."""
    path = entry.path
    if not path.is_file():
        return Finding(NOT_PULLED)
    want = entry.expected_sha
    if entry.kind in ("path", "self") or want is None:
        return Finding(UNCHECKED)  # the user's own file, or a draft derived by measurement here
    st = path.stat()
    # Only a pinned sha256's size= is exact; unpinned entries' sizes are estimates for `models list`.
    if entry.sha256 and entry.size is not None and st.st_size != entry.size:
        return Finding(MISMATCH, "size", f"{entry.size} bytes", f"{st.st_size} bytes")
    record = None if rehash else read_record(entry)
    if record is not None and record.fits(st, want):
        return Finding(OK)
    got = manifest.file_sha256(path)
    if got != want:
        return Finding(MISMATCH, "sha256", want, got)
    write_record(entry, st, got)  # st from before hashing: a file changed meanwhile is hashed again
    return Finding(OK)


def short(value: str) -> str:
    """A sha256 shortened for a one-line message; sizes unchanged."""
    return value[:12] + "…" if is_sha256(value) else value


def tilde_path(path: Path) -> str:
    """The path with the home directory written as ~."""
    home = str(Path.home())
    return "~" + str(path)[len(home):] if str(path).startswith(home + os.sep) else str(path)


def fix(entry: ModelEntry) -> str:
    does = "derives it again" if entry.kind in ("derive", "template") else "fetches it again"
    return f"`specgen models pull --force {entry.name}` {does}"


def mismatch_message(entry: ModelEntry, found: Finding) -> str:
    """One line: the file, the entry, what was expected and found, and the fix."""
    return (f"{tilde_path(entry.path)} is not the {entry.name} of {manifest_path().name} ({found.what} expected "
            f"{short(found.expected)}, found {short(found.found)}): it changed since it was pulled; {fix(entry)}")


def ensure(entry: ModelEntry) -> None:
    """resolve()'s check of a present entry: ModelError when the file is not the entry's."""
    found = check(entry)
    if found.status == MISMATCH:
        raise ModelError(mismatch_message(entry, found))
