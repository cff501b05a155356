"""`specgen chat`: a conversation in the terminal through the model's chat template, each reply
streamed (drafted tokens dimmed) with its stats line; piped stdin is one message per line."""

from __future__ import annotations

import importlib
import sys

import typer

from specgen.app.ask import why_exact_rows
from specgen.app.config import Given, build_config
from specgen.app.conversation import Conversation
from specgen.app.runner import Interrupted, Runner
from specgen.app.session import load_session
from specgen.cli.generate import run_to_sink, stats_of
from specgen.cli.options import (Config, Ctx, Draft, EXIT_INTERRUPTED, EXIT_SOME_FAILED, Method, Store, System,
                                 Target, Threads, with_sampling)
from specgen.cli.render import TextSink, error, stats_line
from specgen.core.kv import PromptCache
from specgen.errors import ConfigError, SpecgenError

CHAT_MODEL = "smollm2-135m-instruct-q4_1"  # the instruct model in models.txt to suggest
COMMANDS = {
    "/reset": "forget the conversation",
    "/system TEXT": "set the system message (and reset; /system alone clears it)",
    "/stats": "totals so far: replies, tokens, tok/s",
    "/exit": "leave (Ctrl-D too)",
    "/help": "this list",
}


@with_sampling
def chat(
    target: Target = None,
    draft: Draft = None,
    method: Method = None,
    system: System = None,
    sampling: Given = Given(),  # the sampling options, typed at the edge (with_sampling)
    threads: Threads = None,
    ctx: Ctx = None,
    config: Config = None,
    store: Store = None,
    prompt_cache: bool = typer.Option(True, "--prompt-cache/--no-prompt-cache", help="Keep the conversation in "
                                      "the model's KV: each turn reads only its new message; --no-prompt-cache "
                                      "reads the whole conversation each turn (the same text)."),
) -> None:
    """Chat with an instruct model: each line you type is a message, the reply streams back.

    Later replies draft from earlier turns (auto); each turn reads only its new tokens (the prompt
    cache). Ctrl-C stops a reply, Ctrl-D leaves; /help lists the commands (/reset, /system TEXT,
    /stats, /exit). Piped stdin: one message per line.

    \b
    Examples:
      specgen chat -m smollm2-135m-instruct-q4_1
      specgen chat -m qwen2.5-7b-instruct-q4_k_m -d qwen2.5-0.5b-instruct-q8_0 --system "Be brief."
      printf 'Name a colour\\nAnother one\\n' | specgen chat -m smollm2-135m-instruct-q4_1
    """
    cfg = build_config(config, dict(
        target=target, draft=draft, method=method, chat=True, system=system, threads=threads, ctx=ctx, store=store),
        sampling)
    screen = why_exact_rows(cfg.sampling, constrained=False) is None  # greedy: a screened target serves
    # The conversation's prefix stays in the target's KV (exact: core/kv.py); without it each turn
    # reads the whole conversation, in the decodes a cold cache reads it in (the same bits).
    runner = Runner(cfg, load_session(cfg.loading, screen=screen), PromptCache(reuse=prompt_cache))
    if not runner.session.target.chat_template:
        raise ConfigError(f"specgen chat needs a model with a chat template; {cfg.target} has none "
                          f"(try -m {CHAT_MODEL})")
    interactive = sys.stdin.isatty()
    if interactive:
        try:
            importlib.import_module("readline")  # input() gains line editing and history
        except ImportError:
            pass
        print(f"specgen chat: {cfg.target}" + (f" <- {runner.session.draft_label}" if runner.session.draft_label
                                                else "") + f" · {cfg.method} · /help for commands, Ctrl-D to leave",
              file=sys.stderr, flush=True)
    conversation, sink, failed = Conversation(cfg.system), TextSink(), 0
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            if interactive:
                print(file=sys.stderr)
            break
        except KeyboardInterrupt:  # at the prompt: the line is dropped, ask again
            print(file=sys.stderr)
            continue
        line = line.strip()
        if not line:
            continue
        if line.startswith("/"):
            if command(line, conversation):
                break
            continue
        prompt = conversation.ask(line)
        try:
            result = run_to_sink(runner, runner.ask(prompt), sink)
        except Interrupted as stop:
            result = stop.partial  # kept: the conversation goes on from what was said
        except SpecgenError as e:  # e.g. the conversation outgrew --ctx: say so, the chat goes on
            sink.close_line()
            error(f"{e} (/reset starts over)")
            failed += 1
            continue
        sink.end()
        stats_line(stats_of(result))
        conversation.answered(prompt, result)
        if result.finish_reason == "interrupted" and not interactive:
            raise typer.Exit(EXIT_INTERRUPTED)  # piped: Ctrl-C ends the run, as in generate
    if failed and not interactive:
        raise typer.Exit(EXIT_SOME_FAILED)


def command(line: str, conversation: Conversation) -> bool:
    """Carry out a /command (its output on stderr, beside the stats); True: leave the chat."""
    name, _, arg = line.partition(" ")
    if name in ("/exit", "/quit"):
        return True
    if name == "/reset":
        conversation.reset()
        say("conversation forgotten")
    elif name == "/system":
        conversation.system = arg.strip() or None
        conversation.reset()
        say(f"system message {'set' if conversation.system else 'cleared'}; conversation forgotten")
    elif name == "/stats":
        say(conversation.summary())
    elif name == "/help":
        width = max(map(len, COMMANDS))
        say("\n".join(f"{usage:<{width}}  {what}" for usage, what in COMMANDS.items())
            + "\nCtrl-C stops a reply (the chat goes on); Ctrl-D leaves")
    else:
        say(f"unknown command {name}; commands: {', '.join(usage.split()[0] for usage in COMMANDS)}")
    return False


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
