"""Drafts whose vocabulary is a subset of the target's (FR-Spec): every draft method stays lossless
(greedy token for token, sampled in distribution), KV caches hold the committed text in draft ids,
and a map that disagrees with the tokenizers is refused in one line."""

from dataclasses import replace

import numpy as np
import pytest

import chisquare
from fakes import FakeModel, SubsetDraft
from harness import generated, run_of
from specgen.app.config import RunConfig
from specgen.costs.curve import CostCurve
from specgen.errors import ModelError
from specgen.drafting.methods import METHODS
from specgen.app.prompts import Prompt
from specgen.core.protocol import Batch
from specgen.app.runner import Runner
from specgen.app.session import open_session
from specgen.core.vocab import SubsetContext, SubsetMap, check_subset

LOOPY = {(3, 4): 5, (4, 5): 6, (5, 6): 3, (6, 3): 4}
KEEP = [0, 1, 2, 3, 4, 5, 6, 8, 9, 11, 13]  # 7, 10, 12, 14, 15 are missing: the draft cannot propose them
DRAFT_METHODS = ("chain", "tree", "staged", "auto")
FLAT = CostCurve([1, 32], [0.010, 0.012])


def session(target, draft, seed=None):
    cfg = RunConfig(target="t", draft="d", chat=False, max_tokens=40, seed=seed)
    chosen = [METHODS[m] for m in ("plain", *DRAFT_METHODS)]
    curves = lambda model, ctx: CostCurve([1, 32], [0.002, 0.0022]) if model is draft else CostCurve(FLAT.sizes, FLAT.seconds)
    return open_session(cfg.loading, chosen, target, draft, curves), cfg


def run(sess, cfg, method, text, **kw):
    runner = Runner(replace(cfg, method=method, **kw), sess)
    return runner.run(runner.ask(Prompt(0, text)))


def tokens(sess, cfg, method, text, **kw):
    """The generated token ids (and the run's stats): a text can hide tokens with empty pieces.
    `kw`: RunConfig's fields over session()'s `cfg`."""
    settings = {"seed": cfg.seed, **kw}
    n = settings.pop("max_tokens", cfg.max_tokens)
    run = run_of(method, text, on=sess, target=cfg.target, draft=cfg.draft, n=n, chat=cfg.chat, **settings)
    return run.tokens, run.stats


@pytest.mark.parametrize("text", ["\x03\x04\x05\x06\x03", "\x09\x08\x07\x0a", "\x0b"])
def test_every_draft_method_is_lossless_with_a_subset_draft(text):
    target = FakeModel(n_vocab=16, sharpness=2.0, script=LOOPY)
    draft = SubsetDraft(target, KEEP, noise=0.5)
    sess, cfg = session(target, draft)
    plain = run(sess, cfg, "plain", text)
    drafted = 0
    for method in DRAFT_METHODS:
        done = run(sess, cfg, method, text)
        assert done.text == plain.text, method
        drafted += done.stats.drafted
        if method != "auto":
            assert done.stats.accepted > 0, method  # the subset draft really drafts and is accepted
    assert drafted > 0


def test_the_draft_cache_holds_the_committed_text_in_draft_ids():
    target = FakeModel(n_vocab=16, sharpness=2.0, script=LOOPY)
    draft = SubsetDraft(target, KEEP, noise=0.5, unk=0)
    sess, cfg = session(target, draft)
    prompt = "\x03\x04\x05\x06\x03"
    generated, _ = tokens(sess, cfg, "chain", prompt, max_tokens=20)
    raw = sess.draft_ctx.inner
    assert set(raw.kv) == {0}
    held = [raw.kv[0][p] for p in sorted(raw.kv[0])]
    committed = target.tokenize(prompt) + generated
    to_draft = {t: i for i, t in enumerate(KEEP)}
    assert held == [to_draft.get(t, 0) for t in committed[:len(held)]] and len(held) >= len(committed) - 2


def test_subset_context_translates_tokens_and_names_its_columns():
    target = FakeModel(n_vocab=16)
    draft = SubsetDraft(target, KEEP, unk=2)
    ctx = SubsetContext(draft.new_context(64, n_seq_max=2), draft.subset_of_target, 16)
    out = ctx.decode(Batch([0, 7, 13], [0, 1, 2], [(0,), (0,), (0,)], [False, False, True]))
    assert ctx.inner.kv[0] == {0: 0, 1: 2, 2: KEEP.index(13)}  # 7 is not in the subset: unk
    assert out.shape == (1, len(KEEP)) and ctx.columns.tolist() == KEEP and ctx.n_vocab == 16


@pytest.mark.parametrize("method", ["chain", "tree"])
def test_sampled_output_with_a_subset_draft_matches_plain_distribution(method):
    """Rejection sampling with q over the subset (zero elsewhere): tokens the draft cannot propose
    still come out as often as plain sampling gives them."""
    target = FakeModel(n_vocab=6, sharpness=1.0, script={(2,): 3})
    draft = SubsetDraft(target, [0, 1, 2, 3], noise=1.0)  # 4 and 5 are missing
    n, runs = 3, 300
    plain, spec = np.zeros((n, 6)), np.zeros((n, 6))
    accepted = 0
    sess, cfg = session(target, draft)
    for seed in range(runs):
        p, _ = tokens(sess, cfg, "plain", "\x02\x03", max_tokens=n, temperature=1.0, seed=seed)
        s, stats = tokens(sess, cfg, method, "\x02\x03", max_tokens=n, temperature=1.0, seed=70_000 + seed)
        accepted += stats.accepted
        for counts, toks in ((plain, p), (spec, s)):
            for pos, tok in enumerate(toks):
                counts[pos, tok] += 1
    assert accepted > runs // 2  # drafts were accepted: rejection sampling was exercised
    for pos in range(n):
        ok, why = chisquare.two_sample(plain[pos], spec[pos])
        assert ok, f"position {pos}: {why}"


def test_a_map_that_disagrees_with_the_tokenizers_is_refused():
    target = FakeModel(n_vocab=16)
    draft = SubsetDraft(target, KEEP)
    check_subset(target, draft, draft.subset_of_target, "t", "d")
    swapped = np.array(KEEP)
    swapped[[5, 6]] = swapped[[6, 5]]
    with pytest.raises(ModelError, match=r"draft d \(a vocabulary subset\) does not match target t: draft token 5 "
                                         r"is b'<5>' but maps to target token 6, which is b'<6>'"):
        check_subset(target, draft, SubsetMap(swapped, 0), "t", "d")
    with pytest.raises(ModelError, match="its map has 3 ids for 11 draft tokens"):
        check_subset(target, draft, SubsetMap(np.array([0, 1, 2]), 0), "t", "d")


def test_the_cut_keeps_what_the_tokenizer_needs_and_the_most_used_normal_tokens():
    from specgen.llama.gguf import BYTE, CONTROL, NORMAL, USER_DEFINED, kept_ids

    tokens = ["<pad>", "<eos>", "<unused0>", "<0x0A>", "<start_of_turn>", "the", "cat", "zebra", "Ġ", "dog"]
    types = np.array([CONTROL, CONTROL, CONTROL, BYTE, USER_DEFINED, NORMAL, NORMAL, NORMAL, NORMAL, NORMAL])
    ranked = [9, 2, 5, 8, 7, 6]  # most used first; the control token 2 does not count as a normal token
    assert kept_ids(types, tokens, ranked, 2).tolist() == [0, 1, 3, 4, 5, 9]
    # A byte-level BPE vocabulary also keeps its byte characters ("Ġ" spells a space), ranked or not.
    assert kept_ids(types, tokens, ranked, 2, byte_level=True).tolist() == [0, 1, 3, 4, 5, 8, 9]


def test_count_use_ranks_what_the_model_writes_and_holds_out_greedy_texts():
    """Every 4th prompt is held out: its continuation is the model's greedy text (what plain greedy
    decoding writes), and it counts apart from the prompts that rank."""
    from specgen.models.selfdraft import HOLD_OUT, count_use

    a = FakeModel(n_vocab=40).tokenize("a", add_special=False)[0]
    model = FakeModel(n_vocab=40, sharpness=1.0, script={(a,): 30, (30,): 31, (31,): 30})  # after "a": 30 31 30 ..
    prompts = ["sofa", "a", "banana", "data", "pizza", "tea"]
    usage = count_use(model, prompts, max_tokens=12, parallel=4)
    assert len(usage.texts) == len([i for i in range(len(prompts)) if i % HOLD_OUT == 0]) == 2
    for (tokens, start), prompt in zip(usage.texts, [prompts[0], prompts[4]]):
        assert tokens[:start] == model.tokenize(prompt)
        greedy = generated(model, model.new_context(64), model.tokenize(prompt), 12).tokens
        assert tokens[start:] == greedy[:len(tokens) - start]
    # Soft counts: every position spreads one unit of p, plus one for the token there.
    n_positions = sum(len(model.tokenize(p)) for p in prompts) + sum(len(t) - s for t, s in usage.texts)
    assert usage.fit.sum() + usage.held_out.sum() >= n_positions
    assert usage.held_out.sum() < usage.fit.sum()
    assert sorted(usage.ranked().tolist()) == list(range(40)) and set(usage.ranked()[:2]) == {30, 31}


def test_chain_speed_prefers_agreement_and_cheapness():
    from specgen.models.selfdraft import chain_speed

    target = CostCurve([1, 4, 16], [0.040, 0.046, 0.070])  # a memory-bound target: batches are cheap
    assert chain_speed(0.9, 0.005, target) > chain_speed(0.8, 0.005, target)
    assert chain_speed(0.8, 0.004, target) > chain_speed(0.8, 0.008, target)
    assert chain_speed(0.0, 0.005, target) < 1 / 0.040  # a useless draft is slower than plain


def test_what_is_not_given_to_draft_derive_is_measured():
    """Left open, the body's type is a measured choice like the head's (Q2_K was once fixed: on
    gemma F32 its best candidate modelled 43.6 tok/s against Q4_K_M's 55.2)."""
    from specgen.models.selfdraft import candidate_bodies

    assert candidate_bodies(None, None) == [("Q2_K", None), ("Q2_K", "Q4_0"), ("Q2_K", "Q4_1"),
                                            ("Q4_K_M", None), ("Q4_K_M", "Q4_0"), ("Q4_K_M", "Q4_1")]
    assert candidate_bodies(None, "Q8_0") == [("Q2_K", "Q8_0"), ("Q4_K_M", "Q8_0")]
    assert candidate_bodies("Q4_0", None) == [("Q4_0", None), ("Q4_0", "Q4_1")]  # its own head is already Q4_0
    assert candidate_bodies("Q4_1", None) == [("Q4_1", None), ("Q4_1", "Q4_0")]
    assert candidate_bodies("Q2_K", "Q4_0") == [("Q2_K", "Q4_0")]


def test_a_cut_keeps_whole_groups_of_rows_for_the_packed_kernels():
    """specgen's packed layouts (q4_1x16, q5_0x16) take an output matrix of whole 16-row groups
    only: a cut keeps the next most used normal tokens until its rows fill the last group (gemma's
    Q4_1 head cut to 65,964 rows ran on the unpacked kernel, 1.45 ms a token against 0.77 at
    65,968), and never more normal tokens than there are."""
    from specgen.llama.gguf import CONTROL, NORMAL, TokenTable
    from specgen.models.selfdraft import CUT_ROWS, kept_rows

    assert CUT_ROWS == 16
    types = np.array([CONTROL] * 3 + [NORMAL] * 40)
    table = TokenTable(types, [f"<c{i}>" for i in range(3)] + [f"w{i}" for i in range(40)], False)
    ranked = np.arange(43)[::-1]  # the last normal tokens are the most used
    keep = kept_rows(table, ranked, 10)
    assert len(keep) == 16 and keep.tolist() == [0, 1, 2, *range(30, 43)]  # 3 controls, 13 normal tokens
    assert len(kept_rows(table, ranked, 13)) == 16  # already whole: no more
    assert len(kept_rows(table, ranked, 30)) == 43  # 48 would need more normal tokens than the 40 there are
