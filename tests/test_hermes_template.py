"""models.txt `template:` entries (a GGUF with a shipped chat template written into it), and the
hermes tool-call path end to end through one: a real `specgen serve` of smollm2 under the shipped
Hermes/Qwen 2.5-style template, driven by OpenAI's client."""

import json
import urllib.request

import jsonschema
import numpy as np
import pytest

import harness
from harness import streamed_calls, tool_choice_switches

from specgen.models import manifest, resolve as models
from specgen.errors import ModelError
from specgen.host import TEMPLATES

HERMES_MODEL = "smollm2-135m-instruct-hermes"
SHIPPED = (TEMPLATES / "hermes-tools.jinja").read_text(encoding="utf-8")


def tiny_gguf(path, template: str | None = "old {{ messages }}"):
    """A small GGUF of the shapes a real one has: strings, numbers, an array, F32 and Q8_0 tensors."""
    from gguf import GGMLQuantizationType, GGUFWriter, quants

    writer = GGUFWriter(path, arch="llama")
    writer.add_uint32("llama.context_length", 64)
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "a", "b"])
    if template is not None:
        writer.add_string("tokenizer.chat_template", template)
    writer.add_string("general.name", "tiny")
    rng = np.random.default_rng(0)
    writer.add_tensor("norm.weight", rng.standard_normal(32).astype(np.float32))
    q8 = quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), GGMLQuantizationType.Q8_0)
    writer.add_tensor("token_embd.weight", q8, raw_dtype=GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def fields(path) -> dict:
    from gguf import GGUFReader

    return {k: f.contents() for k, f in GGUFReader(path).fields.items() if not k.startswith("GGUF.")}


def tensors(path) -> dict:
    from gguf import GGUFReader

    return {t.name: (t.tensor_type, bytes(t.data)) for t in GGUFReader(path).tensors}


@pytest.mark.parametrize("had_template", [True, False])
def test_template_copy_replaces_only_the_template_and_is_deterministic(tmp_path, had_template):
    from specgen.llama import gguf

    src = tiny_gguf(tmp_path / "src.gguf", "old {{ messages }}" if had_template else None)
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    for dst in (a, b):
        gguf.with_strings(src, dst, {gguf.CHAT_TEMPLATE_KEY: SHIPPED})
    assert a.read_bytes() == b.read_bytes()  # pinnable: the same input gives the same bytes
    before, after = fields(src), fields(a)
    assert after.pop(gguf.CHAT_TEMPLATE_KEY) == SHIPPED
    before.pop(gguf.CHAT_TEMPLATE_KEY, None)
    assert after == before
    assert tensors(a) == tensors(src)


def test_a_template_entry_is_derived_recorded_and_checked(isolated_home, tmp_path, monkeypatch):
    src = tiny_gguf(tmp_path / "base.gguf")
    txt = tmp_path / "models.txt"
    txt.write_text("base  path:base.gguf  -\nh  template:base:hermes-tools  -\nbad  template:base:nope  -\n"
                   "orphan  template:missing:hermes-tools  -\n")
    monkeypatch.setenv("SPECGEN_MODELS_TXT", str(txt))
    entry = models.load_manifest()["h"]
    assert entry.kind == "template" and entry.template_from() == manifest.TemplateSource("base", "hermes-tools")
    out = models.resolve("h")
    assert fields(out)["tokenizer.chat_template"] == SHIPPED and tensors(out) == tensors(src)
    assert entry.expected_sha == manifest.file_sha256(out)
    with pytest.raises(ModelError, match=r"bad: expected a chat template named 'nope' in .*\(shipped: .*hermes-tools"):
        models.resolve("bad")
    with pytest.raises(ModelError, match="orphan derives from 'missing', which is not in models.txt"):
        models.resolve("orphan")


@pytest.mark.parametrize("source", ["template:base", "template::hermes-tools", "template:a:b:c"])
def test_a_malformed_template_source_is_one_line(source):
    with pytest.raises(ModelError, match=f"models.txt line 1: expected template:BASE:TEMPLATE for x, found '{source}'"):
        manifest.parse_manifest([f"x  {source}  -"])


# --- end to end: the hermes path through a real server ------------------------------------------

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "hours24": {"type": "boolean"}},
                   "required": ["city", "hours24"]}}}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALLS = 128  # max_tokens for a call: smollm2 writes two (about 30 tokens each), then ends


def valid_call(name: str, arguments: str, tools=TOOLS) -> dict:
    """The call's arguments, after checking that it names one of `tools` and fits its schema."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert name in schemas, f"a call to {name!r}, which is not among the tools {sorted(schemas)}"
    args = json.loads(arguments)
    jsonschema.validate(args, {**schemas[name], "additionalProperties": False})
    return args


@pytest.fixture(scope="module")
def server():
    models.resolve(HERMES_MODEL)  # derived here (pinned sha256 checked), not inside the server's start
    return harness.server(model=HERMES_MODEL)


@pytest.mark.real
def test_the_server_runs_the_shipped_template_on_the_hermes_path(server):
    from specgen.app.structured import HERMES, tool_format

    with urllib.request.urlopen(server.url + "/props", timeout=30) as r:
        props = json.loads(r.read())
    assert props["chat_template"] == SHIPPED and tool_format(props["chat_template"]) == HERMES
    status, reply, _ = server.post("/apply-template", json.dumps({"messages": ASK, "tools": TOOLS}).encode())
    assert status == 200 and "<tools>\n" in reply["prompt"] and '"name": "get_time"' in reply["prompt"]


@pytest.fixture(scope="module")
def required(server):
    """The answer to ASK with tool_choice required (shared: the tool loop goes on from it)."""
    return server.client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required",
                                                 temperature=0, max_tokens=CALLS).choices[0]


@pytest.mark.real
def test_required_gives_a_valid_call_streamed_and_not(server, required):
    choice = required
    assert choice.finish_reason == "tool_calls" and choice.message.content is None and choice.message.tool_calls
    for call in choice.message.tool_calls:
        valid_call(call.function.name, call.function.arguments)
    stream = server.client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice="required",
                                                   temperature=0, max_tokens=CALLS, stream=True)
    calls, reason = streamed_calls(stream)
    assert reason == "tool_calls"
    for got in calls.values():
        valid_call(got["name"], got["arguments"])
    # greedy and lossless: the stream writes the same calls
    assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())] == \
        [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]


@pytest.mark.real
def test_a_named_function_is_the_one_called(server):
    r = server.client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, temperature=0, max_tokens=CALLS,
                                              tool_choice={"type": "function", "function": {"name": "get_time"}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.function.name == "get_time"
        assert set(valid_call("get_time", call.function.arguments)) == {"city", "hours24"}


@pytest.mark.real
def test_a_whole_tool_loop_renders_through_the_template_and_answers(server, required):
    """calls -> the calls and their results go back (rendered as the template's <tool_call> and
    <tool_response> blocks) -> an answer with tool_choice auto, then none."""
    calls = required.message.tool_calls
    blocks = ["<tool_call>\n" + json.dumps({"name": c.function.name, "arguments": json.loads(c.function.arguments)})
              + "\n</tool_call>" for c in calls]
    results = [{"role": "tool", "tool_call_id": c.id, "content": f"{c.function.name}: 18 C, sunny"} for c in calls]
    messages = [*ASK, required.message.model_dump(exclude_none=True), *results]
    status, reply, _ = server.post("/apply-template", json.dumps({"messages": messages, "tools": TOOLS}).encode())
    assert status == 200, reply
    responses = "".join(f"\n<tool_response>\n{m['content']}\n</tool_response>" for m in results)
    assert ("<|im_start|>assistant\n" + "\n".join(blocks) + "<|im_end|>\n<|im_start|>user" + responses
            + "<|im_end|>\n<|im_start|>assistant\n") in reply["prompt"]

    r = server.client.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice="auto",
                                              temperature=0, max_tokens=CALLS)
    answer = r.choices[0]
    for c in answer.message.tool_calls or []:
        valid_call(c.function.name, c.function.arguments)
    if not answer.message.tool_calls:
        assert answer.message.content and "<tool_call>" not in answer.message.content
    r = server.client.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice="none",
                                              temperature=0, max_tokens=16)
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason in ("stop", "length")



@pytest.mark.real
def test_a_tool_choice_switch_reads_only_the_new_tokens(server):

    tool_choice_switches(server, TOOLS, ASK)
