#!/usr/bin/env python3
"""Greedy agreement of draft models with their target: how often a draft's argmax equals the
target's, over held-out text, as `specgen draft derive` measures it when it chooses a draft.

The text: the prompts `-d self` holds out when it ranks vocabularies (every 4th of the shipped
suites/vocabulary.jsonl), each continued greedily for -n tokens by the first draft given. Then the
target and every draft read that text once (teacher-forced) and their argmaxes are compared at
every continuation token. A vocabulary-cut draft is read through its mapping to target ids.

    python scripts/draft_agreement.py gemma-3-270m-f32 gemma-3-270m-f32-self gemma-3-270m-q2_k
"""

from __future__ import annotations

import argparse
import time

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="a models.txt name or a GGUF path")
    parser.add_argument("drafts", nargs="+", help="models.txt names or GGUF paths; the first writes the text")
    parser.add_argument("-n", "--max-tokens", type=int, default=64, help="continuation tokens per prompt [64]")
    args = parser.parse_args()
    target = LlamaModel(resolve(args.target))
    drafts = {spec: LlamaModel(resolve(spec)) for spec in args.drafts}
    started = time.perf_counter()
    texts = held_out_texts(drafts[args.drafts[0]], target.n_vocab, args.max_tokens)
    reference = np.array(greedy_predictions(context(target, target.n_vocab), texts))
    print(f"{len(texts)} held-out prompts, {len(reference)} continuation tokens written by {args.drafts[0]}")
    for spec, model in drafts.items():
        agreement = np.mean(np.array(greedy_predictions(context(model, target.n_vocab), texts)) == reference)
        print(f"{spec}: greedy agreement with {args.target} {agreement:.3f}")
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
