"""Scripts and pipelines: every bad input is one line and a non-zero exit; interrupts and closed pipes
lose nothing and print no traceback; long runs stay flat and go on past a failing prompt; same seed,
same output; chat conversations; doctor; RPC. All through the real CLI on the real smollm2 model."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from clihelp import assert_one_line_error, gen, specgen
from harness import SMOLLM2, serve_directory

pytestmark = pytest.mark.real

F32 = "smollm2-135m-instruct-f32"


# --- bad input: one line, what was expected and what was found, non-zero exit ---------------------


def test_truncated_gguf_and_directory_as_model(tmp_path, smollm2_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(smollm2_path.read_bytes()[:1_000_000])
    assert_one_line_error(specgen("generate", "-m", str(cut), "hi"), "could not load")
    assert_one_line_error(specgen("generate", "-m", str(tmp_path), "hi"),
                          "expected a GGUF model file, got a directory")


def test_sha256_mismatch_on_pull(tmp_path):
    (tmp_path / "m.gguf").write_bytes(b"GGUF" + bytes(60))

    manifest = tmp_path / "models.txt"
    env = {"SPECGEN_MODELS_TXT": str(manifest), "SPECGEN_HOME": str(tmp_path / "home")}
    with serve_directory(tmp_path) as url:
        manifest.write_text(f"tiny {url}/m.gguf {'0' * 64}\n")
        proc = specgen("models", "pull", "tiny", env=env)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "sha256 mismatch for tiny: expected 0000" in proc.stderr.strip().splitlines()[-1]
    assert not list((tmp_path / "home" / "models").glob("tiny*"))  # nothing half-written kept


def test_prompt_longer_than_context_names_the_sizes():
    proc = gen("word " * 400, "--ctx", "64")
    assert_one_line_error(proc, "but the context holds")  # llama.cpp pads --ctx 64 up; the message
    assert "use --ctx" in proc.stderr  # says what it holds


@pytest.mark.parametrize("content, name, message", [
    (b"", "empty.txt", "has no prompts"),
    (b"fine\ncaf\xe9\n", "latin1.txt", "expected UTF-8 text, found byte 0xe9 on line 2"),
    (b'{"prompt": "a"}\n{oops\n', "bad.jsonl", "bad.jsonl line 2: not valid JSON"),
    (b'{"messages": [{"role": "system", "content": "a"}, {"role": "assistant", "content": "b"}]}\n',
     "conv.jsonl", "expected at least one user message"),
])
def test_bad_prompt_files(tmp_path, content, name, message):
    path = tmp_path / name
    path.write_bytes(content)
    assert_one_line_error(gen("-f", str(path)), message)


def test_missing_prompt_file(tmp_path):
    assert_one_line_error(gen("-f", str(tmp_path / "nope.txt")), "prompt file not found")


def test_invalid_yaml_names_the_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("target: x\nmax_tokens: [1,\n")
    assert_one_line_error(gen("hi", "-c", str(cfg)), "invalid YAML")


@pytest.mark.parametrize("flags, message", [
    (["-n", "-1"], "--max-tokens must be at least 1, found -1"),
    (["-t", "-0.5"], "--temperature must be >= 0, found -0.5"),
    (["--top-p", "0"], "--top-p must be in (0, 1], found 0.0"),
    (["--top-p", "1.5"], "--top-p must be in (0, 1], found 1.5"),
    (["--threads", "0"], "--threads must be at least 1, found 0"),
    (["--rpc", "localhost"], "--rpc expects HOST:PORT[,HOST:PORT...], found 'localhost'"),
])
def test_flags_out_of_range(flags, message):
    assert_one_line_error(gen("hi", *flags), message)


def test_draft_method_without_draft_suggests_lookup():
    proc = specgen("generate", "-m", SMOLLM2, "--method", "chain", "hi")
    assert_one_line_error(proc, "--method chain needs a draft model (-d MODEL); --method lookup drafts without one")


# --- interrupts and pipes --------------------------------------------------------------------------


COUNTING = ["--no-chat", "-n", "4000", "--ctx", "8192", "--method", "auto"]


# specgen, with one line more on stderr when a prompt's first token is committed, for a test to wait
# on where --json shows nothing until the prompt ends.
ANNOUNCING = r"""
import sys
from specgen.core.engine import TokenEvent
from specgen.app.runner import Transcript
add = Transcript.add
def announcing(self, event):
    first = isinstance(event, TokenEvent) and not self.pieces
    add(self, event)
    if first:
        print(f"test: prompt {self.prompt_index} has its first token", file=sys.stderr, flush=True)
Transcript.add = announcing
from specgen.cli import main
main()
"""


def start(*args, announce=False):
    """specgen as a terminal starts it, with Ctrl-C at its default. A test run launched in the
    background (`nohup make test &` from a script) hands its children SIGINT ignored, which Python
    keeps, so these runs would write all 4,000 tokens and never exit with 130."""
    program = ["-c", ANNOUNCING] if announce else ["-m", "specgen"]
    return subprocess.Popen([sys.executable, *program, "generate", "-m", SMOLLM2, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_for_line(stream, wanted: bytes) -> bytes:
    """Read `stream` up to a line holding `wanted`; what was read. Fails if the stream ends first."""
    seen = b""
    while wanted not in seen:
        line = stream.readline()
        assert line, f"the stream ended before {wanted!r}: {seen.decode()[-2000:]}"
        seen += line
    return seen


def test_ctrl_c_flushes_text_prints_stats_and_exits_130():
    proc = start(*COUNTING, "1, 2, 3, 4, 5,")
    first = proc.stdout.read(20)  # generation is under way
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    text = (first + out).decode()
    assert len(text) > 20 and "Traceback" not in err.decode()
    assert " tok/s" in err.decode()  # partial stats


def test_ctrl_c_with_json_writes_the_interrupted_record(tmp_path):
    # The first prompt fails at once (too long for the context), so its error record says that
    # loading and calibration are done and the second prompt is being generated.
    prompts = tmp_path / "p.txt"
    prompts.write_text("word " * 9000 + "\n1, 2, 3, 4, 5,\n")
    proc = start(*COUNTING, "--json", "-f", str(prompts), announce=True)
    first = json.loads(proc.stdout.readline())
    assert first["finish_reason"] == "error"
    wait_for_line(proc.stderr, b"test: prompt 1 has its first token")  # the second prompt is decoding
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    record = json.loads(out)
    assert record["prompt_index"] == 1
    assert record["finish_reason"] == "interrupted" and record["n_tokens"] > 0 and record["text"]


def test_reader_closing_the_pipe_is_quiet(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("Name a colour.\nName a fruit.\nName a tree.\n")
    cmd = (f"{sys.executable} -m specgen generate -m {SMOLLM2} -n 40 -f {prompts} | head -1; "
           "exit ${PIPESTATUS[0]}")
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr
    assert len(proc.stdout.splitlines()) == 1


# --- long runs -------------------------------------------------------------------------------------


def rss_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads RSS from /proc")
def test_many_prompts_flat_memory_streamed_records_and_a_failure_reported(tmp_path):
    """600 prompts through auto (which keeps this process's texts to draft from): records stream, a
    failed prompt is reported and the run goes on, and memory is flat. Between the 100th record and
    the 590th, 16 MiB of growth allows 33 KiB per prompt: a leaked logits row (smollm2's, 192 KiB)
    fails it five times over. (It was 1,000 prompts, 18 KiB per prompt, taking 36 s on a 2-core CI
    machine.)"""
    lines = [f"Say the number {i}." for i in range(600)]
    lines[299] = "many words " * 200  # longer than --ctx 256: this prompt fails, the run goes on
    prompts = tmp_path / "many.txt"
    prompts.write_text("\n".join(lines) + "\n")
    with open(tmp_path / "stderr.txt", "w+") as stderr:  # a file: a pipe would fill up and block the run
        proc = subprocess.Popen([sys.executable, "-m", "specgen", "generate", "-m", SMOLLM2, "-n", "2", "--no-chat",
                                 "--ctx", "256", "--json", "-f", str(prompts)], stdout=subprocess.PIPE, stderr=stderr,
                                text=True)
        records, rss = [], {}
        for line in proc.stdout:  # records arrive while the run goes on, one per finished prompt
            records.append(json.loads(line))
            if len(records) in (100, 590):
                rss[len(records)] = rss_kb(proc.pid)
        proc.wait(timeout=60)
        stderr.seek(0)
        err = stderr.read()
    assert len(records) == 600
    assert proc.returncode == 1  # finished, but a prompt failed
    assert records[299]["finish_reason"] == "error" and "but the context holds" in records[299]["error"]
    assert all(r["finish_reason"] in ("length", "stop") for i, r in enumerate(records) if i != 299)
    assert "prompt 300: prompt is" in err and "1 of 600 prompts failed" in err
    assert rss[590] - rss[100] < 16 * 1024, rss  # KiB: no growth with the number of prompts


def test_fail_fast_stops_at_the_first_failure(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("Name a colour.\n" + "many words " * 200 + "\nName a fruit.\n")
    proc = gen("-f", str(prompts), "--ctx", "256", "--json", "--fail-fast")
    assert proc.returncode != 0
    assert len(proc.stdout.splitlines()) == 1  # the first prompt's record is kept
    assert "but the context holds" in proc.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("method", ["plain", "lookup", "chain", "tree", "staged", "auto"])
def test_same_seed_same_output(method):
    """Sampled, in separate processes, the same request gives the same text: `generate` in its own
    process, and the same method, seed and settings through a Runner in this one (harness.run_of,
    on a session that has drafted other texts before). lookup must also give plain's exact text,
    draws being shared."""
    from harness import run_of

    args = ["generate", "-m", F32, "-d", SMOLLM2, "--method", method, "-n", "24", "-t", "0.8", "--seed", "7",
            "--json", "Write a short poem about the sea."]
    first = specgen(*args)
    assert first.returncode == 0, first.stderr
    text = json.loads(first.stdout)["text"]
    here = dict(target=F32, draft=SMOLLM2, n=24, chat=None, temperature=0.8, seed=7)
    assert text == run_of(method, "Write a short poem about the sea.", **here).text
    if method == "lookup":
        assert text == run_of("plain", "Write a short poem about the sea.", **here).text


# --- everyday features -----------------------------------------------------------------------------


def test_system_message_and_conversations_change_the_prompt(tmp_path):
    base = json.loads(gen("--json", "What is your name?").stdout)["text"]
    with_system = gen("--json", "--system", "You are a pirate called Captain Bob. Always say your name.",
                      "What is your name?")
    assert with_system.returncode == 0 and json.loads(with_system.stdout)["text"] != base
    conv = tmp_path / "conv.jsonl"
    conv.write_text(json.dumps({"messages": [
        {"role": "user", "content": "My name is Zanzibar."}, {"role": "assistant", "content": "Nice to meet you!"},
        {"role": "user", "content": "What is my name?"}]}) + "\n")
    proc = gen("--json", "-n", "16", "-f", str(conv))
    assert proc.returncode == 0, proc.stderr
    assert "Zanzibar" in json.loads(proc.stdout)["text"]


def test_doctor_reports_build_cache_and_speed():
    proc = specgen("doctor", "-m", SMOLLM2)
    assert "llama.cpp build:" in proc.stdout and "cache:" in proc.stdout
    assert f"speed check: {SMOLLM2}.gguf:" in proc.stdout and "tok/s plain decoding" in proc.stdout
    # `make` built llama.cpp for this very host: nothing to warn about.
    assert proc.returncode == 0 and "ok: no problems found" in proc.stdout, proc.stdout + proc.stderr


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rpc_server_takes_the_offloaded_layers():
    """A real llama.cpp RPC round trip on this machine: greedy output through the RPC device equals
    local output (F32 weights, so the same kernels give the same numbers)."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "specgen", "rpc-server", "--port", str(port), "--threads", "1"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline, listening = time.monotonic() + 30, False
        while not listening and time.monotonic() < deadline and server.poll() is None:  # poll until it listens
            with socket.socket() as s:
                listening = s.connect_ex(("127.0.0.1", port)) == 0
            if not listening:
                time.sleep(0.1)
        assert listening, f"rpc-server did not listen on {port}: {server.poll()=}"
        args = ["generate", "-m", F32, "--method", "plain", "-n", "12", "--json", "Name a colour."]
        remote = specgen(*args, "--rpc", f"127.0.0.1:{port}", "--gpu-layers", "99")
        assert remote.returncode == 0, remote.stderr
        local = specgen(*args)
        assert json.loads(remote.stdout)["text"] == json.loads(local.stdout)["text"]
    finally:
        server.kill()
        server.wait()


def test_rpc_server_unreachable_is_one_line():
    port = free_port()  # nothing listens there
    assert_one_line_error(gen("hi", "--rpc", f"127.0.0.1:{port}", "--gpu-layers", "99"), f"127.0.0.1:{port}")
