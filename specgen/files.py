"""Writing a file so that readers see the old version or the new one, never half of either."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator


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
