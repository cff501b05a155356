"""How often each JSON layout ends in a finished, valid answer on `--suite json`: the measure the
default `--json-layout` is chosen by (docs/structured-output.md, "Which layout by default").

Greedy plain decoding (speculation writes the same text), each prompt of the suite under each layout;
an answer counts when the model finished it (finish_reason stop, not the length limit) and it is
valid: a response_format answer parses as JSON and validates against the suite's schema as written
(jsonschema); a tool answer holds at least one call, each to a function the request offered, with
arguments that validate against its parameters. Both halves of the suite are reported apart.

    python scripts/json_validity.py -m smollm2-135m-instruct-q4_1 --out docs/results/validity/DATE-json-layouts.json
    python scripts/json_validity.py --table docs/results/validity/DATE-json-layouts.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

LAYOUTS = ("compact", "free")
HALVES = ("tune", "report")


def valid_answer(text: str, finish_reason: str, schema: dict | None, tools: tuple[dict, ...], calls) -> bool:
    """Finished and valid against what the request asked for (see the module's docstring)."""
    import jsonschema

    if finish_reason != "stop":
        return False
    if tools:
        if not calls:
            return False
        by_name = {f["name"]: f["parameters"] for f in tools}
        for call in calls:
            if call.name not in by_name:
                return False
            try:
                jsonschema.validate(json.loads(call.arguments), by_name[call.name])
            except (ValueError, jsonschema.ValidationError):
                return False
        return True
    try:
        obj = json.loads(text)
        if schema is not None:
            jsonschema.validate(obj, schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def measure(target: str, max_tokens: int) -> dict:
    from specgen.app.config import build_config
    from specgen.app.prompts import Prompt
    from specgen.app.runner import Runner
    from specgen.app.session import load_session
    from specgen.bench.suites import half_of, load_suite
    from specgen.host import cpu_name

    cfg = build_config(None, {"target": target, "draft": None, "method": "plain", "max_tokens": max_tokens,
                              "store": False, "temperature": 0.0})
    session = load_session(cfg.loading, ["plain"], store_default=False)
    _, prompts = load_suite("json")
    schemas = _suite_schemas()
    rows = []
    for layout in LAYOUTS:
        runner = Runner(dataclasses.replace(cfg, json_layout=layout), session)
        for bp in prompts:
            prompt = Prompt(0, bp.turns[0], constraint=bp.constraint, tools=bp.tools)
            ask = runner.ask(prompt)
            done = runner.run(ask)
            answer = runner.answer(ask, done.text)
            tools = bp.tools.allowed() if bp.tools is not None else ()
            rows.append({"layout": layout, "prompt_id": bp.prompt_id, "group": bp.group, "half": half_of(bp.prompt_id),
                         "finish_reason": done.finish_reason, "n_tokens": done.stats.n_tokens,
                         "valid": valid_answer(done.text, done.finish_reason, schemas.get(bp.prompt_id), tools,
                                               answer.calls if answer is not None else ()),
                         "text": done.text})
            print(f"{layout:8} {bp.prompt_id:>3} {done.finish_reason:7} {rows[-1]['valid']}", file=sys.stderr)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"run": {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": commit},
            "machine": {"cpu": cpu_name(), "python": platform.python_version()},
            "settings": {"target": target, "method": "plain", "temperature": 0.0, "max_tokens": max_tokens,
                         "suite": "json"},
            "answers": rows}


def _suite_schemas() -> dict[str, dict]:
    """The schema each response_format prompt of the suite asks for, as written (not closed)."""
    from importlib import resources

    out = {}
    for line in resources.files("specgen").joinpath("suites/json.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        fmt = record.get("response_format") or {}
        if fmt.get("type") == "json_schema":
            out[str(record["question_id"])] = fmt["json_schema"]["schema"]
    return out


def table(path: Path) -> str:
    """A results file as docs/structured-output.md shows it: finished valid answers per layout and half."""
    data = json.loads(Path(path).read_text())
    s, m = data["settings"], data["machine"]
    lines = [f"*{data['run']['date'][:10]} · commit {data['run']['commit'][:10]} · {m['cpu']} · {s['target']}, "
             f"{s['method']} greedy, {s['max_tokens']} tokens, --suite {s['suite']} · results: "
             f"[{Path(path).name}](results/validity/{Path(path).name})*", "",
             "| layout | tune half | report half | all | cut at the length limit |", "|---|---|---|---|---|"]
    for layout in LAYOUTS:
        answers = [a for a in data["answers"] if a["layout"] == layout]

        def share(rows: list[dict]) -> str:
            return f"{sum(a['valid'] for a in rows)}/{len(rows)}"

        cut = sum(a["finish_reason"] == "length" for a in answers)
        lines.append(f"| `{layout}` | {share([a for a in answers if a['half'] == 'tune'])} | "
                     f"{share([a for a in answers if a['half'] == 'report'])} | {share(answers)} | {cut} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--table":
        print(table(Path(sys.argv[2])))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--target", default="smollm2-135m-instruct-q4_1")
    parser.add_argument("-n", "--max-tokens", type=int, default=256)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    data = measure(args.target, args.max_tokens)
    args.out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    print(table(args.out))


if __name__ == "__main__":
    main()
