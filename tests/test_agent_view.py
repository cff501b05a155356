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
