"""specgen command line: turns options into a RunConfig and renders events; no algorithm code here."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from .errors import ConfigError, SpecgenError
from .methods import METHODS
from .render import OutputClosed

def _conventional_help(params) -> None:
    """Help as Click and Typer apps have long shown it: a flag takes no value, so nothing stands
    beside it (Typer 0.29 writes `<bool>` there, and `<str>` beside arguments a metavar already
    names), and a help text's brackets are text ("[the cores ...]"), not Rich markup to swallow.
    Valued options name what they take with a metavar (N, MODEL, FILE) where they are declared."""
    from rich.markup import escape

    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
        if isinstance(param, typer.core.TyperArgument) and param.metavar:
            param.display_type_rich = lambda ctx: None
        if param.help:
            param.help = escape(param.help)


class _HelpFlag:
    """`--help` is a flag like any other: no `<bool>` beside it."""

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option


class _Command(_HelpFlag, typer.core.TyperCommand):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _conventional_help(self.params)


class _Group(_HelpFlag, typer.core.TyperGroup):
    pass


def _typer(**kwargs) -> typer.Typer:
    return typer.Typer(cls=_Group, no_args_is_help=True, **kwargs)


app = _typer(add_completion=False, pretty_exceptions_enable=False,
             help="Lossless speculative decoding for GGUF models on your own machine.")
models_app = _typer(help="List, pull and locate the models in models.txt.")
app.add_typer(models_app, name="models")
draft_app = _typer(help="Derive cheap draft models from a target.")
app.add_typer(draft_app, name="draft")
cache_app = _typer(help="What specgen keeps between runs besides models.")
app.add_typer(cache_app, name="cache")

EXIT_INTERRUPTED = 130
EXIT_SOME_FAILED = 1  # a many-prompt run finished, but some prompts failed

# Options more than one command takes, defined once so that a flag means the same everywhere
# (tests/test_cli_options.py checks the commands against each other). None: not given, so the
# -c file or configs/default.yaml decides (config.merged_settings).
Target = Annotated[Optional[str], typer.Option("-m", "--target", metavar="MODEL",
                                               help="Target model: GGUF path or models.txt name.")]
Draft = Annotated[Optional[str], typer.Option("-d", "--draft", metavar="MODEL", help="Draft model (path or "
                                              "name), 'self' (derived from the target: see `specgen draft derive`) "
                                              "or 'none'.")]
MaxTokens = Annotated[Optional[int], typer.Option("-n", "--max-tokens", metavar="N",
                                                  help="Tokens to generate per answer [256].")]
Temperature = Annotated[Optional[float], typer.Option("-t", "--temperature", metavar="T", help="0 = greedy [0].")]
TopK = Annotated[Optional[int], typer.Option("--top-k", metavar="K",
                                             help="Sample from the k most likely tokens (0 = off) [0].")]
TopP = Annotated[Optional[float], typer.Option("--top-p", metavar="P", help="Nucleus sampling mass in (0, 1] [1].")]
Seed = Annotated[Optional[int], typer.Option("--seed", metavar="N", help="Seed for sampling: same seed, same output.")]
Chat = Annotated[Optional[bool], typer.Option("--chat/--no-chat", help="Apply the model's chat template "
                                              "[on when the model has one].")]
System = Annotated[Optional[str], typer.Option("--system", metavar="TEXT", help="System message (chat templates).")]
Config = Annotated[Optional[Path], typer.Option("-c", "--config", metavar="FILE", help="YAML presets (see configs/).")]
Threads = Annotated[Optional[int], typer.Option("--threads", metavar="N",
                                                help="CPU threads [the cores other processes leave free].")]
Ctx = Annotated[Optional[int], typer.Option("--ctx", metavar="N", help="Context size in tokens [4096].")]
GpuLayers = Annotated[Optional[int], typer.Option("--gpu-layers", metavar="N",
                                                  help="Target layers to offload to the GPU [0].")]
DraftGpuLayers = Annotated[Optional[int], typer.Option("--draft-gpu-layers", metavar="N",
                                                       help="Draft layers to offload [0].")]
Rpc = Annotated[Optional[str], typer.Option("--rpc", metavar="HOST:PORT,...", help="llama.cpp RPC servers "
                                            "HOST:PORT,... to offload --gpu-layers onto (see `specgen rpc-server`).")]
Corpus = Annotated[Optional[List[Path]], typer.Option("--corpus", metavar="FILE", help="A text file auto also drafts "
                                                      "from (documents or code being edited); repeat for more.")]
Store = Annotated[Optional[bool], typer.Option("--store/--no-store", help="Draft from, and add to, the store of past "
                                               "generations in the specgen cache (generate: on, bench: off).")]


@app.command(cls=_Command)
def generate(
    prompt: Optional[str] = typer.Argument(None, metavar="PROMPT",
                                           help='Prompt text; "-" (or none, with stdin piped) reads stdin.'),
    prompts: Optional[Path] = typer.Option(None, "-f", "--prompts", metavar="FILE",
                                           help="Many prompts: .txt (one per line) or .jsonl."),
    target: Target = None,
    draft: Draft = None,
    method: Optional[str] = typer.Option(None, "--method", metavar="NAME", help="Decoding method (default: auto). "
                                         + "; ".join(f"{m.name}: {m.summary}" for m in METHODS.values()) + "."),
    max_tokens: MaxTokens = None,
    temperature: Temperature = None,
    top_k: TopK = None,
    top_p: TopP = None,
    seed: Seed = None,
    chat: Chat = None,
    system: System = None,
    config: Config = None,
    fail_fast: bool = typer.Option(False, "--fail-fast", help="Stop at the first prompt that fails "
                                   "(default: report it and go on)."),
    json_out: bool = typer.Option(False, "--json", help="JSON Lines on stdout, one record per prompt."),
    threads: Threads = None,
    ctx: Ctx = None,
    gpu_layers: GpuLayers = None,
    draft_gpu_layers: DraftGpuLayers = None,
    rpc: Rpc = None,
    corpus: Corpus = None,
    store: Store = None,
) -> None:
    """Generate text for one prompt or many, streaming tokens to stdout and stats to stderr.

    \b
    Examples:
      specgen generate "Write a haiku about rain"
      echo "Summarize: ..." | specgen generate -n 64 --json
      specgen generate -m target.gguf -d draft.gguf -f prompts.txt
    """
    from .config import build_config, own_target_without_draft, read_yaml
    from .prompts import collect_prompts
    from .render import TextSink, note, stats_line, write_json_record
    from .session import Interrupted, Runner, load_session

    cfg = build_config(config, dict(
        target=target, draft=draft, method=method, max_tokens=max_tokens, temperature=temperature,
        top_k=top_k, top_p=top_p, seed=seed, chat=chat, system=system, threads=threads, ctx=ctx,
        gpu_layers=gpu_layers, draft_gpu_layers=draft_gpu_layers, rpc=rpc, store=store,
        corpus=",".join(map(str, corpus)) if corpus else None))
    items = collect_prompts(prompt, prompts, sys.stdin)
    runner = Runner(cfg, load_session(cfg))
    given = {name: value for name, value in (("target", target), ("draft", draft)) if value is not None}
    if cfg.method == "auto" and own_target_without_draft(given, read_yaml(config) if config is not None else {}):
        # A target of one's own, and nothing said about a draft: auto can only draft from text.
        note("hint: no draft model, so auto drafts only from text (the prompt, earlier outputs). A draft model "
             "often makes it faster: `-d self` derives one from this target (once, then cached), or `-d "
             "SMALLER.gguf` names a smaller model of the same family (its vocabulary is checked against the "
             "target's). `-d none` silences this.")
    sink = TextSink()
    failed = 0
    for item in items:
        try:
            result = runner.run(item, on_text=None if json_out else sink.write)
        except Interrupted as stop:
            result = stop.partial  # keep what was generated: it is written below, then we exit 130
        except SpecgenError as e:
            if fail_fast or len(items) == 1:
                raise
            # One bad prompt in a long file: say which, keep going; the exit code reports it.
            failed += 1
            sink.close_line()
            print(f"specgen: error: prompt {item.index + 1}: {e}", file=sys.stderr, flush=True)
            if json_out:
                write_json_record({"prompt_index": item.index, "error": str(e), "finish_reason": "error"})
            continue
        if json_out:
            write_json_record(runner.record(result))
        else:
            sink.end()
        stats_line(result.stats.line())
        if result.finish_reason == "interrupted":
            raise typer.Exit(EXIT_INTERRUPTED)
    if failed:
        print(f"specgen: {failed} of {len(items)} prompts failed", file=sys.stderr)
        raise typer.Exit(EXIT_SOME_FAILED)


@app.command(cls=_Command)
def bench(
    target: Target = None,
    draft: Draft = None,
    suite: Optional[str] = typer.Option(None, "--suite", metavar="NAME|FILE", help="builtin | humaneval | a Spec-Bench "
                                        "question.jsonl path [builtin]."),
    methods: Optional[str] = typer.Option(None, "--methods", metavar="LIST", help="Comma-separated; plain always runs "
                                          "[every method that can run with the models given]."),
    limit: Optional[int] = typer.Option(None, "--limit", metavar="N", help="At most N prompts in all."),
    per_group: Optional[int] = typer.Option(None, "--per-group", metavar="N",
                                            help="N prompts per group, spread evenly."),
    max_tokens: MaxTokens = None,
    temperature: Temperature = None,
    top_k: TopK = None,
    top_p: TopP = None,
    seed: Seed = None,
    chat: Chat = None,
    system: System = None,
    config: Config = None,
    repeats: Optional[int] = typer.Option(None, "--repeats", metavar="R", help="Run the whole schedule R times [1]."),
    json_file: Optional[Path] = typer.Option(None, "--json", metavar="FILE", help="Write machine, models, settings, "
                                             "records and summary as one JSON object to this file."),
    plot: Optional[Path] = typer.Option(None, "--plot", metavar="FILE",
                                        help="Write a speedup chart (.svg, or .png with matplotlib)."),
    threads: Threads = None,
    ctx: Ctx = None,
    gpu_layers: GpuLayers = None,
    draft_gpu_layers: DraftGpuLayers = None,
    rpc: Rpc = None,
    corpus: Corpus = None,
    store: Store = None,
    llama_cpp: Optional[Path] = typer.Option(None, "--llama-cpp", metavar="DIR", help="A folder holding llama.cpp's "
                                             "llama-speculative-simple: run the same prompts through it too."),
    spec_type: Optional[List[str]] = typer.Option(None, "--spec-type", metavar="TYPE", help="With --llama-cpp: one "
                                                  "llama.cpp configuration per use, e.g. ngram-mod or "
                                                  "draft-simple,ngram-map-k [the n-gram types, and draft-simple with a "
                                                  "draft]."),
) -> None:
    """Run every method against plain decoding on the same prompts, interleaved, and compare.

    \b
    Examples:
      specgen bench -m smollm2-135m-instruct-q4_1 --methods lookup,auto -n 64
      specgen bench -c configs/bench-pair-a.yaml --suite question.jsonl --per-group 2 --json a.json --plot a.svg
      specgen bench -c configs/bench-pair-b.yaml --methods auto --llama-cpp ~/llama.cpp/build/bin --spec-type ngram-mod
    """
    import dataclasses
    import json

    from rich.console import Console

    from . import backend, bench as b, llamacpp, models
    from .benchview import check_plot_path, head_to_head_line, summary_table, write_plot
    from . import methods as M
    from .config import merged_settings, run_config
    from .host import cpu_sample, others_cores
    from .render import count_progress
    from .session import Runner, load_session

    values = merged_settings(config, dict(
        target=target, draft=draft, max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
        seed=seed, chat=chat, system=system, threads=threads, ctx=ctx, gpu_layers=gpu_layers,
        draft_gpu_layers=draft_gpu_layers, rpc=rpc, methods=methods, suite=suite, limit=limit, per_group=per_group,
        repeats=repeats,
        store=store, corpus=",".join(map(str, corpus)) if corpus else None))
    cfg = run_config(values)
    for key in ("limit", "per_group", "repeats"):
        if values.get(key) is not None and values[key] < 1:
            raise ConfigError(f"--{key.replace('_', '-')} must be at least 1, found {values[key]}")
    chosen = b.parse_methods(values.get("methods") or M.usable(cfg.draft is not None))
    if plot is not None:
        check_plot_path(plot)
    suite_name, pool = b.load_suite(values.get("suite") or "builtin")
    prompts = b.select(pool, values.get("per_group"), values.get("limit"))
    n_repeats = values.get("repeats") or 1

    binary = llamacpp.find_binary(llama_cpp) if llama_cpp is not None else None
    if spec_type and binary is None:
        raise ConfigError("--spec-type runs llama.cpp's speculative decoding: give --llama-cpp DIR too")
    session = load_session(cfg, chosen, store_default=False)  # past runs' texts would favour auto
    runners = {m: Runner(dataclasses.replace(cfg, method=m), session) for m in chosen}
    info = backend.build_info()
    n_threads = cfg.threads or backend.default_threads()
    external = {}
    if binary is not None:
        external = llamacpp.bench_runs(binary, spec_type, session, runners["plain"], n_threads)
    columns = [*chosen, *external]
    machine = b.machine_info(n_threads, info)
    header = (f"{machine['cpu']} · {n_threads} threads · {machine['backend']} · target {cfg.target}"
              f"{f' · draft {session.draft_label}' if session.draft_label else ''} · T={cfg.temperature:g}"
              f" · {cfg.max_tokens} tokens · suite {Path(suite_name).name}")

    calibration_at_start = {role: c.to_json() for role, c in (("target", session.costs), ("draft", session.draft_costs))
                            if c is not None}
    cpu_at_start = cpu_sample()
    trials: list = []
    interrupted = False
    with count_progress(len(prompts) * len(columns) * n_repeats, f"bench: {len(prompts)} prompts x "
                        f"{len(columns)} methods x {n_repeats}") as advance:
        try:
            b.run_bench(prompts, runners, n_repeats, on_trial=lambda t: (trials.append(t), advance()),
                        external=external)
        except KeyboardInterrupt:
            interrupted = True  # report what finished, then exit 130

    machine["others_cores"] = others_cores(cpu_at_start, cpu_sample())  # other processes' CPU use meanwhile
    machine["load_average_at_end"] = b.machine_info(n_threads, info)["load_average"]
    rows = b.summarize(trials, columns, greedy=cfg.sampling.greedy)
    console = Console()
    if not console.is_terminal:
        console = Console(width=30 + sum(max(14, len(c) + 4) for c in columns))  # piped: never truncated
    console.print(summary_table(rows, columns, header, n_repeats))
    versus = [b.head_to_head(trials, m, list(external)) for m in chosen if m != "plain"] if external else []
    for h in versus:
        console.print(head_to_head_line(h, list(external)), markup=False, highlight=False)
    if json_file is not None:
        model_info = {"target": models.describe(cfg.target, Path(session.target.source_path)),
                      "target_screened": session.target.path if session.target.screen else None,
                      "draft": models.describe(cfg.draft, Path(session.draft.path)) if session.draft else None}
        settings = {**dataclasses.asdict(cfg), "method": None, "methods": list(columns), "suite": suite_name,
                    "n_prompts": len(prompts), "repeats": n_repeats, "interrupted": interrupted}
        base = {"target": cfg.target, "draft": session.draft_label, "temperature": cfg.temperature}
        calibration = {role: b.calibration_record(curve, calibration_at_start.get(role))
                       for role, curve in (("target", session.costs), ("draft", session.draft_costs))}
        records = [b.trial_record(t, base) for t in trials]
        report = b.report(machine, model_info, settings, records, rows, calibration, versus)
        json_file.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    if plot is not None and rows:
        write_plot(rows, plot, header)
    if interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)


# The default target is a base model: it continues text rather than answering. So the demo gives it
# text to continue where drafting has something to find: a class whose next methods reuse the
# names and shapes of the ones before (a 270M base model keeps code sensible longer than prose).
DEMO_PROMPT = '''\
class Vector:
    """A vector in the plane."""

    def __init__(self, x, y):
        self.x = x
        self.y = y

    def __repr__(self):
        return f"Vector({self.x}, {self.y})"

    def __add__(self, other):
        return Vector(self.x + other.x, self.y + other.y)

    def __sub__(self, other):
'''
DEMO_TOKENS = 128
DEMO_WARMUP_TOKENS = 8


@app.command(cls=_Command)
def demo(
    prompt: Optional[str] = typer.Argument(None, metavar="TEXT", help="Text to continue [a Python class to finish]."),
    target: Target = None,
    draft: Draft = None,
    max_tokens: Optional[int] = typer.Option(None, "-n", "--max-tokens", metavar="N",
                                             help=f"Tokens to generate per answer [{DEMO_TOKENS}]."),
    threads: Threads = None,
    config: Config = None,
) -> None:
    """Decode one prompt plainly, then with auto: both speeds, the speedup, and whether the texts match.

    Greedy, so auto must write exactly what plain decoding writes. The continuation streams to
    stdout (drafted tokens dimmed on a terminal); the comparison goes to stderr.

    \b
    Examples:
      specgen demo
      specgen demo -m my-model.gguf -d self "Once upon a time"
    """
    from .config import build_config
    from .prompts import Prompt
    from .render import TextSink, note
    from .session import Runner, load_session

    cfg = build_config(config, dict(target=target, draft=draft, max_tokens=max_tokens or DEMO_TOKENS,
                                    temperature=0.0, threads=threads, chat=False, store=False))
    session = load_session(cfg, ["plain", "auto"], store_default=False)
    plain, auto = (Runner(dataclasses.replace(cfg, method=m), session) for m in ("plain", "auto"))
    item = Prompt(0, DEMO_PROMPT if prompt is None else prompt)
    for runner in (plain, auto):  # first decodes run cold: time neither of them
        runner.run(item, DEMO_WARMUP_TOKENS)
    session.forget_texts()  # auto may not draft from its own warm-up
    pair = f"{cfg.target}" + (f" <- {session.draft_label}" if session.draft_label else " (no draft model)")
    note(f"demo: {pair} · greedy · {cfg.max_tokens} tokens: plain decoding first, then auto")
    reference = plain.run(item)
    sink = TextSink()
    sink.write(item.text)
    result = auto.run(item, on_text=sink.write)
    sink.end()
    print(demo_summary(reference.stats.tokens_per_s, result.stats.tokens_per_s, reference.text == result.text),
          file=sys.stderr)
    if reference.text != result.text:
        at = next((i for i, (x, y) in enumerate(zip(reference.text, result.text)) if x != y),
                  min(len(reference.text), len(result.text)))
        note(f"the texts part after {at} characters: on a quantized target, llama.cpp's batch-size-dependent "
             "rounding can flip a near-tie between two tokens (rarely on F32 targets)")


def demo_summary(plain_tps: float, auto_tps: float, identical: bool) -> str:
    """The demo's last line, e.g. `plain 45.2 tok/s · auto 98.4 tok/s · 2.18x · identical to plain: yes`."""
    return (f"plain {plain_tps:.1f} tok/s · auto {auto_tps:.1f} tok/s · {auto_tps / plain_tps:.2f}x"
            f" · identical to plain: {'yes' if identical else 'no'}")


@app.command("rpc-server", cls=_Command)
def rpc_server(
    host: str = typer.Option("127.0.0.1", "--host", metavar="ADDR",
                             help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(50052, "--port", metavar="N", help="TCP port."),
    threads: Optional[int] = typer.Option(None, "--threads", metavar="N", help="CPU threads [all cores]."),
) -> None:
    """Serve this machine's CPU to other specgen/llama.cpp runs over llama.cpp's RPC protocol.

    The RPC protocol has no authentication: listen on a trusted network only.

    \b
    On this machine:   specgen rpc-server --host 0.0.0.0 --port 50052
    On the other one:  specgen generate --rpc HOST:50052 --gpu-layers 99 "..."
    """
    import signal

    from . import backend
    from .config import check_threads

    if not 0 < port < 65536:
        raise ConfigError(f"--port must be in 1..65535, found {port}")
    check_threads(threads)
    # The server loop runs inside llama.cpp and never returns to Python, so Python's Ctrl-C handler
    # would never run: let SIGINT/SIGTERM end the process directly.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    print(f"specgen: serving this CPU over llama.cpp RPC at {host}:{port} (Ctrl-C stops; no authentication: "
          "trusted networks only)", file=sys.stderr, flush=True)
    backend.serve_rpc(f"{host}:{port}", threads)


CALIBRATE_BUDGET_S = 8.0  # `specgen calibrate` times more passes than a first run of auto does


def calibration_summary(curve, threads: int) -> tuple[str, str | None]:
    """One line on how the curve was measured, how noisy and how busy the machine was then; and a
    warning when it was busy or noisy (None when not)."""
    from datetime import datetime

    from .costs import BUSY_CORES

    when = datetime.fromtimestamp(curve.measured_at).strftime("%Y-%m-%d %H:%M") if curve.measured_at else "unknown"
    line = f"measured {when} with {threads} threads, {curve.passes} passes; median spread ±{curve.noise * 100:.0f}%"
    if curve.busy_cores is not None:
        line += f"; other processes used {curve.busy_cores:.2f} of {os.cpu_count()} cores"
    warning = None
    if curve.busy:
        warning = (f"specgen: warning: the machine was busy (other processes above {BUSY_CORES} cores): this curve "
                   "is not cached; run `specgen calibrate --refresh` again when it is quiet")
    elif curve.noise > NOISY_SPREAD:
        warning = (f"specgen: warning: timings spread by ±{curve.noise * 100:.0f}% between passes (more than "
                   f"±{NOISY_SPREAD * 100:.0f}%): is something else running?")
    return line, warning


NOISY_SPREAD = 0.10


@app.command(cls=_Command)
def calibrate(
    model: str = typer.Argument(..., metavar="MODEL", help="GGUF path or models.txt name."),
    threads: Threads = None,
    ctx: Ctx = None,
    gpu_layers: GpuLayers = None,
    refresh: bool = typer.Option(False, "--refresh", help="Measure again instead of using the cache."),
) -> None:
    """Measure (or show the cached) cost of one decode of B tokens, the curve `auto` plans with.

    \b
    Example:
      specgen calibrate gemma-3-270m-f32
    """
    from rich.console import Console
    from rich.table import Table

    from .auto import LONG_PROMPT
    from .config import RunConfig, check_threads
    from .session import TARGET_OUTPUTS, TARGET_SEQS, cost_curve, load_target

    check_threads(threads)
    defaults = RunConfig()
    ctx = defaults.ctx if ctx is None else ctx
    gpu_layers = defaults.gpu_layers if gpu_layers is None else gpu_layers
    if ctx < 16:
        raise ConfigError(f"--ctx must be at least 16 tokens, found {ctx}")
    # What greedy generation loads (a screened copy where one helps, screen.py): the curve it plans with.
    llm = load_target(RunConfig(target=model, gpu_layers=gpu_layers))
    context = llm.new_context(min(ctx, llm.n_ctx_train or ctx), n_seq_max=TARGET_SEQS, n_threads=threads,
                              n_outputs=TARGET_OUTPUTS)
    curve = cost_curve(llm, context, refresh=refresh, budget_s=CALIBRATE_BUDGET_S)
    summary, warning = calibration_summary(curve, context.n_threads)
    print(summary)
    if warning:
        print(warning, file=sys.stderr)
    table = Table(title=f"{Path(llm.path).name}: one decode of B tokens ({curve.source})", box=None)
    for col in ("B", "ms", "x B=1", "ms per token", "spread"):
        table.add_column(col, justify="right")
    spread = curve.spread or [None] * len(curve.sizes)
    raw = curve.raw or curve.seconds
    for b, sec, rel, sp, low in zip(curve.sizes, curve.seconds, curve.relative(), spread, raw):
        # A raised size: it measured cheaper than a smaller one, but not consistently (noise).
        note = f" (measured {low * 1000:.1f})" if low < sec * 0.995 else ""
        table.add_row(str(b), f"{sec * 1000:.1f}{note}", f"{rel:.2f}", f"{sec * 1000 / b:.2f}",
                      "" if sp is None else f"±{sp * 100:.0f}%")
    Console(soft_wrap=True).print(table)
    if curve.linear_from:
        print(f"between B={curve.linear_from} and B={curve.sizes[-1]}: not timed (calibration's first pass ran out "
              f"of time), priced on the straight line between them")
    if curve.per_token_one_output:
        print(f"one output row (catching up on text): {curve.seconds[0] * 1000:.1f} ms + "
              f"{curve.per_token_one_output * 1000:.2f} ms per further token (e.g. B=16: "
              f"{curve.at(16, 0, outputs=1) * 1000:.1f} ms)")
    if curve.per_context_at:
        print(f"context: +{curve.per_context * 1e9:.0f} ns per batch token per context token "
              f"(measured after {curve.per_context_at} tokens; e.g. B=8 after 2048: "
              f"+{curve.per_context * 8 * 2048 * 1000:.1f} ms)")
    else:
        print(f"context: not measured yet (auto measures it after its first prompt over {LONG_PROMPT} tokens)")


@app.command(cls=_Command)
def doctor(
    model: Optional[str] = typer.Option(None, "-m", "--model", metavar="MODEL", help="Model for the speed check "
                                        "[the default target if present, else the smallest model present]."),
    speed: bool = typer.Option(True, "--speed/--no-speed", help="Run the speed check (a few seconds)."),
    threads: Threads = None,
) -> None:
    """Check the installation: llama.cpp build and flags, CPU, cache, models, and a short speed check.

    Exits 1 when it finds a problem (e.g. a build known to crash on this CPU).
    """
    import platform

    from . import __version__, backend, build, doctor as d, models
    from .config import check_threads, read_yaml
    from .host import DEFAULT_CONFIG, cpu_flags, cpu_name, specgen_home

    check_threads(threads)
    info = backend.build_info()
    flags = cpu_flags()
    plan = build.plan_build()
    installed_by_us = build.installed_for(plan)
    features = d.enabled_features(info.system_info)
    print(f"specgen {__version__} · Python {platform.python_version()} · llama-cpp-python {info.llama_cpp_python}")
    print(f"llama.cpp build: {', '.join(features) or 'no CPU extensions'}; computes on {info.accelerator}; "
          f"RPC backend {'yes' if info.rpc else 'no'}")
    print(f"  built by specgen for this host: {'yes' if installed_by_us else 'no'} ({plan.reason})")
    print(f"  specgen's Q8_0 kernel: {d.q8_0_kernel(info.system_info)}")
    print(f"host: {cpu_name()} · {os.cpu_count()} cores · {threads or backend.default_threads()} threads used "
          f"· {platform.system()} {platform.machine()}")
    home = specgen_home()
    present = [(e.name, models.cached_path(e)) for e in models.load_manifest().values() if models.is_present(e)]
    print(f"cache: {home} · {models.human_size(d.human_dir_size(home))}")
    for name, path in present:
        print(f"  model {name}: {models.human_size(path.stat().st_size)}")
    if not present:
        print("  no models present: specgen models pull NAME (see specgen models list)")
    warnings = d.build_warnings(info.system_info, flags)
    if speed:
        if model is None and present:
            default = read_yaml(DEFAULT_CONFIG).get("target") if DEFAULT_CONFIG.exists() else None
            smallest = min(present, key=lambda item: item[1].stat().st_size)[0]
            model = default if default in dict(present) else smallest
        if model is None:
            print("speed check: skipped (no model present)")
        else:
            check = d.speed_check(model, n_threads=threads)
            print(f"speed check: {check.model_file}: {check.tokens_per_s:.1f} tok/s plain decoding "
                  f"({check.tokens} tokens in {check.seconds:.1f} s)")
    for w in warnings:
        print(f"warning: {w}")
    if warnings:
        raise typer.Exit(1)
    print("ok: no problems found")


@cache_app.command("clear", cls=_Command)
def cache_clear(
    calibration: bool = typer.Option(False, "--calibration", help="Also the measured decode costs (measured "
                                     "again on next use)."),
    screened: bool = typer.Option(False, "--screened", help="Also the screened copies of F32/F16 targets "
                                  "(made again on the next greedy run)."),
) -> None:
    """Delete the store of past generations that auto drafts from (one file per tokenizer).

    \b
    Example:
      specgen cache clear
    """
    import shutil

    from .host import specgen_home

    folders = ["history", *(["calibration"] if calibration else []), *(["screened"] if screened else [])]
    for name in folders:
        folder = specgen_home() / name
        files = [p for p in folder.iterdir() if p.is_file()] if folder.is_dir() else []
        size = sum(p.stat().st_size for p in files)
        shutil.rmtree(folder, ignore_errors=True)
        print(f"{name}: removed {len(files)} files ({size / 1e6:.1f} MB) from {folder}")


@draft_app.command("derive", cls=_Command)
def draft_derive(
    target: str = typer.Argument(..., metavar="TARGET", help="Target model: GGUF path or models.txt name."),
    qtype: Optional[str] = typer.Option(None, "--type", metavar="TYPE", help="Quantization type of the draft "
                                        "(default: chosen by measurement among Q2_K and Q4_K_M)."),
    vocab: Optional[int] = typer.Option(None, "--vocab", metavar="K", help="Normal tokens kept, the ones the model "
                                        "uses most (default: chosen by measurement)."),
    head: Optional[str] = typer.Option(None, "--head", metavar="TYPE", help="Type of the embedding/output matrix: "
                                       "Q4_0, Q5_0, Q8_0 or F16 (default: chosen by measurement)."),
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
    from .backend import HEAD_TYPES
    from .subset import self_draft

    if vocab is not None and vocab < 1:
        raise ConfigError(f"--vocab must be at least 1, found {vocab}")
    if head is not None and head.upper() not in HEAD_TYPES:
        raise ConfigError(f"--head must be one of {', '.join(HEAD_TYPES)}, found {head!r}")
    print(self_draft(target, qtype, vocab, head.upper() if head else None, corpus))


@models_app.command("list", cls=_Command)
def models_list() -> None:
    """Models in models.txt (name, source, size, whether the file is present), then the drafts
    `specgen draft derive` made (use them by path, or with -d self)."""
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
        elif entry.kind == "self":
            source = f"self-draft of {entry.self_of}" + "".join(f" {k}={v}" for k, v in entry.options.items())
        present = models.is_present(entry)
        size = models.cached_path(entry).stat().st_size if present else entry.size
        table.add_row(entry.name, source, models.human_size(size), "yes" if present else "no")
    console = Console(soft_wrap=True)
    console.print(table)
    drafts = models.derived_drafts()
    if drafts:
        console.print(f"\nDerived drafts ({models.drafts_dir()}; use one with -d PATH):")
        for path in drafts:
            console.print(f"  {path.name}  {models.human_size(path.stat().st_size)}", highlight=False)


@models_app.command("pull", cls=_Command)
def models_pull(names: List[str] = typer.Argument(..., metavar="NAME...", help="Names from models.txt.")) -> None:
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


@models_app.command("path", cls=_Command)
def models_path(name: str = typer.Argument(..., metavar="NAME", help="A name from models.txt.")) -> None:
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
    except KeyboardInterrupt:
        # Ctrl-C outside generation (loading, pulling, building): no traceback, the usual status.
        print("specgen: interrupted", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    except (BrokenPipeError, OutputClosed):
        # The reader went away (e.g. `| head -1`): stop quietly, and keep Python from complaining
        # again while flushing stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
