"""Would a Q4_1 copy screen a Q8_0 output layer (issue 69, item 3)? What the bound leaves to recompute.

Screening (specgen/llama/screen.py) reads a cheap copy of the output layer and recomputes exactly the
tokens whose bound could still reach the argmax. For an F32 target the copy is Q8_0; a quantized
model's output layer is often Q8_0 itself (gemma-3-270m Q4_K_M's, smollm2-135m Q4_1's), and its copy
would be Q4_1 (specgen's packed Q4_1 kernel: the fastest product it has). Per position of a text the
target writes greedily, this measures:
- the exact side: each probed token's logit computed in numpy as specgen's Q8_0 kernel computes it
  (activations through ggml's quantize_row_q8_0, eight float lanes, fused multiply-adds, hsum8),
  compared bit for bit with the logit llama.cpp returned;
- the Q4_1 copy's real error |w . h^ - w^ . h^| over the whole vocabulary, and two bounds on it per
  token, summed over the 32-value blocks: Hoelder's (||w_b - w^_b||_1 max|h^_b|, screen.py's form)
  and Cauchy-Schwarz's (||w_b - w^_b||_2 ||h^_b||_2); for each, the candidates greedy screening
  would recompute (tokens whose approximate logit plus bound reaches the best lower bound).

    python scripts/quantized_head_screen.py OUT.json [MODEL ...]
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, quants

from specgen.core.kv import evaluate
from specgen.host import cpu_name
from specgen.llama.backend import LlamaModel
from specgen.models import resolve

MODELS = ("gemma-3-270m-q4_k_m", "smollm2-135m-instruct-q4_1")
TEXT = "The printing press was invented by Johannes Gutenberg around 1440 in Mainz, and it"
POSITIONS = 24
QK, LANES = 32, 8


class Recorder:
    """Stands in for a screened context's head: keeps each decode's logits and hidden states."""

    def __init__(self):
        self.rows: list[tuple[np.ndarray, np.ndarray]] = []

    def patch(self, logits, hidden, *rule):
        self.rows.append((np.array(logits[-1]), np.array(hidden[-1])))


def quantize_row(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's x86 quantize_row_q8_0: codes (blocks, 32) int8 and the fp16 scales as float32."""
    x = h.astype(np.float32).reshape(-1, QK)
    amax = np.abs(x).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float16).astype(np.float32)
    inv = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax != 0)
    return np.rint(x * inv[:, None]).astype(np.int8), d


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """a * b + c in float32, rounded once: exact product in float64, two-sum, midpoint repair."""
    p, c64 = a.astype(np.float64) * b.astype(np.float64), c.astype(np.float64)
    s = p + c64
    bp = s - c64
    err = (p - bp) + (c64 - (s - bp))
    r = s.astype(np.float32)
    r64 = r.astype(np.float64)
    other = np.nextafter(r, np.where(s > r64, np.float32(np.inf), np.float32(-np.inf)))
    tie = (s != r64) & (r64 + other.astype(np.float64) == 2 * s) & (err != 0)
    return np.where(tie & ((err > 0) == (other > r)), other, r)


def exact_logits(raw: np.ndarray, q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Q8_0 rows (k, blocks * 34 bytes) times one quantized row, as native/few_q8_0.h computes it."""
    blocks = raw.reshape(len(raw), -1, 34)
    w_d = blocks[:, :, :2].copy().view(np.float16)[..., 0].astype(np.float32)
    lanes = (blocks[:, :, 2:].view(np.int8).astype(np.float32) * q.astype(np.float32)).reshape(
        len(raw), -1, LANES, 4).sum(axis=3)
    acc = np.zeros((len(raw), LANES), np.float32)
    for b in range(blocks.shape[1]):
        acc = fma32((w_d[:, b] * d[b])[:, None], lanes[:, b], acc)
    half = acc[:, 4:] + acc[:, :4]
    return (half[:, 0] + half[:, 2]) + (half[:, 1] + half[:, 3])


def candidates(approx: np.ndarray, bound: np.ndarray) -> int:
    return int(np.sum(approx + bound >= np.max(approx - bound)))


def probe(name: str) -> dict:
    path = resolve.resolve(name)
    head = {t.name: t for t in GGUFReader(path).tensors}
    head = head.get("output.weight") or head["token_embd.weight"]
    assert head.tensor_type.name == "Q8_0", f"{name}: its output matrix is {head.tensor_type.name}"
    raw = np.asarray(head.data)
    w = quants.dequantize(raw, GGMLQuantizationType.Q8_0).astype(np.float64)
    w_hat = quants.dequantize(quants.quantize(w.astype(np.float32), GGMLQuantizationType.Q4_1),
                              GGMLQuantizationType.Q4_1).astype(np.float64)
    diff = (w - w_hat).reshape(len(w), -1, QK)
    err_l1, err_l2 = np.abs(diff).sum(axis=2), np.sqrt((diff ** 2).sum(axis=2))
    model = LlamaModel(path, screen=(recorder := Recorder()))
    ctx = model.new_context(512, n_seq_max=2, n_outputs=32, n_threads=1)
    text = model.tokenize(TEXT)
    evaluate(ctx, text)
    for _ in range(POSITIONS - 1):
        text.append(int(np.argmax(recorder.rows[-1][0])))
        evaluate(ctx, text[-1:], len(text) - 1)
    probed = equal = 0
    rows = []
    rng = np.random.default_rng(0)
    for logits, hidden in recorder.rows:
        q, d = quantize_row(hidden)
        ids = np.concatenate([np.argsort(-logits)[:64], rng.integers(0, len(raw), 192)])
        probed += len(ids)
        equal += int(np.sum(exact_logits(raw[ids], q, d).view(np.uint32) == logits[ids].view(np.uint32)))
        h_hat = (q.astype(np.float64) * d[:, None])
        approx = w_hat @ h_hat.reshape(-1)  # the copy's logits (its own float rounding is far below these)
        holder = err_l1 @ np.abs(h_hat).max(axis=1)
        cauchy = err_l2 @ np.sqrt((h_hat ** 2).sum(axis=1))
        real = np.abs(logits.astype(np.float64) - approx)
        rows.append(dict(real_max=float(real.max()), real_median=float(np.median(real)),
                         holder_median=float(np.median(holder)), cauchy_median=float(np.median(cauchy)),
                         holder_candidates=candidates(approx, holder), cauchy_candidates=candidates(approx, cauchy),
                         real_candidates=candidates(approx, np.full_like(real, real.max()))))
    med = {key: float(np.median([r[key] for r in rows])) for key in rows[0]}
    return dict(model=name, n_vocab=int(len(raw)), n_embd=int(w.shape[1]), positions=len(rows),
                exact_probed=probed, exact_bit_equal=equal, median_over_positions=med,
                max_over_positions={key: float(np.max([r[key] for r in rows])) for key in rows[0]})


def main(out: str, names: list[str]) -> None:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = dict(run=dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                           command=["python", "scripts/quantized_head_screen.py", *sys.argv[1:]], commit=commit),
                  machine=dict(cpu=cpu_name()), text=TEXT, copy_type="Q4_1",
                  models=[probe(name) for name in names])
    Path(out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or list(MODELS))
