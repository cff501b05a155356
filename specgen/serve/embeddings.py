"""/v1/embeddings (OpenAI's shape) and llama-server's /embedding and /embeddings: the served model's
pooled hidden states, from a second context with embeddings on, made on first use
(llama/embed.py). Inputs as llama-server reads them: a string, token ids, a mix, or a list of
those; {"prompt_string": ...} and {"content": [text parts]} objects."""

from __future__ import annotations

import base64
import json
import threading

import numpy as np

from specgen.core.protocol import Model
from specgen.errors import SpecgenError
from specgen.serve.requests import RequestError


def normalized(vector: np.ndarray, norm: int) -> np.ndarray:
    """llama.cpp's embd_normalize: -1 none, 0 max-absolute (int16 range), 1 taxicab, 2 Euclidean
    (the default), p > 2 the p-norm."""
    v = vector.astype(np.float64)
    if norm == -1:
        scale = 1.0
    elif norm == 0:
        scale = np.abs(v).max() / 32760.0
    elif norm == 2:
        scale = float(np.sqrt((v * v).sum()))
    else:
        scale = float((np.abs(v) ** norm).sum() ** (1.0 / norm))
    return (v / scale if scale > 0 else np.zeros_like(v)).astype(np.float32)


class Embeddings:
    """The served model's embedder, made on first use; one text embedded at a time (its own lock:
    generation goes on beside it in its own context). `n_ctx`: the longest text, in tokens."""

    def __init__(self, model: Model, model_id: str, n_ctx: int):
        self.model, self.model_id, self.n_ctx = model, model_id, n_ctx
        self._embedder = None
        self._refusal: str | None = None
        self._lock = threading.Lock()

    def _get(self):
        if self._embedder is None and self._refusal is None:
            make = getattr(self.model, "embedder", None)
            if make is None:
                self._refusal = f"{self.model_id} cannot embed: its backend has no embedding context"
            else:
                try:
                    self._embedder = make(self.n_ctx)
                except SpecgenError as e:
                    self._refusal = f"{self.model_id} cannot embed: {e}"
        if self._refusal is not None:
            raise RequestError(400, self._refusal, "model", kind="not_supported_error")
        return self._embedder

    def run(self, body: dict, native_route: bool) -> object:
        """The response body for one request (called off the event loop: it decodes)."""
        native = native_route or ("input" not in body and "content" in body)
        given = body.get("input", body.get("content"))
        if given is None:
            raise RequestError(400, "expected an input (a string, token ids, or a list of them)", "input")
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise RequestError(400, f"encoding_format expects float or base64, found {json.dumps(fmt)[:40]}",
                               "encoding_format")
        norm = body.get("embd_normalize", 2)
        if isinstance(norm, bool) or not isinstance(norm, int) or norm < -1:
            raise RequestError(400, f"embd_normalize expects -1, 0, 1, 2 or a larger whole number, found "
                                    f"{json.dumps(norm)[:40]}", "embd_normalize")
        prompts = [self._tokens(p, f"input[{i}]") for i, p in enumerate(given)] if _many(given) \
            else [self._tokens(given, "input")]
        if not prompts:
            raise RequestError(400, "input expects at least one text, found an empty list", "input")
        with self._lock:
            embedder = self._get()
            self._check_dimensions(body.get("dimensions"), embedder.n_embd)
            for i, tokens in enumerate(prompts):
                if len(tokens) > embedder.n_ctx:
                    raise RequestError(400, f"input[{i}] is too large: {len(tokens)} tokens, and this server "
                                            f"embeds at most {embedder.n_ctx} (--ctx)", "input")
            vectors = [normalized(embedder.embed(tokens).vector, norm) for tokens in prompts]
        if native:  # llama-server's own shape: one list of vectors per input (one, pooled)
            return [{"index": i, "embedding": [v.tolist()]} for i, v in enumerate(vectors)]
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if fmt == "base64" else v.tolist()}
                for i, v in enumerate(vectors)]
        n = sum(len(t) for t in prompts)
        model = body.get("model")
        return {"object": "list", "data": data, "model": model if isinstance(model, str) else self.model_id,
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    def _check_dimensions(self, dimensions: object, n_embd: int) -> None:
        if dimensions is not None and dimensions != n_embd:
            raise RequestError(400, f"dimensions: {self.model_id} embeds in {n_embd} dimensions and cannot give "
                                    f"{json.dumps(dimensions)[:20]}", "dimensions")

    def _tokens(self, prompt: object, where: str) -> list[int]:
        """One input as token ids, as llama-server tokenizes it (special tokens added and parsed)."""
        if isinstance(prompt, dict):
            prompt = _object_text(prompt, where)
        if isinstance(prompt, str):
            tokens = self.model.tokenize(prompt, add_special=True, parse_special=True)
        elif isinstance(prompt, list) and all(isinstance(p, (int, str)) and not isinstance(p, bool) for p in prompt):
            tokens = []
            for i, p in enumerate(prompt):  # token ids and text mixed: only a leading text gets BOS
                tokens += [p] if isinstance(p, int) else self.model.tokenize(p, add_special=i == 0,
                                                                               parse_special=True)
        else:
            raise RequestError(400, f"{where} expects a string, token ids, or a list of them, found "
                                    f"{json.dumps(prompt)[:60]}", "input")
        bad = [t for t in tokens if not 0 <= t < self.model.n_vocab]
        if bad:
            raise RequestError(400, f"{where} expects token ids in [0, {self.model.n_vocab}), found {bad[0]}", "input")
        if not tokens:
            raise RequestError(400, f"{where} is empty: there is nothing to embed", "input")
        return tokens


def _many(given: object) -> bool:
    """A list of inputs, not one input of token ids (a list holding a number is one prompt)."""
    return isinstance(given, list) and not any(isinstance(p, (int, float)) and not isinstance(p, bool) for p in given)


def _object_text(prompt: dict, where: str) -> str:
    if "prompt_string" in prompt:
        if prompt.get("multimodal_data"):
            raise RequestError(400, f"{where}: the model reads text only, found multimodal_data", "input")
        text = prompt["prompt_string"]
        if not isinstance(text, str):
            raise RequestError(400, f"{where}.prompt_string expects a string", "input")
        return text
    parts = prompt.get("content")
    if not isinstance(parts, list) or not parts:
        raise RequestError(400, f"{where} expects {{\"prompt_string\": text}} or {{\"content\": [text parts]}}, "
                                f"found {json.dumps(prompt)[:60]}", "input")
    texts = []
    for part in parts:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise RequestError(400, f"{where}.content expects text parts (the model reads text only), found "
                                    f"{json.dumps(part)[:60]}", "input")
        texts.append(part["text"])
    return "".join(texts)
