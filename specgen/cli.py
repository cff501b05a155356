"""specgen command line: turns options into a RunConfig and renders events; no algorithm code here."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from .errors import SpecgenError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Lossless speculative decoding for GGUF models on your own machine.")
models_app = typer.Typer(no_args_is_help=True, help="List, pull and locate the models in models.txt.")
app.add_typer(models_app, name="models")

EXIT_INTERRUPTED = 130


@app.command()
def generate(
    prompt: Optional[str] = typer.Argument(None, help='Prompt text; "-" (or none, with stdin piped) reads stdin.'),
    prompts: Optional[Path] = typer.Option(None, "-f", "--prompts", help="Many prompts: .txt (one per line) or .jsonl."),
    target: Optional[str] = typer.Option(None, "-m", "--target", help="Target model: GGUF path or models.txt name."),
    draft: Optional[str] = typer.Option(None, "-d", "--draft", help="Draft model (path or name), or 'none'."),
    method: Optional[str] = typer.Option(None, "--method", help="auto|plain|chain|tree|staged|lookup"),
    max_tokens: Optional[int] = typer.Option(None, "-n", "--max-tokens", help="Tokens to generate [256]."),
    temperature: Optional[float] = typer.Option(None, "-t", "--temperature", help="0 = greedy [0]."),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="Sample from the k most likely tokens (0 = off)."),
    top_p: Optional[float] = typer.Option(None, "--top-p", help="Nucleus sampling mass in (0, 1]."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed: same seed, same output."),
    chat: Optional[bool] = typer.Option(None, "--chat/--no-chat", help="Apply the model's chat template "
                                        "[on when the model has one]."),
    config: Optional[Path] = typer.Option(None, "-c", "--config", help="YAML presets (see configs/)."),
    json_out: bool = typer.Option(False, "--json", help="JSON Lines on stdout, one record per prompt."),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads [all cores]."),
    ctx: Optional[int] = typer.Option(None, "--ctx", help="Context size in tokens [4096]."),
    gpu_layers: Optional[int] = typer.Option(None, "--gpu-layers", help="Target layers to offload to the GPU."),
    draft_gpu_layers: Optional[int] = typer.Option(None, "--draft-gpu-layers", help="Draft layers to offload."),
) -> None:
    """Generate text for one prompt or many, streaming tokens to stdout and stats to stderr.

    \b
    Examples:
      specgen generate "Write a haiku about rain"
      echo "Summarize: ..." | specgen generate -n 64 --json
      specgen generate -m target.gguf -d draft.gguf -f prompts.txt
    """
    from .config import build_config
    from .engine import TokenEvent
    from .prompts import collect_prompts
    from .render import TextSink, stats_line, write_json_record
    from .runner import PromptResult, Runner, load_models
    from .stats import RunStats

    cfg = build_config(config, dict(
        target=target, draft=draft, method=method, max_tokens=max_tokens, temperature=temperature,
        top_k=top_k, top_p=top_p, seed=seed, chat=chat, threads=threads, ctx=ctx, gpu_layers=gpu_layers,
        draft_gpu_layers=draft_gpu_layers))
    items = collect_prompts(prompt, prompts, sys.stdin)
    runner = Runner(cfg, load_models(cfg))
    sink = TextSink()
    for item in items:
        stats, pieces, reason = RunStats(), [], "interrupted"
        try:
            for event in runner.stream(item, stats):
                if isinstance(event, TokenEvent):
                    pieces.append(event.text)
                    if not json_out:
                        sink.write(event.text, event.from_draft)
                else:
                    reason = event.reason
                    pieces.append(event.tail)
                    if not json_out:
                        sink.write(event.tail)
        except KeyboardInterrupt:
            pass  # keep what was generated: it is written below, then we exit 130
        result = PromptResult(item.index, "".join(pieces), stats, reason)
        if json_out:
            write_json_record(runner.record(result))
        else:
            sink.end()
        stats_line(stats.line())
        if reason == "interrupted":
            raise typer.Exit(EXIT_INTERRUPTED)


@app.command()
def calibrate(
    model: str = typer.Argument(..., help="GGUF path or models.txt name."),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads [all cores]."),
    ctx: int = typer.Option(4096, "--ctx", help="Context size the curve is for."),
    gpu_layers: int = typer.Option(0, "--gpu-layers", help="Layers to offload to the GPU."),
    refresh: bool = typer.Option(False, "--refresh", help="Measure again instead of using the cache."),
) -> None:
    """Measure (or show the cached) cost of one decode of B tokens, the curve `auto` plans with.

    \b
    Example:
      specgen calibrate gemma-3-270m-f32
    """
    from rich.console import Console
    from rich.table import Table

    from . import backend, models
    from .runner import TARGET_SEQS, cost_curve

    if threads is not None and threads < 1:
        raise SpecgenError(f"--threads must be at least 1, found {threads}")
    llm = backend.LlamaModel(models.resolve(model), gpu_layers=gpu_layers)
    context = llm.new_context(min(ctx, llm.n_ctx_train or ctx), n_seq_max=TARGET_SEQS, n_threads=threads)
    curve = cost_curve(llm, context, threads, refresh=refresh)
    table = Table(title=f"{Path(llm.path).name}: one decode of B tokens ({curve.source})", box=None)
    for col in ("B", "ms", "x B=1", "ms per token"):
        table.add_column(col, justify="right")
    for b, sec, rel in zip(curve.sizes, curve.seconds, curve.relative()):
        table.add_row(str(b), f"{sec * 1000:.1f}", f"{rel:.2f}", f"{sec * 1000 / b:.2f}")
    Console(soft_wrap=True).print(table)


@models_app.command("list")
def models_list() -> None:
    """Models in models.txt: name, source, size, and whether the file is present."""
    from rich.console import Console
    from rich.table import Table

    from . import models

    table = Table(box=None, pad_edge=False)
    for col in ("name", "source", "size", "present"):
        table.add_column(col, no_wrap=True)
    for entry in models.load_manifest().values():
        source = {"pypi": "PyPI", "path": "local file"}.get(entry.kind, "URL (needs internet)" if entry.internet else "URL")
        if entry.kind == "derive":
            source = "{1} of {0}".format(*entry.derive_from())
        present = models.is_present(entry)
        size = models.cached_path(entry).stat().st_size if present else entry.size
        table.add_row(entry.name, source, models.human_size(size), "yes" if present else "no")
    Console(soft_wrap=True).print(table)


@models_app.command("pull")
def models_pull(names: List[str] = typer.Argument(..., help="Names from models.txt.")) -> None:
    """Download (or derive) models into the cache, checking their sha256."""
    from . import models

    manifest = models.load_manifest()
    for name in names:
        if name not in manifest:
            raise SpecgenError(f"unknown model {name!r}: expected a name from models.txt "
                               f"({', '.join(sorted(manifest))})")
    for name in names:
        entry = manifest[name]
        if models.is_present(entry):
            print(f"{name}: present at {models.cached_path(entry)}", file=sys.stderr)
            continue
        path = models.pull(entry, manifest)
        print(f"{name}: pulled to {path}", file=sys.stderr)


@models_app.command("path")
def models_path(name: str = typer.Argument(..., help="A name from models.txt.")) -> None:
    """Print the local path of a model, pulling it first if it is missing."""
    from . import models

    print(models.resolve(name))


def main() -> None:
    """Entry point: SpecgenErrors become one line on stderr and a non-zero exit, never a traceback."""
    try:
        app()
    except SpecgenError as e:
        if os.environ.get("SPECGEN_DEBUG"):
            raise
        print(f"specgen: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except BrokenPipeError:
        # The reader went away (e.g. `| head -1`): stop quietly, and keep Python from complaining
        # again while flushing stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
