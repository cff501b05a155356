"""Speculative decoding with the lookup drafter against plain decoding on the fake backend:
same tokens greedy and, seed for seed, same tokens sampled (sample-and-match draws exactly what plain
decoding draws), and a KV cache that holds exactly the committed text after every step."""

import numpy as np
import pytest

import chisquare
from fakes import FakeContext, FakeModel
from harness import generated
from specgen.drafting.lookup import LookupDrafter, continuation_tree
from specgen.core.sampling import SamplingParams
from specgen.core.tree import DraftTree
from specgen.core.verify import walk

# A model that often repeats what it said, so lookup drafts get accepted and rejected.
LOOPY = {(3, 4): 5, (4, 5): 6, (5, 6): 3, (6, 3): 4}


def run(model, prompt, max_tokens, sampling, drafter=None):
    ctx = FakeContext(model, n_ctx=512, n_seq_max=8)
    done = generated(model, ctx, prompt, max_tokens, sampling, drafter)
    return done.token_events, done.finish, done.stats, ctx


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(0.8, seed=1),
                                      SamplingParams(1.0, top_k=5, seed=2), SamplingParams(0.7, top_p=0.9, seed=3)])
@pytest.mark.parametrize("prompt", [[0, 3, 4, 5, 6, 3, 4], [0, 9, 8, 7], [0, 3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5]])
def test_lookup_matches_plain_token_for_token(sampling, prompt):
    model = FakeModel(n_vocab=12, sharpness=1.5, script=LOOPY)
    plain, pf, ps, _ = run(model, prompt, 40, sampling)
    spec, sf, ss, ctx = run(model, prompt, 40, sampling, drafter=LookupDrafter())
    assert [e.token for e in spec] == [e.token for e in plain]
    assert sf.reason == pf.reason and ss.n_tokens == ps.n_tokens
    # Committed text is exactly sequence 0, and no other sequence keeps anything.
    committed = prompt + [e.token for e in spec]
    assert set(ctx.kv) == {0}
    kv = ctx.kv[0]
    assert [kv[p] for p in sorted(kv)] == committed[:len(kv)]


def test_lookup_drafts_get_accepted_and_counted():
    model = FakeModel(n_vocab=12, script=LOOPY)
    spec, _, stats, _ = run(model, [0, 3, 4, 5, 6, 3, 4], 30, SamplingParams(),
                            drafter=LookupDrafter())
    assert stats.drafted > 0 and stats.accepted > 0
    assert stats.target_calls < 30 and stats.mean_accepted > 1.5
    assert sum(stats.accepted_lengths.values()) == stats.target_calls
    assert any(e.from_draft for e in spec) and not all(e.from_draft for e in spec)


def test_sampled_distribution_matches_plain_chi_square():
    """Independent seeds for the two methods: token-frequency agreement at each position."""
    model = FakeModel(n_vocab=6, sharpness=1.0, script={(2,): 3, (3,): 2})
    prompt, n, runs = [0, 2, 3, 2, 3], 3, 300
    freq = {m: np.zeros((n, 6)) for m in ("plain", "spec")}
    for seed in range(runs):
        p = run(model, prompt, n, SamplingParams(1.0, seed=seed))[0]
        s = run(model, prompt, n, SamplingParams(1.0, seed=10_000 + seed),
                drafter=LookupDrafter())[0]
        for pos, e in enumerate(p):
            freq["plain"][pos, e.token] += 1
        for pos, e in enumerate(s):
            freq["spec"][pos, e.token] += 1
    for pos in range(n):
        ok, why = chisquare.two_sample(freq["plain"][pos], freq["spec"][pos])
        assert ok, f"position {pos}: {why}"


def test_walk_descends_matching_children_then_bonus():
    tree = DraftTree.root_only(7)
    a = tree.add(1, 0)
    tree.add(2, 0)
    c = tree.add(3, a)
    logits = np.zeros((4, 5))
    logits[0, 1] = logits[a, 3] = logits[c, 4] = 1.0  # target: root->1, 1->3, 3->4
    verdict = walk(tree, logits, lambda row, depth: int(np.argmax(row)))
    assert verdict.path == [a, c] and verdict.tokens == [1, 3, 4]


def test_tree_branch_sequence_ids():
    tree = DraftTree([9, 1, 2, 3, 4, 5], [-1, 0, 0, 1, 1, 2])
    assert tree.depths() == [0, 1, 1, 2, 2, 2]
    assert tree.leaves() == [3, 4, 5]
    assert tree.branch_seq_ids() == [(0, 1, 2), (0, 1), (2,), (0,), (1,), (2,)]
    assert tree.path_to(4) == [1, 4]


def test_lookup_prefers_longest_match_and_needs_recurring_single_tokens():
    d = LookupDrafter(max_n=3)
    d.reset([1, 2, 3, 9, 9, 2, 3, 7, 8, 1, 2, 3])
    # "1 2 3" occurred at the start, followed by 9 9; "2 3" alone last continued with 7.
    assert d.lookup(2) == [9, 9]
    d.reset([5, 6, 7, 8, 6])
    assert d.lookup(3) == []  # "6" seen once before: too weak to draft from
    d.reset([5, 6, 7, 6, 8, 6])
    assert d.lookup(2) == [8, 6]  # "6" recurred: its latest continuation


def test_lookup_continuations_carry_how_far_each_match_reaches_back():
    d = LookupDrafter(max_n=2)
    text = [1, 2, 3, 4, 5, 6, 7, 90, 91, 8, 6, 7, 92, 2, 3, 4, 5, 6, 7]
    d.reset(text)
    found = d.continuations(d.matches(d.tokens, 2), 2)
    tree, sources, match_len = continuation_tree(d.tokens[-1], found, max_depth=2)
    # "6 7" occurred twice: after "1 2 3 4 5" (the text's last 6 tokens match there) and after "8".
    first = tree.children()[0]
    by_token = {tree.tokens[v]: match_len[v] for v in first}
    assert by_token == {90: 6, 92: 2} and set(sources[1:]) == {"lookup"}
    assert all(match_len[c] == match_len[v] for v in first for c in tree.children()[v])


def test_a_copy_that_reaches_the_text_end_goes_round_the_loop():
    """A base model repeating a line: what followed the last repeat runs into the text's end; the
    draft goes on with the loop (llama.cpp's ngram-mod drafts loops the same way)."""
    d = LookupDrafter()
    d.reset([7, 1, 2, 3, 1, 2, 3, 1, 2])
    assert d.lookup(8) == [3, 1, 2, 3, 1, 2, 3, 1]


def test_a_match_that_overlaps_itself_is_a_loop_and_a_short_one_is_not():
    d = LookupDrafter()
    d.reset([7] + [1, 2, 3] * 4)  # the last 9 tokens match 3 tokens earlier: the line repeated 4 times
    found = d.continuations(d.matches(d.tokens, 1), 6)[0]  # the longest match first
    assert found.source == "loop" and found.match_len >= 9 and found.tokens == [1, 2, 3, 1, 2, 3]
    d.reset([7, 1, 2, 3, 1, 2, 3])  # twice, but only 3 matched tokens: too little to call a loop
    found = d.continuations(d.matches(d.tokens, 1), 6)[0]
    assert found.source == "lookup" and found.match_len == 3
