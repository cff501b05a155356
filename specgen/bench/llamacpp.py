"""`specgen bench --llama-cpp DIR`: the same prompts through llama.cpp's own speculative decoding.

Users ask "is this faster than llama.cpp?": given a folder with llama.cpp's examples built (e.g.
`../shared/tools/build-llama-cpp-examples.sh DIR`, or a llama.cpp checkout's build/bin), bench runs
each prompt through `llama-speculative-simple --spec-type T` for every configuration asked for,
and its rows sit beside specgen's in the table, as ratios to specgen's plain decoding measured in
the same run. llama.cpp prints its own decode time (prompt processing excluded, as ours is).

Its speed is taken over the tokens asked for (-n), not all it wrote. Once fewer than two tokens are
left to write, its draft limit becomes 0, which its drafters read as "no limit": the last step then
drafts up to 64 tokens and writes them past -n in one batch (asked for 64, it wrote 129 in one run),
which would inflate its tokens per second, while that large batch's time would weigh on a count cut
at -n. So each step's end is read from its debug log (`-v --log-timestamps`), and the speed is that
of the steps before the first one that started with no limit: N-1 or N tokens, over their time.
This leaves out one step that specgen's own count includes: it errs in llama.cpp's favour. A build
that logs no steps is taken at its own printed count. A run that stopped early counts its
end-of-generation token; specgen counts tokens of text, so that one is left out.

Beside them, where the folder also holds `llama-completion`, a row "llama.cpp plain": llama.cpp's own
one-token-at-a-time decoding of the target with the same sampling, timed by its own `eval time`
(the prompt excluded), so that the table answers "faster than the llama.cpp I use?" and not only
"faster than specgen's plain". Its text is compared like the others.

Its draft modes (draft-simple, the default with a draft) load the bench's draft, or where llama.cpp
cannot load that one (a vocabulary-cut `-d self`) the best it can: see drafts.py. The row's name
then says which draft it ran with.

A conversation's later turns get the context specgen's plain run had: the earlier questions and
plain's own answers, rendered exactly as specgen renders them, so both decode after the same text.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from specgen.app.runner import Runner
from specgen.app.session import Session
from specgen.bench.drafts import LlamaCppDraft
from specgen.bench.run import ExternalRun, conversations
from specgen.core.constraint import ConstraintSpec
from specgen.core.penalties import Penalties
from specgen.core.sampling import SamplingParams
from specgen.core.stats import RunStats
from specgen.errors import ConfigError, SpecgenError
from specgen.reporter import reporter

BINARY = "llama-speculative-simple"
PLAIN_BINARY = "llama-completion"
PLAIN_ROW = "llama.cpp plain"
# One run per configuration; a configuration may chain types ("draft-simple,ngram-map-k": llama.cpp
# then keeps, each step, the draft with the most expected accepted tokens).
DEFAULT_SPEC_TYPES = ("ngram-mod", "ngram-simple", "ngram-map-k", "ngram-cache")
WITH_DRAFT_SPEC_TYPES = ("draft-simple",)
TIMEOUT_S = 600

_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DECODED_AT = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) \w decoded\s", re.M)
_STEP = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) D accepted (\d+)/(\d+) draft tokens", re.M)
_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_EVAL = re.compile(r"^.*?\w:\s+eval time =\s+([\d.]+) ms /\s+(\d+) runs", re.M)
_END_OF_TEXT = " [end of text]\n"
_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
_ACCEPTED = re.compile(r"n_accept\s*=\s*(\d+)")


def method_name(spec_type: str, draft_label: str | None = None) -> str:
    """The table's row name for one llama.cpp configuration; a draft mode run with another draft
    than specgen's says which (drafts.py)."""
    return f"llama.cpp {spec_type}" + (f" ({draft_label})" if draft_label and "draft" in spec_type else "")


def find_binary(folder: Path) -> Path:
    """`folder`/llama-speculative-simple, or a one-line ConfigError naming what was found."""
    binary = Path(folder).expanduser() / BINARY
    if not Path(folder).expanduser().is_dir():
        raise ConfigError(f"--llama-cpp expects a folder holding {BINARY} (e.g. llama.cpp/build/bin), found "
                          f"{str(folder)!r} (no such folder)")
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise ConfigError(f"--llama-cpp expects a folder holding {BINARY} (e.g. llama.cpp/build/bin), found "
                          f"{str(folder)!r} without it (build it with: cmake --build build --target {BINARY})")
    return binary


def spec_types(given: list[str] | None, has_draft: bool) -> list[str]:
    """The configurations to run: as given, else the n-gram types (and draft-simple with a draft)."""
    chosen = list(given) if given else [*DEFAULT_SPEC_TYPES, *(WITH_DRAFT_SPEC_TYPES if has_draft else ())]
    for spec in chosen:
        if "draft" in spec and not has_draft:
            raise ConfigError(f"--spec-type {spec} needs a draft model (-d MODEL), found none")
    return chosen


@dataclass(frozen=True)
class Setup:
    """What every llama.cpp run of a bench shares."""

    binary: Path
    target: Path
    draft: Path | None
    max_tokens: int
    threads: int
    n_ctx: int
    sampling: SamplingParams = SamplingParams()


def sampling_flags(s: SamplingParams) -> list[str]:
    """The bench's sampling settings in llama.cpp's flags (greedy: top-k 1 makes its sampler an
    argmax, after the penalties as in specgen; llama.cpp's own top-k default of 40 would otherwise
    apply when sampling)."""
    base = (["--temp", "0", "--top-k", "1"] if s.greedy else
            ["--temp", f"{s.temperature:g}", "--top-k", str(s.top_k), "--top-p", f"{s.top_p:g}", "--min-p",
             f"{s.min_p:g}", *(["--seed", str(s.seed)] if s.seed is not None else [])])
    return base + penalty_flags(s.penalties)


def penalty_flags(pen: Penalties) -> list[str]:
    """logit_bias and the penalties in llama.cpp's flags (none when they are off)."""
    out = [] if not pen.penalizes else [
        "--repeat-penalty", repr(pen.repeat), "--repeat-last-n", str(pen.last_n),
        "--presence-penalty", repr(pen.presence), "--frequency-penalty", repr(pen.frequency)]
    for token, bias in pen.bias:
        out += ["--logit-bias", f"{token}{'-' if bias < 0 else '+'}{abs(bias)!r}"]
    return out


def constraint_flags(spec: ConstraintSpec | None) -> list[str]:
    """A prompt's constraint in llama.cpp's flags: -j for a JSON Schema (its own converter, which lets
    the model choose whitespace where specgen's grammar fixes json.dumps's layout), --grammar for
    GBNF. Lark and regex grammars have no llama.cpp flag: a ConfigError."""
    if spec is None:
        return []
    if spec.kind == "json_schema":
        return ["-j", spec.text]
    if spec.kind == "json_object":
        return ["-j", '{"type": "object"}']
    if spec.kind == "gbnf":
        return ["--grammar", spec.text]
    raise ConfigError(f"--llama-cpp runs constrained prompts with -j or --grammar; a {spec.kind} grammar has no "
                      "llama.cpp flag (a tool call in a template's own format, say)")


def command(setup: Setup, spec_type: str, prompt: str, constraint: ConstraintSpec | None = None) -> list[str]:
    cmd = [str(setup.binary), "-m", str(setup.target), "-p", prompt, "-n", str(setup.max_tokens),
           *constraint_flags(constraint),
           *sampling_flags(setup.sampling),
           "-c", str(setup.n_ctx), "-b", str(setup.n_ctx), "-ub", "512", "-t", str(setup.threads),
           "--spec-type", spec_type, "-v", "--log-timestamps"]  # each step's end: see the module's note
    if setup.draft is not None and "draft" in spec_type:
        cmd += ["-md", str(setup.draft), "-td", str(setup.threads)]
    return cmd


def parse(stdout: str, stderr: str, prompt: str, max_tokens: int | None = None) -> tuple[str, RunStats]:
    """The generated text and the counters llama-speculative-simple prints at its end; with
    `max_tokens`, the counters are of the steps that wrote the tokens asked for (the module's note)."""
    log = stdout + "\n" + stderr
    decoded, encoded = _DECODED.search(log), _ENCODED.search(log)
    if decoded is None:
        raise SpecgenError(f"{BINARY} printed no 'decoded N tokens' line: {_last_line(stderr) or 'no output'}")
    n_tokens, drafted = int(decoded.group(1)), _int(_DRAFTED, log)
    accepted = _int(_ACCEPTED, log)
    stats = RunStats(n_tokens=n_tokens, n_committed=n_tokens, target_calls=max(1, n_tokens - accepted),
                     drafted=drafted, accepted=accepted, decode_s=float(decoded.group(2)),
                     prefill_s=float(encoded.group(2)) if encoded else 0.0)
    if max_tokens is not None and n_tokens > max_tokens:
        stats = _within(stats, log, max_tokens)
    elif max_tokens is not None and n_tokens > 0:
        # Fewer than asked: it stopped at an end-of-generation token, which its count includes and
        # specgen's (tokens of text) does not.
        stats = replace(stats, n_tokens=n_tokens - 1)
    return _generated(stdout, prompt), stats


@dataclass(frozen=True)
class _Step:
    end_s: float  # the log's clock when the step had sampled its tokens
    accepted: int
    drafted: int


def _seconds(match: re.Match) -> float:
    minutes, seconds, ms, us = (int(g) for g in match.groups()[:4])
    return minutes * 60 + seconds + ms / 1e3 + us / 1e6


def _within(stats: RunStats, log: str, max_tokens: int) -> RunStats:
    """A run that wrote past `max_tokens`, counted over its steps before the first one that began
    with fewer than two tokens left (hence no draft limit): see the module's note. The printed
    totals where the log has no steps, or steps that do not add up to them."""
    steps = [_Step(_seconds(m), int(m.group(5)), int(m.group(6))) for m in _STEP.finditer(log)]
    ended = _DECODED_AT.search(log)
    if ended is None or sum(s.accepted + 1 for s in steps) != stats.n_tokens:
        return stats
    start_s = _seconds(ended) - stats.decode_s
    written, counted = 0, 0
    for step in steps:
        if written >= max_tokens - 1:
            break
        written, counted = written + step.accepted + 1, counted + 1
    if counted in (0, len(steps)):
        return stats  # no limited step (-n 1), or no unlimited one: nothing to leave out
    kept = steps[:counted]
    return replace(stats, n_tokens=written, n_committed=written, target_calls=counted,
                   drafted=sum(s.drafted for s in kept), accepted=sum(s.accepted for s in kept),
                   decode_s=kept[-1].end_s - start_s)


def _int(pattern: re.Pattern, text: str) -> int:
    found = pattern.search(text)
    return int(found.group(1)) if found else 0


def _generated(stdout: str, prompt: str) -> str:
    """stdout is a blank line, the prompt echoed token by token (after a BOS piece), the generated
    text, and a blank line: the text after the echo's first whole copy of the prompt."""
    body = stdout[2:] if stdout.startswith("\n\n") else stdout
    body = body[:-2] if body.endswith("\n\n") else body
    at = body.find(prompt)
    if at >= 0:
        return body[at + len(prompt):]
    anchor = prompt.rstrip()[-64:]  # an echo that differs in whitespace: from the prompt's end
    at = body.find(anchor) if anchor else -1
    return body[at + len(anchor):] if at >= 0 else body


def clip_to(text: str, reference: str) -> str:
    """llama-speculative-simple stops after the step that passes -n, so it can write more tokens
    than asked: a text that starts with `reference` is cut to it (it wrote the same, then more)."""
    return reference if text.startswith(reference) else text


def plain_command(setup: Setup, prompt: str, constraint: ConstraintSpec | None = None) -> list[str]:
    """llama-completion on the same prompt, sampling and threads, the prompt not echoed, no chat
    mode (the prompt is already rendered with the template, as specgen's plain run read it)."""
    return [str(setup.binary.parent / PLAIN_BINARY), "-m", str(setup.target), "-p", prompt,
            *constraint_flags(constraint), "-n",
            str(setup.max_tokens), *sampling_flags(setup.sampling), "-c", str(setup.n_ctx), "-b", "512", "-ub", "512", "-t", str(setup.threads),
            "-no-cnv", "--no-display-prompt", "--no-warmup"]


def parse_plain(stdout: str, stderr: str) -> tuple[str, RunStats]:
    """The text llama-completion wrote and its decode speed: `eval time = T ms / N runs` counts the
    one-token decodes after the prompt (the first token comes from the prompt's own pass)."""
    found = _EVAL.search(stderr + "\n" + stdout)
    if found is None:
        raise SpecgenError(f"{PLAIN_BINARY} printed no 'eval time' line: {_last_line(stderr) or 'no output'}")
    runs, seconds = int(found.group(2)), float(found.group(1)) / 1000
    text = stdout[: -len(_END_OF_TEXT)] if stdout.endswith(_END_OF_TEXT) else stdout
    text = text[:-2] if text.endswith("\n\n") else text  # it ends its output with a blank line
    return text, RunStats(n_tokens=runs, n_committed=runs, target_calls=runs, decode_s=seconds)


def _last_line(text: str) -> str:
    """The last non-blank line of a tool's log, for a one-line error."""
    return next((line.strip() for line in reversed(text.strip().splitlines()) if line.strip()), "")


def _execute(cmd: list[str], label: str) -> subprocess.CompletedProcess:
    """Run one llama.cpp tool; a timeout or a failure is a one-line SpecgenError naming `label`."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SpecgenError(f"{label} ran past {TIMEOUT_S} s") from None
    if proc.returncode != 0:
        raise SpecgenError(f"{label} failed with exit code {proc.returncode}: {_last_line(proc.stderr)}")
    return proc


def run_plain(setup: Setup, prompt: str, constraint: ConstraintSpec | None = None) -> tuple[str, RunStats]:
    proc = _execute(plain_command(setup, prompt, constraint), PLAIN_BINARY)
    return parse_plain(proc.stdout, proc.stderr)


def run(setup: Setup, spec_type: str, prompt: str, constraint: ConstraintSpec | None = None) -> tuple[str, RunStats]:
    proc = _execute(command(setup, spec_type, prompt, constraint), f"{BINARY} --spec-type {spec_type}")
    return parse(proc.stdout, proc.stderr, prompt, setup.max_tokens)


def bench_runs(binary: Path, given: list[str] | None, session: Session, plain: Runner, n_threads: int,
               draft: LlamaCppDraft | None = None) -> dict[str, ExternalRun]:
    """bench's external runs: one per llama.cpp --spec-type, each prompt's turns rendered as specgen's
    plain run read them (its own answers before a later turn). `draft`: what its draft modes load
    (drafts.for_llama_cpp: a vocabulary-cut draft's whole-vocabulary form, say)."""
    types = spec_types(given, draft is not None)
    # The target itself, never its screened copy (screen.py): that one's logits are exact only
    # where specgen patches them, and llama.cpp would decode its cheaper approximate ones.
    setup = Setup(binary, Path(session.target.source_path), draft.path if draft is not None else None,
                  plain.cfg.max_tokens, n_threads, plain.cfg.ctx, plain.cfg.sampling)

    def runner(spec: str | None) -> ExternalRun:
        def run_prompt(prompt, answers):
            texts, per_turn = [], []
            for conversation, answer in zip(conversations(prompt, answers), answers):
                rendered, constraint = plain.prompt_text(conversation), plain.constraint_for(conversation)
                text, stats = (run_plain(setup, rendered, constraint) if spec is None
                               else run(setup, spec, rendered, constraint))
                texts.append(text if spec is None else clip_to(text, answer))
                per_turn.append(stats)
            return texts, per_turn
        return run_prompt

    rows = {method_name(spec, draft.label if draft is not None else None): runner(spec) for spec in types}
    if (binary.parent / PLAIN_BINARY).is_file():
        rows = {PLAIN_ROW: runner(None), **rows}
    else:
        reporter().warn(f"no {PLAIN_BINARY} in {binary.parent}: the table has no row for llama.cpp's own plain "
                        "decoding (build it with: cmake --build build --target llama-completion)")
    return rows
