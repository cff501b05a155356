"""Penalties, logit_bias, min-p and logprobs on the fake backend: the adjustment against a hand
computation, each tree node adjusted with its own path, every drafter greedy-equal to plain decoding
under penalties, sampled output distributed as plain sampling's (chi-square), and logprobs equal to
the log-softmax of the rows plain decoding reads."""

import math

import numpy as np
import pytest

from fakes import FakeContext, FakeModel, NoisyDraft
from harness import generated, penalized
from specgen.core.logprobs import token_logprob
from specgen.core.penalties import Penalties, PathRows, Scoring, adjusted
from specgen.core.sampling import SamplingParams, distribution
from specgen.core.tree import DraftTree
from specgen.drafting.lookup import LookupDrafter
from specgen.drafting.model import ModelDrafter, Staged

LOOPY = {(3, 4): 5, (4, 5): 6, (5, 6): 3, (6, 3): 4}
DRAFTERS = {
    "lookup": lambda model, s: LookupDrafter(),
    "chain": lambda model, s: ModelDrafter(FakeContext(NoisyDraft(model, 1.0), 512, 64), s, branching=1,
                                           max_nodes=5, min_prob=0.0),
    "tree": lambda model, s: ModelDrafter(FakeContext(NoisyDraft(model, 1.0), 512, 64), s, branching=3,
                                          max_nodes=8, max_depth=4),
    "staged": lambda model, s: Staged.build(FakeContext(NoisyDraft(model, 1.0), 512, 64), s, branching=2,
                                            max_nodes=8, max_depth=6),
}
PENALTIES = [
    Penalties(repeat=3.0, last_n=8),
    Penalties(frequency=1.0, presence=1.0, last_n=-1),
    Penalties(repeat=2.0, frequency=0.5, last_n=4, bias=((7, 2.0), (5, -math.inf))),
]


def run(model, prompt, max_tokens, sampling, method=None, logprobs=None):
    drafter = None if method is None else DRAFTERS[method](model, sampling)
    ctx = FakeContext(model, n_ctx=512, n_seq_max=16)
    return generated(model, ctx, prompt, max_tokens, sampling, drafter, logprobs=logprobs).token_events


def test_adjusted_matches_a_hand_computation():
    row = np.array([2.0, -1.0, 0.5, 3.0, -0.5, 0.0], dtype=np.float32)
    pen = Penalties(repeat=2.0, last_n=64, frequency=0.25, presence=0.5, bias=((2, 1.0), (4, -math.inf)))
    out = adjusted(row, [1, 3, 3, 2], pen)
    # bias first (2: 0.5 + 1 = 1.5; 4 banned), then per token in the window with its count c:
    # logit > 0 halved, <= 0 doubled, then minus c * 0.25 + 0.5.
    expect = [2.0, -1.0 * 2 - 0.75, 1.5 / 2 - 0.75, 3.0 / 2 - 1.0, -math.inf, 0.0]
    np.testing.assert_allclose(out, expect, rtol=1e-6)
    assert row[2] == 0.5  # the decode's row is left as it was
    # Only the last `last_n` tokens count; last_n 0 turns the penalties off.
    np.testing.assert_allclose(adjusted(row, Penalties(repeat=2.0, last_n=1).window([1, 3, 3, 2]),
                                        Penalties(repeat=2.0, last_n=1)), [2.0, -1.0, 0.25, 3.0, -0.5, 0.0])
    assert not Penalties(repeat=2.0, last_n=0).active and not Penalties(bias=((3, 0.0),)).active


def test_each_tree_node_is_scored_with_its_own_path():
    """Two branches below the root carry different tokens: the same child position is penalised for
    the token on its own branch, not its sibling's."""
    tree = DraftTree.root_only(9)
    a = tree.add(2, 0)
    b = tree.add(3, 0)
    aa = tree.add(4, a)
    logits = np.ones((4, 10), dtype=np.float32)
    pen = Penalties(repeat=2.0, last_n=3)
    rows = PathRows(logits, tree, [7, 8, 9], pen)
    np.testing.assert_array_equal(rows[0], adjusted(logits[0], [7, 8, 9], pen))
    np.testing.assert_array_equal(rows[a], adjusted(logits[a], [8, 9, 2], pen))
    np.testing.assert_array_equal(rows[b], adjusted(logits[b], [8, 9, 3], pen))
    np.testing.assert_array_equal(rows[aa], adjusted(logits[aa], [9, 2, 4], pen))
    assert rows[a][2] == 0.5 and rows[a][3] == 1.0 and rows[b][3] == 0.5 and rows[b][2] == 1.0
    assert Scoring(Penalties(), [1, 2]).rows(logits, tree) is logits  # nothing set: no work at all


@pytest.mark.parametrize("pen", PENALTIES, ids=["repeat", "freq-presence", "all-bias"])
@pytest.mark.parametrize("method", list(DRAFTERS))
def test_greedy_with_penalties_equals_plain(method, pen):
    model = FakeModel(n_vocab=12, sharpness=1.5, script=LOOPY)
    prompt = [0, 3, 4, 5, 6, 3, 4]
    sampling = penalized(pen)
    plain = [e.token for e in run(model, prompt, 40, sampling)]
    assert [e.token for e in run(model, prompt, 40, sampling, method)] == plain
    assert plain != [e.token for e in run(model, prompt, 40, SamplingParams())]  # the penalty acts


def test_a_banned_token_never_appears_and_a_bias_favours():
    model = FakeModel(n_vocab=12, sharpness=1.5, script=LOOPY)
    prompt = [0, 3, 4, 5, 6, 3, 4]
    assert 5 in [e.token for e in run(model, prompt, 20, SamplingParams())]
    banned = [e.token for e in run(model, prompt, 20, SamplingParams(logit_bias=((5, -math.inf),)),
                                   "lookup")]
    assert 5 not in banned
    favoured = [e.token for e in run(model, prompt, 20, SamplingParams(logit_bias=((9, 100.0),)))]
    assert favoured == [9] * 20


@pytest.mark.parametrize("method", ["lookup", "tree"])
def test_sampled_with_penalties_equals_plain_under_the_same_seed(method):
    """Each node's row carries the penalties of its own path; the race at each position then
    chooses what plain decoding chooses there. Positions 1 and 2 see the tokens drawn before them."""
    model = FakeModel(n_vocab=6, sharpness=1.0, script={(2,): 3, (3,): 2})
    prompt, n = [0, 2, 3, 2, 3], 3
    pen = Penalties(repeat=2.5, frequency=0.5, presence=1.0, last_n=3, bias=((4, 0.8),))
    texts = set()
    for seed in range(150):
        p = [e.token for e in run(model, prompt, n, penalized(pen, 1.0, seed=seed))]
        s = [e.token for e in run(model, prompt, n, penalized(pen, 1.0, seed=seed), method)]
        assert s == p, seed
        texts.add(tuple(p))
    assert len(texts) > 30


def test_min_p_keeps_tokens_at_least_min_p_of_the_most_likely():
    logits = np.log(np.array([0.5, 0.3, 0.12, 0.05, 0.03]))
    p = distribution(logits, SamplingParams(2.0, min_p=0.2))  # 0.2 * 0.5 = 0.1: keeps 0, 1, 2
    assert (p[:3] > 0).all() and (p[3:] == 0).all()
    tempered = np.exp(logits[:3] / 2.0)
    np.testing.assert_allclose(p[:3], tempered / tempered.sum())
    # After top-p, as llama.cpp's chain: top_p 0.6 keeps {0, 1}; min_p 0.7 then keeps {0}.
    assert np.flatnonzero(distribution(logits, SamplingParams(1.0, top_p=0.6, min_p=0.7))).tolist() == [0]


@pytest.mark.parametrize("method", [None, "lookup", "tree"])
def test_logprobs_are_the_log_softmax_of_plain_decodings_rows(method):
    model = FakeModel(n_vocab=12, sharpness=1.5, script=LOOPY)
    prompt = [0, 3, 4, 5, 6, 3, 4]
    pen = Penalties(repeat=1.3, last_n=6, bias=((8, 1.5),))
    events = run(model, prompt, 25, penalized(pen), method, logprobs=3)
    text = list(prompt)
    for e in events:
        row = adjusted(model.logits_for(tuple(text)), pen.window(text), pen).astype(np.float64)
        log_p = row - np.log(np.exp(row - row.max()).sum()) - row.max()
        assert e.logprob.token == e.token and e.logprob.logprob == pytest.approx(log_p[e.token], abs=1e-6)
        assert [a.token for a in e.logprob.top] == list(np.argsort(-log_p, kind="stable")[:3])
        assert [a.logprob for a in e.logprob.top] == pytest.approx(sorted(log_p, reverse=True)[:3], abs=1e-6)
        text.append(e.token)
    assert all(e.logprob is None for e in run(model, prompt, 5, SamplingParams(), method))


def test_token_logprob_skips_banned_tokens_in_the_top_list():
    row = np.array([0.0, -math.inf, 1.0], dtype=np.float32)
    lp = token_logprob(row, 2, 5)
    assert [a.token for a in lp.top] == [2, 0]
    assert lp.logprob == pytest.approx(1.0 - math.log(1 + math.e))


@pytest.mark.parametrize("command, args, message", [
    ("generate", ["--repeat-penalty", "0"], "--repeat-penalty must be in (0, 10] (1 = off), found 0.0"),
    ("bench", ["--presence-penalty", "2.5"], "--presence-penalty must be in [-2, 2], found 2.5"),
    ("serve", ["--frequency-penalty", "-3"], "--frequency-penalty must be in [-2, 2], found -3.0"),
    ("generate", ["--min-p", "1.5"], "--min-p must be in [0, 1], found 1.5"),
    ("bench", ["--repeat-last-n", "-2"], "--repeat-last-n must be -1 (the whole context), 0 (off) or more, found -2"),
    ("serve", ["--logit-bias", "15043*2"], "--logit-bias expects TOKEN_ID+BIAS or TOKEN_ID-BIAS"),
    ("generate", ["--logit-bias", "15043+1", "--logit-bias", "7+101"],
     "--logit-bias expects a bias in [-100, 100] or -inf, found '7+101'"),
])
def test_out_of_range_options_are_one_line_errors(command, args, message):
    """Each command takes the options (tests/test_cli_options.py checks they mean the same in each)."""
    from clihelp import assert_one_line_error, specgen

    proc = specgen(command, *args, *(["hi"] if command == "generate" else []))
    assert_one_line_error(proc, message)
    assert proc.returncode == 2


def test_options_reach_the_sampling_settings():
    from specgen.app.config import build_config
    from specgen.cli.options import with_sampling

    seen = []

    @with_sampling
    def command(sampling=None):
        seen.append(sampling)

    command(min_p=0.05, repeat_penalty=1.1, repeat_last_n=32, presence_penalty=0.5, frequency_penalty=-0.5,
            logit_bias=["15043+1.5", "2-inf"])
    cfg = build_config(None, {}, seen[0])
    assert cfg.sampling.min_p == 0.05 and cfg.sampling.penalties == Penalties(
        repeat=1.1, last_n=32, frequency=-0.5, presence=0.5, bias=((15043, 1.5), (2, -math.inf)))


def test_a_files_logit_bias_text_and_the_flags_pairs_are_one_setting():
    """A -c file's text is read into (token, bias) pairs when the config is made; the flags arrive as
    pairs (read_sampling) and replace it; reports write the pairs back as a file writes them."""
    from specgen.app.config import Given, RunConfig, bias_text, run_config
    from specgen.app.ask import Overrides

    pairs = ((15043, 1.5), (2, -math.inf))
    assert RunConfig(logit_bias="15043+1.5, 2-inf").logit_bias == pairs and RunConfig().logit_bias == ()
    assert run_config({"logit_bias": "7+1"}, Given(Overrides(logit_bias=pairs))).sampling.logit_bias == pairs
    assert bias_text(pairs) == "15043+1.5,2-inf" and bias_text(()) is None


def test_penalties_read_the_targets_own_rows_never_a_screened_copy(monkeypatch):
    """A screened copy's rows are exact at their argmax only; a penalty or bias can move the argmax."""
    from specgen.app.config import RunConfig
    from specgen.app.ask import Ask
    from specgen.app.prompts import Prompt
    from specgen.app.runner import check_bias, check_rows
    from specgen.app.ask import why_exact_rows
    from specgen.errors import ConfigError

    monkeypatch.setenv("SPECGEN_SCREEN", "1")
    def screenable(cfg):  # what load_session's callers ask before it loads (screen=...)
        return why_exact_rows(cfg.sampling, constrained=False) is None

    assert screenable(RunConfig()) and not screenable(RunConfig(repeat_penalty=1.1))
    assert not screenable(RunConfig(logit_bias="3+1")) and screenable(RunConfig(logit_bias="3+0"))
    model = FakeModel(n_vocab=12)
    with pytest.raises(ConfigError, match=r"logit bias expects token ids in \[0, 12\) for fake, found 12"):
        check_bias(SamplingParams(logit_bias=((12, 1.0),)), model)
    model.screen = object()
    with pytest.raises(ConfigError, match="penalties and logit bias need the target loaded without screening"):
        check_rows(Ask(Prompt(0, "x"), False, SamplingParams(repeat_penalty=1.2)), model)
    check_rows(Ask(Prompt(0, "x"), False, SamplingParams()), model)
    assert Ask(Prompt(0, "x"), False, SamplingParams(repeat_penalty=1.2)).needs_exact_rows
