"""Embeddings: /v1/embeddings through OpenAI's own client and llama-server's /embedding, against a
real server process on smollm2 (a second context, made on first use, pooled by mean as its GGUF
declares no pooling); and the embedder itself, read in batches, against one read whole."""

import json

import numpy as np
import pytest

from harness import call, server as shared

pytestmark = pytest.mark.real

N_EMBD = 576  # smollm2-135m's hidden size
CTX = 256
ALIAS = "embedder"  # --alias: the model id the server lists and answers with
SAME = "The cat sat on the mat."
OTHER = "Quarterly revenue rose by four percent."


@pytest.fixture(scope="module")
def server():
    return shared("--ctx", str(CTX), "--alias", ALIAS)


def post(server, path, body):
    status, _, raw = call(server, "POST", path, body)
    return status, json.loads(raw)


def unit(v):
    return np.asarray(v, dtype=np.float64) / np.linalg.norm(v)


def test_openai_client_gets_one_normalised_vector_per_input_the_same_each_time(server):
    chat = dict(model="x", messages=[{"role": "user", "content": "Name three colours."}], max_tokens=8, temperature=0)
    before = server.client.chat.completions.create(**chat).choices[0].message.content
    r = server.client.embeddings.create(model="x", input=[SAME, SAME, OTHER])  # the client asks for base64
    assert [d.index for d in r.data] == [0, 1, 2] and all(d.object == "embedding" for d in r.data)
    a, b, c = (np.array(d.embedding) for d in r.data)
    assert a.shape == (N_EMBD,) and abs(np.linalg.norm(a) - 1) < 1e-5
    assert float(unit(a) @ unit(b)) == pytest.approx(1.0, abs=1e-6)
    assert float(unit(a) @ unit(c)) < 0.95
    assert r.usage.prompt_tokens == r.usage.total_tokens > 0
    again = server.client.embeddings.create(model="x", input=SAME)
    assert np.array_equal(np.array(again.data[0].embedding), a)  # deterministic
    # the floats, as JSON, are the same numbers; the generation beside it is unchanged
    status, raw = post(server, "/v1/embeddings", {"input": SAME, "encoding_format": "float", "model": "m"})
    assert status == 200 and raw["model"] == "m" and raw["object"] == "list"
    assert np.array_equal(np.array(raw["data"][0]["embedding"], dtype=np.float32), a.astype(np.float32))
    assert server.client.chat.completions.create(**chat).choices[0].message.content == before
    assert [m.id for m in server.client.models.list()] == [ALIAS]
    assert post(server, "/v1/embeddings", {"input": SAME})[1]["model"] == ALIAS  # none asked: the server's id


def test_token_ids_and_llama_servers_own_shape(server):
    status, tokens = post(server, "/tokenize", {"content": SAME, "add_special": True})
    assert status == 200
    vectors = []
    for body in ({"input": SAME}, {"input": tokens["tokens"]}, {"input": [{"content": [
            {"type": "text", "text": SAME[:7]}, {"type": "text", "text": SAME[7:]}]}]}):
        status, r = post(server, "/v1/embeddings", {**body, "encoding_format": "float"})
        assert status == 200, r
        vectors.append(r["data"][0]["embedding"])
    assert vectors[0] == vectors[1] == vectors[2]
    status, r = post(server, "/embedding", {"content": SAME})  # llama-server: a list of vectors per input
    assert status == 200 and r == [{"index": 0, "embedding": [vectors[0]]}]
    status, r = post(server, "/v1/embeddings", {"input": SAME, "embd_normalize": -1, "encoding_format": "float"})
    raw = np.array(r["data"][0]["embedding"])
    assert np.allclose(raw / np.linalg.norm(raw), vectors[0], atol=1e-6) and abs(np.linalg.norm(raw) - 1) > 1e-3


@pytest.mark.parametrize("body, status, words", [
    ({"input": SAME, "dimensions": 64}, 400, "embeds in 576 dimensions"),
    ({"input": SAME, "encoding_format": "int8"}, 400, "encoding_format expects float or base64"),
    ({"input": []}, 400, "at least one text"),
    ({"input": [SAME, {"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]}, 400, "text only"),
    ({"input": [1, 2, 10**9]}, 400, "token ids in [0, 49152)"),
    ({"input": "word " * (CTX + 10)}, 400, "embeds at most"),
    ({"model": "x"}, 400, "expected an input"),
])
def test_refusals_name_the_field(server, body, status, words):
    got, r = post(server, "/v1/embeddings", body)
    assert got == status and words in r["error"]["message"], r


def test_dimensions_equal_to_the_models_is_accepted(server):
    r = server.client.embeddings.create(model="x", input=SAME, dimensions=N_EMBD)
    assert len(r.data[0].embedding) == N_EMBD


def test_a_text_read_in_batches_pools_to_what_one_batch_gives(smollm2):
    from specgen.llama.embed import Embedder

    tokens = smollm2.tokenize("A long text to embed, read in several batches of sixteen tokens each. " * 4)
    assert len(tokens) > 48
    whole, pieces = Embedder(smollm2, 256), Embedder(smollm2, 256, batch=16)
    assert whole.batch >= len(tokens) and whole.pooling_name == "mean"
    a, b = whole.embed(tokens).vector, pieces.embed(tokens).vector
    assert np.allclose(a, b, rtol=1e-3, atol=1e-3) and float(unit(a) @ unit(b)) > 0.99999
    assert not np.allclose(a, pieces.embed(tokens[:-8]).vector, atol=1e-3)  # the whole text counts


def test_a_model_that_cannot_embed_is_one_clear_4xx():  # the refusal alone, before any model
    from specgen.errors import ModelError
    from specgen.serve.embeddings import Embeddings
    from specgen.serve.requests import RequestError

    class Reranker:
        n_vocab = 10

        def tokenize(self, text, add_special=True, parse_special=False):
            return [1, 2]

        def embedder(self, n_ctx):
            raise ModelError("rr is a reranker (pooling: rank): it scores pairs of texts and does not embed one")

    with pytest.raises(RequestError) as e:
        Embeddings(Reranker(), "rr", 64).run({"input": "hi"}, native_route=False)
    assert e.value.status == 400 and e.value.message.startswith("rr cannot embed: rr is a reranker")


def test_embeddings_beside_a_generation_change_neither(server):
    """The embedding context decodes on its own thread while the worker decodes a chat: the
    embeddings come back while the chat still streams (an embedding that waited for the
    generation would come back after its last chunk), and neither result
    changes."""
    import threading

    chat = dict(model="x", messages=[{"role": "user", "content": "Count from one to forty in words."}],
                max_tokens=96, temperature=0)
    vector = server.client.embeddings.create(model="x", input=OTHER).data[0].embedding
    started, texts, chunks = threading.Event(), [], []

    def generate():
        text = ""
        for chunk in server.client.chat.completions.create(**chat, stream=True):
            chunks.append(chunk)
            started.set()
            text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
        texts.append(text)

    thread = threading.Thread(target=generate)
    thread.start()
    assert started.wait(120)  # the generation is under way
    beside = [server.client.embeddings.create(model="x", input=OTHER).data[0].embedding for _ in range(3)]
    seen, finished = len(chunks), bool(texts)
    thread.join(120)
    # after, not before: a text generated once is drafted from its history the second time, too
    # fast (tens of ms) for anything to come back while it streams
    alone = server.client.chat.completions.create(**chat).choices[0].message.content
    assert texts == [alone] and all(v == vector for v in beside)
    # An embedder that waited for the generation would come back after its last chunk.
    assert not finished and seen < len(chunks), f"the embeddings came back after {seen} of {len(chunks)} chunks"
