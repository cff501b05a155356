"""Constrained decoding on the fake backend: every method gives constrained plain's tokens (greedy)
and its distribution (sampled), forced tokens are verified drafts, and the tree helpers keep what
rejection sampling needs."""

import json

import numpy as np
import pytest

from fakes import FakeConstraint, FakeContext, FakeModel, NoisyDraft
from harness import generated
from specgen.core.constraint import ConstraintSpec, masked, masked_argmax, merge_forced, prune
from specgen.core.engine import GenerationRequest, TokenEvent, generate
from specgen.core.sampling import SamplingParams
from specgen.core.stats import RunStats
from specgen.core.tree import DraftTree
from specgen.drafting.forced import ConstrainedDrafter
from specgen.drafting.lookup import LookupDrafter
from specgen.drafting.model import ModelDrafter, Staged
from specgen.errors import ConstraintError

V, EOS = 16, 1
FREE = list(range(2, 10))
# "{", key, ":" forced; then two free tokens; then "," and either of two closings, or an enum.
LANGUAGE = [
    [[12], [13], [14], FREE, FREE, [15], [3], [4], [5]],
    [[12], [13], [14], FREE, FREE, [15], [3], [6]],
    [[12], [13], [14], [7], [8], [9], [10], [11], [12], [13], [14], FREE],
]
SPEC = ConstraintSpec("lark", json.dumps(LANGUAGE))
LOOPY = {(12, 13): 14, (3, 4): 5, (13, 14): 7, (7, 8): 9}
DRAFTERS = {
    "lookup": lambda model, s: LookupDrafter(),
    "chain": lambda model, s: ModelDrafter(FakeContext(NoisyDraft(model, 1.0), 512, 64), s, branching=1,
                                           max_nodes=5, min_prob=0.0),
    "tree": lambda model, s: ModelDrafter(FakeContext(NoisyDraft(model, 1.0), 512, 64), s, branching=3,
                                          max_nodes=8, max_depth=4),
    "staged": lambda model, s: Staged.build(FakeContext(NoisyDraft(model, 1.0), 512, 64), s, branching=2,
                                            max_nodes=8, max_depth=6),
}


def run(model, prompt, sampling, method=None, max_tokens=30, forced=True):
    constraint = model.constrain(SPEC)
    drafter = None
    if method is not None:
        drafter = DRAFTERS[method](model, sampling)
        if forced:
            drafter = ConstrainedDrafter(drafter, constraint, max_nodes=40, max_leaves=16)
    ctx = FakeContext(model, n_ctx=512, n_seq_max=32)
    done = generated(model, ctx, prompt, max_tokens, sampling, drafter, constraint=constraint)
    return done.tokens, done.reason, done.stats, ctx


def matches(tokens):
    return any(len(p) == len(tokens) and all(t in s for t, s in zip(tokens, p)) for p in LANGUAGE)


@pytest.mark.parametrize("method", list(DRAFTERS))
@pytest.mark.parametrize("prompt", [[0, 12, 13, 14, 7, 8, 9, 10], [0, 3, 4, 5, 6], [0, 2]])
def test_greedy_constrained_equals_constrained_plain(method, prompt):
    model = FakeModel(n_vocab=V, eos=EOS, sharpness=2.0, script=LOOPY)
    plain, plain_reason, _, _ = run(model, prompt, SamplingParams())
    spec, reason, stats, ctx = run(model, prompt, SamplingParams(), method)
    assert spec == plain and reason == plain_reason == "stop"
    assert matches(plain), plain
    assert stats.accepted_by["forced"] >= 3  # "{", key, ":" at least, as drafts the target accepted
    assert set(ctx.kv) == {0}
    kv = ctx.kv[0]
    assert [kv[p] for p in sorted(kv)] == (prompt + spec)[:len(kv)]


def test_unconstrained_model_leaves_the_language():
    """The check above is not vacuous: without the mask the fake writes other text."""
    model = FakeModel(n_vocab=V, eos=EOS, sharpness=2.0, script=LOOPY)
    ctx = FakeContext(model, n_ctx=512, n_seq_max=1)
    events = generate(model, ctx, GenerationRequest([0, 2], 12, SamplingParams()), RunStats())
    assert not matches([e.token for e in events if isinstance(e, TokenEvent)])


def test_forced_tokens_cost_no_target_call_each():
    model = FakeModel(n_vocab=V, eos=EOS, sharpness=2.0, script=LOOPY)
    plain = run(model, [0, 2], SamplingParams())[2]
    spec = run(model, [0, 2], SamplingParams(), "lookup")[2]
    assert spec.target_calls < plain.target_calls
    no_forced = run(model, [0, 2], SamplingParams(), "lookup", forced=False)[2]
    assert no_forced.accepted_by["forced"] == 0 and spec.accepted_by["forced"] > 0
    assert spec.target_calls < no_forced.target_calls  # the forced tokens, not lookup alone, saved the calls


def test_nodes_whose_child_the_grammar_forces_are_decoded_without_logits():
    """Greedy under a grammar, a node whose child is forced needs no row (its choice is the one
    token the mask allows): those nodes ask llama.cpp for no logits (the output layer skips them),
    and the text is constrained plain's."""
    model = FakeModel(n_vocab=V, eos=EOS, sharpness=2.0, script=LOOPY)
    for prompt in ([0, 2], [0, 12, 13, 14, 7, 8, 9, 10]):
        plain, _, _, _ = run(model, prompt, SamplingParams())
        spec, _, stats, ctx = run(model, prompt, SamplingParams(), "lookup")
        assert spec == plain and stats.accepted_by["forced"] >= 3
        trees = [b for b in ctx.calls[1:] if len(b) > 1]
        assert sum(not want for b in trees for want in b.logits) >= 2, [b.logits for b in trees]
        assert all(b.logits[-1] for b in trees)  # a leaf's row: the bonus token is chosen from it


class OverstatedForced(FakeConstraint):
    """forced() also names a token where the grammar allows a choice: a node decoded without logits
    then meets a mask with more than one token, and the tree is decoded again with every row."""

    def forced(self) -> list[int]:
        out = super().forced()
        nxt = self._next(self.consumed + out)
        return out + [min(nxt)] if len(nxt) > 1 and self.eos not in nxt else out


def test_a_forced_node_where_the_grammar_allows_a_choice_is_decoded_again_with_every_row():
    model = FakeModel(n_vocab=V, eos=EOS, sharpness=2.0, script=LOOPY)
    plain, _, _, _ = run(model, [0, 2], SamplingParams())
    constraint = OverstatedForced([[set(pos) for pos in p] for p in LANGUAGE], V, EOS)
    drafter = ConstrainedDrafter(LookupDrafter(), constraint, max_nodes=40, max_leaves=16)
    ctx = FakeContext(model, n_ctx=512, n_seq_max=32)
    events = list(generate(model, ctx, GenerationRequest([0, 2], 30, SamplingParams(), constraint), RunStats(),
                           drafter))
    assert [e.token for e in events if isinstance(e, TokenEvent)] == plain
    again = [(a, b) for a, b in zip(ctx.calls, ctx.calls[1:]) if a.tokens == b.tokens and len(a) > 1]
    assert again and all(not all(a.logits) and all(b.logits) for a, b in again)
    kv = ctx.kv[0]
    assert [kv[p] for p in sorted(kv)] == ([0, 2] + plain)[:len(kv)]


@pytest.mark.parametrize("method", [None, "lookup", "chain", "tree"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_logit_bias_that_bans_every_allowed_token_is_one_clear_error(method, temperature):
    """At position 5 every pattern allows only 15 (or 9 after 7, 8): with both at -inf there is
    nothing to write. Greedy, sampled and rejection-sampled walks all say so, by position."""
    model = FakeModel(n_vocab=V, eos=EOS, sharpness=1.0, script=LOOPY)
    ban = SamplingParams(temperature, seed=3, logit_bias=((15, -np.inf), (9, -np.inf)))
    with pytest.raises(ConstraintError, match=r"logit_bias bans every token the grammar allows at output token 6: "
                                              r"expected a finite logit for at least one of the [12] tokens it allows "
                                              r"\(ids (9, )?15\), found -inf for all"):
        run(model, [0, 2], ban, method)


@pytest.mark.parametrize("method", ["lookup", "chain", "staged"])
def test_sampled_constrained_equals_constrained_plain_under_the_same_seed(method):
    """The race decides each token from (seed, position, row): any method writes plain's text."""
    model = FakeModel(n_vocab=V, eos=EOS, sharpness=1.0, script=LOOPY)
    texts = set()
    for seed in range(60):
        p = run(model, [0, 2], SamplingParams(1.0, seed=seed))[0]
        assert matches(p)
        assert run(model, [0, 2], SamplingParams(1.0, seed=seed), method)[0] == p, seed
        texts.add(tuple(p))
    assert len(texts) > 5  # the seeds do sample (position 3 is nearly always 7, position 4 is free)


def test_masked_argmax_is_the_argmax_of_the_masked_row():
    rng = np.random.default_rng(0)
    for _ in range(200):
        row = rng.normal(size=20).astype(np.float32)
        allowed = rng.random(20) < 0.3
        allowed[rng.integers(20)] = True
        ref = int(np.argmax(np.where(allowed, row, -np.inf)))
        assert masked_argmax(row, allowed) == ref
        assert np.isneginf(masked(row, allowed)[~allowed]).all()


def test_prune_drops_forbidden_nodes_and_what_hangs_below():
    c = FakeConstraint([[{5}, {6}, {7}]], n_vocab=10, eos=1)
    tree = DraftTree.root_only(0)
    a = tree.add(5, 0)
    tree.add(6, a)          # allowed
    bad = tree.add(9, a)    # forbidden: goes
    tree.add(4, bad)        # below it: goes
    tree.add(8, 0)          # forbidden: goes
    pruned, index = prune(tree, c)
    assert pruned.tokens == [0, 5, 6] and index == {0: 0, 1: 1, 2: 2}
    assert c.consumed == []  # pruning never moves the matcher


def test_merge_forced_puts_trunk_first_and_maps_origins():
    tree = DraftTree.root_only(0)
    a = tree.add(5, 0)
    b = tree.add(6, a)
    other = tree.add(7, 0)
    merged = merge_forced(tree, [5, 6, 2], max_nodes=10, max_leaves=4)
    out = merged.tree
    assert out.tokens[:4] == [0, 5, 6, 2] and out.forced == {1, 2, 3}
    assert merged.origin[1] == a and merged.origin[2] == b and merged.origin[3] is None
    assert merged.origin.index(other) > 3
    capped = merge_forced(tree, [5, 6, 2], max_nodes=10, max_leaves=1)
    assert capped.tree.tokens == [0, 5, 6, 2]  # each of the others would open a branch


class Recorder:
    """A drafter that proposes a fixed tree and records what it is told."""

    last_choice = "lookup"

    def __init__(self, tree):
        self.tree, self.seen = tree, []

    def reset(self, tokens, sampler=None):
        pass

    def propose(self, max_depth):
        return self.tree

    def observe(self, verdict, committed):
        self.seen.append((verdict, committed))

    def finish_text(self):
        pass


def test_the_wrapped_drafter_hears_of_its_own_nodes():
    """Forced trunk [5, 6], a drafter tree 5 -> 6 -> 7 plus a forbidden branch 9: the target takes
    5, 6, 7 and a bonus 8; the drafter must hear its own indices for 5, 6, 7, not the merged ones."""
    from specgen.core.verify import Verdict

    c = FakeConstraint([[{5}, {6}, {7, 3}, {8}]], n_vocab=10, eos=1)
    tree = DraftTree.root_only(0)
    bad = tree.add(9, 0)
    a = tree.add(5, 0)
    b = tree.add(6, a)
    d = tree.add(7, b)
    inner = Recorder(tree)
    wrapped = ConstrainedDrafter(inner, c, max_nodes=10, max_leaves=4)
    merged = wrapped.propose(8)
    assert merged.tokens == [0, 5, 6, 7] and merged.forced == {1, 2}  # 9 pruned; 7 joins below the trunk
    wrapped.observe(Verdict([1, 2, 3], [5, 6, 7, 8]), [5, 6, 7, 8])
    verdict, committed = inner.seen[-1]
    assert verdict.path == [a, b, d] and [tree.tokens[v] for v in verdict.path] == [5, 6, 7]
    assert committed == [5, 6, 7, 8] and bad not in verdict.path


def test_tool_answers_parse_in_both_formats():
    from specgen.app.structured import GENERIC, HERMES, parse_answer, read_tools

    tools = read_tools([{"type": "function", "function": {"name": n}} for n in ("f", "g")], "auto")
    hermes = parse_answer('<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n'
                          '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>', HERMES, tools)
    assert hermes.content is None and [c.name for c in hermes.calls] == ["f", "g"]
    assert json.loads(hermes.calls[0].arguments) == {"x": 1} and hermes.calls[0].id != hermes.calls[1].id
    assert parse_answer("just text", HERMES, tools).calls == ()
    generic = parse_answer('{"tool_call": {"name": "f", "arguments": {"x": 1}}}', GENERIC, tools)
    assert generic.content is None and generic.calls[0].name == "f"
    assert parse_answer('{"response": "hello"}', GENERIC, tools).content == "hello"
    assert parse_answer('{"tool_call": {"na', GENERIC, tools).content == '{"tool_call": {"na'  # cut at the limit


def test_closed_schemas_and_response_formats():
    from specgen.app.structured import closed, read_tools, response_format
    from specgen.errors import ConstraintError

    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"const": {"x": 1}}}}}}
    out = closed(schema)
    assert out["additionalProperties"] is False and out["properties"]["a"]["additionalProperties"] is False
    assert out["properties"]["a"]["properties"]["b"] == {"const": {"x": 1}}  # values are not schemas
    assert closed({"type": "object", "additionalProperties": True, "properties": {}})["additionalProperties"] is True
    assert response_format({"type": "text"}) is None
    assert response_format({"type": "json_object"}).kind == "json_object"
    for bad in ({"type": "xml"}, {"type": "json_schema"}, "json", {"type": "json_schema", "json_schema": {"schema": 3}}):
        with pytest.raises(ConstraintError):
            response_format(bad)
    assert read_tools(None, None) is None and read_tools([], "none") is None
    with pytest.raises(ConstraintError, match="needs tools"):
        read_tools(None, "required")


# Four tokens forced, then two free ones, then the end.
FORCES_FOUR = ConstraintSpec("lark", json.dumps([[[12], [13], [14], [15], FREE, FREE]]))


class Once:
    """A drafter whose first proposal is a fixed tree (given as chains below the root), and then nothing."""

    last_choice = "lookup"

    def __init__(self, *chains):
        self.chains, self.root, self.steps = chains, None, 0

    def reset(self, tokens, sampler=None):
        self.root = tokens[-1]

    def propose(self, max_depth):
        tree = DraftTree.root_only(self.root)
        for chain in self.chains if self.steps == 0 else ():
            node = 0
            for tok in chain:
                node = next((c for c in tree.children()[node] if tree.tokens[c] == tok), None) or tree.add(tok, node)
        self.steps += 1
        return tree

    def observe(self, verdict, committed):
        self.root = committed[-1]

    def finish_text(self):
        pass


def constrained_run(model, spec, inner, prompt=(0, 2), sampling=SamplingParams(), max_tokens=30):
    constraint = model.constrain(spec)
    drafter = None if inner is None else ConstrainedDrafter(inner, constraint, max_nodes=40, max_leaves=16)
    done = generated(model, FakeContext(model, n_ctx=512, n_seq_max=32), list(prompt), max_tokens, sampling, drafter,
                     constraint=constraint)
    return done.token_events, done.reason, done.stats


def test_forced_tokens_are_counted_apart_from_the_drafters():
    """The drafter proposes the four forced tokens (they join the trunk: the grammar decided them),
    then the target's next token and a wrong one beside it: its own acceptance is 1 of 2, τ counts
    its token and the bonus, and the forced tokens are their own 4/4."""
    model = FakeModel(n_vocab=V, eos=EOS, sharpness=2.0)
    plain, _, _ = constrained_run(model, FORCES_FOUR, None)
    good = plain[4].token
    wrong = next(t for t in FREE if t != good)
    events, reason, stats = constrained_run(model, FORCES_FOUR, Once([12, 13, 14, 15, good], [12, 13, 14, 15, wrong]))
    assert [e.token for e in events] == [e.token for e in plain] and reason == "stop"
    assert [e.source for e in events] == ["forced"] * 4 + ["lookup", "target"]
    assert stats.target_calls == 1 and stats.n_committed == 6
    assert (stats.drafted, stats.accepted, stats.acceptance_rate) == (2, 1, 0.5)
    assert (stats.forced_drafted, stats.forced_accepted) == (4, 4)
    assert stats.mean_accepted == 2.0  # (6 committed - 4 forced) / 1 call
    assert stats.accepted_by == {"forced": 4, "lookup": 1} and stats.accepted_lengths == {1: 1}
    record = stats.record_fields()
    assert (record["drafted"], record["accepted"], record["forced_drafted"], record["forced_accepted"]) == (2, 1, 4, 4)
    assert "accepted 50% (1/2)" in stats.line() and "forced 4/4" in stats.line()
    # A drafter that proposes the forced tokens alone adds nothing: the step is the grammar's.
    _, _, only = constrained_run(model, FORCES_FOUR, Once([12, 13, 14, 15]))
    assert (only.drafted, only.accepted, only.forced_accepted) == (0, 0, 4) and only.choices["forced"] == 1


def test_a_forced_stretch_inside_a_drafters_path_is_the_grammars():
    """A free token, then two the grammar forces: a drafter that proposes all three gets credit for
    the first alone (nothing is forced where the step starts, so there is no trunk)."""
    spec = ConstraintSpec("lark", json.dumps([[FREE, [12], [13], FREE]]))
    model = FakeModel(n_vocab=V, eos=EOS, sharpness=2.0)
    plain, _, _ = constrained_run(model, spec, None)
    events, reason, stats = constrained_run(model, spec, Once([plain[0].token, 12, 13]))
    assert [e.token for e in events] == [e.token for e in plain] and reason == "stop"
    assert [e.source for e in events] == ["lookup", "forced", "forced", "target"]
    assert (stats.drafted, stats.accepted, stats.forced_drafted, stats.forced_accepted) == (1, 1, 2, 2)
    assert stats.target_calls == 1 and stats.mean_accepted == 2.0  # (4 committed - 2 forced) / 1 call


def test_jump_is_constrained_plain_with_the_forced_tokens_batched():
    """Greedy: jump's text is constrained plain's; each forced token saves one target call (but
    where the trunk runs to the grammar's end: that step's own token is then an end-of-generation
    token, which plain decoding never decodes for, the grammar being complete)."""
    from specgen.drafting.methods import METHODS, DrafterInputs

    model = FakeModel(n_vocab=V, eos=EOS, sharpness=2.0, script=LOOPY)
    for prompt in ([0, 2], [0, 3, 4, 5, 6]):
        plain, plain_reason, plain_stats = constrained_run(model, SPEC, None, prompt)
        jump_drafter = METHODS["jump"].drafter(DrafterInputs(SamplingParams()))
        jump, reason, stats = constrained_run(model, SPEC, jump_drafter, prompt)
        assert [e.token for e in jump] == [e.token for e in plain] and reason == plain_reason
        assert stats.forced_accepted >= 3 and stats.drafted == stats.accepted == 0
        end = stats.n_committed - plain_stats.n_committed  # 1: jump's last token was the end plain never decodes
        assert stats.target_calls == plain_stats.target_calls - stats.forced_accepted + end
        assert stats.mean_accepted == 1.0 and set(stats.choices) <= {"forced", "plain"}


def test_the_runner_wraps_jump_under_a_constraint_and_leaves_it_plain_without():
    from specgen.app.config import RunConfig
    from specgen.app.prompts import Prompt
    from specgen.app.runner import Runner
    from specgen.app.session import open_session
    from specgen.drafting.methods import METHODS

    model = FakeModel(n_vocab=V, eos=EOS, sharpness=2.0, script=LOOPY)
    cfg = RunConfig(target="fake", chat=False, max_tokens=30)
    session = open_session(cfg.loading, [METHODS["plain"], METHODS["jump"]], model)
    runs = {m: Runner(RunConfig(target="fake", chat=False, max_tokens=30, method=m), session) for m in ("plain", "jump")}
    constrained = {m: r.run(r.ask(Prompt(0, "ab", constraint=SPEC))) for m, r in runs.items()}
    free = {m: r.run(r.ask(Prompt(0, "ab"))) for m, r in runs.items()}
    assert constrained["jump"].text == constrained["plain"].text and free["jump"].text == free["plain"].text
    jump, plain = constrained["jump"].stats, constrained["plain"].stats
    forced = jump.forced_accepted
    assert forced >= 3 and jump.target_calls == plain.target_calls - forced + jump.n_committed - plain.n_committed
    assert free["jump"].stats.target_calls == free["plain"].stats.target_calls and free["jump"].stats.forced_drafted == 0
    record = runs["jump"].record(constrained["jump"])
    assert record["forced_accepted"] == forced and record["drafted"] == 0 and record["mean_accepted"] == 1.0


class Lying(Once):
    """Once, with every node of its tree marked forced: a drafter (or a stale grammar state) that
    claims the grammar decided tokens it did not. Forced nodes are drafts like any other; only
    the target's masked row may accept them."""

    def propose(self, max_depth):
        tree = super().propose(max_depth)
        tree.forced = set(range(1, len(tree.tokens)))
        return tree


def test_forced_nodes_are_verified_by_the_target_not_appended():
    """A grammar forces a token only where it alone is allowed, so a real forced token always
    passes; an engine that appended forced nodes unverified would show only where a node marked
    forced is wrong. Two lies: a token the grammar rules out (5 where 14 is forced), and a free
    token the target would not pick. Each is rejected and the text is constrained plain's."""
    model = FakeModel(n_vocab=V, eos=EOS, sharpness=2.0)
    plain, _, _ = constrained_run(model, FORCES_FOUR, None)
    good = plain[4].token
    wrong = next(t for t in FREE if t != good)
    for chain, taken in (([12, 13, 5], 2), ([12, 13, 14, 15, wrong], 4)):
        constraint = model.constrain(FORCES_FOUR)
        events = list(generate(model, FakeContext(model, n_ctx=512, n_seq_max=32),
                               GenerationRequest([0, 2], 30, SamplingParams(), constraint), RunStats(), Lying(chain)))
        tokens = [e.token for e in events if isinstance(e, TokenEvent)]
        assert tokens == [e.token for e in plain], f"{chain}: {tokens}"
        assert events[-1].stats.forced_accepted == taken  # the true prefix of the chain, no more
