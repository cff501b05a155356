"""Terminal output: generated text to stdout (Rich on a terminal, plain when piped), everything
else (stats, progress, warnings) to stderr; progress bars only when stderr is a terminal."""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any, Callable, Iterator

from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn, TransferSpeedColumn)

from specgen.reporter import Reporter

_stderr = Console(stderr=True, highlight=False)


def note(message: str) -> None:
    """One progress/status line on stderr."""
    print(f"specgen: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def spinner(message: str) -> Iterator[None]:
    if _stderr.is_terminal:
        with _stderr.status(message):
            yield
    else:
        note(message)
        yield


@contextlib.contextmanager
def progress_bar(label: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """Yields `advance(n_bytes)`; draws a byte progress bar on a terminal, nothing otherwise."""
    if not _stderr.is_terminal:
        note(f"fetching {label}")
        yield lambda n: None
        return
    columns = [TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn()]
    with Progress(*columns, console=_stderr, transient=True) as progress:
        task = progress.add_task(label, total=total)
        yield lambda n: progress.advance(task, n)


@contextlib.contextmanager
def count_progress(total: int, label: str) -> Iterator[Callable[[], None]]:
    """Yields `advance()`; a bar with done/total and ETA on a terminal, one note otherwise."""
    if not _stderr.is_terminal:
        note(label)
        yield lambda: None
        return
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("ETA"), TimeRemainingColumn()]
    with Progress(*columns, console=_stderr, transient=True) as progress:
        task = progress.add_task(label, total=total)
        yield lambda: progress.advance(task)


def warn(message: str) -> None:
    print(f"specgen: warning: {message}", file=sys.stderr, flush=True)


def error(message: str) -> None:
    """An error the command goes on past (its exit code says it): the same one line as main's."""
    print(f"specgen: error: {message}", file=sys.stderr, flush=True)


class TerminalReporter(Reporter):
    """What lower layers report, on stderr: spinners and bars on a terminal, plain lines when not."""

    def note(self, message: str) -> None:
        note(message)

    def warn(self, message: str) -> None:
        warn(message)

    def spinner(self, message: str):
        return spinner(message)

    @contextlib.contextmanager
    def progress(self, label: str, total: int | None, unit: str = "items") -> Iterator[Callable[[int], None]]:
        if unit == "bytes":
            with progress_bar(label, total) as advance:
                yield advance
        else:
            with count_progress(total or 0, label) as advance:
                yield lambda n=1: [advance() for _ in range(n)] and None


class OutputClosed(Exception):
    """stdout's reader went away (`| head -1`). Not an OSError on purpose: click turns EPIPE into
    exit code 1, while a closed pipe is a normal way for a pipeline to end."""


@contextlib.contextmanager
def _pipe_guard() -> Iterator[None]:
    try:
        yield
    except BrokenPipeError:
        raise OutputClosed() from None


class TextSink:
    """Streams generated text to stdout; dims tokens that came from a draft on a terminal only."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stdout
        self.console = Console(file=self.stream, highlight=False) if self.stream.isatty() else None
        self.line_open = False  # text written since the last end()

    def write(self, text: str, from_draft: bool = False) -> None:
        if not text:
            return
        self.line_open = True
        with _pipe_guard():
            if self.console is not None:
                self.console.print(text, end="", style="dim" if from_draft else None, markup=False,
                                   soft_wrap=True)
            else:
                self.stream.write(text)
                self.stream.flush()

    def end(self) -> None:
        self.write("\n")
        self.line_open = False

    def close_line(self) -> None:
        """End the line of text in progress, if any (before an error message on stderr)."""
        if self.line_open:
            self.end()


def write_json_record(record: dict[str, Any], stream=None) -> None:
    stream = stream or sys.stdout
    with _pipe_guard():
        stream.write(json.dumps(record, ensure_ascii=False) + "\n")
        stream.flush()


def stats_line(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
