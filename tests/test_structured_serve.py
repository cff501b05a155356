"""Structured output and tool calls through `specgen serve`, as clients send them: OpenAI's Python
client (response_format, .parse(), a whole tool loop, streamed and not), LangChain's
with_structured_output and bind_tools, and simonw/llm's --schema, against a real server process."""

import json
import os
import subprocess
import sys

import jsonschema
import langchain_openai
import openai
import pytest
from pydantic import BaseModel

from harness import TOO_WIDE, call, events, streamed_calls, tool_choice_switches
from harness import server as shared

pytestmark = pytest.mark.real

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
EXTRACT = [{"role": "user", "content": "Extract the person: Ada Lovelace, aged 36, lived in London."}]


class Person(BaseModel):
    name: str
    age: int


@pytest.fixture(scope="module")
def server():
    return shared()


def test_json_schema_answer_is_valid_and_says_what_it_forced(server):
    r = server.client.chat.completions.create(
        model="m", messages=EXTRACT, temperature=0, max_tokens=64,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    obj = json.loads(r.choices[0].message.content)
    jsonschema.validate(obj, {**PERSON, "additionalProperties": False})
    assert r.choices[0].finish_reason == "stop"
    spec, timings = r.model_extra["speculative"], r.model_extra["timings"]
    assert spec["forced_accepted"] > 0 and timings["draft_n_forced_accepted"] == spec["forced_accepted"]
    assert timings["draft_n_accepted"] == sum(v for k, v in spec["accepted_by"].items() if k != "forced")  # drafters'


def _metrics(server) -> dict[str, float]:
    _, _, raw = call(server, "GET", "/metrics")
    return {name: float(value) for name, value in (line.rsplit(" ", 1) for line in raw.decode().splitlines()
                                                   if line and not line.startswith("#"))}


def test_forced_tokens_are_counted_apart_in_the_stream_timings_and_metrics(server):
    """Each streamed token the grammar forced (source "forced") is one the counters call forced and
    accepted; the drafters' own counts (draft_n, /metrics' spec_decode_*) leave them out."""
    before = _metrics(server)
    status, _, raw = call(server, "POST", "/completion", {"prompt": "Ada Lovelace, aged 36, as JSON:", "n_predict": 48,
                                                          "temperature": 0, "json_schema": PERSON, "stream": True})
    chunks = [json.loads(e) for e in events(raw)]
    after = _metrics(server)
    assert status == 200 and chunks[-1]["stop"] is True
    forced = 0
    for chunk in chunks[:-1]:
        sources = {source for _, source in chunk["specgen"]["sources"]}
        if "forced" in sources:
            assert sources == {"forced"}, chunk  # one token a chunk here: no mixed chunk to split
            forced += len(chunk["tokens"])
    timings, spec = chunks[-1]["timings"], chunks[-1]["speculative"]
    assert forced > 0 and timings["draft_n_forced_accepted"] == spec["forced_accepted"] == forced
    assert spec["accepted_by"]["forced"] == forced and timings["draft_n_forced"] >= forced
    assert timings["draft_n_accepted"] == sum(v for k, v in spec["accepted_by"].items() if k != "forced")
    grew = {k: after[k] - before.get(k, 0) for k in after}
    assert grew['specgen:forced_tokens_total{state="accepted"}'] == forced
    assert grew['specgen:forced_tokens_total{state="drafted"}'] == timings["draft_n_forced"]
    assert grew["llamacpp:spec_decode_num_accepted_tokens_total"] == timings["draft_n_accepted"]
    assert grew["llamacpp:spec_decode_num_draft_tokens_total"] == timings["draft_n"]


NAME, AGE = {"name": {"type": "string", "maxLength": 24}}, {"age": {"type": "integer", "minimum": 0}}
COMBINED = [{"allOf": [{"type": "object", "properties": NAME, "required": ["name"]},
                       {"type": "object", "properties": AGE, "required": ["age"]}]},
            {"type": "object", "properties": NAME, "required": ["name"],
             "anyOf": [{"properties": AGE, "required": ["age"]}, {"properties": {"city": {"type": "string"}},
                                                                    "required": ["city"]}]},
            {"allOf": [{"type": "object", "properties": NAME}, {"properties": AGE}]}]


def test_combined_schemas_answer_their_parts_keys(server):
    """allOf of two objects and base properties beside anyOf were refused (400), allOf with nothing
    required admitted only {}: each part's object was closed on its own keys."""
    for schema in COMBINED:
        r = server.client.chat.completions.create(
            model="m", messages=EXTRACT, temperature=0, max_tokens=64,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
        obj = json.loads(r.choices[0].message.content)
        jsonschema.validate(obj, schema)
        assert obj and set(obj) <= {"name", "age", "city"}, obj


def test_parse_with_a_pydantic_model(server):
    r = server.client.chat.completions.parse(model="m", messages=EXTRACT, response_format=Person, temperature=0)
    person = r.choices[0].message.parsed
    # pydantic ignores keys it does not know: the schema's own keys, and no others, come from the grammar
    assert isinstance(person, Person) and set(json.loads(r.choices[0].message.content)) == {"name", "age"}
    assert person.name.strip() and r.choices[0].finish_reason == "stop"


def test_json_object_and_streamed_schema(server):
    r = server.client.chat.completions.create(model="m", messages=EXTRACT, temperature=0, max_tokens=48,
                                              response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop"  # a finished object (an answer cut at the limit would prove nothing)
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    stream = server.client.chat.completions.create(
        model="m", messages=EXTRACT, temperature=0, stream=True, max_tokens=64,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), PERSON)


def test_tool_loop_call_result_answer(server):
    """required -> a call; its result goes back as a tool message (content null beside the call)."""
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = server.client.chat.completions.create(model="m", messages=messages, tools=[WEATHER, TIME],
                                              tool_choice="required", temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.function.name in ("get_weather", "get_time") and set(json.loads(call.function.arguments)) == {"city"}
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
    r = server.client.chat.completions.create(model="m", messages=messages, tools=[WEATHER, TIME],
                                              tool_choice="none", temperature=0, max_tokens=32)
    # none: whatever the model writes (this one imitates the call it saw, as text) is content, never a call
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason in ("stop", "length")


def test_a_tool_choice_switch_reads_only_the_new_tokens(server):
    """The generic format: the same loop as the hermes one (test_hermes_template.py)."""
    tool_choice_switches(server)


def test_a_tool_loop_reads_the_same_every_run(server):
    """tool_choice none after a call: the history as the generic format shows it, each result named
    by its function (not by the call's random id), so the same loop gives the same prompt each run."""
    prompts = []
    for _ in range(2):
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        r = server.client.chat.completions.create(model="m", messages=messages, tools=[WEATHER, TIME],
                                                  tool_choice="required", temperature=0)
        message = r.choices[0].message
        messages += [message.model_dump(exclude_none=True),
                     *({"role": "tool", "tool_call_id": c.id, "content": "18 C"} for c in message.tool_calls)]
        status, reply, _ = server.post("/apply-template", json.dumps(
            {"messages": messages, "tools": [WEATHER, TIME], "tool_choice": "none"}).encode())
        assert status == 200, reply
        assert all(c.id not in reply["prompt"] for c in message.tool_calls)
        prompts.append(reply["prompt"])
    name = message.tool_calls[0].function.name
    assert prompts[0] == prompts[1] and f"Result of {name}: 18 C" in prompts[0]
    assert json.dumps({"tool_call": {"name": name}})[:-2] in prompts[0]


def test_named_tool_streamed_as_openai_fragments(server):
    stream = server.client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}}, temperature=0, stream=True)
    chunks = list(stream)
    calls, reason = streamed_calls(chunks)
    assert reason == "tool_calls" and calls[0]["name"] == "get_time"
    assert set(json.loads(calls[0]["arguments"])) == {"city"}
    # written as it is generated: the head (id, name) first, then the arguments in several pieces,
    # and the finish_reason in a chunk after them, never a whole call held to the end
    fragments = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert fragments[0].id and fragments[0].function.name == "get_time" and fragments[0].function.arguments == ""
    assert all(f.id is None and f.function.name is None for f in fragments[1:]) and len(fragments) >= 3
    assert chunks[-1].choices[0].finish_reason == "tool_calls" and not chunks[-1].choices[0].delta.tool_calls


def test_a_call_cut_by_max_tokens_is_the_same_streamed_and_whole(server):
    """Cut inside its arguments, a call is answered as it was written, streamed or not: its name,
    the arguments so far (not JSON yet), finish_reason length, as OpenAI answers it."""
    ask = dict(model="m", messages=[{"role": "user", "content": "What time is it in Oslo?"}], tools=[WEATHER, TIME],
               tool_choice={"type": "function", "function": {"name": "get_time"}}, temperature=0)
    whole = server.client.chat.completions.create(**ask).choices[0]
    cut = None
    for n in range(8, 40):
        r = server.client.chat.completions.create(**ask, max_tokens=n).choices[0]
        if r.message.tool_calls and r.finish_reason == "length":
            cut = n
            break
    assert cut is not None and whole.finish_reason == "tool_calls"
    assert r.message.content is None and r.message.tool_calls[0].function.name == "get_time"
    args = r.message.tool_calls[0].function.arguments
    assert whole.message.tool_calls[0].function.arguments.replace(" ", "").startswith(args.replace(" ", ""))
    with pytest.raises(ValueError):
        json.loads(args)
    calls, reason = streamed_calls(server.client.chat.completions.create(**ask, max_tokens=cut, stream=True))
    assert reason == "length" and calls == {0: {"name": "get_time", "arguments": args}}


def both(server, **ask) -> tuple[str | None, list[tuple[str, str]], str]:
    """A chat answer's content, calls (name, arguments) and finish_reason: the same streamed and whole."""
    r = server.client.chat.completions.create(model="m", temperature=0, **ask).choices[0]
    calls = [(c.function.name, c.function.arguments) for c in r.message.tool_calls or ()]
    content, joined, reason = "", {}, None
    stream = server.client.chat.completions.create(model="m", temperature=0, stream=True, **ask)
    for choice in (choice for chunk in stream for choice in chunk.choices):
        content += choice.delta.content or ""
        for d in choice.delta.tool_calls or ():
            name, args = joined.get(d.index, ("", ""))
            joined[d.index] = (name + (d.function.name or ""), args + (d.function.arguments or ""))
        reason = choice.finish_reason or reason
    assert (content or None, [joined[i] for i in sorted(joined)], reason) == (r.message.content, calls, r.finish_reason)
    return r.message.content, calls, r.finish_reason


GET_TIME, OSLO = {"type": "function", "function": {"name": "get_time"}}, [{"role": "user", "content": "Time in Oslo?"}]
PARIS = [{"role": "user", "content": "What is the weather in Paris?"}]
HAIKU = [{"role": "user", "content": "Write a haiku about rain."}]  # with tools offered, an answer in text


def test_a_call_cut_by_a_stop_string_is_cut_not_finished(server):
    """The stop string ends the text inside the call's arguments: the call as written, finish_reason
    stop (it was answered as a finished call, finish_reason tool_calls, its arguments not JSON)."""
    content, calls, reason = both(server, messages=OSLO, tools=[WEATHER, TIME], tool_choice=GET_TIME, stop=["city"])
    assert reason == "stop" and content is None and [name for name, _ in calls] == ["get_time"]
    with pytest.raises(ValueError):
        json.loads(calls[0][1])


PICK = {"type": "function", "function": {"name": "pick", "description": "Pick numbers", "parameters": {
    "type": "array", "items": {"enum": [1, 2, 3]}, "maxItems": 3}}}


def test_arguments_that_are_not_an_object_are_never_a_call(server):
    """A tool whose parameters admit an array: the stream showed its call and the whole reply took
    the stream's calls over the reader's refusal. Not a call, either way: the text is content."""
    content, calls, reason = both(server, messages=[{"role": "user", "content": "Pick two numbers."}], tools=[PICK],
                                  tool_choice="required", max_tokens=48)
    assert calls == [] and reason == "stop" and json.loads(content)["tool_call"]["name"] == "pick"


def test_a_cut_text_answer_is_its_text(server):
    """Cut by max_tokens or a stop string, a text answer in the generic format is its text so far
    (the whole reply gave the raw `{"response": "...` the model wrote)."""
    text, _, reason = both(server, messages=HAIKU, tools=[WEATHER, TIME], max_tokens=40)
    assert reason == "stop" and len(text.split()) > 4
    word = text.split()[3]
    for cut in ({"max_tokens": 8}, {"stop": [word]}):
        content, calls, reason = both(server, messages=HAIKU, tools=[WEATHER, TIME], **cut)
        assert calls == [] and content and text.startswith(content) and len(content) < len(text)
        assert reason == ("length" if "max_tokens" in cut else "stop")


@pytest.mark.parametrize("ask", [
    *({"messages": PARIS, "tool_choice": "required", "max_tokens": n} for n in (9, 13, 19)),
    {"messages": PARIS, "tool_choice": "required", "stop": ["Paris"]},
    {"messages": PARIS, "tool_choice": "auto"},
], ids=lambda ask: "-".join(f"{k}={v}" for k, v in ask.items() if k != "messages"))
def test_streamed_and_whole_replies_agree(server, ask):
    content, calls, reason = both(server, tools=[WEATHER, TIME], **ask)
    assert reason in ("stop", "length", "tool_calls") and (content or calls)
    if reason == "tool_calls":  # only calls the grammar finished
        assert calls and content is None and all(isinstance(json.loads(a), dict) for _, a in calls)


def test_prefill_and_system_nudge_at_the_end(server):
    """A final assistant message is continued (no new turn opened after it); a final system message
    is a turn of its own before the answer's. Each answer is read from the prompt the template
    renders for those messages, every token of it."""
    prefill = [{"role": "user", "content": "Name three colours."}, {"role": "assistant", "content": "Red, green"}]
    nudge = [{"role": "user", "content": "Name three colours."}, {"role": "system", "content": "Answer in French."}]
    for messages, ending in ((prefill, "<|im_start|>assistant\nRed, green"),
                             (nudge, "<|im_start|>system\nAnswer in French.<|im_end|>\n<|im_start|>assistant\n")):
        status, rendered, _ = server.post("/apply-template", json.dumps({"messages": messages}).encode())
        assert status == 200 and rendered["prompt"].endswith(ending), rendered
        status, tokens, _ = server.post("/tokenize", json.dumps({"content": rendered["prompt"]}).encode())
        r = server.client.chat.completions.create(model="m", temperature=0, max_tokens=8, messages=messages)
        assert r.usage.prompt_tokens == len(tokens["tokens"]) and r.usage.completion_tokens > 0
        assert r.choices[0].message.content and not r.choices[0].message.content.startswith("<|im_")


@pytest.mark.parametrize("body,param,words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/none"}}}}}}, None, "json_schema"),
    ({"json_schema": [1, 2]}, "json_schema", "json_schema expects a JSON Schema object, found [1, 2]"),
    ({"response_format": {"type": "json_object", "schema": 7}}, "response_format",
     "response_format.schema expects a JSON Schema object, found 7"),
    ({"tools": [{"type": "function"}]}, "tools", "tools[0]"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [WEATHER]}, "tools", "tool_choice"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format", "either"),
])
def test_refusals_are_400_with_one_line(server, body, param, words):
    status, reply, _ = server.post("/v1/chat/completions", json.dumps({"messages": EXTRACT, **body}).encode())
    assert status == 400, reply
    message = reply["error"]["message"]
    assert words in message and "\n" not in message
    if param:
        assert reply["error"]["param"] == param


# The answer must be the JSON string "okQ": once `"ok` is written, every token the grammar allows
# holds a "Q", and logit_bias (false: never this token, as llama-server reads it) bans them all.
OK_Q = {"type": "json_schema", "json_schema": {"name": "q", "schema": {"enum": ["okQ"]}}}
BANS = "logit_bias bans every token the grammar allows at output token "


@pytest.fixture(scope="module")
def plain_server():
    """One token a step, so that text is sent before an error meets a later step (auto may draft a
    whole answer from the text of an earlier request, and meet the error in its first step: a 400)."""
    return shared("--method", "plain")


@pytest.fixture(scope="module")
def q_ban(smollm2):
    return {str(t): False for t in range(smollm2.n_vocab) if b"Q" in smollm2.piece(t)}


@pytest.mark.parametrize("temperature", [0, 0.8])
def test_logit_bias_that_bans_every_allowed_token_is_400(server, q_ban, temperature):
    body = {"messages": EXTRACT, "response_format": OK_Q, "logit_bias": q_ban, "temperature": temperature, "seed": 1}
    status, reply, _ = server.post("/v1/chat/completions", json.dumps(body).encode())
    assert status == 400, reply
    message = reply["error"]["message"]
    assert message.startswith(BANS) and "found -inf for all" in message and "\n" not in message


def test_logit_bias_ban_mid_stream_is_an_error_event_not_a_stop(plain_server, q_ban):
    """Text was sent (`"ok`), then the ban: an error event, as llama-server sends one mid-stream
    (`data: {"error": ...}`), which OpenAI's client raises; no chunk says finish_reason "stop"."""
    stream = plain_server.client.chat.completions.create(model="m", messages=EXTRACT, response_format=OK_Q,
                                                         temperature=0, stream=True, logit_bias=q_ban)
    text, reasons = "", []
    with pytest.raises(openai.APIError, match=BANS):
        for chunk in stream:
            for choice in chunk.choices:
                text += choice.delta.content or ""
                reasons.append(choice.finish_reason)
    assert text.startswith('"') and not any(reasons)


def test_a_grammar_engine_error_is_400_or_an_error_event_never_a_stop(server, plain_server):
    body = {"messages": [{"role": "user", "content": "Say hello."}], "grammar": TOO_WIDE, "temperature": 0}
    status, reply, _ = server.post("/v1/chat/completions", json.dumps(body).encode())
    assert status == 400, reply
    assert reply["error"]["message"].startswith("the grammar engine failed at output token ")
    stream = plain_server.client.chat.completions.create(model="m", messages=body["messages"], temperature=0,
                                                         stream=True, extra_body={"grammar": TOO_WIDE})
    text, reasons = "", []
    with pytest.raises(openai.APIError, match="Too many items"):
        for chunk in stream:
            for choice in chunk.choices:
                text += choice.delta.content or ""
                reasons.append(choice.finish_reason)
    assert text.startswith("H") and not any(reasons)  # the steps before the error were sent


def test_langchain_structured_output_and_bind_tools(server):
    llm = langchain_openai.ChatOpenAI(base_url=server.url + "/v1", api_key="none", model="m", temperature=0,
                                      max_retries=0)
    person = llm.with_structured_output(Person, method="json_schema").invoke(EXTRACT[0]["content"])
    assert isinstance(person, Person) and person.name
    # function_calling: one forced tool call, sent with parallel_tool_calls false
    person = llm.with_structured_output(Person, method="function_calling").invoke(EXTRACT[0]["content"])
    assert isinstance(person, Person) and person.name
    ai = llm.bind_tools([WEATHER], tool_choice="get_weather").invoke("What is the weather in Rome?")
    assert ai.tool_calls and ai.tool_calls[0]["name"] == "get_weather" and "city" in ai.tool_calls[0]["args"]


def test_llm_cli_schema(server, tmp_path):
    (tmp_path / "extra-openai-models.yaml").write_text(
        f"- model_id: specgen\n  model_name: m\n  api_base: {server.url}/v1\n  supports_schema: true\n")
    env = {**os.environ, "LLM_USER_PATH": str(tmp_path), "OPENAI_API_KEY": "none"}
    out = subprocess.run([sys.executable, "-m", "llm", "-m", "specgen", "--schema", "name, age int", "--no-log",
                          EXTRACT[0]["content"]], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    jsonschema.validate(json.loads(out.stdout), PERSON)
