"""Every route's body as a hostile or careless client writes it: wrong types, huge and tiny numbers,
unicode digits, deep nesting, empty and duplicate tools, bytes that are not JSON. No reply is a 500,
no error carries a traceback, the server stays up and the next ordinary request is answered. Bodies
are drawn by hypothesis (derandomized: the same bodies every run); most are refused at parsing, and
any that decode ask for at most 4 tokens of smollm2 (the server's -n is 4 too). Then each fault the
fuzzing found, alone."""

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from specgen.serve import fields
from harness import ASK, VALID, WEATHER, Server as Served, call, events, post

pytestmark = pytest.mark.real

SETTINGS = dict(deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=list(HealthCheck))
LIMITS = ("max_tokens", "max_completion_tokens", "n_predict")  # never more than 4 tokens decoded
DIGITS = ("²", "³", "١٢", "٣", "𝟗", "½", "Ⅻ", "๓", "९९", "0x1f", "1e3", " 7", "-3", "", "007", "+1", "1_0")
EDGES = (0, -0.0, 1, -1, 2, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63, 2**64, -2**63, 10**30, 1e308, -1e308, 5e-324,
         1e-320, 1e-40, 2.9e-38, 1.2e-38, 1e-30, 1e-8, 0.5, math.nan, math.inf, -math.inf)


_DEEP: dict[str, str] = {}  # a mark in the body's text -> the deep value written in its place


def deep(n: int, kind: str) -> str:
    """A value nested `n` levels deep, written into the body's text by dumps (json.dumps would recurse)."""
    mark = f"\x00deep{len(_DEEP)}\x00"
    _DEEP[mark] = "[" * n + "]" * n if kind == "[" else '{"a": ' * n + "1" + "}" * n
    return mark


def dumps(body: object) -> bytes:
    text = json.dumps(body, ensure_ascii=False)
    for mark, nested in _DEEP.items():
        text = text.replace(json.dumps(mark), nested)
    return text.encode()


texts = st.text(max_size=12)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.sampled_from(EDGES), st.floats(), texts,
                    st.sampled_from(DIGITS))
deeps = st.builds(deep, st.integers(2, 1500), st.sampled_from("[{"))
values = st.one_of(st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(
    texts | st.sampled_from(DIGITS), c, max_size=3), max_leaves=6), deeps)
numbers = st.one_of(st.sampled_from(EDGES), st.floats(), st.integers(), st.sampled_from(DIGITS), values)
limits = st.one_of(st.integers(1, 4), st.sampled_from((0, -2, 2**31, 2**63, 1.5, 4.0, "4", True, None, [4])))

def often(valid):
    """Mostly `valid` (so that a body gets past its first check), now and then any value."""
    return st.integers(0, 4).flatmap(lambda i: values if i == 0 else valid)


names = often(st.sampled_from(("f", "g", "get_weather", "a-b", "", "f f")) | texts)
schemas = often(st.one_of(
    st.sampled_from(({"type": "object"}, {"type": "string"}, {"type": "integer", "minimum": 2**70},
                     {"type": "object", "properties": {"c": {"enum": ["red", "blue"]}}, "required": ["c"]},
                     {"type": "array", "items": {"type": "number"}, "maxItems": 2}, {"$ref": "#/nope"},
                     {"allOf": [{"$ref": "#"}]}, {"type": "objekt"}, {}, {"enum": []}, {"anyOf": []},
                     {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, {"anyOf": [{"$ref": "#"}]},
                     {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
                     {"type": "string", "minLength": 2**64}, {"type": "string", "pattern": "("}, {"const": math.nan},
                     {"type": "number", "multipleOf": 0}, {"type": "array", "minItems": 10**5}, {"not": {}})),
    st.fixed_dictionaries({"type": often(st.sampled_from(("object", "string", "array")))},
                          optional={"properties": st.dictionaries(texts, values, max_size=2),
                                    "required": values, "items": values})))
functions = often(st.fixed_dictionaries({"name": names}, optional={"parameters": schemas, "description": values,
                                                                   "strict": values}))
tool = often(st.fixed_dictionaries({"type": often(st.just("function")), "function": functions}))
tools = often(st.one_of(st.just([]), st.lists(tool, min_size=1, max_size=3), tool.map(lambda t: [t, t])))
tool_call = often(st.fixed_dictionaries({"id": texts | values, "type": often(st.just("function")), "function": often(
    st.fixed_dictionaries({"name": names}, optional={"arguments": often(st.just("{}") | texts)}))}))
content = often(st.one_of(texts, st.none(), st.lists(st.fixed_dictionaries(
    {"type": often(st.just("text")), "text": often(texts)}), max_size=2)))
message = often(st.fixed_dictionaries(
    {"role": often(st.sampled_from(("user", "assistant", "system", "tool", "developer", "", "bot")))},
    optional={"content": content, "tool_calls": often(st.lists(tool_call, max_size=2)),
              "tool_call_id": often(texts), "name": names}))
# A call and its result after the question, as agents send them.
called = st.tuples(st.lists(tool_call, min_size=1, max_size=2), content, st.lists(message, max_size=2)).map(
    lambda t: [*ASK, {"role": "assistant", "content": None, "tool_calls": t[0]},
               {"role": "tool", "tool_call_id": "1", "content": t[1]}, *t[2]])
messages = often(st.one_of(st.lists(message, max_size=4).map(lambda ms: [*ms, *ASK]), st.lists(message, max_size=4),
                           called))
pair = st.tuples(st.one_of(st.integers(-2, 60000), st.sampled_from(DIGITS), values),
                 st.one_of(st.just(False), numbers)).map(list)
logit_bias = st.one_of(st.dictionaries(st.one_of(st.integers(0, 2**70).map(str), st.sampled_from(DIGITS), texts),
                                       st.one_of(st.just(False), numbers), max_size=3),
                       st.lists(pair, max_size=3), values)
response_format = st.one_of(st.fixed_dictionaries(
    {"type": st.sampled_from(("text", "json_object", "json_schema")) | values},
    optional={"json_schema": st.fixed_dictionaries({"name": names}, optional={"schema": schemas, "strict": values})
              | values}), values)
grammar = st.one_of(st.sampled_from(('root ::= "a"', 'root ::= [0-9]+', "root ::= root", "root ::=", 'x ::= "a"',
                                     'root ::= "a"{2,1}', "")), texts, values)

FIELDS = {**dict.fromkeys(LIMITS, limits), "messages": messages, "tools": tools, "logit_bias": logit_bias,
          "response_format": response_format, "json_schema": schemas, "grammar": grammar,
          "tool_choice": st.one_of(st.sampled_from(("none", "auto", "required")), st.fixed_dictionaries(
              {"type": st.just("function") | values, "function": st.fixed_dictionaries({"name": names})}), values),
          "stop": st.one_of(texts, st.lists(texts | values, max_size=3), values),
          "prompt": st.one_of(texts, st.lists(texts, max_size=2), values), "content": st.one_of(texts, values),
          "tokens": st.one_of(st.lists(st.integers(-2, 60000) | numbers, max_size=4), values),
          "input": st.one_of(texts, st.lists(texts | values, max_size=3), values),
          "stream_options": often(st.fixed_dictionaries({}, optional={"include_usage": often(st.booleans())})),
          "logprobs": often(st.booleans() | st.integers(-1, 25)), "encoding_format": often(st.sampled_from(
              ("float", "base64", "int8"))), "samplers": often(st.lists(st.sampled_from(
                  ("top_k", "k", "temperature", "t", "top_p", "min_p", "penalties", "dry", "")), max_size=5) | texts),
          **{name: often(st.booleans()) for name in ("stream", "cache_prompt", "parallel_tool_calls", "add_special",
                                                     "parse_special", "with_pieces")},
          **{name: numbers for name in ("temperature", "top_p", "top_k", "min_p", "seed", "repeat_penalty",
                                        "repeat_last_n", "penalty_last_n", "presence_penalty", "frequency_penalty",
                                        "n_probs", "top_logprobs", "n", "typical_p", "mirostat", "dimensions",
                                        "embd_normalize")}}


@st.composite
def bodies(draw, path: str) -> dict:
    """The route's ordinary body with one to four of its fields drawn (sometimes an unknown one, or
    one of the ordinary fields left out)."""
    body = dict(VALID[path])
    if "messages" in body and draw(st.booleans()):  # a chat: its messages, and tools, more often
        body["messages"] = draw(messages)
        body["tools"] = [WEATHER, {**WEATHER, "function": {**WEATHER["function"], "name": "f"}}]
    known = sorted(fields.ROUTES[path])
    read = [name for name in known if name in FIELDS]  # the fields with a strategy of their own, more often
    chosen = draw(st.lists(st.sampled_from(read), max_size=4)) + draw(st.lists(st.sampled_from(known), max_size=2))
    for name in chosen or known[:1]:
        body[name] = draw(FIELDS.get(name, values))
    if draw(st.integers(0, 19)) == 0:
        body[draw(texts)] = draw(values)
    if draw(st.integers(0, 9)) == 0:
        body.pop(draw(st.sampled_from(sorted(body))))
    return body


raw_bodies = st.one_of(st.binary(max_size=40), texts.map(str.encode), st.builds(lambda d: dumps(d), values),
                       st.sampled_from((b"", b"null", b"[]", b"NaN", b"\xef\xbb\xbf{}", b'{"a": 1,}', b"{" * 100_000,
                                        b"[" * 5000 + b"]" * 5000, b'{"messages": ' + b"[" * 3000 + b"]" * 3000 + b"}",
                                        b"\xff\xfe{}", b'{"a": "\\ud800"}', b'{"' + b"a" * 1000 + b'": 1}')))


@pytest.fixture(scope="module")
def server():
    served = Served("-n", "4", "--ctx", "512")
    yield served
    assert served.stop() == 0


def answered(served, path: str, body: bytes) -> int:
    """Send one body: never a 500, an error is one line of JSON, and the server is still up."""
    status, _, raw = call(served, "POST", path, body)
    assert served.proc.poll() is None, f"the server died on {body[:200]!r}"
    assert status < 500, (status, raw[:300], body[:300])
    if status != 200:
        error = json.loads(raw)["error"]
        assert isinstance(error["message"], str) and "\n" not in error["message"], error
        assert "Traceback" not in error["message"] and error["type"] != "server_error", error
    elif raw.startswith(b"data: "):
        assert all("server_error" not in e for e in events(raw)), raw[-300:]
    else:
        json.loads(raw)
    return status


def still_answers(served) -> None:
    status, r = post(served, "/v1/chat/completions", {"messages": ASK, "max_tokens": 2}, headers={})
    assert status == 200 and r["choices"][0]["message"]["content"], r


EXAMPLES = {"/v1/chat/completions": 150, "/v1/completions": 40, "/completion": 40, "/apply-template": 60}


@pytest.mark.parametrize("path", sorted(fields.ROUTES))
def test_no_body_is_a_server_error(server, path):
    @settings(max_examples=EXAMPLES.get(path, 25), **SETTINGS)
    @given(bodies(path))
    def fuzz(body):
        answered(server, path, dumps(body))

    fuzz()
    still_answers(server)


def test_no_raw_body_is_a_server_error(server):
    @settings(max_examples=60, **SETTINGS)
    @given(st.sampled_from(sorted(fields.ROUTES)), raw_bodies)
    def fuzz(path, body):
        answered(server, path, body)

    fuzz()
    still_answers(server)


# --- each fault the fuzzing found, alone (issue 67, "500s where a 4xx belongs") ------------------

def chat(served, **fields):
    return post(served, "/v1/chat/completions", {"messages": ASK, "max_tokens": 2, **fields}, headers={})


def refused(reply, param, *words):
    status, r = reply
    assert status == 400 and r["error"]["param"] == param, r
    assert all(w in r["error"]["message"] for w in words) and "\n" not in r["error"]["message"], r


def test_a_unicode_digit_is_not_a_token_id(server):
    """str.isdigit() says yes to "²" and "١", int() does not; nor does it read 5,000 digits."""
    for key in ("²", "١٢", "9" * 5000):
        refused(chat(server, logit_bias={key: 1}), "logit_bias", "token ids", key[:8])
    still_answers(server)


def nested_schema(levels: int) -> dict:
    schema = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def test_deep_nesting_is_refused_with_the_depth_allowed(server):
    deep = b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    status, _, raw = call(server, "POST", "/v1/chat/completions", deep)
    assert status == 400 and "nested at most 128 levels deep" in json.loads(raw)["error"]["message"], raw
    schema = nested_schema(400)  # 800 levels: Python's JSON reader takes it, the schema's readers recursed
    refused(chat(server, json_schema=schema), None, "nested at most 128 levels deep")
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    refused(chat(server, tools=tools), None, "nested at most 128 levels deep")
    assert chat(server, json_schema=nested_schema(20))[0] == 200  # a deep schema as agents write them
    still_answers(server)


CALLED = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
          {"role": "tool", "tool_call_id": "call_1", "content": "rain"}]


def test_a_tool_call_id_or_name_that_is_not_a_string_is_refused(server):
    for path in ("/v1/chat/completions", "/apply-template"):
        assert post(server, path, {"messages": CALLED, "tools": [WEATHER], "max_tokens": 2}, headers={})[0] == 200
        for key, wrong in (("id", [1]), ("id", {"a": 1}), ("id", 7)):
            messages = [*CALLED[:1], {**CALLED[1], "tool_calls": [{**CALLED[1]["tool_calls"][0], key: wrong}]},
                        CALLED[2]]
            reply = post(server, path, {"messages": messages, "tools": [WEATHER], "max_tokens": 2}, headers={})
            refused(reply, "messages[1]", "messages[1].tool_calls[0].id expects a string", json.dumps(wrong))
        function = {**CALLED[1]["tool_calls"][0]["function"], "name": ["get_weather"]}
        messages = [*CALLED[:1], {**CALLED[1], "tool_calls": [{**CALLED[1]["tool_calls"][0], "function": function}]},
                    CALLED[2]]
        reply = post(server, path, {"messages": messages, "tools": [WEATHER], "max_tokens": 2}, headers={})
        refused(reply, "messages[1]", "tool_calls[0].function.name expects a string")
    still_answers(server)


def test_a_temperature_below_1e_30_is_greedy(server):
    """Sampling at T -> 0 is the argmax; below 1e-30 the server says so itself (docs/serve.md)."""
    status, greedy = chat(server, temperature=0, max_tokens=4)
    assert status == 200 and "seed" not in greedy["speculative"], greedy
    for tiny in (1e-31, 1e-40, 5e-324):
        status, r = chat(server, temperature=tiny, max_tokens=4)
        assert status == 200 and "seed" not in r["speculative"], r  # a greedy run: no seed drawn
        assert r["choices"][0]["message"] == greedy["choices"][0]["message"]
    status, r = chat(server, temperature=1e-29, seed=3, max_tokens=4)
    assert status == 200 and r["speculative"]["seed"] == 3, r  # sampled: the rule's edge is where it says


def test_a_logit_bias_that_bans_every_token_is_refused(server):
    n_vocab = json.loads(call(server, "GET", "/v1/models")[2])["data"][0]["meta"]["n_vocab"]
    every = [[t, False] for t in range(n_vocab)]
    refused(chat(server, logit_bias=every), "logit_bias", "at least one token left unbanned", str(n_vocab))
    refused(chat(server, logit_bias={str(t): False for t in range(n_vocab)}), "logit_bias", "unbanned")
    status, r = chat(server, logit_bias=every[1:])  # one token left: the answer is made of it
    assert status == 200, r
    still_answers(server)


def test_an_unknown_field_named_with_a_newline_is_named_on_one_line(server):
    """The fuzzer's find: a field named "\\n" went into the message as it was, two lines."""
    refused(chat(server, **{"\n": 1}), "\n", "Unrecognized request argument", '"\\n"')
    still_answers(server)
