"""Where lower layers send progress and warnings, since they never print: the reporter the
command line installs (cli/render.py draws it on stderr). Until one is installed, nothing is shown,
so a library caller sees no output it did not ask for."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator


class Reporter:
    """Silent by default; the CLI's subclass draws each call."""

    def note(self, message: str) -> None:
        """One status line (e.g. "downloading X from PyPI")."""

    def warn(self, message: str) -> None:
        """Something the user should know that does not stop the run."""

    @contextlib.contextmanager
    def spinner(self, message: str) -> Iterator[None]:
        """A step of unknown length."""
        yield

    @contextlib.contextmanager
    def progress(self, label: str, total: int | None, unit: str = "items") -> Iterator[Callable[[int], None]]:
        """Yields `advance(n)`; `unit` is "items" (done of total) or "bytes" (a download)."""
        yield lambda n=1: None


_current = Reporter()


def reporter() -> Reporter:
    return _current


def use(new: Reporter) -> Reporter:
    """Install `new`; returns the one it replaces."""
    global _current
    old, _current = _current, new
    return old


# Writes that failed while the work went on (a full disk, an unwritable cache): each was warned
# about once; the command's exit code says so at the end (cli.main).
_failed_writes: list[str] = []


def write_failed(path: object, error: OSError, then: str) -> None:
    """Say that writing `path` failed, and what the run does instead (`then`)."""
    _failed_writes.append(str(path))
    _current.warn(f"could not write {path}: {error.strerror or error}; {then}")


def failed_writes() -> list[str]:
    return list(_failed_writes)
