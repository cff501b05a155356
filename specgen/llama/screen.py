"""Exact greedy choices from a cheap copy of the output layer ("screening").

A greedy step needs one thing from the target's logits: the argmax. On an F32 or F16 target the
output matrix is much of every decode (gemma-3-270m F32: 671 of the 1,079 MB read per token, its
262,144 x 640 vocabulary), yet almost all of its rows are far from the argmax. So specgen derives,
once, a copy of the target whose output layer is Q8_0 (a quarter of F32's bytes; specgen's Q8_0
kernel serves a verification's columns in one pass) and asks llama.cpp for each row's hidden state h
beside the approximate logits l^. A bound b_i on |l_i - l^_i| per vocabulary entry says which
tokens could still be the argmax: those with l^_i + b_i >= max_j (l^_j - b_j). Their exact logits,
the original matrix's rows times h (in float32), overwrite the approximate ones in the row, so the
row's argmax is plain decoding's argmax: every other token's exact logit is below a candidate's.
Lowest-id ties break as before, since no other token can reach the maximum. The rows are no longer
the target's distribution, so what reads a row must need only its choice: greedy decoding, or sampling
by the race of core/race.py, whose winner needs exact logits only for the tokens whose bounds, with
their noise (known before the target runs), can still win it or enter the top-k it runs over
(ScreenedHead.patch; app/ask.why_exact_rows decides which requests may read a screened row).

The bound, for row i of the exact matrix w_i and its Q8_0 copy w^_i: llama.cpp computes
l^_i = w^_i . h^, where h^ is h quantized to Q8_0 (32-wide blocks, scale d = max|h|/127 stored in
fp16), and plain decoding computes l_i = w_i . h' (h' = h in the matrix's type: F16 products take
F16 activations). So, block by block (Hoelder: a block's L1 norm times the other's largest entry),
    |l_i - l^_i| <= |(w_i - w^_i) . h'| + |w^_i . (h' - h^)|
                 <= sum_b ||w_ib - w^_ib||_1 max|h'_b| + ||w^_ib||_1 (max|h'_b - h_b| + max|h_b - h^_b|)
plus a share for float rounding in either product, where |h - h^| is at most d/2 per element
(rounding to the nearest step) plus 127 d 2^-11 (the scale's fp16 rounding). The per-block L1
norms of each row are computed once, at derivation, and cached beside the copy. Per block rather
than over the whole row, because gemma's hidden states have a few blocks 3-17 times larger than the
median: on gemma-3-270m F32 the real error stayed under a fifth of the bound, and 1-125 tokens of
262,144 were candidates per row (with one Cauchy-Schwarz bound over the row, up to 13,040).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specgen.core import race
from specgen.core.sampling import Sampler, top_k_ids
from specgen.errors import ModelError
from specgen.files import replacing, write_text
from specgen.host import specgen_home
from specgen.llama.gguf import copy_metadata, write_tensors

SCREEN_TYPE = "Q8_0"
EXACT_TYPES = ("F32", "F16")  # output matrices screened (llama.cpp's products with them are exact-ish)
# llama.cpp's general.file_type values whose output matrix may be one of EXACT_TYPES (ALL_F32,
# MOSTLY_F16) and its bytes per weight: a first look that needs no reading of the tensor list
# (derive() checks the matrix itself).
FILE_TYPES = {"0": 4, "1": 2}
# Screened only where the output matrix is at least this share of the model's bytes: the copy costs
# about the model's size on disk, and saves at most 73% (F32) or 47% (F16) of the matrix's share of
# a decode. gemma-3-270m F32: 62% (a decode took 21 ms instead of 41); smollm2-135m F32: 21%; an
# 8B model in F16, about 6%.
MIN_SHARE = 0.15
SCREEN_VERSION = 2  # bump when what a screened copy or its sidecar holds changes
BLOCK = 32  # Q8_0's block
# |h - h^| per element, in units of the block's scale d: half a step, plus the fp16 rounding of d
# times the largest step count (127 d 2^-11), plus float rounding inside the quantization.
STEP_ERROR = 0.5 + 127 * 2.0 ** -11 + 1e-4
# Float rounding in either product (llama.cpp's F32 one and ours): n 2^-24 of sum |w_j h_j| each,
# under 4e-5 for n = 640 terms; charged as this share of sum_b ||w^_ib||_1 max|h_b|.
SLACK = 2e-4
CHUNK_ROWS = 16384  # rows quantized and measured at once while deriving (bounded memory)


@dataclass(frozen=True)
class ExactMatrix:
    """Where the original output matrix lies: rows of `dtype` from `offset` in `file`."""

    file: str
    offset: int
    dtype: str  # "F32" or "F16"
    n_rows: int
    n_embd: int

    def open(self) -> np.ndarray:
        dtype = np.float32 if self.dtype == "F32" else np.float16
        return np.memmap(self.file, dtype=dtype, mode="r", offset=self.offset, shape=(self.n_rows, self.n_embd))


class ScreenedHead:
    """The bound's per-block norms and the exact matrix of one screened target (see the module doc)."""

    def __init__(self, exact: np.ndarray, err_l1: np.ndarray, q_l1: np.ndarray):
        self.exact = exact  # (n_vocab, n_embd) float32 or float16, read by rows
        self.err_l1 = np.ascontiguousarray(err_l1, dtype=np.float32)  # (n_vocab, blocks): ||w_ib - w^_ib||_1
        self.q_l1 = np.ascontiguousarray(q_l1, dtype=np.float32)  # ||w^_ib||_1
        self.err_max, self.q_max = self.err_l1.max(axis=0), self.q_l1.max(axis=0)  # per block, over rows
        self.candidates = 0  # tokens whose exact logits were computed, over all rows (stats)
        self.rows = 0

    def patch(self, logits: np.ndarray, hidden: np.ndarray, positions: np.ndarray | None = None,
              sampler: "Sampler | None" = None) -> None:
        """Overwrite, in each row of `logits` (approximate, from the Q8_0 copy), the tokens that
        could be its choice with their exact logits; `hidden[r]` is row r's final hidden state.
        Greedy (no sampler): the tokens that could be the argmax. Sampling: those that could win
        the race of core/race.py for the token at `positions[r]`, or be in the top-k (or min-p's
        set) that the race runs over, so the Sampler's choice from the patched row is its choice
        from the exact one (Sampler.screenable says which settings these are)."""
        act = self.activations(hidden)
        # A first cut with each block's largest norm (one pass over each row), then each survivor's own.
        wide = act.h_max @ self.err_max + act.q_factor @ self.q_max
        racing = sampler is not None and not sampler.params.greedy
        for r in range(len(logits)):
            row = logits[r]
            if racing:
                cand = self._race_candidates(row, float(wide[r]), act, r, sampler, int(positions[r]))
            else:
                near = np.flatnonzero(row >= row.max() - 2 * wide[r])
                bound = self.bound(near, act, r)
                approx = row[near]
                cand = near[approx + bound >= np.max(approx - bound)]
            row[cand] = self.exact[cand].astype(np.float32) @ act.h[r]
            self.candidates += len(cand)
        self.rows += len(logits)

    def _race_candidates(self, row: np.ndarray, wide: float, act: "Activations", r: int, sampler: "Sampler",
                         position: int) -> np.ndarray:
        """Tokens whose upper bound reaches the lower bound that decides: the k-th largest (top-k),
        the largest plus ln(min_p) (min-p alone), else the best race score known for sure."""
        params = sampler.params
        if params.top_p < 1.0 and params.top_k <= 0:  # the nucleus needs the whole row's mass
            return np.arange(row.shape[0])
        if params.top_k > 0 or params.min_p > 0.0:
            k = min(params.top_k, row.shape[0]) if params.top_k > 0 else 1
            kth = float(row[top_k_ids(row, k)].min())
            slack = 0.0 if params.top_k > 0 else float(np.log(params.min_p))
            near = np.flatnonzero(row >= kth - 2 * wide + slack)
            bound = self.bound(near, act, r)
            low = row[near].astype(np.float64) - bound
            floor = np.partition(low, len(low) - k)[len(low) - k] + slack
            return near[row[near] + bound >= floor]
        t = params.temperature
        nz = race.Noise.at(sampler.seed, position, row.shape[0])
        near = race.contenders(row, t, nz, 1, wide)  # each logit within `wide` of its approximation
        bound = self.bound(near, act, r)
        score = race.race_scores(row[near], t, nz.of(near))
        best = float(np.max(score - bound))  # a sure lower bound of the winner's exact score
        return near[score + bound >= best]

    def activations(self, hidden: np.ndarray) -> "Activations":
        h32 = hidden.astype(np.float32)
        h = h32.astype(self.exact.dtype).astype(np.float32)  # h': what plain's product reads
        h_max = _block_max(h)
        # What multiplies ||w^_ib||_1: h' - h^ (its type's rounding, then Q8_0's), and rounding.
        return Activations(h, h_max, _block_max(h - h32) + quantization_step_error(h32) + SLACK * h_max)

    def bound(self, tokens: np.ndarray, act: "Activations", r: int) -> np.ndarray:
        """|exact - approximate logit| can be no larger than this for `tokens` of row r."""
        return self.err_l1[tokens] @ act.h_max[r] + self.q_l1[tokens] @ act.q_factor[r]


@dataclass(frozen=True)
class Activations:
    """Per output row: h' (the hidden state as plain decoding's product reads it), and per block
    what the bound multiplies each row's two L1 norms by."""

    h: np.ndarray  # (rows, n_embd) float32
    h_max: np.ndarray  # (rows, blocks): max |h'| in the block
    q_factor: np.ndarray  # (rows, blocks): max |h' - h^| in the block, plus the rounding share


def _block_max(x: np.ndarray) -> np.ndarray:
    return np.abs(x).reshape(len(x), -1, BLOCK).max(axis=2)


def quantize_head(exact: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The Q8_0 copy of an output matrix (raw GGUF bytes per row) and, per row and block, the L1
    norms of its error and of itself, rounded up to float32 (a bound must not shrink)."""
    from gguf import GGMLQuantizationType, quants

    qtype = GGMLQuantizationType[SCREEN_TYPE]
    n_rows, n_embd = exact.shape
    if n_embd % BLOCK:
        raise ModelError(f"screening needs a hidden size divisible by {BLOCK}, found {n_embd}")
    blocks = n_embd // BLOCK
    screened = np.empty((n_rows, blocks * (2 + BLOCK)), dtype=np.uint8)  # per block: fp16 scale, 32 int8
    err_l1, q_l1 = np.empty((n_rows, blocks), np.float32), np.empty((n_rows, blocks), np.float32)
    for lo in range(0, n_rows, CHUNK_ROWS):
        rows = np.asarray(exact[lo:lo + CHUNK_ROWS], dtype=np.float32)
        screened[lo:lo + len(rows)] = quants.quantize(rows, qtype)
        back = quants.dequantize(screened[lo:lo + len(rows)], qtype).astype(np.float64)
        shape = (len(rows), blocks, BLOCK)
        err_l1[lo:lo + len(rows)] = _up(np.abs(rows - back).reshape(shape).sum(axis=2))
        q_l1[lo:lo + len(rows)] = _up(np.abs(back).reshape(shape).sum(axis=2))
    return screened, err_l1, q_l1


def quantization_step_error(hidden: np.ndarray) -> np.ndarray:
    """Per row and block, a bound on |h - h^|, h^ being h quantized to Q8_0 as ggml does for a product."""
    return STEP_ERROR * _block_max(hidden) / 127


def _up(x: np.ndarray) -> np.ndarray:
    """float64 values as the nearest float32 at or above each."""
    y = x.astype(np.float32)
    return np.where(y < x, np.nextafter(y, np.float32(np.inf)), y)


def worth_screening(file_type: str | None, n_vocab: int, n_embd: int, file_bytes: int) -> bool:
    """Whether a model of this llama.cpp file type and shape may be screened with profit (MIN_SHARE)."""
    per_weight = FILE_TYPES.get(file_type or "")
    return per_weight is not None and n_vocab * n_embd * per_weight >= MIN_SHARE * file_bytes


def screened_dir() -> Path:
    return specgen_home() / "screened"


def screened_path(source: Path, source_sha256: str) -> Path:
    """The cache file of a target's screened copy (its sidecar: the same name with .json, .npz)."""
    return screened_dir() / f"{source.stem}-{SCREEN_TYPE.lower()}-head-v{SCREEN_VERSION}-{source_sha256[:12]}.gguf"


def load(path: Path, source: Path) -> ScreenedHead:
    """The ScreenedHead of a screened copy made by derive(). Its sidecar is checked first, since a
    wrong bound would break greedy equality: ValueError (or KeyError, TypeError, OSError) says
    what does not fit."""
    meta = json.loads(path.with_suffix(".json").read_text())
    if meta.get("version") != SCREEN_VERSION or meta.get("exact_in") not in ("copy", "source"):
        raise ValueError(f"expected version {SCREEN_VERSION} with exact_in copy or source")
    matrix = ExactMatrix(str(path if meta["exact_in"] == "copy" else source), **meta["exact"])
    itemsize = 4 if matrix.dtype == "F32" else 2
    if (matrix.dtype not in EXACT_TYPES or min(matrix.n_rows, matrix.n_embd, matrix.offset + 1) < 1
            or matrix.n_embd % BLOCK or matrix.offset + matrix.n_rows * matrix.n_embd * itemsize
            > os.path.getsize(matrix.file)):
        raise ValueError("expected the exact matrix inside its file")
    with np.load(path.with_suffix(".npz")) as norms:
        err_l1, q_l1 = norms["err_l1"], norms["q_l1"]
    shape = (matrix.n_rows, matrix.n_embd // BLOCK)
    if err_l1.shape != shape or q_l1.shape != shape or not (np.isfinite(err_l1).all() and np.isfinite(q_l1).all()
                                                            and (err_l1 >= 0).all() and (q_l1 >= 0).all()):
        raise ValueError(f"expected finite non-negative norms of shape {shape}")
    return ScreenedHead(matrix.open(), err_l1, q_l1)


SUFFIXES = (".gguf", ".json", ".npz")  # a screened copy and its sidecar


def is_derived(path: Path) -> bool:
    return all(path.with_suffix(s).is_file() for s in SUFFIXES)


def derive(source: Path, dest: Path) -> bool:
    """Write `dest`: `source` with an output layer in SCREEN_TYPE (a new output.weight for a model
    whose embedding matrix is its output, else its output.weight replaced), and its sidecar.
    False, writing nothing, when the output matrix is not one of EXACT_TYPES."""
    from gguf import GGMLQuantizationType, GGUFReader

    reader = GGUFReader(source)
    tensors = {t.name: t for t in reader.tensors}
    tied = "output.weight" not in tensors
    head = tensors.get("output.weight") or tensors.get("token_embd.weight")
    if head is None or head.tensor_type.name not in EXACT_TYPES or len(head.data.shape) != 2:
        return False
    exact = np.asarray(head.data)
    n_rows, n_embd = exact.shape
    if n_embd % BLOCK:
        return False
    qtype = GGMLQuantizationType[SCREEN_TYPE]
    screened, err_l1, q_l1 = quantize_head(exact)

    # The sidecar first, each file whole or absent (another process may be deriving the same), and
    # the copy last: is_derived() looks for all three.
    with replacing(dest) as tmp:
        writer = copy_metadata(reader, tmp)
        write_tensors(writer, [(t.name, t.data, t.tensor_type) for t in reader.tensors if t.name != "output.weight"]
                      + [("output.weight", screened, qtype)])
        if tied:  # the exact matrix is the copy's own embedding matrix: find where it was written
            embd = next(t for t in GGUFReader(tmp).tensors if t.name == "token_embd.weight")
            offset = int(embd.data_offset)
        else:
            offset = int(head.data_offset)
        with replacing(dest.with_suffix(".npz")) as npz, open(npz, "wb") as f:
            np.savez(f, err_l1=err_l1, q_l1=q_l1)
        write_text(dest.with_suffix(".json"), json.dumps({
            "version": SCREEN_VERSION, "exact_in": "copy" if tied else "source",
            "exact": {"offset": offset, "dtype": head.tensor_type.name, "n_rows": n_rows, "n_embd": n_embd}}))
    return True
