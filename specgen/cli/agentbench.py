"""`specgen bench --suite agent`: the agent suite's conversations through real servers (bench/agent.py)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from specgen.bench import agent, agent_summary
from specgen.bench.agent_suite import SUITE, load_agent_suite
from specgen.cli.render import count_progress, note
from specgen.errors import ConfigError
from specgen.files import check_writable, write_text

DEFAULT_MAX_TOKENS = 128  # per request: a call of the suite's tools fits
DEFAULT_CTX = 4096
LLAMA_SERVER = "llama-server"
DEFAULT_SPEC_TYPES = ("ngram-mod",)  # llama-server's n-gram drafting: no draft model needed


def run_agent_bench(target: str, split: str, limit: int | None, max_tokens: int | None, threads: int | None,
                    ctx: int | None, draft: str | None, json_file: Path | None, llama_cpp: Path | None,
                    spec_type: list[str] | None, llama_cpp_draft: str | None, turns: int | None = None,
                    answer_max_tokens: int | None = None, template: Path | None = None,
                    answer_choice: str | None = None) -> dict:
    """Run the bench, print its table, write --json; the report (bench's JSON object) is returned.
    `turns` (the first N of each conversation) and `answer_max_tokens` (the answers' limit, else
    -n's) keep a test's run small; `answer_choice` is the answers' tool_choice [auto]."""
    from specgen.models.manifest import describe
    from specgen.models.resolve import resolve
    from specgen.bench.drafts import gguf_facts
    from specgen.bench.results import machine_info, run_info
    from specgen.bench.agent_view import render
    from specgen.host import cpu_sample, others_cores
    from specgen.llama import backend, tools

    answer_choice = answer_choice or "auto"
    if answer_choice not in agent.ANSWER_CHOICES:
        raise ConfigError(f"--answer-tool-choice expects {' or '.join(agent.ANSWER_CHOICES)}, found {answer_choice!r}")
    if json_file is not None:
        check_writable(json_file, "--json")
    convs = load_agent_suite(split)[:limit] if limit else load_agent_suite(split)
    n_threads, n_ctx, n_max = threads or backend.default_threads(), ctx or DEFAULT_CTX, max_tokens or DEFAULT_MAX_TOKENS
    target_path = resolve(target)
    rows = agent.specgen_rows(target, n_threads, n_ctx, draft)
    their_draft = None
    if llama_cpp is not None:
        binary = Path(llama_cpp).expanduser() / LLAMA_SERVER
        if not binary.is_file():
            raise ConfigError(f"--llama-cpp expects a folder holding {LLAMA_SERVER}, found {str(llama_cpp)!r} without it")
        types = list(spec_type or DEFAULT_SPEC_TYPES)
        if llama_cpp_draft is not None:
            their_draft = resolve(llama_cpp_draft)
        needs = [t for t in types if t.startswith("draft")]
        if needs and their_draft is None:
            raise ConfigError(f"--spec-type {needs[0]} loads a draft: give --llama-cpp-draft MODEL too")
        if template is not None and not Path(template).expanduser().is_file():
            raise ConfigError(f"--llama-cpp-template expects a Jinja chat template file, found {str(template)!r}: no such file")
        rows += agent.llama_server_rows(binary, target_path, n_threads, n_ctx, types, their_draft,
                                        llama_cpp_draft, template=Path(template).expanduser() if template else None)
    elif spec_type or llama_cpp_draft or template:
        raise ConfigError(f"{'--spec-type' if spec_type else '--llama-cpp-draft' if llama_cpp_draft else '--llama-cpp-template'} "
                          "sets up llama-server: give --llama-cpp DIR too")
    names = [r.name for r in rows]
    n_requests = sum(2 * len(c.turns[:turns]) for c in convs)
    info = tools.build_info()
    cpu_at_start, run_at_start = cpu_sample(), run_info()
    records: list[dict] = []
    by_id = {c.prompt_id: c for c in convs}
    with tempfile.TemporaryDirectory(prefix="specgen-agent-") as logs:
        note(f"starting {len(rows)} servers: {', '.join(names)}")
        servers = agent.start_all(rows, Path(logs))
        interrupted = False
        try:
            with count_progress(n_requests, f"agent bench: {len(convs)} conversations, {n_requests} requests x "
                                f"{len(rows)} rows") as advance:
                for conv in convs:
                    agent.run_conversation(conv, servers, n_max, turns, on_exchange=lambda e: (
                        records.extend(agent.reply_record(by_id[e.prompt_id], e, n) for n in names), advance()),
                        answer_max_tokens=answer_max_tokens, answer_choice=answer_choice)
        except KeyboardInterrupt:
            interrupted = True  # report the requests every row answered, then exit 130
        finally:
            agent.stop_all(servers)
    machine = machine_info(n_threads, info)
    machine["others_cores"] = others_cores(cpu_at_start, cpu_sample())
    summary = agent_summary.summarize(records, names)
    report = {"run": run_at_start, "machine": machine,
              "models": {"target": {**describe(target, target_path), **gguf_facts(target_path)},
                         "draft": {**describe(draft, resolve(draft))} if draft else None,
                         "llama_cpp_draft": {**describe(llama_cpp_draft, their_draft), **gguf_facts(their_draft)}
                         if their_draft else None},
              "settings": {"suite": SUITE, "split": split, "n_prompts": len(convs), "turns": turns,
                           "max_tokens": n_max, "answer_max_tokens": answer_max_tokens or n_max,
                           "answer_tool_choice": answer_choice, "temperature": 0.0, "threads": n_threads, "ctx": n_ctx,
                           "repeats": 1, "interrupted": interrupted,
                           "llama_cpp_template": Path(template).name if template else None,
                           "methods": names, "baseline": agent.BASELINE},
              "rows": [{"name": r.name, "engine": r.engine, "command": r.command} for r in rows],
              "records": records, "summary": agent_summary.as_json(summary)}
    print(render(report, str(json_file) if json_file else "(not written)"))
    if json_file is not None:
        write_text(json_file, json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    if interrupted:
        raise KeyboardInterrupt
    return report
