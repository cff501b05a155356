"""`specgen generate` and `specgen demo`: options into a RunConfig, the runner's events rendered."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Optional

import typer

from specgen.app.ask import Ask, Overrides, any_needs_exact_rows, why_exact_rows
from specgen.app.config import Given, build_config, own_target_without_draft, read_yaml
from specgen.app.prompts import Prompt, collect_prompts
from specgen.app.runner import Completion, Interrupted, Runner, Transcript
from specgen.app.session import load_session
from specgen.cli.options import (Chat, Config, Corpus, Ctx, Draft, DraftGpuLayers, EXIT_INTERRUPTED,
                                 EXIT_SOME_FAILED, GpuLayers, Grammar, JsonLayout, JsonObject, JsonSchema, Method,
                                 Rpc, Store, System, Target, Threads, constraint_option, with_sampling)
from specgen.cli.render import TextSink, note, stats_line, write_json_record
from specgen.core.engine import TokenEvent
from specgen.core.kv import PromptCache
from specgen.errors import ConfigError, SpecgenError


def run_to_sink(runner: Runner, ask: Ask, sink: TextSink | None) -> Completion:
    """Run `ask`, its text streamed to `sink` as it is committed (None: not shown), up to its first
    stop string (text that may begin one is held back until it is known not to). Ctrl-C raises
    Interrupted with what was shown."""
    with Transcript(ask).interruptible() as transcript:
        for step in transcript.follow(runner.stream(ask, transcript.stats)):
            if sink is not None:
                sink.write(step.text, isinstance(step.event, TokenEvent) and step.event.from_draft)
    return transcript.completion()


def stats_of(result: Completion) -> str:
    """The stats line, and the stop string that ended the text, if one did."""
    stopped = f" · stopped at {json.dumps(result.stopping_word, ensure_ascii=False)}" if result.stopping_word else ""
    return result.stats.line() + stopped


@with_sampling
def generate(
    prompt: Optional[str] = typer.Argument(None, metavar="PROMPT",
                                           help='Prompt text; "-" (or none, with stdin piped) reads stdin.'),
    prompts: Optional[Path] = typer.Option(None, "-f", "--prompts", metavar="FILE",
                                           help="Many prompts: .txt (one per line) or .jsonl."),
    target: Target = None,
    draft: Draft = None,
    method: Method = None,
    sampling: Given = Given(),  # the sampling options, typed at the edge (with_sampling)
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
    json_schema: JsonSchema = None,
    grammar: Grammar = None,
    json_object: JsonObject = False,
    json_layout: JsonLayout = None,
    prompt_cache: bool = typer.Option(True, "--prompt-cache/--no-prompt-cache", help="With several prompts: "
                                      "one that begins as the one before (a system prompt) reads only the rest; "
                                      "--no-prompt-cache reads each whole (the same text)."),
    prompt_cache_mb: int = typer.Option(1024, "--prompt-cache-mb", metavar="MIB", help="With several prompts: "
                                        "host memory for other conversations' KV besides the live one (least "
                                        "recently used dropped first), so interleaved multi-turn records each "
                                        "resume their own; 0: the last prompt's only."),
) -> None:
    """Generate text for one prompt or many, streaming tokens to stdout and stats to stderr.

    \b
    Examples:
      specgen generate -m smollm2-135m-instruct-q4_1 "Write a haiku about rain"
      echo "Summarize: ..." | specgen generate -m smollm2-135m-instruct-q4_1 -n 64 --json
      specgen generate -m target.gguf -d draft.gguf -f prompts.txt
      specgen generate -m smollm2-135m-instruct-q4_1 --json-schema person.json "Extract: Ada, 36, London"
      specgen generate -m smollm2-135m-instruct-q4_1 -f jobs.jsonl --json   # records may carry response_format, tools
    """
    cfg = build_config(config, dict(
        target=target, draft=draft, method=method, chat=chat, system=system, threads=threads, ctx=ctx,
        gpu_layers=gpu_layers, draft_gpu_layers=draft_gpu_layers, rpc=rpc, store=store, json_layout=json_layout,
        corpus=",".join(map(str, corpus)) if corpus else None), sampling)
    items = collect_prompts(prompt, prompts, sys.stdin)
    spec = constraint_option(json_schema, grammar, json_object)
    if spec is not None:  # for every prompt that does not carry its own response_format or tools
        items = [item if item.constrained else dataclasses.replace(item, constraint=spec) for item in items]
    # A screened target serves only where no prompt's generation needs the target's exact rows.
    # Several prompts share one context: the prompt cache keeps a shared beginning (in invariant decodes,
    # --no-prompt-cache too, so both read the same bits). One prompt keeps the n_batch prefill.
    if prompt_cache_mb < 0:
        raise ConfigError(f"--prompt-cache-mb must be at least 0, found {prompt_cache_mb}")
    cache = PromptCache(reuse=prompt_cache, budget=prompt_cache_mb << 20) if len(items) > 1 else None
    runner = Runner(cfg, load_session(cfg.loading, screen=not any_needs_exact_rows(cfg.sampling, items)), cache)
    given = {name: value for name, value in (("target", target), ("draft", draft)) if value is not None}
    if runner.method.measured and own_target_without_draft(given, read_yaml(config) if config is not None else {}):
        # A target of one's own, and nothing said about a draft: auto can only draft from text.
        note("hint: no draft model, so auto drafts only from text (the prompt, earlier outputs); `-d MODEL` adds "
             "one of the same family (whether it is faster here is not measured: `specgen bench` measures it). "
             "`-d none` silences this.")
    sink = TextSink()
    failed = 0
    for item in items:
        try:
            ask = runner.ask(item)
            result = run_to_sink(runner, ask, None if json_out else sink)
        except Interrupted as stop:
            result = stop.partial  # keep what was generated: it is written below, then we exit 130
        except SpecgenError as e:
            sink.close_line()  # text written before the error stays, on its own line
            if fail_fast or len(items) == 1:
                raise
            # One bad prompt in a long file: say which, keep going; the exit code reports it.
            failed += 1
            print(f"specgen: error: prompt {item.index + 1}: {e}", file=sys.stderr, flush=True)
            if json_out:
                write_json_record({"prompt_index": item.index, "error": str(e), "finish_reason": "error"})
            continue
        answer = runner.answer(ask, result.text)
        if json_out:
            record = runner.record(result)
            if answer is not None:
                record.update(content=answer.content, tool_calls=[c.openai() for c in answer.calls])
            write_json_record(record)
        else:
            sink.end()
        stats_line(stats_of(result))
        if result.finish_reason == "interrupted":
            raise typer.Exit(EXIT_INTERRUPTED)
    if failed:
        print(f"specgen: {failed} of {len(items)} prompts failed", file=sys.stderr)
        raise typer.Exit(EXIT_SOME_FAILED)


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
    cfg = build_config(config, dict(target=target, draft=draft, threads=threads, chat=False, store=False),
                       Given(Overrides(temperature=0.0), max_tokens or DEMO_TOKENS))
    session = load_session(cfg.loading, ["plain", "auto"], store_default=False,
                           screen=why_exact_rows(cfg.sampling, constrained=False) is None)
    plain, auto = (Runner(dataclasses.replace(cfg, method=m), session) for m in ("plain", "auto"))
    item = Prompt(0, DEMO_PROMPT if prompt is None else prompt)
    for runner in (plain, auto):  # first decodes run cold: time neither of them
        runner.run(runner.ask(item, DEMO_WARMUP_TOKENS))
    session.forget_texts()  # auto may not draft from its own warm-up
    pair = f"{cfg.target}" + (f" <- {session.draft_label}" if session.draft_label else " (no draft model)")
    note(f"demo: {pair} · greedy · {cfg.max_tokens} tokens: plain decoding first, then auto")
    reference = plain.run(plain.ask(item))
    sink = TextSink()
    sink.write(item.text)
    result = run_to_sink(auto, auto.ask(item), sink)
    sink.end()
    print(demo_summary(reference.stats.tokens_per_s, result.stats.tokens_per_s, reference.text == result.text),
          file=sys.stderr)
    if reference.text != result.text:
        at = next((i for i, (x, y) in enumerate(zip(reference.text, result.text)) if x != y),
                  min(len(reference.text), len(result.text)))
        from specgen.llama.tools import build_info

        if "SPECGEN_INVARIANT = on" in build_info().system_info:  # batch-invariant kernels: no rounding excuse
            note(f"the texts part after {at} characters: this build's decodes are batch-invariant, so this is a bug "
                 "in specgen; please report it with the command line (docs/troubleshooting.md)")
        else:
            note(f"the texts part after {at} characters: this llama.cpp build lacks specgen's batch-invariant "
                 "kernels, and its batch-size-dependent rounding can flip a near-tie between two tokens")


def demo_summary(plain_tps: float, auto_tps: float, identical: bool) -> str:
    """The demo's last line, e.g. `plain 45.2 tok/s · auto 98.4 tok/s · 2.18x · identical to plain: yes`."""
    return (f"plain {plain_tps:.1f} tok/s · auto {auto_tps:.1f} tok/s · {auto_tps / plain_tps:.2f}x"
            f" · identical to plain: {'yes' if identical else 'no'}")
