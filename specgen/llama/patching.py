"""specgen's changes to llama.cpp as unified diffs (patches/*.patch), applied strictly (stdlib only).

Each patch is one llama.cpp file's change, as `diff -u` writes it against the llama.cpp that the pinned
llama-cpp-python vendors, with a paragraph before it saying what it does; `patch -p1` reads the same
files. Here a hunk applies where its old lines (context and removed) occur exactly once in the file,
wherever that is, so that llama.cpp moving code around is fine and changing it is not: a hunk whose
lines are missing or ambiguous stops the build with the patch, the hunk, the llama.cpp file and the
versions named, before anything is compiled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PATCHES = Path(__file__).resolve().parent / "patches"


class PatchError(Exception):
    """A patch that does not apply to this llama.cpp; the message names what and where."""


@dataclass(frozen=True)
class Hunk:
    header: str  # "@@ -4635,12 +4639,13 @@"
    old: tuple[str, ...]
    new: tuple[str, ...]


@dataclass(frozen=True)
class FilePatch:
    path: Path    # the .patch file
    target: str   # the file it changes, relative to llama.cpp's root
    hunks: tuple[Hunk, ...]


HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@")


def read_patch(path: Path) -> FilePatch:
    """One file's unified diff (text before its `---` line is its description)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    start = next((i for i, line in enumerate(lines) if line.startswith("--- ")), None)
    if start is None or start + 1 >= len(lines) or not lines[start + 1].startswith("+++ "):
        raise PatchError(f"{path.name}: not a unified diff (no ---/+++ lines)")
    target = lines[start + 1][4:].split("\t")[0].strip()
    target = target[2:] if target.startswith("b/") else target
    hunks: list[Hunk] = []
    header, old, new = "", [], []
    for line in lines[start + 2:]:
        if HUNK.match(line):
            if header:
                hunks.append(Hunk(header, tuple(old), tuple(new)))
            header, old, new = HUNK.match(line).group(0), [], []
        elif not header or line.startswith("\\"):  # "\ No newline at end of file"
            continue
        elif line.startswith(" ") or line == "":
            old.append(line[1:])
            new.append(line[1:])
        elif line.startswith("-"):
            old.append(line[1:])
        elif line.startswith("+"):
            new.append(line[1:])
        else:
            raise PatchError(f"{path.name}: unexpected line in hunk {header}: {line!r}")
    if header:
        hunks.append(Hunk(header, tuple(old), tuple(new)))
    # a diff's last line ends with a newline: the split leaves one empty string, not a context line
    if hunks and hunks[-1].old and hunks[-1].old[-1] == "" and lines[-1] == "":
        last = hunks[-1]
        hunks[-1] = Hunk(last.header, last.old[:-1], last.new[:-1])
    if not hunks:
        raise PatchError(f"{path.name}: no hunks")
    return FilePatch(path, target, tuple(hunks))


def patches() -> list[FilePatch]:
    return [read_patch(path) for path in sorted(PATCHES.glob("*.patch"))]


def _where(lines: list[str], block: tuple[str, ...]) -> list[int]:
    n = len(block)
    return [i for i in range(len(lines) - n + 1) if lines[i] == block[0] and tuple(lines[i:i + n]) == block]


def apply(patch: FilePatch, root: Path, versions: str) -> None:
    """Apply `patch` to its file under `root` (llama.cpp's root); `versions` says which llama.cpp this
    is, for the message when a hunk does not apply."""
    path = root / patch.target
    if not path.is_file():
        raise PatchError(f"{patch.path.name}: {patch.target} is not in {versions}")
    lines = path.read_text(encoding="utf-8").split("\n")
    for number, hunk in enumerate(patch.hunks, 1):
        found = _where(lines, hunk.old)
        if len(found) != 1:
            missing = next((line for line in hunk.old if line.strip() and line not in lines), None)
            why = (f"its line {missing.strip()!r} is not there" if missing is not None else
                   "its lines are there, but not together" if not found else
                   f"its lines occur {len(found)} times")
            raise PatchError(f"{patch.path.name}, hunk {number} of {len(patch.hunks)} ({hunk.header}): expected "
                             f"its {len(hunk.old)} lines once in {patch.target} of {versions}, found them "
                             f"{len(found)} times ({why}); a changed llama.cpp: update the patch")
        at = found[0]
        lines[at:at + len(hunk.old)] = hunk.new
    path.write_text("\n".join(lines), encoding="utf-8")
