"""The prompt cache: a prompt that begins with the last generation's tokens reads only the rest, and
every greedy answer is the one a cold prefill gives. On the fake backend (the KV as tokens by
position: a wrong cell changes the logits) and through a real `specgen serve` against a second one
started with --no-prompt-cache."""

import json
import random
import urllib.request

import pytest

from fakes import FakeContext, FakeModel
from specgen.core.engine import GenerationRequest, TokenEvent, generate
from specgen.core.kv import PromptCache
from specgen.core.sampling import SamplingParams
from specgen.core.stats import RunStats
from specgen.drafting.lookup import LookupDrafter

LOOPY = {(3, 4): 5, (4, 5): 3, (5, 3): 4}  # a text that repeats: lookup drafts and gets accepted


def run(model, ctx, prompt, max_tokens, cache=None, stop_after=None):
    """The greedy tokens (a caller may stop after `stop_after` of them, closing the generator)."""
    stats = RunStats()
    events = generate(model, ctx, GenerationRequest(prompt, max_tokens, SamplingParams()), stats,
                      LookupDrafter(), cache)
    tokens = []
    for event in events:
        if isinstance(event, TokenEvent):
            tokens.append(event.token)
            if len(tokens) == stop_after:
                events.close()
                break
    return tokens, stats


def test_warm_answers_equal_cold_ones_and_only_the_rest_is_read():
    model = FakeModel(n_vocab=12, sharpness=1.5, script=LOOPY)
    warm, cache = FakeContext(model, n_ctx=512, n_seq_max=8, n_batch=8), PromptCache(min_keep=3)
    rng = random.Random(5)
    system = [0, 2, 3, 4, 5, 6, 7]
    conversation = list(system)
    kept = 0
    for turn in range(40):
        if rng.random() < 0.3:
            prompt = system + [rng.randrange(2, 12) for _ in range(rng.randrange(1, 6))]  # a new conversation
        else:
            conversation += [rng.randrange(2, 12) for _ in range(rng.randrange(0, 4))]
            prompt = list(conversation)
        held, written = list(cache.tokens[:cache.n]), warm.cells_written
        # max_tokens cuts a step short (the KV then holds more than the text); stop_after closes early
        stop_after = rng.choice([None, 1, 3])
        tokens, stats = run(model, warm, prompt, rng.randrange(1, 12), cache, stop_after)
        cold, cold_stats = run(model, FakeContext(model, n_ctx=512, n_seq_max=8, n_batch=8), prompt,
                               stats.n_tokens if stop_after is None else stop_after + 1, None, stop_after)
        assert tokens == cold[:len(tokens)], f"turn {turn}"
        shared = 0
        while shared < min(len(held), len(prompt) - 1) and held[shared] == prompt[shared]:
            shared += 1
        if written - shared > 512 // 2 or shared < 3:  # the head too far along, or too little to keep
            shared = 0
        assert stats.n_cached == shared and cold_stats.n_cached == 0
        kept += stats.n_cached
        # sequence 0 holds exactly what the cache says, position by position
        assert [warm.kv[0][p] for p in range(cache.n)] == cache.tokens[:cache.n]
        assert sorted(warm.kv[0]) == list(range(cache.n))
        if rng.random() < 0.5:
            conversation = prompt + tokens  # the answer joins the conversation, as a client resends it
    assert kept > 100


def test_the_prefill_reads_only_tokens_past_the_common_prefix():
    model = FakeModel(n_vocab=12, script=LOOPY)
    ctx, cache = FakeContext(model, n_ctx=256, n_seq_max=8, n_batch=4), PromptCache(min_keep=1)
    first = [0, 2, 3, 4, 5, 6, 7, 8, 9]
    answer, _ = run(model, ctx, first, 5, cache)
    ctx.calls.clear()
    second = first + answer + [10, 11, 2]
    _, stats = run(model, ctx, second, 3, cache)
    assert stats.n_cached == len(first) + len(answer) - 1  # the answer's last token was never evaluated
    prefill_positions = [p for b in ctx.calls[:2] for p in b.positions]
    assert prefill_positions[0] == stats.n_cached and len(second) - 2 in prefill_positions
    _, stats = run(model, ctx, [0, 5, 5], 3, cache)  # shares only the first token
    assert stats.n_cached == 1
    _, stats = run(model, ctx, [0, 5, 5], 3, cache)  # the same prompt again: all but its root
    assert stats.n_cached == 2
    cache.min_keep = 3
    _, stats = run(model, ctx, [0, 5, 9, 7], 3, cache)  # 2 tokens shared: too few to keep
    assert stats.n_cached == 0


def test_the_cache_starts_over_before_the_head_leads_a_cold_start_by_half_the_context():
    """Attention sums cells in cell order: a warm run must not wrap around the cache where a cold
    one would not, so a head far along (cells taken by drafts and earlier turns) means a clear."""
    model = FakeModel(n_vocab=12, script=LOOPY)
    ctx, cache = FakeContext(model, n_ctx=64, n_seq_max=8), PromptCache(min_keep=1)
    prompt = [0, 2, 3, 4, 5]
    kept = []
    for _ in range(20):
        written = ctx.cells_written
        _, stats = run(model, ctx, prompt, 6, cache)
        n_cached = stats.n_cached
        kept.append(n_cached)
        assert (n_cached == len(prompt) - 1) == (0 < written and written - (len(prompt) - 1) <= 64 // 2)
    assert kept[0] == 0 and kept[1] == len(prompt) - 1 and 0 in kept[2:] and kept[-1] > 0


def test_an_error_midway_forgets_what_the_kv_held():
    model = FakeModel(n_vocab=12, script=LOOPY)
    ctx, cache = FakeContext(model, n_ctx=256, n_seq_max=8), PromptCache(min_keep=1)
    run(model, ctx, [0, 2, 3, 4, 5], 4, cache)
    assert cache.n > 0

    class Broken(LookupDrafter):
        def propose(self, max_depth):
            raise RuntimeError("drafter failed")

    events = generate(model, ctx, GenerationRequest([0, 2, 3, 4, 5, 6], 4, SamplingParams()), RunStats(), Broken(),
                      cache)
    with pytest.raises(RuntimeError):
        list(events)
    assert cache.n == 0


# -- real models ---------------------------------------------------------------------------------

@pytest.mark.real
@pytest.mark.parametrize("name", ["smollm2", "gemma"])
def test_a_prefill_in_invariant_decodes_is_the_same_bits_however_it_is_split(request, name):
    """The prompt cache's premise: in decodes of at most INVARIANT_ROWS tokens a token's KV does not
    depend on what shared its decode, so a kept prefix (read by an earlier prompt's decodes, or one
    token at a time as generated) and the rest give the cold prefill's logits, bit for bit. (In
    n_batch decodes they do not: a prompt of more than 128 tokens goes to llama.cpp's kernels.)"""
    import numpy as np

    from specgen.core.kv import INVARIANT_ROWS, evaluate

    model = request.getfixturevalue(name)
    ctx = model.new_context(1024, n_batch=512, n_threads=2)
    text = " ".join(["The agent called get_weather for Paris and got 18 C and sunny, then answered."] * 20)
    tokens = model.tokenize(text, add_special=True, parse_special=False)[:300]

    def last_logits(parts: list[int], chunk: int) -> np.ndarray:
        ctx.clear()
        pos, last = 0, None
        for n in parts:
            last = evaluate(ctx, tokens[pos:pos + n], start_pos=pos, chunk=chunk)
            pos += n
        return np.array(last, copy=True)

    cold = last_logits([300], INVARIANT_ROWS)
    for parts in ([4, 296], [37, 263], [130, 170], [299, 1], [1] * 20 + [280]):
        assert np.array_equal(last_logits(parts, INVARIANT_ROWS), cold), parts[:3]


@pytest.mark.real
def test_without_a_prompt_cache_a_q4_1_prompt_is_read_as_a_prompt_cache_reads_it(smollm2, gemma):
    """`specgen generate` (no prompt cache) reads a Q4_1 model's prompt in the prompt cache's decodes,
    which specgen's kernels read faster (backend.prompt_chunk), so its first token's log-probabilities
    are the bits `specgen serve` gives, cache on or off. Q4_K_M's prompts stay in n_batch decodes
    (llama.cpp's tiled kernels read them faster)."""
    from specgen.llama.backend import prompt_chunk

    text = " ".join(["The agent called get_weather for Paris and got 18 C and sunny, then answered."] * 20)
    tokens = smollm2.tokenize(text, add_special=True, parse_special=False)[:300]
    ctx = smollm2.new_context(1024, n_batch=512, n_threads=2)

    def first(cache):
        request = GenerationRequest(tokens, 1, SamplingParams(), logprobs=5)
        return next(e for e in generate(smollm2, ctx, request, RunStats(), None, cache)
                    if isinstance(e, TokenEvent)).logprob

    assert first(None) == first(PromptCache(reuse=False))
    assert gemma.prompt_chunk is None and smollm2.prompt_chunk == 128
    info = "| SPECGEN_INVARIANT = on | SPECGEN_KERNELS = avx512vnni: q8_0 q4_1 |"
    assert prompt_chunk("3", info, 0) == 128 and prompt_chunk("9", info, 0) is None  # Q5_1's kernel is off
    assert prompt_chunk("3", info, 1) is None and prompt_chunk("3", info.replace("= on", "= off"), 0) is None


# -- a real server ---------------------------------------------------------------------------------

SYSTEM = {"role": "system", "content": "You are a terse assistant for a travel agency. Answer in one sentence, "
          "name the city and the month, never invent a price, and say when a tool gave the answer. Refunds are "
          "possible within 24 hours of booking; one change per booking is free."}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {
        "type": "string", "enum": ["C", "F"]}}, "required": ["city", "unit"]}}}


RAW = "Rivers run to the sea"


def conversations() -> list[tuple[str, list[dict], dict]]:
    """(name, messages, extra request fields): a system prompt shared, conversations that grow turn by
    turn, a tool loop; unrelated prompts between them."""
    out = []
    talk = [SYSTEM]
    for i, q in enumerate(["Where should I go in May?", "And what should I pack?", "How long a stay?"]):
        talk = talk + [{"role": "user", "content": q}]
        out.append((f"talk{i}", talk, {}))
        talk = talk + [{"role": "assistant", "content": f"Answer number {i}: Lisbon is lovely then."}]
    for city in ("Paris", "Oslo"):
        loop = [SYSTEM, {"role": "user", "content": f"What is the weather in {city}?"}]
        out.append((f"call-{city}", loop, {"tools": [WEATHER], "tool_choice": "required"}))
        loop = loop + [{"role": "assistant", "content": None, "tool_calls": [{
            "id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city, "unit": "C"})}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "18 C and sunny"}]
        out.append((f"answer-{city}", loop, {"tools": [WEATHER], "tool_choice": "none"}))
    out.append(("other", [{"role": "user", "content": "Write a haiku about rain."}], {}))
    out.append(("raw", None, {}))  # /v1/completions with a plain prompt
    return out


@pytest.fixture(scope="module")
def servers():
    from test_serve import Served

    warm, cold = Served("--method", "auto"), Served("--method", "auto", "--no-prompt-cache")
    yield warm, cold
    warm.stop()
    cold.stop()


def ask(server, messages, extra):
    """(answer text with its calls, cached tokens, cache_n)"""
    if messages is None:
        r = server.client.completions.create(model="m", prompt=RAW, max_tokens=24, temperature=0)
        return r.choices[0].text, r.usage.prompt_tokens_details, r.model_extra["timings"]
    r = server.client.chat.completions.create(model="m", messages=messages, max_tokens=32, temperature=0, **extra)
    m = r.choices[0].message
    calls = [(c.function.name, c.function.arguments) for c in m.tool_calls or ()]
    return (m.content, calls), r.usage.prompt_tokens_details, r.model_extra["timings"]


def prompt_tokens(server, messages, extra) -> list[int]:
    """The tokens the server reads for a request (as the runner encodes them: runner.encode_prompt)."""
    if messages is None:
        _, r, _ = server.post("/tokenize", json.dumps({"content": RAW, "add_special": True,
                                                        "parse_special": False}).encode())
        return r["tokens"]
    _, r, _ = server.post("/apply-template", json.dumps({"messages": messages, **extra}).encode())
    _, r, _ = server.post("/tokenize", json.dumps({"content": r["prompt"], "add_special": True}).encode())
    tokens = r["tokens"]
    return tokens[1:] if len(tokens) >= 2 and tokens[0] == tokens[1] else tokens


def common(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.real
def test_warm_server_answers_equal_a_cold_servers_in_random_order(servers):
    warm, cold = servers
    asks = conversations() * 2
    random.Random(11).shuffle(asks)
    asks = [a for i, a in enumerate(asks) if i == 0 or a[0] != asks[i - 1][0]] + [asks[-1]]  # and one repeat
    cold_answers = {}
    cached_all, shared_with_none, reused = 0, 0, 0
    previous: list[int] = []
    for name, messages, extra in asks:
        got, details, timings = ask(warm, messages, extra)
        if name not in cold_answers:
            cold_answers[name], cold_details, _ = ask(cold, messages, extra)
            assert cold_details.cached_tokens == 0
        assert got == cold_answers[name], name
        tokens = prompt_tokens(warm, messages, extra)
        shared = common(previous, tokens)
        # the last request's prompt is all in the KV (and some of its answer); never the root; a prefix
        # under 32 tokens (the template's header) is not worth keeping
        assert details.cached_tokens == timings["cache_n"] <= len(tokens) - 1, name
        assert details.cached_tokens >= min(shared, len(tokens) - 1) or shared < 32 and details.cached_tokens == 0
        reused += details.cached_tokens >= 32
        assert timings["prompt_n"] == len(tokens) - details.cached_tokens
        if shared == 0:
            assert details.cached_tokens == 0, name
            shared_with_none += 1
        cached_all += details.cached_tokens
        previous = tokens
    assert reused >= 5 and shared_with_none > 0
    text = urllib.request.urlopen(warm.url + "/metrics").read().decode()
    cached_total = next(float(line.split()[-1]) for line in text.splitlines()
                        if line.startswith("llamacpp:prompt_tokens_cached_total"))
    assert cached_total == cached_all
