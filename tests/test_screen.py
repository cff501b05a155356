"""Screening (screen.py): a Q8_0 copy of an F32/F16 output layer, and exact logits where the argmax
could be, give exactly plain decoding's greedy choices; exact logits where the race could be won
(or its top-k or min-p set decided) give exactly its sampled choices."""

import dataclasses

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from specgen.core.sampling import Sampler, SamplingParams
from specgen.llama import screen
from specgen.app.config import RunConfig
from specgen.app.session import screenable

Q8_0 = GGMLQuantizationType.Q8_0


def q8_0(x: np.ndarray) -> np.ndarray:
    """x through Q8_0 and back, as ggml quantizes a product's activations."""
    return quants.dequantize(quants.quantize(np.ascontiguousarray(x, dtype=np.float32), Q8_0), Q8_0)


def approximate(head: screen.ScreenedHead, exact: np.ndarray, hidden: np.ndarray) -> np.ndarray:
    """What llama.cpp computes with the Q8_0 copy: w^ . h^."""
    w_hat = quants.dequantize(screen.quantize_head(exact)[0], Q8_0).astype(np.float64)
    return (q8_0(hidden).astype(np.float64) @ w_hat.T).astype(np.float32)


def hidden_states(rng, n_rows: int, n_embd: int) -> np.ndarray:
    """Hidden states with a few blocks far larger than the rest, as gemma's are."""
    h = rng.standard_normal((n_rows, n_embd)).astype(np.float32)
    h[:, rng.choice(n_embd, 4, replace=False)] *= 30
    return h


def rivals(rng, n_vocab: int, n_embd: int, dtype=np.float32) -> np.ndarray:
    """An output matrix whose rows come in near-identical pairs: Q8_0's error decides between them."""
    base = rng.standard_normal((n_vocab // 2, n_embd)) * 0.05
    return np.concatenate([base, base + rng.standard_normal(base.shape) * 2e-4]).astype(dtype)


@pytest.mark.parametrize("dtype,upcast", [(np.float32, False), (np.float16, False), (np.float32, True)])
def test_the_bound_holds_for_every_token(dtype, upcast):
    rng = np.random.default_rng(0)
    exact = rivals(rng, 2048, 128, dtype)
    if upcast:  # a matrix Q8_0 holds exactly (as an upcast quantized model's): only h^'s error is left
        exact = q8_0(exact)
    head = screen.ScreenedHead(exact, *screen.quantize_head(exact)[1:])
    hidden = hidden_states(rng, 64, 128)
    approx = approximate(head, exact, hidden)
    act = head.activations(hidden)
    true = act.h.astype(np.float64) @ exact.astype(np.float64).T  # plain's product reads h in W's type
    for r in range(len(hidden)):
        assert np.all(np.abs(true[r] - approx[r]) <= head.bound(np.arange(len(exact)), act, r))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_patched_rows_have_the_exact_argmax_where_the_copy_alone_would_not(dtype):
    rng = np.random.default_rng(1)
    exact = rivals(rng, 2048, 128, dtype)
    head = screen.ScreenedHead(exact, *screen.quantize_head(exact)[1:])
    hidden = hidden_states(rng, 400, 128)
    true = head.activations(hidden).h.astype(np.float64) @ exact.astype(np.float64).T
    logits = approximate(head, exact, hidden)
    wrong_before = int(np.sum(logits.argmax(axis=1) != true.argmax(axis=1)))
    head.patch(logits, hidden)
    assert wrong_before > 0  # the pairs make Q8_0 pick the wrong twin: the patch has work to do
    assert np.array_equal(logits.argmax(axis=1), true.argmax(axis=1))
    assert head.candidates < 0.05 * head.rows * len(exact)  # it recomputed few tokens


@pytest.mark.parametrize("params", [SamplingParams(0.3), SamplingParams(0.8), SamplingParams(1.5),
                                    SamplingParams(0.8, top_k=40, top_p=0.95, min_p=0.05), SamplingParams(1.0, min_p=0.1),
                                    SamplingParams(0.7, top_k=3)], ids=["T0.3", "T0.8", "T1.5", "llama-server",
                                                                       "min_p", "top_k"])
def test_patched_rows_give_the_exact_rows_race_winner(params):
    rng = np.random.default_rng(4)
    exact = rivals(rng, 4096, 128)
    head = screen.ScreenedHead(exact, *screen.quantize_head(exact)[1:])
    hidden = hidden_states(rng, 120, 128) * 3  # sharper rows: a few tokens in the running
    true = (head.activations(hidden).h.astype(np.float64) @ exact.astype(np.float64).T).astype(np.float32)
    logits = approximate(head, exact, hidden)
    positions = np.arange(100, 100 + len(hidden))
    wrong_before = 0
    for seed in range(3):
        sampler = Sampler(SamplingParams(**{**params.__dict__, "seed": seed}))
        rows = logits.copy()
        wrong_before += sum(sampler.sample(rows[r], t) != sampler.sample(true[r], t) for r, t in enumerate(positions))
        head.patch(rows, hidden, positions, sampler)
        assert [sampler.sample(rows[r], t) for r, t in enumerate(positions)] == \
            [sampler.sample(true[r], t) for r, t in enumerate(positions)]
    assert wrong_before > 0  # the copy alone would sample otherwise: the patch has work to do
    # it recomputed few tokens (a top-k's boundary among 4,096 near-identical pairs takes more)
    assert head.candidates < (0.1 if params.top_k else 0.02) * head.rows * len(exact)


def test_a_tie_goes_to_the_lowest_id_as_in_plain_decoding():
    rng = np.random.default_rng(2)
    hidden = hidden_states(rng, 1, 64)
    exact = rng.standard_normal((512, 64)).astype(np.float32) * 1e-4
    exact[7] = exact[300] = hidden[0] / np.linalg.norm(hidden[0]) ** 2  # identical rows, the largest logits
    head = screen.ScreenedHead(exact, *screen.quantize_head(exact)[1:])
    logits = approximate(head, exact, hidden)
    logits[0, 300] += 1e-3  # even when the copy favours the later one
    head.patch(logits, hidden)
    assert int(np.argmax(logits[0])) == 7


def test_only_models_whose_output_layer_is_a_good_share_of_them_are_screened():
    # (file type, n_vocab, n_embd, file bytes): the copy costs a model's size on disk
    assert screen.worth_screening("0", 262144, 640, 1_078_917_824)  # gemma-3-270m F32: 62%
    assert screen.worth_screening("0", 49152, 576, 539_845_696)  # smollm2-135m F32: 21%
    assert not screen.worth_screening("1", 128256, 4096, 16_060_522_496)  # an 8B model in F16: 7%
    assert not screen.worth_screening("15", 262144, 640, 253_113_024)  # Q4_K_M: its matrix is Q8_0 already
    assert not screen.worth_screening(None, 262144, 640, 1_078_917_824)


def test_only_cpu_runs_whose_choices_need_no_whole_row_are_screened(monkeypatch):
    from specgen.app.ask import why_exact_rows

    cfg = RunConfig(target="t")
    assert screenable(cfg.loading, "cpu")

    def serves(**sampling):  # what load_session's callers ask before it loads (screen=...)
        return why_exact_rows(dataclasses.replace(cfg, **sampling).sampling, constrained=False) is None

    assert serves() and serves(temperature=0.7)  # the race needs its contenders only
    assert serves(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
    assert not serves(temperature=0.7, top_p=0.9)  # the nucleus needs the mass
    assert not screenable(dataclasses.replace(cfg, gpu_layers=99).loading, "cpu")
    assert not screenable(dataclasses.replace(cfg, rpc="10.0.0.2:50052").loading, "cpu")
    assert not screenable(cfg.loading, "cuda")  # a GPU may take another route through a Q8_0 product
    monkeypatch.setenv("SPECGEN_SCREEN", "0")
    assert not screenable(cfg.loading, "cpu")


REAL_F32 = ["smollm2-135m-instruct-f32", "gemma-3-270m-f32"]


@pytest.mark.real
@pytest.mark.parametrize("target", REAL_F32)
def test_screened_greedy_and_sampled_decoding_equal_the_targets_own(target, monkeypatch):
    from harness import tokens_of
    from specgen.app.session import load_session

    cfg = RunConfig(target=target, draft=None, method="plain", chat=False)

    def plain(on, prompt, n=48, **sampling):
        return tokens_of("plain", prompt, target=target, draft=None, n=n, on=on, **sampling)

    screened = load_session(cfg.loading, ["plain"])
    assert screened.target.screen is not None  # else this compares the target with itself
    monkeypatch.setenv("SPECGEN_SCREEN", "0")
    own = load_session(cfg.loading, ["plain"])
    assert own.target.screen is None
    for prompt in ["The three primary colours are", "def fibonacci(n):", "Once upon a time, in a valley"]:
        assert plain(screened, prompt) == plain(own, prompt), prompt
    # Sampled: the race's winner (and the top-k, top-p and min-p sets it runs over) from exact logits.
    for prompt, seed, extra in [("The three primary colours are", 1, {}), ("Once upon a time, in a valley", 2, {}),
                                ("def fibonacci(n):", 3, dict(top_k=40, top_p=0.95, min_p=0.05))]:
        sampling = dict(temperature=0.8, seed=seed, **extra)
        assert plain(screened, prompt, 32, **sampling) == plain(own, prompt, 32, **sampling), (prompt, extra)
    assert screened.target.screen.candidates < 0.01 * screened.target.screen.rows * screened.target.n_vocab


class Recorder:
    """Stands in for a context's ScreenedHead: keeps what llama.cpp computed, patches nothing."""

    def __init__(self):
        self.rows = []

    def patch(self, logits, hidden, *rule):
        self.rows.append((np.array(logits), np.array(hidden)))


@pytest.mark.real
@pytest.mark.parametrize("target", REAL_F32)
def test_the_bound_holds_on_llama_cpps_own_q8_0_products(target):
    """The bound assumes how ggml computes a Q8_0 product (activations quantized to Q8_0 blocks): one
    row (ggml's vector path) and a batch (specgen's few-columns kernel or ggml's matmul) on this CPU."""
    from specgen.core.kv import evaluate
    from specgen.core.protocol import Batch
    from specgen.app.session import load_target

    model = load_target(RunConfig(target=target, draft=None).loading)
    head = model.screen
    ctx = model.new_context(512, n_seq_max=2, n_outputs=32)
    ctx.screen = recorder = Recorder()
    tokens = model.tokenize("The printing press was invented by Johannes Gutenberg around 1440 in Mainz, and it "
                            "spread across Europe within fifty years.")
    evaluate(ctx, tokens)  # the prompt, then its last token alone
    batch = Batch()
    for j, token in enumerate(tokens[:24]):
        batch.add(token, j, (1,), True)
    ctx.decode(batch)
    all_tokens = np.arange(model.n_vocab)
    for approx, hidden in recorder.rows:
        act = head.activations(hidden)
        true = act.h.astype(np.float64) @ np.asarray(head.exact, dtype=np.float64).T
        for r in range(len(approx)):
            assert np.all(np.abs(true[r] - approx[r]) <= head.bound(all_tokens, act, r))
    assert [len(a) for a, _ in recorder.rows] == [1, len(batch)]


@pytest.mark.real
def test_a_quantized_target_is_loaded_as_it_is():
    from specgen.app.session import load_target

    assert load_target(RunConfig(target="gemma-3-270m-q4_k_m", draft=None).loading).screen is None
