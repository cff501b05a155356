"""The command line: Typer commands only. Each turns options into a RunConfig (app/) and renders
what comes back (render.py); the commands are registered here, grouped one module per group."""

from __future__ import annotations

import os
import sys

from specgen import reporter
from specgen.cli import bench, chat, generate, manage, serve, upkeep
from specgen.cli.options import EXIT_INTERRUPTED, EXIT_WRITE_FAILED, Command, new_typer
from specgen.cli.render import OutputClosed, TerminalReporter
from specgen.errors import SpecgenError

app = new_typer(add_completion=False, pretty_exceptions_enable=False,
                help="Lossless speculative decoding for GGUF models on your own machine.")
models_app = new_typer(help="List, pull, verify and locate the models in models.txt.")
app.add_typer(models_app, name="models")
draft_app = new_typer(help="Derive cheap draft models from a target.")
app.add_typer(draft_app, name="draft")
cache_app = new_typer(help="What specgen keeps between runs besides models.")
app.add_typer(cache_app, name="cache")


@app.callback()
def _show_reports() -> None:
    """Lower layers report progress and warnings; on the command line they go to stderr."""
    reporter.use(TerminalReporter())


for group, name, command in (
        (app, None, generate.generate), (app, None, bench.bench), (app, "bench-report", bench.bench_report),
        (app, None, generate.demo), (app, None, chat.chat),
        (app, None, serve.serve),
        (app, "rpc-server", upkeep.rpc_server), (app, None, upkeep.calibrate), (app, None, upkeep.doctor),
        (cache_app, "clear", upkeep.cache_clear), (draft_app, "derive", manage.draft_derive),
        (models_app, "list", manage.models_list), (models_app, "pull", manage.models_pull),
        (models_app, "path", manage.models_path), (models_app, "verify", manage.models_verify)):
    group.command(name, cls=Command)(command)


def main() -> None:
    """Entry point: SpecgenErrors become one line on stderr and a non-zero exit, never a traceback; a
    run that went on past a failed write exits EXIT_WRITE_FAILED."""
    try:
        app()
    except SystemExit as e:
        if e.code in (0, None) and reporter.failed_writes():
            sys.exit(EXIT_WRITE_FAILED)  # each failed write was named as it happened
        raise
    except SpecgenError as e:
        if os.environ.get("SPECGEN_DEBUG"):
            raise
        print(f"specgen: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        # Ctrl-C outside generation (loading, pulling, building): no traceback, the usual status.
        print("specgen: interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except (BrokenPipeError, OutputClosed):
        # The reader went away (e.g. `| head -1`): stop quietly, and keep Python from complaining
        # again while flushing stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
