"""The prompt cache: a prompt that begins with the last generation's tokens reads only the rest, and
every greedy answer is the one a cold prefill gives. On the fake backend (the KV as tokens by
position: a wrong cell changes the logits) and through a real `specgen serve` against a second one
started with --no-prompt-cache."""

import json
import random
import urllib.request

import pytest

from fakes import FakeContext, FakeModel
from harness import generated
from specgen.core.engine import GenerationRequest, TokenEvent, generate
from specgen.core.kv import PromptCache, common_prefix
from specgen.core.sampling import SamplingParams
from specgen.core.stats import RunStats
from specgen.drafting.lookup import LookupDrafter

LOOPY = {(3, 4): 5, (4, 5): 3, (5, 3): 4}  # a text that repeats: lookup drafts and gets accepted


def run(model, ctx, prompt, max_tokens, cache=None, stop_after=None, cache_prompt=True):
    """The greedy tokens (a caller may stop after `stop_after` of them, closing the generator)."""
    done = generated(model, ctx, prompt, max_tokens, SamplingParams(), LookupDrafter(), cache=cache,
                     stop_after=stop_after, cache_prompt=cache_prompt)
    return done.tokens, done.stats


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
        # the head too far along (more than half the room a cold start has left), or too little to keep
        if written - shared > (512 - (len(prompt) - 1)) // 2 or shared < 3:
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


def test_the_cache_starts_over_before_the_head_leads_a_cold_start_by_half_its_room():
    """Attention sums cells in cell order: a warm run must not wrap around the cache where a cold
    one would not, so a head far along (cells taken by drafts and earlier turns) means a clear: once
    it leads a cold start's by more than half the cells a cold start has left after the prompt."""
    model = FakeModel(n_vocab=12, script=LOOPY)
    ctx, cache = FakeContext(model, n_ctx=64, n_seq_max=8), PromptCache(min_keep=1)
    prompt = [0, 2, 3, 4, 5]
    kept = []
    for _ in range(20):
        written = ctx.cells_written
        _, stats = run(model, ctx, prompt, 6, cache)
        n_cached = stats.n_cached
        kept.append(n_cached)
        assert (n_cached == len(prompt) - 1) == (0 < written and written - (len(prompt) - 1) <= (64 - 4) // 2)
    assert kept[0] == 0 and kept[1] == len(prompt) - 1 and 0 in kept[2:] and kept[-1] > 0


def test_with_a_budget_a_head_too_far_along_is_put_back_compact():
    """Where one slot starts over, a budget saves the prefix and puts it back from cell 0: kept.
    (One token a run: the live prefix never loses enough to be saved before.)"""
    model = FakeModel(n_vocab=12, script=LOOPY)
    ctx, cache = FakeContext(model, n_ctx=64, n_seq_max=8), PromptCache(min_keep=3, budget=1 << 20)
    prompt = [0, 2, 3, 4, 5]
    written, kept = [], []
    for _ in range(60):
        written.append(ctx.cells_written)
        kept.append(run(model, ctx, prompt, 1, cache)[1].n_cached)
    assert max(written) - (len(prompt) - 1) > (64 - 4) // 2  # one slot would have started over
    assert kept[0] == 0 and set(kept[1:]) == {len(prompt) - 1}


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


def test_saved_prefixes_come_back_for_interleaved_conversations():
    """Three conversations interleaved at random: with a budget each resumes from its own saved
    prefix (the whole previous prompt kept) and answers as a cold cache does; in one slot each
    switch reads its prompt whole; a budget for one saved prefix drops the least recently used."""
    model = FakeModel(n_vocab=12, sharpness=1.5, script=LOOPY)
    rng = random.Random(7)
    order = [c for c in (0, 1, 2) for _ in range(6)]
    rng.shuffle(order)
    systems = [[0] + [rng.randrange(2, 12) for _ in range(8)] for _ in range(3)]

    def play(budget):
        ctx, cache = FakeContext(model, n_ctx=1024, n_seq_max=8, n_batch=8), PromptCache(min_keep=3, budget=budget)
        talks, cached, restored = [list(s) for s in systems], [], 0
        for c in order:
            previous = list(talks[c])
            talks[c] += [rng.randrange(2, 12) for _ in range(3)]
            live = list(cache.tokens[:cache.n])
            tokens, stats = run(model, ctx, talks[c], 5, cache)
            cold, _ = run(model, FakeContext(model, n_ctx=1024, n_seq_max=8, n_batch=8), talks[c], stats.n_tokens)
            assert tokens == cold
            assert sorted(ctx.kv[0]) == list(range(cache.n))  # from position 0, nothing missing
            cached.append((stats.n_cached, len(previous) - 1 if len(previous) > len(systems[c]) else 0))
            restored += stats.n_cached > 0 and common_prefix(live, talks[c]) < 3
            talks[c] += tokens
        return cached, restored, cache

    cached, restored, cache = play(budget=1 << 20)
    assert all(got >= want for got, want in cached) and restored >= 6, cached
    cached, restored, _ = play(budget=0)
    assert restored == 0
    one = len(cache.saved[-1].state) + 10
    _, _, cache = play(budget=one)
    assert len(cache.saved) == 1 and sum(len(s.state) for s in cache.saved) <= one


def test_a_request_that_keeps_no_cache_leaves_the_live_conversation_saved():
    """cache_prompt: false reads its own prompt whole, but the conversation the KV held is saved
    first (with a budget), so the next turn of that conversation still resumes from it."""
    model = FakeModel(n_vocab=12, sharpness=1.5, script=LOOPY)
    ctx, cache = FakeContext(model, n_ctx=1024, n_seq_max=8, n_batch=8), PromptCache(min_keep=3, budget=1 << 20)
    talk = [0, 3, 4, 5, 6, 7, 8, 9, 2, 3]
    talk += run(model, ctx, talk, 6, cache)[0]
    other, stats = run(model, ctx, [0, 9, 8, 7, 6, 5, 4, 3], 4, cache, cache_prompt=False)
    assert stats.n_cached == 0
    talk += [4, 4, 5]
    tokens, stats = run(model, ctx, talk, 5, cache)
    assert stats.n_cached >= len(talk) - 4, stats.n_cached
    assert tokens == run(model, FakeContext(model, n_ctx=1024, n_seq_max=8, n_batch=8), talk, 5)[0]


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
def test_without_a_prompt_cache_a_prompt_is_read_as_a_prompt_cache_reads_it(smollm2, gemma):
    """`specgen generate` (no prompt cache) reads a prompt in the prompt cache's decodes wherever
    specgen's kernel for the model's weights is on (backend.prompt_chunk: they read it at least as
    fast), so its first token's log-probabilities are the bits `specgen serve` gives, cache on or
    off: smollm2 Q4_1 and, since 2026-11-29, gemma Q4_K_M. F32 and F16 need the AVX-512 kernels
    (on AVX2 llama.cpp's tiled product reads them faster)."""
    from specgen.llama.backend import prompt_chunk

    text = " ".join(["The agent called get_weather for Paris and got 18 C and sunny, then answered."] * 20)
    for model in (smollm2, gemma):
        tokens = model.tokenize(text, add_special=True, parse_special=False)[:300]
        ctx = model.new_context(1024, n_batch=512, n_threads=2)

        def first(cache):
            request = GenerationRequest(tokens, 1, SamplingParams(), logprobs=5)
            return next(e for e in generate(model, ctx, request, RunStats(), None, cache)
                        if isinstance(e, TokenEvent)).logprob

        assert first(None) == first(PromptCache(reuse=False))
        ctx.close()
    assert gemma.prompt_chunk == 128 and smollm2.prompt_chunk == 128
    info = "| SPECGEN_INVARIANT = on | SPECGEN_KERNELS = avx2: q8_0 q4_1 q4_k f32 |"
    assert prompt_chunk("3", info, 0) == 128 and prompt_chunk("9", info, 0) is None  # Q5_1's kernel is off
    assert prompt_chunk("15", info, 0) == 128 and prompt_chunk("14", info, 0) == 128  # Q4_K_M, Q4_K_S
    assert prompt_chunk("0", info, 0) is None and prompt_chunk("0", info.replace("f32", "f32x16"), 0) == 128
    assert prompt_chunk("3", info, 1) is None and prompt_chunk("3", info.replace("= on", "= off"), 0) is None
    assert prompt_chunk("30", info, 0) is None and prompt_chunk(None, info, 0) is None  # BF16; no file type


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
    """auto with its prompt cache, and without (shared with other modules: harness.server)."""
    from harness import server

    return server(), server("--no-prompt-cache")


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


def cached_total(server) -> float:
    """The prompt tokens the server has taken from its cache since it started (/metrics)."""
    text = urllib.request.urlopen(server.url + "/metrics").read().decode()
    return next(float(line.split()[-1]) for line in text.splitlines()
                if line.startswith("llamacpp:prompt_tokens_cached_total"))


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
    cached_before = cached_total(warm)  # the server is shared: what earlier requests had from its cache
    cached_all, shared_with_none, reused = 0, 0, 0
    previous: list[int] = []
    earlier: list[list[int]] = []  # every prompt before: a saved prefix may come back (--prompt-cache-mb)
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
        if max((common(e, tokens) for e in earlier), default=0) == 0:
            assert details.cached_tokens == 0, name
            shared_with_none += 1
        cached_all += details.cached_tokens
        previous = tokens
        earlier.append(tokens)
    assert reused >= 5 and shared_with_none > 0
    assert cached_total(warm) - cached_before == cached_all


@pytest.mark.real
def test_cache_prompt_false_reads_the_whole_prompt(servers):
    """llama-server's cache_prompt: false is a setting asked for: that request keeps nothing (and
    answers the same); the next one may use the cache again."""
    warm, _ = servers
    talk = [SYSTEM, {"role": "user", "content": "Where should I go in June?"}]
    first, _, _ = ask(warm, talk, {})
    again, details, timings = ask(warm, talk, {"extra_body": {"cache_prompt": False}})
    assert again == first and details.cached_tokens == timings["cache_n"] == 0
    _, details, _ = ask(warm, talk, {"extra_body": {"cache_prompt": True}})
    assert details.cached_tokens > 32
    status, body, _ = warm.post("/v1/chat/completions", json.dumps({"messages": talk, "cache_prompt": "no"}).encode())
    assert status == 400 and "cache_prompt expects true or false, found \"no\"" in body["error"]["message"]


@pytest.mark.real
def test_switching_tool_choice_keeps_the_system_prompt_and_the_history(servers):
    """An agent's loop: a `required` call, then a `none` answer, then `auto`. In the generic tool
    format what depends on tool_choice comes after the shared part (the tools, the system prompt and
    the conversation), so each turn keeps the whole previous prompt; the answers are a cold server's."""
    warm, cold = servers
    turn1 = [SYSTEM, {"role": "user", "content": "What is the weather in Rome today?"}]
    (_, calls), _, _ = ask(warm, turn1, {"tools": [WEATHER], "tool_choice": "required"})
    assert calls and calls[0][0] == "get_weather"
    turn2 = turn1 + [{"role": "assistant", "content": None, "tool_calls": [{
        "id": "c7", "type": "function", "function": {"name": calls[0][0], "arguments": calls[0][1]}}]},
        {"role": "tool", "tool_call_id": "c7", "content": "21 C and cloudy"}]
    turn3 = turn2 + [{"role": "assistant", "content": "It is 21 C and cloudy in Rome."},
                     {"role": "user", "content": "And in Milan?"}]
    previous = turn1
    for messages, choice in ((turn2, "none"), (turn3, "auto")):
        extra = {"tools": [WEATHER], "tool_choice": choice}
        got, details, _ = ask(warm, messages, extra)
        assert got == ask(cold, messages, extra)[0], choice
        # the last prompt as `auto` renders it (no note): all of it but the assistant's header
        history = prompt_tokens(warm, previous, {"tools": [WEATHER], "tool_choice": "auto"})
        assert details.cached_tokens >= len(history) - 6, choice
        previous = messages


AGENTS = [{"role": "system", "content": text} for text in (
    "You are the booking agent of a small hotel in Porto. Rooms: single, double, suite. Breakfast is served "
    "from 7 to 10. Check-in from 15:00, check-out by 11:00. Answer in one short sentence.",
    "You are a support agent for a bicycle shop in Utrecht. Repairs take two days; a flat tyre is fixed while "
    "the customer waits. The shop opens at 9 and closes at 18, Monday to Saturday. Be brief.",
    "You are a librarian at a public library. Members may borrow ten books for three weeks and renew twice "
    "online. Late returns cost ten cents a day. Reply in a single sentence, politely.")]
QUESTIONS = ("What can you tell me?", "Is there anything I should know first?", "What about tomorrow?")


@pytest.mark.real
def test_interleaved_conversations_each_resume_their_own_prefix(servers):
    """Three agents' conversations interleaved in a random order (a fixed seed): each request resumes
    its own conversation (the whole previous prompt kept, brought back from host memory when another
    conversation came between), and every greedy answer is a cold server's."""
    warm, cold = servers
    order = [a for a in range(3) for _ in QUESTIONS]
    random.Random(3).shuffle(order)
    talks = [[system] for system in AGENTS]
    turn, last, restores = [0, 0, 0], None, 0
    before: list[list[int]] = [[], [], []]
    for a in order:
        talks[a] = talks[a] + [{"role": "user", "content": QUESTIONS[turn[a]]}]
        got, details, _ = ask(warm, talks[a], {})
        assert got == ask(cold, talks[a], {})[0], (a, turn[a])
        tokens = prompt_tokens(warm, talks[a], {})
        if turn[a]:
            assert details.cached_tokens >= common(before[a], tokens) > 32, (a, turn[a])
            restores += last != a
        before[a], last, turn[a] = tokens, a, turn[a] + 1
        talks[a] = talks[a] + [{"role": "assistant", "content": got[0]}]
    assert restores >= 3
