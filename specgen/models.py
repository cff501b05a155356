"""models.txt: named models with a source and a sha256; pulling them into the cache atomically.

A MODEL argument anywhere in specgen is a path to a GGUF file or a name from models.txt; a name
whose file is not in the cache yet is pulled on use.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterable

from .errors import ModelError
from .render import note, progress_bar, spinner

from .host import MANIFEST, specgen_home

CHUNK = 1 << 20


def models_dir() -> Path:
    return specgen_home() / "models"


@dataclass(frozen=True)
class PypiFile:
    package: str  # "name==version"
    member: str  # path inside the wheel


@dataclass(frozen=True)
class ModelEntry:
    name: str
    source: str
    sha256: str | None  # None: recorded on first pull
    size: int | None = None
    internet: bool = False
    options: dict[str, str] = field(default_factory=dict)  # a self: entry's derivation options

    @property
    def kind(self) -> str:
        for prefix in ("pypi", "derive", "path", "self"):
            if self.source.startswith(prefix + ":"):
                return prefix
        return "url"

    def pypi_files(self) -> list[PypiFile]:
        files = []
        for part in self.source.split("+"):
            package, _, member = part.removeprefix("pypi:").partition("#")
            files.append(PypiFile(package, member))
        return files

    def derive_from(self) -> tuple[str, str]:
        _, base, qtype = self.source.split(":")
        return base, qtype

    @property
    def self_of(self) -> str:
        """The target a self: entry derives its draft from."""
        return self.source.removeprefix("self:")


def manifest_path() -> Path:
    return Path(os.environ.get("SPECGEN_MODELS_TXT") or MANIFEST)


def parse_manifest(lines: Iterable[str], origin: str = "models.txt") -> dict[str, ModelEntry]:
    entries: dict[str, ModelEntry] = {}
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) < 3:
            raise ModelError(f"{origin} line {lineno}: expected 'NAME SOURCE SHA256 [key=value ...]', "
                             f"found {line!r}")
        name, source, sha = fields[:3]
        extras = dict(f.partition("=")[::2] for f in fields[3:])
        if sha != "-" and (len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha)):
            raise ModelError(f"{origin} line {lineno}: expected a 64-hex-digit sha256 or '-' for {name}, "
                             f"found {sha!r}")
        if not source.startswith(("pypi:", "derive:", "path:", "self:", "https://", "http://")):
            raise ModelError(f"{origin} line {lineno}: unknown source {source!r} for {name} (expected "
                             "pypi:, derive:, path:, self: or https://)")
        if source.startswith("self:") and sha != "-":
            raise ModelError(f"{origin} line {lineno}: {name} is derived by measurement on each machine: "
                             f"expected '-' for its sha256, found {sha[:12]}...")
        size = extras.get("size")
        entries[name] = ModelEntry(name, source, None if sha == "-" else sha,
                                   int(size) if size and size.isdigit() else None,
                                   extras.get("internet") == "yes",
                                   {k: extras[k] for k in SELF_OPTIONS if k in extras})
    return entries


def load_manifest() -> dict[str, ModelEntry]:
    path = manifest_path()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ModelError(f"cannot read the model manifest {path}: {e.strerror}") from None
    return parse_manifest(text.splitlines(), str(path))


def cached_path(entry: ModelEntry) -> Path:
    if entry.kind == "path":
        p = Path(entry.source.removeprefix("path:")).expanduser()
        # Relative paths are relative to the manifest that names them.
        return p if p.is_absolute() else manifest_path().resolve().parent / p
    return models_dir() / f"{entry.name}.gguf"


def _recorded_sha_path(entry: ModelEntry) -> Path:
    return models_dir() / f"{entry.name}.sha256"


def expected_sha(entry: ModelEntry) -> str | None:
    if entry.sha256:
        return entry.sha256
    rec = _recorded_sha_path(entry)
    return rec.read_text().split()[0] if rec.exists() else None


def is_present(entry: ModelEntry) -> bool:
    return cached_path(entry).is_file()


def looks_like_path(spec: str) -> bool:
    return os.sep in spec or "/" in spec or spec.endswith(".gguf") or Path(spec).exists()


def resolve(spec: str, pull_missing: bool = True) -> Path:
    """A MODEL argument (path or models.txt name) -> a local GGUF path, pulling a name if needed."""
    if looks_like_path(spec):
        path = Path(spec).expanduser()
        if not path.exists():
            raise ModelError(f"model file not found: {spec}")
        return path
    manifest = load_manifest()
    entry = manifest.get(spec)
    if entry is None:
        raise ModelError(f"unknown model {spec!r}: expected a GGUF path or a name from {manifest_path().name} "
                         f"({', '.join(sorted(manifest))})")
    if not pull_missing or (is_present(entry) and not _self_is_stale(entry)):
        return cached_path(entry)
    return pull(entry, manifest)


# --- pulling ------------------------------------------------------------------------------------


class _HashingWriter:
    """Writes a temporary file beside the destination, hashing as it goes; `commit` renames it in."""

    def __init__(self, dest: Path):
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
        self.dest, self.tmp = dest, Path(tmp)
        self.file: BinaryIO = os.fdopen(fd, "wb")
        self.sha = hashlib.sha256()

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self.sha.update(data)

    def copy_from(self, src: BinaryIO, advance: Callable[[int], None]) -> None:
        while data := src.read(CHUNK):
            self.write(data)
            advance(len(data))

    def abort(self) -> None:
        self.file.close()
        self.tmp.unlink(missing_ok=True)

    def commit(self, entry: ModelEntry) -> Path:
        self.file.close()
        got = self.sha.hexdigest()
        _check_sha(entry, got, self.tmp)
        os.replace(self.tmp, self.dest)
        return self.dest


def _check_sha(entry: ModelEntry, got: str, tmp: Path) -> None:
    want = expected_sha(entry)
    if want is None:
        _recorded_sha_path(entry).write_text(f"{got}  {entry.name}\n")
        return
    if got != want:
        tmp.unlink(missing_ok=True)
        raise ModelError(f"sha256 mismatch for {entry.name}: expected {want}, got {got} "
                         "(the download is corrupt or the source changed; nothing was kept)")


def pull(entry: ModelEntry, manifest: dict[str, ModelEntry] | None = None) -> Path:
    """Fetch or build one entry into the cache; a failed pull leaves no partial file behind."""
    dest = cached_path(entry)
    if entry.kind == "path":
        if not dest.is_file():
            raise ModelError(f"{entry.name}: local model file not found: {dest}")
        return dest
    if entry.kind == "derive":
        return _derive(entry, manifest or load_manifest())
    if entry.kind == "self":
        return _derive_self(entry, dest)
    writer = _HashingWriter(dest)
    try:
        if entry.kind == "pypi":
            _pull_pypi(entry, writer)
        else:
            _pull_url(entry, writer)
        return writer.commit(entry)
    except BaseException:
        writer.abort()
        raise


def _pip_download(package: str, into: Path) -> Path:
    note(f"downloading {package} from PyPI")
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(into), package],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        last = (proc.stdout.strip().splitlines() or ["pip failed"])[-1]
        raise ModelError(f"could not download {package} from PyPI: {last}")
    wheels = sorted(into.glob("*.whl"))
    if not wheels:
        raise ModelError(f"pip download {package} produced no wheel in {into}")
    return wheels[-1]


def _pull_pypi(entry: ModelEntry, writer: _HashingWriter) -> None:
    with tempfile.TemporaryDirectory(prefix="specgen-pip-", dir=writer.dest.parent) as tmp:
        for i, item in enumerate(entry.pypi_files()):
            wheel = _pip_download(item.package, Path(tmp) / str(i))
            with zipfile.ZipFile(wheel) as zf:
                try:
                    info = zf.getinfo(item.member)
                except KeyError:
                    raise ModelError(f"{item.package} has no file {item.member} (models.txt entry "
                                     f"{entry.name})") from None
                with zf.open(info) as src, progress_bar(f"{entry.name} [{i + 1}]", info.file_size) as advance:
                    writer.copy_from(src, advance)
            wheel.unlink()  # chunks can be large: keep at most one wheel on disk


def _pull_url(entry: ModelEntry, writer: _HashingWriter) -> None:
    req = urllib.request.Request(entry.source, headers={"User-Agent": "specgen"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            total = int(resp.headers.get("Content-Length") or 0) or None
            with progress_bar(entry.name, total) as advance:
                writer.copy_from(resp, advance)
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ModelError(f"could not download {entry.name} from {entry.source}: {reason}"
                         + (" (this model needs internet access)" if entry.internet else "")) from None


def _derive(entry: ModelEntry, manifest: dict[str, ModelEntry]) -> Path:
    from . import backend  # only derivation needs llama.cpp here

    base_name, qtype = entry.derive_from()
    base = manifest.get(base_name)
    if base is None:
        raise ModelError(f"{entry.name} derives from {base_name!r}, which is not in models.txt")
    src = resolve(base_name)
    dest = cached_path(entry)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        with spinner(f"deriving {entry.name}: llama.cpp quantize {base_name} -> {qtype}"):
            backend.quantize(src, tmp, qtype)
        _check_sha(entry, file_sha256(tmp), tmp)
        os.replace(tmp, dest)
        return dest
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


SELF_OPTIONS = ("type", "head", "vocab")  # a self: entry's key=value options (specgen draft derive's)


def drafts_dir() -> Path:
    """Where `specgen draft derive` (and -d self) keeps the drafts it derives."""
    return specgen_home() / "drafts"


def derived_drafts() -> list[Path]:
    """The derived drafts in the cache, oldest first."""
    return sorted(drafts_dir().glob("*.gguf"), key=lambda p: p.stat().st_mtime) if drafts_dir().is_dir() else []


def _derived_record(entry: ModelEntry) -> Path:
    """Beside a self: entry's link: the name of the derived draft it links (subset.derived_path)."""
    return models_dir() / f"{entry.name}.derived"


def _self_options(entry: ModelEntry) -> tuple[str | None, int | None, str | None]:
    opts = entry.options
    vocab = opts.get("vocab")
    if vocab is not None and not vocab.isdigit():
        raise ModelError(f"{entry.name}: expected vocab=NUMBER in models.txt, found vocab={vocab}")
    return opts.get("type"), int(vocab) if vocab else None, opts.get("head")


def _self_is_stale(entry: ModelEntry) -> bool:
    """A self: entry linked to a draft this version of specgen would not derive (its choices or
    the derivation changed since): `-d self` means the current derivation, so it is derived again."""
    if entry.kind != "self":
        return False
    from .subset import self_draft_path

    record = _derived_record(entry)
    linked = record.read_text().strip() if record.is_file() else None
    return linked != self_draft_path(entry.self_of, *_self_options(entry)).name


def _derive_self(entry: ModelEntry, dest: Path) -> Path:
    """`specgen draft derive` of the entry's target with its options, linked in under the entry's
    name. Its choices are measured on this machine, so its bytes are not pinned by a sha256."""
    from .subset import self_draft

    derived = self_draft(entry.self_of, *_self_options(entry))
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.part")
    tmp.unlink(missing_ok=True)
    try:
        os.link(derived, tmp)  # both live under the specgen cache: no second copy
    except OSError:
        shutil.copyfile(derived, tmp)
    os.replace(tmp, dest)
    _derived_record(entry).write_text(derived.name + "\n")
    return dest


def file_sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while data := f.read(CHUNK):
            sha.update(data)
    return sha.hexdigest()


def _sha256_memo(path: Path) -> Path:
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:32]
    return specgen_home() / "sha256" / key


def remembered_sha256(path: Path) -> str:
    """file_sha256, remembered by the file's path, size and mtime: a model given as a path is
    described on every `-d self` and `bench --json` run, and hashing gigabytes costs seconds."""
    memo = _sha256_memo(path)
    if memo.is_file():
        return memo.read_text().strip()
    sha = file_sha256(path)
    memo.parent.mkdir(parents=True, exist_ok=True)
    memo.write_text(sha + "\n")
    return sha


def known_sha256(spec: str, path: Path) -> str | None:
    """describe()'s sha256 where it is had without hashing the file (models.txt's, or remembered)."""
    entry = None if looks_like_path(spec) else load_manifest().get(spec)
    memo = _sha256_memo(path)
    return (expected_sha(entry) if entry else None) or (memo.read_text().strip() if memo.is_file() else None)


def describe(spec: str, path: Path) -> dict[str, str]:
    """name, path and sha256 (the one models.txt checked on pull for a name, else the file's)."""
    entry = None if looks_like_path(spec) else load_manifest().get(spec)
    sha = (expected_sha(entry) if entry else None) or remembered_sha256(path)
    return {"name": spec, "path": str(path), "sha256": sha}


def human_size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"
