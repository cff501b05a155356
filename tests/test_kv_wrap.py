"""Long speculative texts never take the KV cache's head round to its start (core/kv.py wraps_soon,
reread): specgen's build never moves the head back, so every rejected draft node (and every timing
auto makes) takes a cell for good; past the cache's end llama.cpp would put committed tokens into
the holes before earlier ones, and attention, which sums a row's cells in cell order, would round
otherwise than plain decoding's. The committed text is read anew from cell 0 first, with the same bits."""

import pytest

import harness

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def small_cache():
    """gemma Q4_K_M with its Q2_K draft in a 256-token context: a 180-token answer with trees
    writes more cells than that."""
    from specgen.app.config import RunConfig
    from specgen.app.session import load_session

    cfg = RunConfig(target=harness.GEMMA, draft="gemma-3-270m-q2_k", store=False, ctx=256, threads=1)
    return load_session(cfg.loading, ["plain", "tree", "auto"], store_default=False)


@pytest.mark.parametrize("method,n", [("tree", 180), ("tree", 240), ("auto", 240)])
def test_a_long_text_is_plains_and_the_head_never_comes_round(small_cache, monkeypatch, method, n):
    """180 tokens: re-read once or more; 240: into the last quarter of the context, where plain
    steps (one cell each) finish it."""
    prompt = "The history of the city begins with a small settlement on the river."
    ctx = small_cache.target_ctx
    most = [0]
    decode = type(ctx).decode

    def counted(self, batch):
        out = decode(self, batch)
        if self is ctx:  # the target's (a draft's KV only proposes)
            most[0] = max(most[0], self.cells_written)
        return out

    monkeypatch.setattr(type(ctx), "decode", counted)
    kw = dict(target=harness.GEMMA, draft="gemma-3-270m-q2_k", n=n, on=small_cache, threads=1)
    plain = harness.run_of("plain", prompt, **kw)
    most[0] = 0
    tree = harness.run_of(method, prompt, **kw)
    assert most[0] <= ctx.n_ctx  # never past the cache's end...
    assert tree.stats.rereads >= 1  # ...though its trees took more cells than the cache has
    assert tree.tokens == plain.tokens
