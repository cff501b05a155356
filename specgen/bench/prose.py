"""Prose that quotes measured figures: each figure bound to the value it quotes, by name.

A page binds the figures of a passage in the marker that opens it: the files (relative to the
page, each with a short name where there are several), then one line per figure of the passage,
in the order the passage quotes them: the figure as the prose writes it, and the key path (or a
small expression over key paths, see keys.py) whose value it is; a range or a fraction gives one
path per number, joined by ` | `:

    <!-- figures: g=results/2026-11-27-json-greedy.json t=results/2026-11-27-json-t07.json
    1.47x        g:summary[method=auto,group=overall].speedup
    1.36x        t:summary[method=auto,group=overall].speedup
    78%          100 * g:summary[method=auto,group=overall].acceptance_rate
    1.37-1.59x   g:summary[method=auto,group=overall].speedup_low | g:summary[method=auto,group=overall].speedup_high
    -->
    ...the passage, quoting 1.47x, 1.36x, 78% and 1.37-1.59x...
    <!-- figures:end -->

`specgen bench-report --check PAGE` reads each named value, writes it the way the prose writes
the figure (its decimals, thousands separators, sign, unit; numbers.format_like) and compares the
two as text; it fails where they differ, where the passage's figures are not the lines' figures
in order, and where a figure anywhere on the page outside such a passage is neither exempt (see
numbers.py: code, dates, names, rendered tables...) nor under a heading that says History.
A passage whose marker binds nothing (pages not converted yet) gets the older, weaker check: each
of its figures must be one its files give, whichever value that is.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from specgen.bench import keys, numbers, published
from specgen.bench.published import unfenced
from specgen.errors import ConfigError

_BLOCK = re.compile(r"^<!-- figures:(?P<head>[^\n]*?)(?P<closed>-->)?\n(?(closed)|(?P<binds>.*?)^-->\n)"
                    r"(?P<body>.*?)^<!-- figures:end -->", re.S | re.M)
_BIND = re.compile(r"^[ \t]*(?P<figure>\S+)[ \t]+(?P<exprs>\S.*?)[ \t]*$")


@dataclass(frozen=True)
class Binding:
    figure: str        # as the binding line writes it
    exprs: tuple[str, ...]
    line: int          # the binding line's number on the page (from 1)
    at: int            # the figure's offset in the page's text


@dataclass(frozen=True)
class Quote:
    figure: str        # as the prose writes it
    line: int
    at: int


@lru_cache(maxsize=256)
def _read(path: str, mtime: float):
    return keys.read(Path(path))


def _data(path: Path):
    try:
        return _read(str(path.resolve()), path.stat().st_mtime)
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None


def _line(text: str, at: int) -> int:
    return text.count("\n", 0, at) + 1


def figures(text: str) -> list[str]:
    """The figures a text quotes, in order, less the exempt ones (numbers.mask)."""
    return [m.group(0) for m in numbers.find(numbers.mask(text))]


def passages(page: Path, text: str) -> list[tuple[dict[str, Path], list[Binding], list[Quote], tuple[int, int]]]:
    """Each figures passage of a page: its files by name, its bindings, the figures its prose
    quotes (exempt ones left out), and its body's span."""
    plain = unfenced(text)  # markers shown as examples in code are not read
    masked = numbers.mask(text)
    if re.search(r"^<!-- figures:(?!end)", plain, re.M) and \
            len(re.findall(r"^<!-- figures:(?!end)", plain, re.M)) != len(_BLOCK.findall(plain)):
        raise ConfigError(f"{page}: a figures marker without its end (<!-- figures:end -->) or its closing -->")
    found = []
    for m in _BLOCK.finditer(plain):
        files, unnamed = {}, 0
        for word in m.group("head").split():
            name, _, path = word.rpartition("=")
            unnamed += not name
            files[name or f"#{len(files)}"] = Path(page).parent / path
        if not files:
            raise ConfigError(f"{page}:{_line(text, m.start())}: a figures marker names no file")
        if len(files) == 1 and unnamed:
            files = {"": next(iter(files.values()))}  # one file: its paths need no name
        elif unnamed and m.group("binds"):
            raise ConfigError(f"{page}:{_line(text, m.start())}: a marker naming several files names each "
                              "(name=path), for its paths to say which they read")
        binds = []
        if m.group("binds"):
            start = m.start("binds")
            for i, raw in enumerate(m.group("binds").split("\n")):
                at = start + sum(len(x) + 1 for x in m.group("binds").split("\n")[:i])
                b = _BIND.match(raw)
                if raw.strip() and not raw.strip().startswith("#"):
                    if not b:
                        raise ConfigError(f"{page}:{_line(text, at)}: a binding reads FIGURE PATH, found {raw.strip()!r}")
                    binds.append(Binding(b.group("figure"), tuple(e.strip() for e in b.group("exprs").split(" | ")),
                                         _line(text, at), at + b.start("figure")))
        quotes = [Quote(q.group(0), _line(text, m.start("body") + q.start()), m.start("body") + q.start())
                  for q in numbers.find(masked[m.start("body"):m.end("body")])]
        found.append((files, binds, quotes, (m.start("body"), m.end("body"))))
    return found


def problems(page: Path, text: str | None = None) -> list[str]:
    """'PAGE:LINE: what is wrong' for each figure of the page that does not check (see the module's
    note); `text`: the page's text, if not the file's."""
    if text is None:
        try:
            text = Path(page).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"cannot read {page}: {e.strerror or e}") from None
    out, spans = [], []
    for files, binds, quotes, span in passages(page, text):
        spans.append(span)
        if not binds:  # a passage not bound yet: each figure must at least be one its files give
            out += _loose(page, files, quotes)
            continue
        data = {name: _data(path) for name, path in files.items()}
        for i in range(max(len(binds), len(quotes))):
            q, b = quotes[i] if i < len(quotes) else None, binds[i] if i < len(binds) else None
            if q is None or b is None or q.figure != b.figure:
                where = q.line if q else b.line
                out.append(f"{page}:{where}: the passage's figure {i + 1} is {q.figure if q else 'missing'}, its "
                           f"binding's {b.figure + f' (line {b.line})' if b else 'missing'}: bind each figure, in order")
                break
        for b in binds:
            try:
                values = [keys.evaluate(e, data) for e in b.exprs]
                shown = numbers.format_like(b.figure, values)
            except (ConfigError, ValueError) as e:
                out.append(f"{page}:{b.line}: {b.figure}: {e}")
                continue
            if shown != b.figure:
                out.append(f"{page}:{b.line}: the prose quotes {b.figure}, its files give {shown} "
                           f"({' | '.join(b.exprs)})")
    masked = numbers.mask(text)
    for m in numbers.find(masked):
        if not any(s <= m.start() < e for s, e in spans):
            out.append(f"{page}:{_line(text, m.start())}: {m.group(0)} is bound to no file: bind it in a figures "
                       "passage, or move it under a History heading")
    return out


def _loose(page: Path, files: dict[str, Path], quotes: list[Quote]) -> list[str]:
    """The check an unbound passage gets (the one every passage had before bindings): each figure
    must appear in what its files give, rendered for a bench results file, as written otherwise.
    Weaker than a binding (any cell of the right value passes), and said so in its message."""
    given, together = [], []
    for path in files.values():
        raw = path.read_text(encoding="utf-8") if path.is_file() else ""
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        results = data is not None and published.is_results(data)
        given.append(published.render_files([path], Path(page).parent) if results else raw)
        together += [path] if results else []
    if len(together) > 1:  # several runs rendered as one block add what they say together (their spread)
        given.append(published.render_files(together, Path(page).parent))
    known = set(_LOOSE.findall("\n".join(given)))  # unmasked: the files' tables are the values
    return [f"{page}:{q.line}: {q.figure} is in no value its files give (a passage not yet bound to keys: "
            "checked by value alone)" for q in quotes if _LOOSE.fullmatch(q.figure) and q.figure not in known]


# What the value-alone check reads (as before bindings): decimals and their ranges, percentages, counts.
_LOOSE = re.compile(r"(?<![\w.-])(\d+\.\d+-\d+\.\d+x?|\d+\.\d+x?|\d+%|\d+/\d+)(?![\w.]*\d)")


def checked(page: Path, text: str | None = None) -> list[tuple[Quote, Binding]]:
    """Each figure the check reads and the binding it is compared by (for tests that alter them)."""
    text = Path(page).read_text(encoding="utf-8") if text is None else text
    return [pair for _, binds, quotes, _ in passages(page, text) for pair in zip(quotes, binds)]
