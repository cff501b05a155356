"""Prose that repeats published figures: each figure it quotes must be one its results files render.

A page marks such prose between two markers naming the files (relative to the page), as for tables:

    <!-- figures: results/2026-11-27-json-greedy.json -->
    ...sentences quoting 1.47x, 8/8, 78%...
    <!-- figures:end -->

`specgen bench-report --check PAGE` fails where a figure there (a ratio like 1.47x, a share like 78%,
a count like 8/8, a decimal like 2.13, a range like 1.37-1.59x) is not in the text published.render() makes of the files, so a
sentence cannot go on quoting a run that was re-rendered, or one that no file holds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from specgen.bench import published
from specgen.errors import ConfigError

_BLOCK = re.compile(r"^<!-- figures: (?P<files>[^>]*?) -->\n(?P<body>.*?)<!-- figures:end -->", re.S | re.M)
# Decimals (and ranges of them) with an optional unit, percentages and counts; dates (2026-11-27) and plain integers are words.
_FIGURE = re.compile(r"(?<![\w.-])(\d+\.\d+-\d+\.\d+x?|\d+\.\d+x?|\d+%|\d+/\d+)(?![\w.]*\d)")


def figures(text: str) -> list[str]:
    """The figures a text quotes, in order."""
    return _FIGURE.findall(text)


def source_text(path: Path, base: Path) -> str:
    """The text a figure may be quoted from: a bench --json file as published.render() renders it
    (linked from the folder `base`), any other file as it stands."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        data = json.loads(text)
    except ValueError:
        return text
    return published.render_files([path], base) if published.is_results(data) else text


def unbacked(page: Path) -> list[str]:
    """'FIGURE (files)' for each figure in a figures block of `page` that its files do not render."""
    text = published.unfenced(Path(page).read_text(encoding="utf-8"))  # markers shown as examples are not read
    if re.search("^<!-- figures:", text, re.M) and not _BLOCK.search(text):
        raise ConfigError(f"{page}: a figures block without its end marker (<!-- figures:end -->)")
    out = []
    for m in _BLOCK.finditer(text):
        files = [Path(page).parent / f for f in m.group("files").split()]
        if not files:
            raise ConfigError(f"{page}: a figures marker names no results file")
        texts = [source_text(f, Path(page).parent) for f in files]
        together = [f for f in files if f.suffix == ".json" and published.is_results(json.loads(f.read_text()))]
        if len(together) > 1:  # several runs rendered as one block add what they say together (their spread)
            texts.append(published.render_files(together, Path(page).parent))
        rendered = set(figures("\n".join(texts)))
        out += [f"{f} ({m.group('files')})" for f in figures(m.group("body")) if f not in rendered]
    return out
