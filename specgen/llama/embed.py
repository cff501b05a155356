"""Embeddings from a loaded model: a second llama.cpp context with embeddings on, pooled as the GGUF
says (`<arch>.pooling_type`; mean where it says none or nothing, as a generative model does).
Each text is read whole in one batch (pooling needs every token of a sequence in one ubatch).
`model` is a backend.LlamaModel, which makes its Embedder (LlamaModel.embedder): this module reads
it and never imports backend, as grammar.py."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import llama_cpp as L

from specgen import host
from specgen.errors import ModelError, SpecgenError
from specgen.llama.runtime import last_error as _last_error

OUTPUT_BYTES = 64 << 20  # a causal model's logits rows per batch: about this many bytes of them
POOLING_NAMES = {L.LLAMA_POOLING_TYPE_MEAN: "mean", L.LLAMA_POOLING_TYPE_CLS: "cls",
                 L.LLAMA_POOLING_TYPE_LAST: "last"}


@dataclass(frozen=True)
class Embedding:
    vector: np.ndarray  # float32, n_embd values, pooled (not normalised)
    n_tokens: int


def gguf_pooling(model) -> int:
    """The pooling the GGUF declares (llama.cpp's enum), LLAMA_POOLING_TYPE_NONE if it declares none."""
    arch = model.meta("general.architecture") or ""
    value = model.meta(f"{arch}.pooling_type")
    try:
        return int(value) if value is not None else L.LLAMA_POOLING_TYPE_NONE
    except ValueError:
        return L.LLAMA_POOLING_TYPE_NONE


def _causal(model) -> bool:
    arch = model.meta("general.architecture") or ""
    return not L.llama_model_has_encoder(model._model) and model.meta(f"{arch}.attention.causal") != "false"


class Embedder:
    """`n_ctx`: the longest text, in tokens, it embeds; `batch`: a causal model's tokens per decode
    (default: as many as OUTPUT_BYTES of logits rows).

    A causal model (a decoder: every generative model) is read in batches of `batch` tokens with
    llama.cpp's pooling off, and its tokens' final hidden states (what llama.cpp pools) pooled here:
    the same numbers, without a logits buffer for the whole text at once (a row of n_vocab floats
    per token: 1 MB each for gemma's 262k vocabulary). Any other model is read whole in one batch,
    pooled by llama.cpp, as its attention needs."""

    def __init__(self, model, n_ctx: int, n_threads: int | None = None, batch: int | None = None):
        declared = gguf_pooling(model)
        if declared == L.LLAMA_POOLING_TYPE_RANK:
            raise ModelError(f"{model.name} is a reranker (pooling: rank): it scores pairs of texts and does "
                             "not embed one")
        self.model = model
        self.pooling = declared if declared in POOLING_NAMES else L.LLAMA_POOLING_TYPE_MEAN
        self.pooling_name = POOLING_NAMES[self.pooling]
        self.encoder = bool(L.llama_model_has_encoder(model._model))
        self.causal = _causal(model)
        self.n_embd: int = L.llama_model_n_embd_out(model._model)
        # Logits rows per batch: about OUTPUT_BYTES of them, a power of two.
        rows = 1 << max(4, (OUTPUT_BYTES // (4 * model.n_vocab)).bit_length() - 1)
        self.batch = (batch or rows) if self.causal else n_ctx
        params = L.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = min(n_ctx, self.batch)
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = n_threads or host.default_threads()
        params.embeddings = True
        params.pooling_type = L.LLAMA_POOLING_TYPE_NONE if self.causal else self.pooling
        params.no_perf = True
        self._ctx = L.llama_init_from_model(model._model, params)
        if not self._ctx:
            raise SpecgenError(f"llama.cpp could not create an embedding context of {n_ctx} tokens for "
                               f"{model.name}: {_last_error() or 'out of memory?'}")
        self.batch = min(self.batch, L.llama_n_batch(self._ctx), L.llama_n_ubatch(self._ctx))
        self.n_ctx: int = L.llama_n_ctx(self._ctx) if self.causal else self.batch
        self._mem = L.llama_get_memory(self._ctx)
        self._batch = L.llama_batch_init(self.batch, 0, 1)

    def embed(self, tokens: list[int]) -> Embedding:
        """The pooled embedding of `tokens` (1 to n_ctx of them), not normalised."""
        n = len(tokens)
        if not 0 < n <= self.n_ctx:
            raise ValueError(f"expected 1 to {self.n_ctx} tokens to embed, found {n}")
        if self._mem:
            L.llama_memory_clear(self._mem, True)
        total, first, last = np.zeros(self.n_embd, dtype=np.float64), None, None
        for start in range(0, n, self.batch):
            chunk = tokens[start:start + self.batch]
            self._run(chunk, start)
            if not self.causal:
                return Embedding(self._pooled(), n)
            rows = np.ctypeslib.as_array(L.llama_get_embeddings(self._ctx), shape=(len(chunk), self.n_embd))
            total += rows.sum(axis=0, dtype=np.float64)
            first = rows[0].copy() if first is None else first
            last = rows[-1].copy()
        pooled = {L.LLAMA_POOLING_TYPE_MEAN: lambda: (total / n).astype(np.float32),
                  L.LLAMA_POOLING_TYPE_CLS: lambda: first, L.LLAMA_POOLING_TYPE_LAST: lambda: last}[self.pooling]()
        return Embedding(pooled, n)

    def _run(self, chunk: list[int], start: int) -> None:
        b = self._batch
        b.n_tokens = len(chunk)
        for i, t in enumerate(chunk):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, start + i, 1, True
            b.seq_id[i][0] = 0
        rc = (L.llama_encode if self.encoder else L.llama_decode)(self._ctx, b)
        if rc != 0:
            raise SpecgenError(f"llama.cpp failed to embed {len(chunk)} tokens (code {rc}): {_last_error()}")

    def _pooled(self) -> np.ndarray:
        ptr = L.llama_get_embeddings_seq(self._ctx, 0)
        if not ptr:
            raise SpecgenError(f"llama.cpp gave no pooled embedding for {self.model.name}")
        return np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).copy()

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            L.llama_batch_free(self._batch)
            L.llama_free(self._ctx)
            self._ctx = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # at interpreter exit the bindings, or this module's globals, may be gone first
            pass
