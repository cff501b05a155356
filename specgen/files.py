"""Files specgen writes: atomically (readers see the old version or the new one, never half of
either), output paths checked before the work that fills them, damaged state files set aside."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

from specgen.errors import ConfigError
from specgen.reporter import reporter


@contextlib.contextmanager
def replacing(dest: Path, suffix: str = ".part") -> Iterator[Path]:
    """Yields a temporary path beside `dest` (same folder: the rename is atomic) to write; on
    success it replaces `dest`, on any failure (Ctrl-C included) it is removed."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=suffix, dir=dest.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(dest: Path, text: str) -> None:
    """`dest.write_text(text)`, atomically."""
    with replacing(dest) as tmp:
        tmp.write_text(text, encoding="utf-8")


def check_writable(path: Path, option: str) -> None:
    """Fail before a long run, not after it: `path` (given as `option`) must be a file that can be
    created or replaced in an existing folder."""
    if path.is_dir():
        raise ConfigError(f"{option} expects a file to write, found a folder: {path}")
    folder = path.parent
    if not folder.is_dir():
        found = "a file" if folder.exists() else "nothing"
        raise ConfigError(f"{option} expects a file in an existing folder, found {found} at {folder}")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=folder)
    except OSError as e:
        raise ConfigError(f"{option}: cannot write in {folder}: {e.strerror or e}") from None
    os.close(fd)
    os.unlink(probe)


def set_aside(path: Path, problem: str) -> None:
    """A state file that fails its checks: renamed to NAME.bad beside it (never deleted, so it can
    be looked at), with one warning naming it; its reader then rebuilds it."""
    aside = path.with_name(path.name + ".bad")
    try:
        os.replace(path, aside)
        where = f"moved to {aside.name}"
    except OSError as e:
        where = f"could not move it aside ({e.strerror or e})"
    reporter().warn(f"{path}: {problem}; {where}, and it is rebuilt")
