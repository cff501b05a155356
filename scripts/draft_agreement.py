#!/usr/bin/env python3
"""Greedy agreement of draft models with their target: how often a draft's argmax equals the
target's, over held-out text, as `specgen draft derive` measures it when it chooses a draft.

The text: the prompts `-d self` holds out when it ranks vocabularies (every 4th of the shipped
suites/vocabulary.jsonl), each continued greedily for -n tokens by the first draft given. Then the
target and every draft read that text once (teacher-forced) and their argmaxes are compared at
every continuation token. A vocabulary-cut draft is read through its mapping to target ids.

    python scripts/draft_agreement.py gemma-3-270m-f32 gemma-3-270m-f32-self gemma-3-270m-q2_k

`--json FILE` keeps the result (models with their sha256 and GGUF facts, the counts, when, from
which commit, on which CPU); `table(FILE)` renders it as docs/measurements.md shows it between its
`<!-- agreement-table: FILE -->` markers (tests/test_bench_report.py checks the page against the file).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from specgen.models.resolve import resolve
from specgen.models.selfdraft import HOLD_OUT, RANK_PROMPT_TOKENS, greedy_predictions, ranking_prompts
from specgen.core.kv import evaluate
from specgen.core.protocol import Batch
from specgen.core.vocab import SubsetContext
from specgen.llama.backend import LlamaModel


def context(model: LlamaModel, n_vocab: int):
    ctx = model.new_context(1024, n_batch=64)
    return ctx if model.subset_of_target is None else SubsetContext(ctx, model.subset_of_target, n_vocab)


def held_out_texts(writer: LlamaModel, n_vocab: int, max_tokens: int) -> list[tuple[list[int], int]]:
    """Every HOLD_OUT-th ranking prompt and `writer`'s greedy continuation of it."""
    ctx, texts = context(writer, n_vocab), []
    for prompt in [p for i, p in enumerate(ranking_prompts()) if i % HOLD_OUT == 0]:
        tokens = writer.tokenize(prompt)[:RANK_PROMPT_TOKENS]
        ctx.clear()
        row, out = evaluate(ctx, tokens), []
        for _ in range(max_tokens):
            best = int(np.argmax(row))
            token = best if ctx.columns is None else int(ctx.columns[best])
            if writer.is_eog(token):
                break
            out.append(token)
            batch = Batch()
            batch.add(token, len(tokens) + len(out) - 1, (0,), True)
            row = ctx.decode(batch)[0]
        texts.append((tokens + out, len(tokens)))
    return texts


def describe_model(spec: str, path: Path) -> dict:
    """name, sha256 and GGUF facts (quantization, output matrix, vocabulary and whether it was cut)."""
    from specgen.models.manifest import remembered_sha256
    from specgen.bench.drafts import gguf_facts

    name = Path(spec).stem if Path(spec).suffix == ".gguf" else spec
    return {"name": name, "sha256": remembered_sha256(path), **gguf_facts(path)}


def _link(path: Path) -> str:
    """The file as docs/measurements.md links it: from its `results` folder on."""
    parts = path.resolve().parts
    return "/".join(parts[len(parts) - 1 - parts[::-1].index("results"):])


def table(path: Path) -> str:
    """The markdown measurements.md shows for one --json file: a caption and a row per draft."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    run, target = data["run"], data["target"]
    lines = [f"*{run['date'][:10]} · commit {run['commit'][:10]} · {data['cpu']} · target {target['name']} · "
             f"{data['n_prompts']} held-out prompts, {data['n_tokens']:,} tokens written by {data['writer']} · "
             f"results: [{Path(path).name}]({_link(Path(path))})*", "",
             "| draft | quantization | output matrix | vocabulary | agreement | sha256 |", "|---|---|---|---|---|---|"]
    for d in data["drafts"]:
        vocab = f"cut to {d['n_vocab']:,}" if d.get("vocabulary_cut") else f"{d.get('n_vocab', 0):,}"
        lines.append(f"| {d['name']} | {d.get('file_type', '?')} | {d.get('head_type', '?')} | {vocab} | "
                     f"{d['agreement']:.3f} ({d['agreed']:,}/{data['n_tokens']:,}) | `{d['sha256'][:12]}` |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="a models.txt name or a GGUF path")
    parser.add_argument("drafts", nargs="+", help="models.txt names or GGUF paths; the first writes the text")
    parser.add_argument("-n", "--max-tokens", type=int, default=64, help="continuation tokens per prompt [64]")
    parser.add_argument("--json", type=Path, help="write the result here (see table())")
    args = parser.parse_args()
    paths = {spec: resolve(spec) for spec in [args.target, *args.drafts]}
    target = LlamaModel(paths[args.target])
    drafts = {spec: LlamaModel(paths[spec]) for spec in args.drafts}
    started = time.perf_counter()
    texts = held_out_texts(drafts[args.drafts[0]], target.n_vocab, args.max_tokens)
    reference = np.array(greedy_predictions(context(target, target.n_vocab), texts))
    print(f"{len(texts)} held-out prompts, {len(reference)} continuation tokens written by {args.drafts[0]}")
    rows = []
    for spec, model in drafts.items():
        agreed = int(np.sum(np.array(greedy_predictions(context(model, target.n_vocab), texts)) == reference))
        rows.append({**describe_model(spec, paths[spec]), "agreed": agreed, "agreement": agreed / len(reference)})
        print(f"{spec}: greedy agreement with {args.target} {agreed / len(reference):.3f}")
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.json:
        from specgen.bench.results import run_info
        from specgen.host import cpu_name

        out = {"run": {**run_info(), "command": ["python", "scripts/draft_agreement.py", *sys.argv[1:]]}, "cpu": cpu_name(), "target": describe_model(args.target, paths[args.target]),
               "writer": rows[0]["name"], "n_prompts": len(texts), "n_tokens": len(reference),
               "max_tokens": args.max_tokens, "drafts": rows}
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
