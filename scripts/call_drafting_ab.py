"""Call-aware drafting A/B (docs/structured-output.md, "Call-aware drafting"): constrained plain,
`jump`, `auto` without the call-aware source and `auto` with it, on tool loops driven as an agent
drives them (tool_choice required, a canned result per call, the next user turn), interleaved
(the order rotates each round), every text checked identical to plain's. Each method's texts of
earlier runs are forgotten before it runs (no method drafts from another's answers).

    python scripts/call_drafting_ab.py 2          # 5 loops of our own, 2 rounds
    python scripts/call_drafting_ab.py 2 suite    # specgen/suites/json.jsonl's tool records (one turn)
"""
import dataclasses, json, sys, time, statistics
from specgen.app.config import RunConfig
from specgen.app.session import load_session
from specgen.app.runner import Runner
from specgen.app.prompts import Prompt, Message
from specgen.app.structured import read_tools
from specgen.core.kv import PromptCache
from specgen.core.stats import RunStats

def fn(name, props, req=None):
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": props, "required": req or list(props)}}}
S = {"type": "string"}
WEATHER = fn("get_weather", {"city": S, "unit": {"enum": ["celsius", "fahrenheit"]}})
FORECAST = fn("get_forecast", {"city": S, "days": {"type": "integer"}})
EVENT = fn("create_event", {"title": S, "date": S, "attendees": {"type": "array", "items": S}})
EMAIL = fn("send_email", {"to": S, "subject": S, "body": S})
CUST = fn("find_customer", {"name": S})
ORDERS = fn("list_orders", {"customer_id": S, "status": {"enum": ["open", "shipped", "all"]}})
REFUND = fn("refund_order", {"customer_id": S, "order_id": S, "reason": S})
READ = fn("read_file", {"path": S})
WRITE = fn("write_file", {"path": S, "content": S})
CONVS = [
    ([WEATHER, FORECAST], ["What's the weather in San Francisco, in fahrenheit?", "And the forecast for the next 3 days there?",
                           "Now the weather in Buenos Aires, also in fahrenheit.", "And its forecast for 3 days?"]),
    ([EVENT, EMAIL], ["Create an event 'Design review' on 2027-03-14 with alice@example.com and bob@example.com.",
                      "Email alice@example.com with the subject 'Design review' saying the room is booked.",
                      "Also create 'Design review follow-up' on 2027-03-21 with the same attendees."]),
    ([CUST, ORDERS, REFUND], ["Find the customer named Margaret Holloway.", "List her open orders.",
                              "Refund order O-55817 for her, reason: damaged in transit."]),
    ([READ, WRITE], ["Read the file /home/ana/projects/report/notes.md.", "Now read /home/ana/projects/report/summary.md too.",
                     "Write 'Draft ready' to /home/ana/projects/report/status.txt."]),
    ([WEATHER, EMAIL], ["What's the weather in Reykjavik in celsius?", "Email sigrun@example.is with the subject 'Weather in Reykjavik' and the weather.",
                        "Check the weather in Reykjavik again, in fahrenheit."]),
]
RESULTS = {"find_customer": lambda a: {"customer_id": "C-20931", "name": a.get("name"), "tier": "gold"},
           "list_orders": lambda a: {"orders": [{"order_id": "O-55817", "status": "open"}, {"order_id": "O-55902", "status": "open"}]},
           "get_weather": lambda a: {"temperature": 18, "conditions": "sunny"},
           "get_forecast": lambda a: {"days": [{"high": 20}, {"high": 17}, {"high": 15}]},
           "create_event": lambda a: {"event_id": "E-7781", "status": "created"},
           "send_email": lambda a: {"status": "sent"}, "read_file": lambda a: {"content": "Quarterly notes: revenue up 4%."},
           "refund_order": lambda a: {"status": "refunded"}, "write_file": lambda a: {"status": "written"}}
if len(sys.argv) > 2 and sys.argv[2] == "suite":
    CONVS = []
    for l in open("specgen/suites/json.jsonl"):
        r = json.loads(l)
        if "tools" in r:
            CONVS.append((r["tools"], r["turns"]))
N = int(sys.argv[1]) if len(sys.argv) > 1 else 2
base = RunConfig(target="smollm2-135m-instruct-q4_1", draft=None, method="plain", max_tokens=96, store=False)
s = load_session(base.loading, ["plain", "auto", "jump"], store_default=False, screen=False)
caches = {}
def runner(label):
    m = {"auto-nocall": "auto"}.get(label, label)
    r = Runner(dataclasses.replace(base, method=m), s)
    if label == "auto-nocall":
        r.method = dataclasses.replace(r.method, call_aware=False)
    r.prompt_cache = caches.setdefault(id(r._ctx), PromptCache())
    return r
LABELS = ["plain", "jump", "auto-nocall", "auto"]
runners = {l: runner(l) for l in LABELS}
def conversation(r, tools, turns):
    hist, texts, st = (), [], RunStats()
    t = read_tools(tools, "required")
    for i, q in enumerate(turns):
        p = Prompt(0, q, hist, tools=t)
        a = r.ask(p)
        c = r.run(a)
        texts.append(c.text); st.add(c.stats)
        call = r.answer(a, c.text).calls
        if not call:
            break
        call = call[0]
        res = json.dumps(RESULTS[call.name](json.loads(call.arguments)))
        tc = {"id": f"c{i}", "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
        hist = hist + (Message("user", q), Message("assistant", None, tool_calls=(tc,)), Message("tool", res, tool_call_id=f"c{i}"))
    return texts, st
rows = {}  # (conv, label) -> list of (decode_s, tokens, stats)
for rep in range(N):
    for ci, (tools, turns) in enumerate(CONVS):
        order = LABELS[rep % 4:] + LABELS[:rep % 4]
        out = {}
        for l in order:
            s.forget_texts()  # no method drafts from another's (or an earlier repeat's) answers
            texts, st = conversation(runners[l], tools, turns)
            out[l] = texts
            rows.setdefault((ci, l), []).append(st)
        same = all(out[l] == out["plain"] for l in LABELS)
        if rep == 0:
            print(ci, "identical:", same, [t[:90] for t in out["plain"]], flush=True)
        assert same, {l: out[l] for l in LABELS}
print("conv  " + "  ".join(f"{l:>22}" for l in LABELS[1:]))
allr = {l: [] for l in LABELS}
for ci in range(len(CONVS)):
    cells = []
    for l in LABELS:
        rates = [st.n_tokens / st.decode_s for st in rows[(ci, l)]]
        allr[l].append(rates)
    for l in LABELS[1:]:
        ratios = [a / b for a, b in zip(allr[l][ci], allr["plain"][ci])]
        st = rows[(ci, l)][0]
        cells.append(f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}] calls {st.target_calls} call-acc {st.accepted_by.get('call', 0)}")
    print(ci, " | ".join(cells), "plain calls", rows[(ci, 'plain')][0].target_calls)
for l in LABELS[1:]:
    tot = [sum(rows[(ci, l)][k].n_tokens for ci in range(len(CONVS))) / sum(rows[(ci, l)][k].decode_s for ci in range(len(CONVS))) for k in range(N)]
    totp = [sum(rows[(ci, 'plain')][k].n_tokens for ci in range(len(CONVS))) / sum(rows[(ci, 'plain')][k].decode_s for ci in range(len(CONVS))) for k in range(N)]
    r = [a / b for a, b in zip(tot, totp)]
    print(f"all {l}: {statistics.median(r):.2f}x [{min(r):.2f}-{max(r):.2f}] over plain; per rep {[round(x,2) for x in r]}")
# Modelled on the quiet machine's calibration (docs/structured-output.md: c(B) = 5.8 ms + 2.2 ms per further token),
# plus each run's measured drafting time: what the trees cost, independent of the load.
def modelled(st):
    nodes = st.target_calls + st.drafted + st.forced_drafted
    return (5.8 - 2.2) * st.target_calls / 1000 + 2.2 * nodes / 1000 + st.draft_s
for l in LABELS:
    sts = [rows[(ci, l)][0] for ci in range(len(CONVS))]
    calls = sum(s.target_calls for s in sts); dr = sum(s.drafted for s in sts); fd = sum(s.forced_drafted for s in sts)
    acc = sum(s.accepted for s in sts); ca = sum(s.accepted_by.get("call", 0) for s in sts); toks = sum(s.n_tokens for s in sts)
    per = [modelled(rows[(ci, 'plain')][0]) / modelled(rows[(ci, l)][0]) for ci in range(len(CONVS))]
    tot = sum(modelled(rows[(ci, 'plain')][0]) for ci in range(len(CONVS))) / sum(modelled(s) for s in sts)
    print(f"{l:12s} tokens {toks} target calls {calls} drafted {dr} accepted {acc} (call {ca}) forced {fd}; "
          f"modelled {tot:.2f}x over plain, per conversation {[round(x, 2) for x in per]}")
