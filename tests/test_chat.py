"""`specgen chat` on the real smollm2 instruct model: piped turns, a pseudo-terminal session
(commands, Ctrl-C mid-reply, Ctrl-D), the same text as `generate`, and a target without a template."""

import os
import re
import signal
import sys

import pytest

from clihelp import assert_one_line_error, specgen
from harness import GEMMA, SMOLLM2

pytestmark = pytest.mark.real

CHAT = ("chat", "-m", SMOLLM2, "--no-store", "-t", "0")
STATS = re.compile(r"^(\d+) tok · [\d.]+ tok/s · (\d+) target calls · τ ([\d.]+) .*prefill [\d.]+ s", re.M)


def test_piped_turns_reply_in_turn_and_the_second_drafts_from_the_first():
    proc = specgen(*CHAT, "-n", "24", input="What is the capital of France?\nRepeat your answer exactly.\n")
    assert proc.returncode == 0, proc.stderr
    stats = STATS.findall(proc.stderr)
    assert len(stats) == 2, proc.stderr
    assert proc.stdout.strip() and "> " not in proc.stdout  # piped: replies only, no prompt
    # The second reply repeats the first, which is in its prompt: auto drafts it from there
    # (RunStats.line names the steps when they were of more than one kind: lookup, history...).
    second = proc.stderr.strip().splitlines()[-1]
    accepted = re.search(r"accepted \d+% \((\d+)/\d+\)", second)
    assert accepted and int(accepted.group(1)) >= 8, second
    assert float(stats[1][2]) >= 2.0, second
    steps = re.search(r"steps: (.*?) ·", second)
    assert steps is None or re.search(r"\b(lookup|history|loop)\b", steps.group(1)), second


def test_each_turn_reads_only_its_new_tokens_and_answers_as_a_cold_read():
    """The conversation's earlier turns stay in the target's KV (core/kv.py PromptCache): the second
    turn's prefill keeps them (the stats line's "cached N") and reads only the new message; its
    reply is the one a whole read of the conversation gives (the prompt cache is exact)."""
    turns = "Name a colour.\nName another one.\n"
    options = ("--method", "plain", "-n", "12")
    proc = specgen(*CHAT, *options, input=turns)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if STATS.match(line)]
    assert len(lines) == 2 and "cached" not in lines[0], proc.stderr
    cached = re.search(r"\(cached (\d+)\)", lines[1])
    assert cached and int(cached.group(1)) >= 20, lines[1]  # the system header and the first turn, kept
    cold = specgen(*CHAT, *options, "--no-prompt-cache", input=turns)  # each turn read whole
    assert cold.returncode == 0 and "cached" not in cold.stderr, cold.stderr
    assert proc.stdout == cold.stdout and proc.stdout.strip(), (proc.stdout, cold.stdout)


def test_the_first_reply_is_what_generate_writes_through_the_same_chat_template():
    question = "Name three primary colours."
    options = ("--method", "plain", "-n", "24")  # plain: no batch-shape rounding of a quantized target
    alone = specgen("generate", "-m", SMOLLM2, "--no-store", *options, question)
    chatted = specgen(*CHAT, *options, input=question + "\n")
    assert alone.returncode == chatted.returncode == 0, alone.stderr + chatted.stderr
    assert alone.stdout.strip()
    assert chatted.stdout == alone.stdout


def test_a_target_without_a_chat_template_is_one_line_error(gemma):
    assert not gemma.chat_template  # a base model
    proc = specgen("chat", "-m", GEMMA, "--no-store", input="hello\n")
    assert_one_line_error(proc, f"specgen chat needs a model with a chat template; {GEMMA} has none "
                                f"(try -m {SMOLLM2})")


def test_a_bad_option_is_one_line_error():
    proc = specgen(*CHAT, "--top-p", "2", input="hello\n")
    assert_one_line_error(proc, "--top-p must be in (0, 1]")
    assert proc.returncode == 2


def test_terminal_session_commands_ctrl_c_mid_reply_and_ctrl_d():
    pexpect = pytest.importorskip("pexpect")
    # SIGINT as a terminal gives it: a suite run in the background (`make test &` from a script)
    # hands its children SIGINT ignored, and Python then never raises KeyboardInterrupt
    child = pexpect.spawn(sys.executable, ["-m", "specgen", *CHAT, "-n", "400"], encoding="utf-8", timeout=180,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                          env={**os.environ, "COLUMNS": "200"}, dimensions=(40, 200))
    try:
        child.expect_exact("> ")
        child.sendline("Say hello in one word.")
        child.expect(STATS)
        child.expect_exact("> ")
        child.sendline("/stats")
        child.expect(r"1 reply · \d+ tok · [\d.]+ tok/s")
        child.expect_exact("> ")
        child.sendline("/nope")
        child.expect("unknown command /nope; commands: /reset, /system, /stats, /exit, /help")
        child.expect_exact("> ")
        child.sendline("/reset")
        child.expect("conversation forgotten")
        child.expect_exact("> ")
        child.sendline("Write a long story about a dragon who learns to paint, with many chapters.")
        child.expect(r"Write a long story.*chapters\.\r\n")  # the echo; then the reply begins
        child.expect(r"\w+\W+\w+\W+\w+")
        child.sendintr()
        child.expect(STATS)
        assert int(child.match.group(1)) < 400, child.match.group(0)  # stopped mid-reply
        child.expect_exact("> ")  # and the chat goes on
        child.sendline("/stats")
        child.expect(r"2 replies · ")
        child.expect_exact("> ")
        child.sendline("What is 2 + 2?")
        child.expect(STATS)
        child.expect_exact("> ")
        child.sendintr()  # at the prompt: the line is dropped, the prompt comes back
        child.expect_exact("> ")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, (child.exitstatus, child.signalstatus)
