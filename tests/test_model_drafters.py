"""chain / tree / staged drafting with a draft model on the fake backend: lossless against plain,
KV caches that hold exactly the committed text, and the self-draft property."""

import pytest

from fakes import FakeContext, FakeModel, NoisyDraft
from harness import generated
from specgen.drafting.lookup import LookupDrafter
from specgen.drafting.model import ModelDrafter, Staged
from specgen.core.sampling import SamplingParams

LOOPY = {(3, 4): 5, (4, 5): 6, (5, 6): 3, (6, 3): 4}
METHODS = {
    "chain": dict(branching=1, max_nodes=5, min_prob=0.2),
    "tree": dict(branching=3, max_nodes=8, max_depth=4),
    "staged": dict(branching=2, max_nodes=8, max_depth=6, lookup=True),
}


def drafter(model, sampling, kw, n_seq_max=64):
    kw = dict(kw)
    lookup = LookupDrafter() if kw.pop("lookup", False) else None
    ctx = FakeContext(model, n_ctx=512, n_seq_max=n_seq_max)
    model = ModelDrafter(ctx, sampling, lookup=lookup, **kw)
    return (model if lookup is None else Staged(model, lookup)), ctx


def run_plain(target, prompt, n, sampling):
    return generated(target, FakeContext(target, n_ctx=512, n_seq_max=1), prompt, n, sampling).tokens


def run_spec(target, draft_model, prompt, n, sampling, kw):
    d, dctx = drafter(draft_model, sampling, kw)
    ctx = FakeContext(target, n_ctx=512, n_seq_max=32)
    done = generated(target, ctx, prompt, n, sampling, d)
    return done.token_events, done.stats, ctx, dctx, d


def committed_kv(ctx):
    assert set(ctx.kv) <= {0}, f"stale sequences left: {sorted(ctx.kv)}"
    kv = ctx.kv.get(0, {})
    assert sorted(kv) == list(range(len(kv))), "holes in the committed sequence"
    return [kv[p] for p in sorted(kv)]


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("prompt", [[0, 3, 4, 5, 6, 3], [0, 9, 8, 7, 10], [0, 2]])
def test_greedy_equals_plain_and_caches_hold_committed_text(method, prompt):
    target = FakeModel(n_vocab=16, sharpness=2.0, script=LOOPY)
    draft = NoisyDraft(target, noise=1.5)
    spec, stats, ctx, dctx, d = run_spec(target, draft, prompt, 40, SamplingParams(), METHODS[method])
    tokens = [e.token for e in spec]
    assert tokens == run_plain(target, prompt, 40, SamplingParams())
    text = prompt + tokens
    assert committed_kv(ctx) == text[:len(committed_kv(ctx))]
    assert committed_kv(dctx) == text[:len(committed_kv(dctx))]
    assert stats.drafted > 0 and 0 < stats.accepted <= stats.drafted


@pytest.mark.parametrize("method", list(METHODS))
def test_self_draft_accepts_every_drafted_token(method):
    target = FakeModel(n_vocab=16, sharpness=2.0)
    spec, stats, *_ = run_spec(target, target, [0, 5, 6], 30, SamplingParams(), METHODS[method])
    assert stats.accepted == sum(k * c for k, c in stats.accepted_lengths.items())
    # The draft's first token is the target's own argmax, so every step that drafts accepts at least
    # one; only the last step may have had no room left to draft.
    assert stats.accepted_lengths[0] <= 1 and stats.accepted >= stats.target_calls - 1
    # Every step emits its accepted drafted tokens, then one token of the target's own; only the
    # last step's may be cut off by max_tokens.
    from_draft = [e.from_draft for e in spec]
    assert len(spec) == 30 and from_draft.count(False) == stats.target_calls - from_draft[-1]
    if method == "chain":
        assert stats.accepted == stats.drafted


def test_tree_keeps_best_nodes_by_cumulative_probability():
    target = FakeModel(n_vocab=16, sharpness=2.0)
    d, _ = drafter(target, SamplingParams(), dict(branching=3, max_nodes=7, max_depth=3))
    d.reset([0, 4, 5])
    tree = d.propose(max_depth=3)
    assert len(tree) == 8 and max(tree.depths()) <= 3
    cum = [1.0]
    for i in range(1, len(tree)):
        cum.append(cum[tree.parents[i]] * tree.q[i])
        assert cum[i] <= cum[tree.parents[i]] + 1e-12


def test_staged_makes_fewer_draft_calls_for_the_same_tree():
    target = FakeModel(n_vocab=16, sharpness=2.0, script=LOOPY)
    prompt = [0, 3, 4, 5, 6, 3, 4, 5, 6, 3]
    kw = dict(branching=1, max_nodes=6, max_depth=6)
    trees, calls = [], []
    for lookup in (False, True):
        d, _ = drafter(target, SamplingParams(), {**kw, "lookup": lookup})
        d.reset(prompt)
        trees.append(d.propose(max_depth=6).tokens)
        calls.append(d.draft_calls)
    assert trees[0] == trees[1]
    assert calls[1] < calls[0]


@pytest.mark.parametrize("method", ["chain", "tree", "staged"])
def test_sampled_drafts_write_plains_text_under_the_same_seed(method):
    """The draft races with the target's noise (core/race.py): whatever it proposes, verification
    commits plain sampling's own choices, so each seed's text is plain's, token for token."""
    target = FakeModel(n_vocab=6, sharpness=1.0, script={(2,): 3})
    draft = NoisyDraft(target, noise=1.0)
    n, runs, prompt = 6, 120, [0, 2, 3]
    accepted, texts = 0, set()
    for seed in range(runs):
        plain = run_plain(target, prompt, n, SamplingParams(1.0, seed=seed))
        events, stats, *_ = run_spec(target, draft, prompt, n, SamplingParams(1.0, seed=seed), METHODS[method])
        assert [e.token for e in events] == plain, seed
        accepted += stats.accepted
        texts.add(tuple(plain))
    assert accepted > runs  # drafts really were accepted
    assert len(texts) > runs // 2  # and the seeds really sample


def test_noise_keyed_by_the_step_instead_of_the_position_breaks_the_identity(monkeypatch):
    """The identity test above has teeth: verification that keys the race by the node's depth in
    its step (a plausible slip) instead of its absolute position writes other texts than plain."""
    from specgen.core import engine, verify

    def by_step(tree, logits, sampler, n_past, constraint=None):
        return verify.walk(tree, logits, lambda row, depth: verify.choose(sampler, row, 1 + depth, constraint))

    target = FakeModel(n_vocab=6, sharpness=1.0, script={(2,): 3})
    draft = NoisyDraft(target, noise=1.0)
    monkeypatch.setattr(engine, "verify", by_step)
    differ = 0
    for seed in range(30):
        plain = run_plain(target, [0, 2, 3], 6, SamplingParams(1.0, seed=seed))
        events, _, *_ = run_spec(target, draft, [0, 2, 3], 6, SamplingParams(1.0, seed=seed), METHODS["chain"])
        differ += [e.token for e in events] != plain
    assert differ > 10


@pytest.mark.parametrize("lazy", [False, True])
def test_a_second_request_sharing_the_prompt_reads_only_its_new_tokens_into_the_draft(lazy):
    """The draft's KV keeps the prefix a new prompt shares with the text it holds (a conversation's
    next turn, an agent's next call), as the target's prompt cache does: it reads only what is new,
    and every answer is still plain's."""
    target = FakeModel(n_vocab=16, sharpness=2.0, script=LOOPY)
    dctx = FakeContext(NoisyDraft(target, noise=1.5), n_ctx=512, n_seq_max=64)
    d = ModelDrafter(dctx, SamplingParams(), branching=1, max_nodes=5, min_prob=0.2, lazy_prefill=lazy)
    first = [0, 3, 4, 5, 6, 3, 9, 8]
    done = generated(target, FakeContext(target, n_ctx=512, n_seq_max=32), first, 12, SamplingParams(), d)
    second = first + [e.token for e in done.token_events] + [7, 10, 3, 4]
    dctx.calls.clear()
    done = generated(target, FakeContext(target, n_ctx=512, n_seq_max=32), second, 12, SamplingParams(), d)
    assert [e.token for e in done.token_events] == run_plain(target, second, 12, SamplingParams())
    read = sorted(p for call in dctx.calls for p, seqs in zip(call.positions, call.seq_ids) if 0 in seqs)
    assert read[0] >= len(first), f"the draft re-read the shared prompt from position {read[0]}"
    assert committed_kv(dctx) == (second + [e.token for e in done.token_events])[:len(committed_kv(dctx))]
