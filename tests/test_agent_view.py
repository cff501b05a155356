"""The agent bench's table leads with what a user compares, on the same work: `auto` with its
cache against llama-server and against specgen's cached plain, over the whole loop and per token
decoded (rows that write more tokens are not faster for it)."""

from specgen.bench.agent_summary import as_json, summarize
from specgen.bench.agent_view import render

ROWS = ["plain --no-prompt-cache", "plain", "auto", "llama-server"]


def record(row: str, wall_s: float, tokens: int, identical: bool = True) -> dict:
    return {"prompt_id": "agent-02", "turn": 1, "kind": "call", "row": row, "wall_s": wall_s, "ttft_s": 0.1,
            "completion_tokens": tokens, "decode_s": wall_s / 2, "prompt_n": 100, "cache_n": 0, "prompt_s": 0.1,
            "identical": identical, "call_made": True, "error": None, "calls": [], "finish_reason": "stop"}


def test_the_lead_line_sets_auto_against_llama_server_per_decoded_token():
    # llama-server took twice auto's time but wrote 1.5 times its tokens: 2x the loop, 1.33x a token.
    records = [record("plain --no-prompt-cache", 8.0, 100), record("plain", 4.0, 100), record("auto", 2.0, 100),
               record("llama-server", 4.0, 150, identical=False)]
    data = {"settings": {"methods": ROWS, "baseline": ROWS[0], "max_tokens": 128, "n_prompts": 1},
            "summary": as_json(summarize(records, ROWS)), "records": records}
    text = render(data, "x.json")
    lead = text.split("\n")[2]
    assert lead.startswith("`auto` (prompt cache on) ran")
    assert "as plain 2.00x and 2.00x (100 tokens decoded against auto's 100)" in lead
    assert "as llama-server 2.00x and 1.33x (150 tokens decoded against auto's 100; its histories are the " \
           "baseline's replies, and 0 of its 1 replies were the same)" in lead
    table = {}  # the first table's rows (the per-turn table below repeats the names)
    for line in text.split("\n"):
        if line.startswith("| "):
            table.setdefault(line.split(" | ")[0].strip("| "), line.split(" | "))
    assert table["llama-server"][3:5] == ["150", "26.7"] and table["auto"][3:5] == ["100", "20.0"]


def test_the_lead_over_llama_server_has_its_interval_over_conversations_resampled_whole():
    """Each conversation's requests go together into the bootstrap (not each request on its own),
    seeded, so the same file renders the same interval; one conversation has no interval to give."""
    from specgen.bench.agent_summary import loop_spread
    from specgen.bench.summary import speedup_spread

    # Conversations differ (llama-server 1.5x-4x auto's time); requests within one vary a little.
    records, speed = [], {"agent-02": 1.5, "agent-04": 4.0, "agent-06": 2.0, "agent-08": 3.0, "agent-10": 2.5}
    for conv, ratio in speed.items():
        for turn, jitter in enumerate((1.1, 1.0, 0.9)):
            for row, wall in ((ROWS[0], 8.0), ("plain", 4.0), ("auto", 2.0 * jitter), ("llama-server", 2.0 * ratio)):
                records.append({**record(row, wall, 100), "prompt_id": conv, "turn": turn + 1})
    data = {"settings": {"methods": ROWS, "baseline": ROWS[0], "max_tokens": 128, "n_prompts": 5},
            "summary": as_json(summarize(records, ROWS)), "records": records}
    lead = render(data, "x.json").split("\n")[2]
    low, high = loop_spread(records, "llama-server", "auto")
    theirs = [r["wall_s"] for r in records if r["row"] == "llama-server"]
    mine = [r["wall_s"] for r in records if r["row"] == "auto"]
    convs = [r["prompt_id"] for r in records if r["row"] == "auto"]
    _, whole_low, whole_high, _ = speedup_spread(theirs, mine, convs)
    _, naive_low, naive_high, _ = speedup_spread(theirs, mine)  # every request its own conversation
    assert (low, high) == (whole_low, whole_high) and high - low > naive_high - naive_low
    ratio = sum(theirs) / sum(mine)
    assert f"as llama-server {ratio:.2f}x (90% interval over conversations {low:.2f}-{high:.2f}x) and" in lead
    assert f"{naive_low:.2f}-{naive_high:.2f}x" not in lead
    assert render(data, "x.json") == render(data, "x.json")  # seeded
    one = [r for r in records if r["prompt_id"] == "agent-02"]
    data = {**data, "summary": as_json(summarize(one, ROWS)), "records": one}
    assert "interval over conversations" not in render(data, "x.json")
