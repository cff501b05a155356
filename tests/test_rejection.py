"""Rejection sampling over synthetic p and q: what verification emits is distributed as p, for
drawn children, for drawn children beside deterministic ones (lookup), and for a q that is zero
on tokens p likes (a vocabulary-subset draft); each test fails when its rule is broken. And the
overlap auto learns from is the exact acceptance of a drawn child."""

import numpy as np
import pytest

import chisquare
import specgen.core.verify as verify
from specgen.core.sampling import SamplingParams, distribution
from specgen.core.tree import DraftTree
from specgen.drafting.acceptance import SampledAcceptance

V = 8
PARAMS = SamplingParams(temperature=1.0)
RNG = np.random.default_rng(7)
P_LOGITS = RNG.normal(0.0, 1.2, (3, V)).astype(np.float32)  # the target's rows: root, depth 1, depth 2
Q_LOGITS = (P_LOGITS + RNG.normal(0.0, 1.0, (3, V))).astype(np.float32)  # a draft near it


def _draws(q: np.ndarray, k: int, rng: np.random.Generator) -> list[int]:
    picks, rest = [], q.copy()
    for _ in range(k):
        x = int(rng.choice(V, p=rest / rest.sum()))
        picks.append(x)
        rest[x] = 0.0
    return picks


def sampled_tree(rng, fixed=(), k=2, q_cut=()):
    """A root with deterministic children `fixed` (lookup tokens, each with one deterministic
    child) and k children drawn from q without them, each drawn child with one drawn child."""
    tree = DraftTree.root_only(0)
    logits_rows = [P_LOGITS[0]]
    q = distribution(Q_LOGITS[0], PARAMS)
    q[list(q_cut)] = 0.0
    q[list(fixed)] = 0.0
    q /= q.sum()
    for tok in fixed:
        v = tree.add(tok, 0)
        logits_rows.append(P_LOGITS[1])
        tree.add((tok + 1) % V, v)
        logits_rows.append(P_LOGITS[2])
    tree.q_rows[0] = q
    for x in _draws(q, k, rng):
        v = tree.add(x, 0, float(q[x]), drawn=True)
        logits_rows.append(P_LOGITS[1])
        q1 = distribution(Q_LOGITS[1], PARAMS)
        tree.q_rows[v] = q1
        tree.add(_draws(q1, 1, rng)[0], v, drawn=True)
        logits_rows.append(P_LOGITS[2])
    return tree, np.array(logits_rows)


def emitted(fixed=(), k=2, q_cut=(), n=12_000):
    """Counts of the first and second emitted tokens, and how many drafted tokens were accepted."""
    draft_rng, verify_rng = np.random.default_rng(1), np.random.default_rng(2)
    first, second, accepted = np.zeros(V), np.zeros((V, V)), 0
    for _ in range(n):
        tree, logits = sampled_tree(draft_rng, fixed, k, q_cut)
        verdict = verify.walk_rejection(tree, logits, PARAMS, verify_rng)
        accepted += len(verdict.path)
        first[verdict.tokens[0]] += 1
        if len(verdict.tokens) > 1:
            second[verdict.tokens[0], verdict.tokens[1]] += 1
    return first, second, accepted


def check(fixed=(), k=2, q_cut=()):
    first, second, accepted = emitted(fixed, k, q_cut)
    p0 = distribution(P_LOGITS[0], PARAMS)
    assert accepted > 2_000  # drafts were accepted: the test exercises the rule
    ok, why = chisquare.one_sample(first, p0)
    assert ok, f"first token: {why}"
    # The token after an accepted one: the target's depth-1 row, whichever child led there.
    after = second[[t for t in range(V) if second[t].sum() > 500]].sum(axis=0)
    ok, why = chisquare.one_sample(after, distribution(P_LOGITS[1], PARAMS))
    assert ok, f"second token: {why}"


def test_drawn_children_emit_p():
    check()


def test_deterministic_children_beside_drawn_ones_emit_p():
    check(fixed=(int(np.argmax(P_LOGITS[0])), 3))


def test_a_draft_blind_to_the_target_s_likely_tokens_emits_p():
    """q is zero on p's two likeliest tokens (a subset draft cut without them): they come from the residual."""
    cut = tuple(int(i) for i in np.argsort(-P_LOGITS[0])[:2])
    first, _, _ = emitted(q_cut=cut)
    assert first[list(cut)].sum() > 2_000
    check(q_cut=cut)


def test_accepting_with_p_alone_is_caught(monkeypatch):
    monkeypatch.setattr(verify, "accepts", lambda u, p_x, q_x: u < p_x)
    with pytest.raises(AssertionError):
        check()


def test_keeping_the_lookup_tokens_in_p_for_the_drawn_children_is_caught(monkeypatch):
    monkeypatch.setattr(verify, "outside", lambda p, tokens: p)
    with pytest.raises(AssertionError):
        check(fixed=(int(np.argmax(P_LOGITS[0])),))


def test_a_deterministic_tree_makes_plain_s_draws():
    """Without drawn children the rejection walk draws once per node, as sample-and-match does."""
    tree = DraftTree.chain(0, [3, 4])
    logits = P_LOGITS
    a = verify.walk_rejection(tree, logits, PARAMS, np.random.default_rng(3))
    rng = np.random.default_rng(3)
    b = verify.walk(tree, logits, lambda row: verify.draw(distribution(row, PARAMS), rng))
    assert a.tokens == b.tokens and a.path == b.path


def test_overlap_is_the_drawn_child_s_exact_acceptance_and_is_learned():
    """sum_x min(p, q) is the probability the first drawn child is accepted; SampledAcceptance's
    estimate converges on it from overlaps (not from 0/1 outcomes)."""
    draft_rng, verify_rng = np.random.default_rng(4), np.random.default_rng(5)
    p, q = distribution(P_LOGITS[0], PARAMS), distribution(Q_LOGITS[0], PARAMS)
    overlap = float(np.minimum(p, q).sum())
    hits, n = 0, 20_000
    for _ in range(n):
        tree, logits = sampled_tree(draft_rng, k=1)
        verdict = verify.walk_rejection(tree, logits, PARAMS, verify_rng)
        assert verdict.overlap[0] == pytest.approx(overlap)
        hits += bool(verdict.path)
    assert hits / n == pytest.approx(overlap, abs=0.015)

    est = SampledAcceptance(prior=0.2)
    for _ in range(200):
        est.observe(depth=1, confidence=float(q.max()), overlap=overlap)
    # Old evidence fades (about 50 observations' worth are kept), so the prior keeps a little weight.
    assert est.p(1, float(q.max())) == pytest.approx(overlap, abs=0.06)
    assert est.by_depth(2)[0] == pytest.approx(overlap, abs=0.06)
    assert est.by_depth(2)[1] == pytest.approx(est.by_depth(2)[0])  # depth 2 never seen: as depth 1
