"""The commands that manage models: models list / pull / path / verify, draft derive."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from specgen.models import integrity, resolve as models
from specgen.models.manifest import ModelEntry, derived_drafts, drafts_dir, human_size, load_manifest, manifest_path
from specgen.errors import ConfigError, ModelError


def draft_derive(
    target: str = typer.Argument(..., metavar="TARGET", help="Target model: GGUF path or models.txt name."),
    qtype: Optional[str] = typer.Option(None, "--type", metavar="TYPE", help="Quantization type of the draft "
                                        "(default: chosen by measurement among Q2_K and Q4_K_M)."),
    vocab: Optional[int] = typer.Option(None, "--vocab", metavar="K", help="Normal tokens kept, the ones the model "
                                        "uses most, and the next few where they fill the output matrix's last "
                                        "16-row group (default: chosen by measurement)."),
    head: Optional[str] = typer.Option(None, "--head", metavar="TYPE", help="Type of the embedding/output matrix: "
                                       "Q4_0, Q4_1, Q5_0, Q8_0 or F16 (default: chosen by measurement)."),
    corpus: List[Path] = typer.Option([], "--corpus", metavar="FILE",
                                      help="Text files whose tokens count too (repeatable)."),
) -> None:
    """Derive a draft of TARGET with a frequency-ranked vocabulary (FR-Spec) and print its path.

    The target is quantized and made to write after a built-in multilingual prompt set;
    the vocabulary is cut to the tokens it used most (plus every control, user-defined and
    byte token), so its output layer, most of a small model's cost, shrinks with it.
    Unless given, the quantization type, the vocabulary size and the output matrix's type are
    chosen by measuring each candidate's cost and its agreement with the target on held-out prompts.
    `-d self` uses the default derivation; derived drafts are cached.

    \b
    Example:
      specgen draft derive gemma-3-270m-f32
      specgen generate -m gemma-3-270m-f32 -d self "..."
    """
    from specgen.llama.tools import HEAD_TYPES  # loads llama.cpp: not at start-up

    if vocab is not None and vocab < 1:
        raise ConfigError(f"--vocab must be at least 1, found {vocab}")
    if head is not None and head.upper() not in HEAD_TYPES:
        raise ConfigError(f"--head must be one of {', '.join(HEAD_TYPES)}, found {head!r}")
    print(models.self_draft(target, qtype, vocab, head.upper() if head else None, corpus))


def models_list() -> None:
    """Models in models.txt (name, source, size, whether the file is present), then the drafts
    `specgen draft derive` made (use them by path, or with -d self)."""
    table = Table(box=None, pad_edge=False)
    for col in ("name", "source", "size", "present"):
        table.add_column(col, no_wrap=True)
    for entry in load_manifest().values():
        source = {"pypi": "PyPI", "path": "local file"}.get(entry.kind, "URL (needs internet)" if entry.internet else "URL")
        if entry.kind == "derive":
            source = "{1} of {0}".format(*entry.derive_from())
        elif entry.kind == "self":
            source = f"self-draft of {entry.self_of}" + "".join(f" {k}={v}" for k, v in entry.options.items())
        elif entry.kind == "template":
            t = entry.template_from()
            source = f"{t.template} template on {t.base}"
        present = entry.present
        size = entry.path.stat().st_size if present else entry.size
        table.add_row(entry.name, source, human_size(size), "yes" if present else "no")
    # Piped, a row is never cut to the terminal's width: scripts read the names whole.
    console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 240)
    console.print(table)
    drafts = derived_drafts()
    if drafts:
        console.print(f"\nDerived drafts ({drafts_dir()}; use one with -d PATH):")
        for path in drafts:
            console.print(f"  {path.name}  {human_size(path.stat().st_size)}", highlight=False)


def named_entries(names: List[str]) -> list[ModelEntry]:
    """models.txt's entries for `names`, every name checked before any work starts."""
    manifest = load_manifest()
    unknown = [name for name in names if name not in manifest]
    if unknown:
        raise ModelError(f"unknown model {unknown[0]!r}: expected a name from {manifest_path().name} "
                         f"({', '.join(sorted(manifest))})")
    return [manifest[name] for name in names]


def models_pull(
    names: List[str] = typer.Argument(..., metavar="NAME...", help="Names from models.txt."),
    force: bool = typer.Option(False, "--force", help="Fetch (or derive) again even when present; the file "
                               "in the cache is replaced only by one that passes its sha256 check."),
) -> None:
    """Download (or derive) models into the cache, checking their sha256."""
    manifest = load_manifest()
    for entry in named_entries(names):
        if entry.present and not force:
            found = integrity.check(entry)
            if found.status == integrity.MISMATCH:
                raise ModelError(integrity.mismatch_message(entry, found))
            print(f"{entry.name}: present at {entry.path}", file=sys.stderr)
            continue
        path = models.pull(entry, manifest)
        print(f"{entry.name}: pulled to {path}", file=sys.stderr)


def verify_line(entry: ModelEntry, found: integrity.Finding) -> str:
    if found.status == integrity.MISMATCH:
        return (f"{entry.name}: MISMATCH ({found.what} expected {integrity.short(found.expected)}, "
                f"found {integrity.short(found.found)})")
    return f"{entry.name}: " + {integrity.UNCHECKED: "no sha256 to check against"}.get(found.status, found.status)


def models_verify(names: List[str] = typer.Argument(None, metavar="NAME", show_default=False,
                                                    help="Names from models.txt [every model present].")) -> None:
    """Hash cached models again and check them against models.txt; exits 1 on a mismatch.

    A name without a sha256 in models.txt is checked against the one its first pull recorded.

    \b
    Example:
      specgen models verify smollm2-135m-instruct-q4_1
    """
    entries = named_entries(names) if names else [e for e in load_manifest().values() if e.present]
    bad = []
    for entry in entries:
        found = integrity.check(entry, rehash=True)
        print(verify_line(entry, found), flush=True)
        if found.status == integrity.MISMATCH:
            bad.append(entry.name)
    if bad:
        print(f"specgen: {len(bad)} of {len(entries)} models do not match {manifest_path().name}: "
              f"`specgen models pull --force {' '.join(bad)}` fetches them again", file=sys.stderr)
        raise typer.Exit(1)


def models_path(name: str = typer.Argument(..., metavar="NAME", help="A name from models.txt.")) -> None:
    """Print the local path of a model, pulling it first if it is missing."""
    print(models.resolve(name))
