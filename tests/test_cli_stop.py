"""Stop strings at the command line: `generate --stop` and `chat --stop` (a -c file's `stop`, a -f
record's "stop") under the server's one rule (app/stops.py): the text cut just before the stop
string, finish reason "stop", and nothing streamed that the stop string later cuts. One model load
serves the in-process CLI runs and the in-process server they are compared with."""

import io
import json
import re

import pytest
from typer.testing import CliRunner

from clihelp import assert_one_line_error, specgen
import harness
from harness import SMOLLM2

QUESTION = "Count from 1 to 20, comma separated."
STOP = "4, 5"  # three tokens ("4", ",", " 5"): it forms across pieces
CUT = "1, 2, 3, "  # smollm2's greedy answer up to STOP
N = "40"


# --- the rule, without a model -------------------------------------------------------------------


def test_the_server_uses_the_rule_the_cli_uses():
    from specgen.app.runner import Transcript
    from specgen.cli import generate
    from specgen.serve import worker

    assert worker.Transcript is generate.Transcript is Transcript  # one loop cuts both edges' texts


def _events(pieces, reason):
    from specgen.core.engine import FinishEvent, TokenEvent

    return [*(TokenEvent(i, piece, False) for i, piece in enumerate(pieces)), FinishEvent(reason)]


def _stream(events):
    def stream(ask, stats):
        yield from events
    return stream


def _cli(ask, events):
    """What `generate --stop` shows (cli/generate.run_to_sink, as its terminal sink gets it) and its Completion."""
    from types import SimpleNamespace

    from specgen.cli.generate import run_to_sink

    written = []
    sink = SimpleNamespace(write=lambda t, _: written.append(t))
    result = run_to_sink(SimpleNamespace(stream=_stream(events)), ask, sink)
    return [t for t in written if t], (result.text, result.finish_reason, result.stopping_word)


def _server(ask, events):
    """What the server streams for the same events (worker.Worker._generate's Pieces) and its Done."""
    import threading
    from types import SimpleNamespace

    from specgen.serve.worker import Worker

    runner = SimpleNamespace(stream=_stream(events), session=SimpleNamespace(target=None))
    worker = SimpleNamespace(slot=SimpleNamespace(ask=lambda request, limit: ask, runner=runner),
                             _limit=lambda request: 64)
    pieces = []
    done = Worker._generate(worker, SimpleNamespace(request=None, cancelled=threading.Event(), put=pieces.append))
    return [p.text for p in pieces], (done.text, done.finish_reason, done.stopping_word)


@pytest.mark.parametrize("stops, pieces, reason, streamed, whole", [
    # a stop string split across two tokens: the first half held back, then cut
    (("world",), ("Hello wor", "ld! Bye"), "length", ["Hello "], ("Hello ", "stop", "world")),
    ((STOP,), ("1, 2, 3, 4", ",", " 5", ", 6"), "length", [CUT], (CUT, "stop", STOP)),
    # held back while it may be a stop string, released once it is not one
    (("4, 6",), ("1, 2, 3, 4", ",", " 5", ", 6"), "length", [CUT, "4, 5", ", 6"], ("1, 2, 3, 4, 5, 6", "length", "")),
    # held back when the model ends: the end releases it (the model's own stop, no stop string)
    ((STOP,), ("1, 2, 3, 4",), "stop", [CUT, "4"], ("1, 2, 3, 4", "stop", "")),
    # the first of two stop strings in the text ends it, whichever is listed first
    (("3", "2, "), ("1, 2, 3",), "length", ["1, "], ("1, ", "stop", "2, ")),
])
def test_generate_stop_and_the_servers_stop_cut_the_same_events_alike(stops, pieces, reason, streamed, whole):
    from specgen.app.ask import Ask
    from specgen.app.prompts import Prompt

    ask = Ask(Prompt(0, QUESTION), False, stop=stops)
    events = _events(pieces, reason)
    assert _cli(ask, events) == _server(ask, events) == (streamed, whole)


def test_a_stop_string_across_pieces_is_held_back_then_cut():
    from specgen.app.stops import StopText

    stop = StopText((STOP,))
    shown = [stop.feed(p) for p in ("1, 2, 3, 4", ",", " 5", ", 6")]
    assert shown == [CUT, "", "", ""] and stop.hit and stop.text == CUT and stop.word == STOP


def test_a_near_miss_is_held_back_only_until_it_is_not_a_stop_string():
    from specgen.app.stops import StopText

    stop = StopText(("4, 6",))
    shown = [stop.feed(p) for p in ("1, 2, 3, 4", ",", " 5")]
    assert shown == [CUT, "", "4, 5"] and not stop.hit and stop.flush() == ""


# --- bad input: one line, before any model loads -----------------------------------------------------


def _jsonl(tmp_path, record):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(record) + "\n")
    return str(path)


def _yaml(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("args, words", [
    (lambda t: ["--stop", "", "hi"], "--stop expects a non-empty stop string, found an empty one"),
    (lambda t: [*["--stop", "x"] * 17, "hi"], "--stop expects at most 16 stop strings, found 17"),
    (lambda t: ["--stop", "x" * 257, "hi"], "--stop expects a stop string of at most 256 characters, found 257"),
    (lambda t: ["-c", _yaml(t, "stop: [1]\n"), "hi"], "--stop expects text or a list of texts, found [1]"),
    (lambda t: ["-f", _jsonl(t, {"prompt": "hi", "stop": ""})],
     'p.jsonl line 1: "stop" expects a non-empty stop string, found an empty one'),
], ids=["empty", "too-many", "too-long", "config-not-text", "record-empty"])
def test_bad_stop_strings_are_one_line(tmp_path, args, words):
    for command in ("generate", "chat"):
        if command == "chat" and "-f" in args(tmp_path):
            continue
        given = [a for a in args(tmp_path) if a != "hi"] if command == "chat" else args(tmp_path)
        proc = specgen(command, "-m", SMOLLM2, "--no-store", *given, input="")
        assert_one_line_error(proc, words)


def test_bench_refuses_stop_beside_llama_cpps_rows(tmp_path):
    """llama.cpp's rows cannot stop at a string: their texts would be compared with cut ones."""
    (tmp_path / "llama-speculative-simple").write_text("#!/bin/sh\nexit 1\n")  # found, never run
    (tmp_path / "llama-speculative-simple").chmod(0o755)
    proc = specgen("bench", "-m", SMOLLM2, "--limit", "1", "--stop", "4, 5", "--llama-cpp", str(tmp_path))
    assert_one_line_error(proc, "--stop cuts specgen's texts only: llama.cpp's rows (--llama-cpp) do not stop")


# --- real runs: the CLI's text is the server's --------------------------------------------------------


@pytest.fixture(scope="module")
def session():
    return harness.session(SMOLLM2, None)  # as generate and serve load it (no screening: a server may sample)


@pytest.fixture(scope="module")
def server(session):
    from starlette.testclient import TestClient

    from specgen.app.config import build_config
    from specgen.serve.app import Api
    from specgen.serve.worker import Slot, Worker

    cfg = build_config(None, dict(target=SMOLLM2, method="auto", store=False))
    worker = Worker(Slot(cfg, session), max_queue=2)
    try:
        yield TestClient(Api(worker, SMOLLM2, "auto").app)
    finally:
        worker.close()


class Terminal(io.StringIO):
    def isatty(self):
        return True


def run(session, command, *args, input=None, terminal=None):
    """`specgen COMMAND ...` in this process on the loaded session (stdout as a terminal when
    `terminal` is given: it receives the text); its stdout and stderr."""
    from specgen.cli import app, chat, generate, render

    with pytest.MonkeyPatch.context() as mp:
        for module in (generate, chat):
            mp.setattr(module, "load_session", lambda *a, **k: session)
        if terminal is not None:
            mp.setattr(generate, "TextSink", lambda: render.TextSink(terminal))
        result = CliRunner().invoke(app, [command, "-m", SMOLLM2, "--no-store", "--seed", "7", *args], input=input)
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout, result.stderr


def plain_text(terminal: Terminal) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", terminal.getvalue())


def ask_server(server, stop, stream=False):
    body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": int(N), "temperature": 0, "seed": 7,
            "stop": stop, "stream": stream}
    reply = server.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    if not stream:
        choice = reply.json()["choices"][0]
        return choice["message"]["content"], choice["finish_reason"]
    chunks = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    return text, [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]


def test_generate_stop_cuts_the_text_as_the_server_does_streamed_and_piped(session, server):
    whole, _ = run(session, "generate", "-n", N, "--json", QUESTION)
    assert json.loads(whole)["text"].startswith(CUT + STOP)  # without it, the answer goes on through STOP
    assert len(session.target.tokenize(STOP, add_special=False, parse_special=False)) > 1
    piped, _ = run(session, "generate", "-n", N, "--json", "--stop", STOP, "--stop", "never said", QUESTION)
    record = json.loads(piped)
    terminal = Terminal()
    _, stderr = run(session, "generate", "-n", N, "--stop", STOP, QUESTION, terminal=terminal)
    assert (record["text"], record["finish_reason"], record["stopping_word"]) == (CUT, "stop", STOP)
    assert plain_text(terminal) == CUT + "\n"  # nothing later cut was ever written to the terminal
    assert stderr.strip().splitlines()[-1].endswith(f'· stopped at "{STOP}"')
    assert ask_server(server, [STOP]) == ask_server(server, STOP, stream=True) == (CUT, "stop")


def test_a_stop_string_that_never_completes_costs_no_text(session, server):
    full, _ = run(session, "generate", "-n", N, "--json", QUESTION)
    terminal = Terminal()
    run(session, "generate", "-n", N, "--stop", "4, 6", QUESTION, terminal=terminal)
    assert plain_text(terminal) == json.loads(full)["text"] + "\n"  # "4, " was held back, then shown
    assert ask_server(server, ["4, 6"]) == (json.loads(full)["text"], "length")


def test_a_config_file_and_a_record_give_stop_strings(session, tmp_path):
    config = _yaml(tmp_path, f"stop: {json.dumps(STOP)}\n")
    records = tmp_path / "p.jsonl"
    records.write_text(json.dumps({"prompt": QUESTION}) + "\n" + json.dumps({"prompt": QUESTION, "stop": ["3,"]}) + "\n")
    out, _ = run(session, "generate", "-n", N, "-c", config, "-f", str(records), "--json")
    first, second = map(json.loads, out.splitlines())
    assert (first["text"], first["finish_reason"]) == (CUT, "stop")
    assert (second["text"], second["stopping_word"]) == ("1, 2, ", "3,")


def test_chat_stop_ends_a_reply(session):
    out, stderr = run(session, "chat", "-n", N, "--stop", STOP, input=QUESTION + "\n")
    assert out == CUT + "\n" and f'stopped at "{STOP}"' in stderr


def test_a_real_run_piped_is_cut():
    proc = specgen("generate", "-m", SMOLLM2, "--no-store", "--seed", "7", "-n", N, "--stop", STOP, QUESTION)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == CUT + "\n" and f'stopped at "{STOP}"' in proc.stderr


def test_serve_stop_gives_the_stop_strings_of_a_request_naming_none(session):
    from specgen.app.config import build_config
    from specgen.serve.requests import chat_request
    from specgen.serve.worker import Slot

    slot = Slot(build_config(None, dict(target=SMOLLM2, method="auto", store=False, stop=[STOP])), session)
    messages = [{"role": "user", "content": QUESTION}]
    assert slot.ask(chat_request({"messages": messages}), 8).stop == (STOP,)
    assert slot.ask(chat_request({"messages": messages, "stop": "3,"}), 8).stop == ("3,",)
