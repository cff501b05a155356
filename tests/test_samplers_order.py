"""llama.cpp's sampler order (llama-server's `samplers`), followed exactly: the eligible set that
core/sampling.py computes for an order is the set llama.cpp's chain keeps (a plain statement of its
samplers below), the order decides it (temperature before the nucleus sees a flatter distribution),
app/samplers.py turns off what the list leaves out and refuses only what specgen cannot follow, and
speculation under an order writes plain decoding's tokens seed by seed."""

import math

import numpy as np
import pytest

from specgen.app import samplers
from specgen.app.ask import sampling_params
from specgen.core.sampling import SamplingParams, eligible, truncated
from specgen.errors import ConfigError

VALUES = {"temperature": 0.8, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 1, "repeat_penalty": 1.0,
          "repeat_last_n": 64, "frequency_penalty": 0.0, "presence_penalty": 0.0, "logit_bias": ()}


def llama_chain(logits: np.ndarray, params: SamplingParams) -> set[int]:
    """The ids llama.cpp's samplers keep, step by step on (id, logit) candidates (src/llama-sampling.cpp:
    top_k sorts and keeps k; top_p takes the softmax of what is left and keeps the sorted prefix whose
    sum reaches p; min_p keeps logits >= the largest + ln p; temperature divides the logits)."""
    cand = [(i, float(x)) for i, x in enumerate(logits)]
    for step in params.order:
        if step == "temperature":
            cand = [(i, x / params.temperature) for i, x in cand]
        elif step == "top_k" and params.top_k > 0:
            cand = sorted(cand, key=lambda c: -c[1])[:params.top_k]
        elif step == "top_p" and params.top_p < 1:
            top = max(x for _, x in cand)
            total = sum(math.exp(x - top) for _, x in cand)
            kept, mass = [], 0.0
            for i, x in sorted(cand, key=lambda c: -c[1]):
                kept.append((i, x))
                mass += math.exp(x - top) / total
                if mass >= params.top_p:
                    break
            cand = kept
        elif step == "min_p" and params.min_p > 0:
            floor = max(x for _, x in cand) + math.log(params.min_p)
            cand = [(i, x) for i, x in cand if x >= floor]
    return {i for i, _ in cand}


ORDERS = [("top_k", "top_p", "min_p", "temperature"), ("temperature", "top_k", "top_p", "min_p"),
          ("min_p", "temperature", "top_p", "top_k"), ("top_p", "temperature", "min_p"), ("temperature", "top_p"),
          ("top_p", "top_k", "temperature")]


@pytest.mark.parametrize("order", ORDERS)
def test_an_order_keeps_what_llama_cpps_chain_keeps(order):
    rng = np.random.default_rng(7)
    for trial in range(20):
        logits = (rng.standard_normal(3000) * rng.uniform(0.5, 3)).astype(np.float32)
        params = SamplingParams(float(rng.choice([0.5, 1.5, 2.5])), top_k=int(rng.choice([0, 50, 400])),
                                top_p=float(rng.choice([1.0, 0.5, 0.9])), min_p=float(rng.choice([0.0, 0.02, 0.2])),
                                order=order)
        kept = eligible(logits, params)  # None: every id
        assert set(map(int, range(3000) if kept is None else kept)) == llama_chain(logits, params), (order, params)
        ids, p = truncated(logits, params)  # p: softmax(logits / T) over the kept ids
        x = logits[np.arange(3000) if ids is None else ids].astype(np.float64) / params.temperature
        assert np.allclose(p, np.exp(x - x.max()) / np.exp(x - x.max()).sum())


def test_the_order_decides_the_eligible_set():
    """At T = 2 the nucleus after temperature is wider than before it; min-p after temperature keeps
    more (its floor is ln(min_p) under the tempered largest); top-k commutes with both."""
    logits = np.random.default_rng(3).standard_normal(2000).astype(np.float32) * 3
    size = {order: len(eligible(logits, SamplingParams(2.0, top_p=0.5, min_p=0.05, order=order)))
            for order in (("top_p", "temperature"), ("temperature", "top_p"), ("min_p", "temperature"),
                          ("temperature", "min_p"))}
    assert size[("top_p", "temperature")] < size[("temperature", "top_p")]
    assert size[("min_p", "temperature")] < size[("temperature", "min_p")]


def test_follow_turns_off_what_the_list_leaves_out_and_says_so():
    given = {**VALUES, "top_k": 40, "top_p": 0.9, "repeat_penalty": 1.1}
    v, order, notes = samplers.follow(given, ("top_p", "temperature"))
    assert (v["top_k"], v["repeat_penalty"], v["top_p"], order) == (0, 1.0, 0.9, ("top_p", "temperature"))
    assert notes == ["repeat_penalty 1.1 changed nothing: samplers leaves out penalties, as llama-server's chain would",
                     "top_k 40 changed nothing: samplers leaves out top_k, as llama-server's chain would"]
    v, order, notes = samplers.follow({**VALUES, "temperature": 0.0}, ("top_k",))  # no temperature: drawn at 1
    assert v["temperature"] == 1.0 and order is None and "the draw is at temperature 1" in notes[0]
    # Orders that choose as specgen's own chain does keep it (None): screening and its numbers stay.
    for names, values in ((samplers.OWN, {**given, "min_p": 0.05, "temperature": 1.0}),
                          (("penalties", "top_k", "temperature", "top_p"), given),
                          (("min_p", "temperature", "top_k"), {**VALUES, "min_p": 0.1}),
                          (("top_p", "min_p", "temperature"), {**VALUES, "top_p": 0.9, "temperature": 0.0})):
        assert samplers.follow(values, names)[1] is None, names
    assert samplers.follow({**VALUES, "min_p": 0.1}, samplers.OWN)[1] == ("temperature", "min_p")


def test_follow_refuses_only_what_it_cannot_follow():
    pen = {**VALUES, "top_k": 40, "repeat_penalty": 1.3}
    with pytest.raises(ConfigError, match="expects penalties before every other sampler that acts .*found penalties "
                                          "after top_k"):
        samplers.follow(pen, ("top_k", "penalties", "temperature"))
    v, order, _ = samplers.follow({**pen, "repeat_penalty": 1.0}, ("top_k", "penalties"))  # penalties off: anywhere
    assert order is None and v["temperature"] == 1.0  # top-k alone at T = 1: specgen's own chain
    with pytest.raises(ConfigError, match="each sampler that acts once, found top_p 2 times"):
        samplers.follow({**VALUES, "top_p": 0.5}, ("top_p", "temperature", "top_p"))
    assert samplers.parse("kypmxt") == (("top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"), [])
    assert samplers.parse(["top_k", "tfs_z", "typical_p", "temperature"]) == (("top_k", "temperature"),
                                                                            ["tfs_z", "typical_p"])
    for bad, words in ((3, "a list of sampler names or a string of their letters, found 3"),
                       (["top_k", 1], "found [\"top_k\", 1]"), (["infill"], "infill")):
        with pytest.raises(ConfigError, match=words.replace("[", r"\[")):
            samplers.parse(bad)
    assert sampling_params({**VALUES, "top_p": 0.9, "samplers": ("top_p", "temperature")}).order == ("top_p",
                                                                                                     "temperature")


@pytest.mark.real
def test_speculation_under_an_order_writes_plains_tokens(smollm2_f32, smollm2):
    """auto with a draft model, under llama.cpp's default order (temperature last: the nucleus and
    min-p on the untempered logits), writes plain decoding's tokens seed by seed; the order changes
    the text (specgen's own order, temperature before the nucleus, writes others)."""
    from harness import generated
    from specgen.costs.curve import CostCurve
    from specgen.drafting.methods import METHODS, DrafterInputs

    target, prompt = smollm2_f32, smollm2_f32.tokenize("The three primary colors are")
    ctx, dctx = target.new_context(256, n_seq_max=32), smollm2.new_context(256, n_seq_max=64)

    accepted = []

    def tokens(params, drafter=None):
        run = generated(target, ctx, prompt, 12, params, drafter)
        accepted.append(run.stats.accepted if drafter else 0)
        return tuple(run.tokens)

    texts = {}
    for order in (("top_k", "top_p", "min_p", "temperature"), None):
        for seed in range(8):
            params = SamplingParams(1.5, top_k=40, top_p=0.8, min_p=0.02, seed=seed, order=order)
            inputs = DrafterInputs(params, dctx, CostCurve([1, 32], [0.010, 0.012]), CostCurve([1, 8], [0.002, 0.003]),
                                   reproducible=True)
            texts[order, seed] = tokens(params)
            assert tokens(params, METHODS["auto"].drafter(inputs)) == texts[order, seed], (order, seed)
    assert any(texts[ORDERS[0], s] != texts[None, s] for s in range(8))
    assert sum(accepted) > 50, accepted
