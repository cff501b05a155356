import numpy as np

from fakes import FakeContext, FakeModel
from harness import generated
from specgen.core.engine import FinishEvent, GenerationRequest, TokenEvent, generate
from specgen.errors import PromptError
from specgen.core.sampling import SamplingParams
from specgen.core.stats import RunStats

import pytest


def run(model, ctx, prompt, max_tokens=10, sampling=SamplingParams()):
    done = generated(model, ctx, prompt, max_tokens, sampling)
    assert isinstance(done.finish, FinishEvent)
    return done.tokens, done.reason, done.stats


def test_plain_greedy_follows_argmax_of_full_history():
    model = FakeModel()
    prompt = [0, 5, 6, 7]
    tokens, reason, stats = run(model, FakeContext(model), prompt, max_tokens=12)
    history = list(prompt)
    for tok in tokens:  # each token is the argmax given everything before it
        assert tok == int(np.argmax(model.logits_for(tuple(history))))
        history.append(tok)
    assert reason == "length" and len(tokens) == 12
    assert stats.target_calls == 12 and stats.mean_accepted == 1.0
    assert stats.drafted == stats.accepted == 0
    assert stats.n_prompt == len(prompt)  # what the server reports as prompt_tokens


def test_stops_on_end_of_generation_without_emitting_it():
    model = FakeModel(script={(9,): 1})  # after token 9 the model says EOS
    tokens, reason, stats = run(model, FakeContext(model), [0, 4, 9], max_tokens=10)
    assert tokens == [] and reason == "stop"
    assert stats.n_tokens == 0 and stats.target_calls == 1 and stats.mean_accepted == 1.0


def test_context_full_stops_with_length():
    model = FakeModel()
    tokens, reason, _ = run(model, FakeContext(model, n_ctx=8), [0, 3, 4], max_tokens=100)
    assert reason == "length" and len(tokens) == 8 - 3


def test_prompt_longer_than_context_names_sizes():
    model = FakeModel()
    with pytest.raises(PromptError, match=r"prompt is 9 tokens but the context holds 8: use --ctx"):
        run(model, FakeContext(model, n_ctx=8), list(range(9)))


def test_prefill_is_chunked_by_n_batch():
    model = FakeModel()
    ctx = FakeContext(model, n_batch=4)
    tokens, _, _ = run(model, ctx, [0] + list(range(2, 12)), max_tokens=3)
    assert all(len(b) <= 4 for b in ctx.calls)
    ref, _, _ = run(model, FakeContext(model, n_batch=64), [0] + list(range(2, 12)), max_tokens=3)
    assert tokens == ref


def test_seeded_sampling_is_reproducible_and_seed_sensitive():
    model = FakeModel(sharpness=1.0)
    s = lambda seed: run(model, FakeContext(model), [0, 2], 20, SamplingParams(1.0, seed=seed))[0]
    assert s(1) == s(1)
    assert s(1) != s(2)


def test_text_decoder_joins_split_utf8():
    class Utf8Model(FakeModel):
        def piece(self, token):
            return {5: b"\xc3", 6: b"\xa9"}.get(token, b"x")

    model = Utf8Model(script={(2,): 5, (5,): 6, (6,): 7})
    stats = RunStats()
    events = list(generate(model, FakeContext(model), GenerationRequest([0, 2], 3, SamplingParams()), stats))
    text = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert text == "éx"


def test_drafts_are_capped_to_fit_one_batch():
    from specgen.drafting.lookup import LookupDrafter

    model = FakeModel(n_vocab=16, script={(3, 4): 5, (4, 5): 6, (5, 6): 3, (6, 3): 4})
    ctx = FakeContext(model, n_ctx=256, n_seq_max=4, n_batch=8)
    drafter = LookupDrafter(k_init=32, k_max=32)  # asks for 32-token loop copies
    stats = RunStats()
    list(generate(model, ctx, GenerationRequest([0, 3, 4, 5, 6, 3, 4], 40, SamplingParams()), stats, drafter))
    assert stats.n_tokens == 40 and stats.accepted > 0 and max(len(b) for b in ctx.calls) <= 8
