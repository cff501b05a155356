"""`specgen bench`: every method against plain decoding on the same prompts, interleaved, in one process.

Each trial runs one prompt with one method; trials are interleaved prompt by prompt (plain first),
so drift in machine speed hits every method alike.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from specgen.app.prompts import Prompt
from specgen.app.runner import Runner
from specgen.bench.suites import BenchPrompt
from specgen.core.stats import RunStats
from specgen.drafting import methods as M

WARMUP_TOKENS = 16
# specgen's plain decoding of the target itself where the bench's target is screened (bench beside
# llama.cpp): the row that tells screening's share of the lead over llama.cpp apart from speculation's.
UNSCREENED = "plain, unscreened"


@dataclass
class Trial:
    """One prompt run by one method (all its turns)."""
    prompt: BenchPrompt
    method: str
    repeat: int
    text: str
    stats: RunStats  # all turns
    finish_reason: str
    # Per turn, where a prompt has several (MT-bench's second turn reads the first's answer, so
    # drafting finds more there: the table shows each turn's speedup).
    answers: tuple[str, ...] = ()
    turn_stats: tuple[RunStats, ...] = ()


def parse_methods(spec: str | Sequence[str], constrained: bool = False) -> tuple[str, ...]:
    """"plain,lookup,auto" -> ("plain", "lookup", "auto"): the baselines always run, first: plain,
    and with `constrained` prompts jump-forward (methods.baselines)."""
    names = [M.get(m.strip(), "--methods", "expects a comma-separated list of").name for m in (spec.split(",") if isinstance(spec, str) else spec)
             if m.strip()]
    return tuple(dict.fromkeys([*M.baselines(constrained), *names]))


def conversations(prompt: BenchPrompt, answers: Sequence[str]) -> list[Prompt]:
    """The prompt of each turn: turn i follows the earlier turns and `answers` to them."""
    turns = [Prompt(0, prompt.turns[0], constraint=prompt.constraint, tools=prompt.tools)]
    for answer, question in zip(answers, prompt.turns[1:]):
        turns.append(turns[-1].followed_by(answer, question))
    return turns


def run_turns(runner: Runner, prompt: BenchPrompt, max_tokens: int | None = None) -> tuple[str, RunStats, str]:
    """All turns of a prompt, each fed after the model's own previous answer; stats summed over turns.
    Returns the answers joined by blank lines."""
    answers, per_turn, reason = run_answers(runner, prompt, max_tokens)
    return "\n\n".join(answers), total_of(per_turn), reason


def trial_seed(base: int | None, prompt_id: str, repeat: int, turn: int) -> int:
    """The seed of one turn of one prompt in one repeat, the same for every method: sampled, every
    method's text must then be plain's (core/race.py), and the bench counts those that are."""
    return ((base or 0) + zlib.crc32(f"{prompt_id}/{repeat}/{turn}".encode())) % 2**32


def run_answers(runner: Runner, prompt: BenchPrompt, max_tokens: int | None = None, repeat: int = 0
                ) -> tuple[list[str], list[RunStats], str]:
    """Each turn's answer and stats; and the last turn's finish reason."""
    answers, per_turn, reason = [], [], "length"
    for i in range(len(prompt.turns)):
        ask = runner.ask(conversations(prompt, answers)[i], max_tokens)
        if not ask.sampling.greedy:
            ask = replace(ask, sampling=replace(ask.sampling, seed=trial_seed(ask.sampling.seed, prompt.prompt_id,
                                                                               repeat, i)))
        done = runner.run(ask)
        per_turn.append(done.stats)
        answers.append(done.text)
        reason = done.finish_reason
    return answers, per_turn, reason


def total_of(per_turn: Sequence[RunStats]) -> RunStats:
    total = RunStats()
    for stats in per_turn:
        total.add(stats)
    return total


def schedule(prompts: Sequence[BenchPrompt], methods: Sequence[str], repeats: int) -> list[tuple[BenchPrompt, str, int]]:
    """Interleaved: for each repeat, for each prompt, every method (plain first) back to back."""
    return [(p, m, r) for r in range(repeats) for p in prompts for m in methods]


# Another tool's run of a prompt (llama.cpp's, say): given the prompt and plain's answers to its
# turns (a later turn follows plain's earlier answers), its answer and counters for each turn.
ExternalRun = Callable[[BenchPrompt, Sequence[str]], tuple[list[str], list[RunStats]]]


def run_bench(prompts: Sequence[BenchPrompt], runners: dict[str, Runner], repeats: int,
              on_trial: Callable[[Trial], None] = lambda t: None,
              external: dict[str, ExternalRun] | None = None) -> list[Trial]:
    """Warm up every method on the first prompt (not recorded), then run the schedule; `external`
    runs go right after specgen's methods on each prompt, interleaved as they are."""
    for runner in runners.values():
        run_turns(runner, BenchPrompt("warmup", "warmup", prompts[0].turns[:1]), WARMUP_TOKENS)
    trials = []
    plain_answers: dict[str, list[str]] = {}
    last_repeat = None
    for prompt, method, repeat in schedule(prompts, list(runners), repeats):
        if repeat != last_repeat:  # a prompt may draft from earlier prompts' texts, never from its own
            for runner in runners.values():  # (the warm-up's, or an earlier repeat's)
                runner.session.forget_texts()
            last_repeat = repeat
        answers, per_turn, reason = run_answers(runners[method], prompt, repeat=repeat)
        if method == "plain":
            plain_answers[prompt.prompt_id] = answers
        trial = Trial(prompt, method, repeat, "\n\n".join(answers), total_of(per_turn), reason, tuple(answers),
                      tuple(per_turn))
        trials.append(trial)
        on_trial(trial)
        if method == list(runners)[-1]:
            for name, run in (external or {}).items():
                answers, per_turn = run(prompt, plain_answers[prompt.prompt_id])
                trial = Trial(prompt, name, repeat, "\n\n".join(answers), total_of(per_turn), "length",
                              tuple(answers), tuple(per_turn))
                trials.append(trial)
                on_trial(trial)
    return trials


def in_process(runner: Runner, warmup: BenchPrompt) -> ExternalRun:
    """`runner` (a second session's, say) as a row beside the bench's own: warmed up once on
    `warmup`'s first turn as run_bench warms its methods, then each prompt's turns as plain runs them."""
    run_turns(runner, BenchPrompt("warmup", "warmup", warmup.turns[:1]), WARMUP_TOKENS)
    return lambda prompt, _plain_answers: run_answers(runner, prompt)[:2]
