"""Sampling as a race: token t is argmax_i (logit_i + T g_i) over the eligible tokens.

g_i = g(seed, t, i) is standard Gumbel noise from a counter-based generator keyed by the seed, the
absolute position t of the token being chosen and the token id, so by the Gumbel-max theorem the
winner is exactly a draw from softmax(logit / T) over the eligible set (argmax of l/T + g is the
argmax of l + T g, which cannot overflow however small T is). Whoever computes the race (plain
decoding, verification of any tree, a draft model proposing) gets the same winner from the same
logits: the same seed gives the same text for every method.

Noise by blocks. The vocabulary's ids are cut into blocks of BLOCK ids. For each block the noise is
built top-down: its largest value G_b (the maximum of BLOCK standard Gumbels: a Gumbel shifted by
log BLOCK), where it sits (uniform over the block), and every other id's noise drawn below G_b
(a Gumbel truncated at G_b). That is exactly BLOCK independent standard Gumbels, whatever subset of
ids exists, yet a race needs only the blocks whose bound max(logit) + T G_b can reach the best
score seen at a block's maximum: on a 262,144-token vocabulary, a handful of 256 blocks.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

BLOCK = 1024
NOISE_CACHE = 256  # positions whose noise is kept (a step's tree and its drafts span a few dozen)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_MASK = (1 << 64) - 1
_SALT_MAX, _SALT_POS = 0x5DEECE66D, 0xB5297A4D  # the block maximum's value and place: streams apart from ids


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _mix_int(x: int) -> int:
    """_mix() on one integer, in Python's integers (the same bits, without numpy's per-call cost)."""
    x &= _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def stream_key(seed: int, position: int) -> int:
    """The counter base of one (seed, position): every id's noise there derives from it."""
    return _mix_int(_mix_int(int(seed) * 0x2545F4914F6CDD1D + 1) + int(position) * int(_GOLDEN))


def _uniform(key: int, counters: np.ndarray) -> np.ndarray:
    """Uniforms in (0, 1), one per counter, 53 bits each."""
    with np.errstate(over="ignore"):
        h = _mix(np.uint64(key) + (counters.astype(np.uint64) + np.uint64(1)) * _GOLDEN)
    return ((h >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53


@dataclass(frozen=True)
class Noise:
    """The noise of one (seed, position) over the blocks covering `n_ids` ids."""

    key: int
    block_max: np.ndarray  # G_b per block
    block_arg: np.ndarray  # id of each block's maximum

    @classmethod
    def at(cls, seed: int, position: int, n_ids: int) -> "Noise":
        """One position's noise; the same object for the same arguments while it is recent (the draft
        proposing, the screen and the sampler each run the race at the same position)."""
        return _noise_at(int(seed), int(position), -(-int(n_ids) // BLOCK))

    @classmethod
    def _make(cls, seed: int, position: int, n_blocks: int) -> "Noise":
        key = stream_key(seed, position)
        blocks = np.arange(n_blocks, dtype=np.int64)
        u_max = _uniform(key ^ _SALT_MAX, blocks)
        u_pos = _uniform(key ^ _SALT_POS, blocks)
        g_max = -np.log(-np.log(u_max)) + math.log(BLOCK)
        arg = blocks * BLOCK + np.minimum((u_pos * BLOCK).astype(np.int64), BLOCK - 1)
        g_max.flags.writeable = arg.flags.writeable = False  # shared by every caller of the cache
        return cls(key, g_max, arg)

    def of(self, ids: np.ndarray) -> np.ndarray:
        """g for these ids: the block's maximum where it sits, else a Gumbel truncated below it."""
        ids = np.asarray(ids, dtype=np.int64)
        b = ids // BLOCK
        g_max = self.block_max[b]
        # Truncated at G: F(g) = exp(-exp(-g)) scaled by F(G); inverted.
        u = _uniform(self.key, ids) * np.exp(-np.exp(-g_max))
        g = -np.log(-np.log(u))
        return np.where(ids == self.block_arg[b], g_max, np.minimum(g, g_max))


@functools.lru_cache(maxsize=NOISE_CACHE)
def _noise_at(seed: int, position: int, n_blocks: int) -> Noise:
    return Noise._make(seed, position, n_blocks)


def noise(seed: int, position: int, ids: np.ndarray, n_ids: int | None = None) -> np.ndarray:
    """g(seed, position, id) for `ids` (the same values whichever ids are asked together)."""
    ids = np.asarray(ids, dtype=np.int64)
    top = int(ids.max()) + 1 if n_ids is None and len(ids) else (n_ids or 0)
    return Noise.at(seed, position, max(top, 1)).of(ids)


def winner(row: np.ndarray, temperature: float, seed: int, position: int,
           eligible: np.ndarray | None = None) -> int:
    """The race's winner over `eligible` ids (None: every id whose logit is not -inf); ties go to
    the lowest id. -1 when no id can win (every logit -inf)."""
    if eligible is not None:
        ids = np.sort(np.asarray(eligible, dtype=np.int64))
        scores = race_scores(row[ids], temperature, noise(seed, position, ids, row.shape[0]))
        if not len(ids) or scores.max() == -np.inf:
            return -1
        return int(ids[int(np.argmax(scores))])
    nz = Noise.at(seed, position, row.shape[0])
    ids = contenders(row, temperature, nz, 1)
    if not len(ids):
        return -1
    scores = race_scores(row[ids], temperature, nz.of(ids))
    return int(ids[int(np.argmax(scores))])


def ranking(row: np.ndarray, temperature: float, seed: int, position: int, k: int,
            eligible: np.ndarray | None = None) -> list[int]:
    """The race's first k finishers (winner first; ties: lowest id), for a draft's siblings;
    fewer if fewer can run."""
    return finishers(row, temperature, seed, position, k, eligible)[0]


def finishers(row: np.ndarray, temperature: float, seed: int, position: int, k: int,
              eligible: np.ndarray | None = None) -> tuple[list[int], list[float]]:
    """ranking() with each finisher's score, logit + T g: the gaps between them are the race's
    margins (how much the target's logits may differ from these before the order changes)."""
    if eligible is not None:
        ids = np.sort(np.asarray(eligible, dtype=np.int64))
        scores = race_scores(row[ids], temperature, noise(seed, position, ids, row.shape[0]))
    else:
        nz = Noise.at(seed, position, row.shape[0])
        ids = contenders(row, temperature, nz, k)
        scores = race_scores(row[ids], temperature, nz.of(ids))
    order = [i for i in np.lexsort((ids, -scores))[:k] if scores[i] > -np.inf]
    return [int(ids[i]) for i in order], [float(scores[i]) for i in order]


def race_scores(logits: np.ndarray, temperature: float, g: np.ndarray) -> np.ndarray:
    """logit + T g in float64: the same arithmetic wherever a race is run."""
    return logits.astype(np.float64) + float(temperature) * g


def contenders(row: np.ndarray, temperature: float, nz: Noise, k: int = 1, widen: float = 0.0) -> np.ndarray:
    """Ids that can still finish among the first k: each block's bound max(logit) + T G_b against
    the k-th best score known for sure, the block maxima's own (and the likeliest token's; rounding
    is monotone, so the bound holds in floats); in the blocks that reach it, each id's logit with
    its block's G_b. `widen`: each logit is known to within that (a screened row, llama/screen.py):
    upper bounds add it, the sure scores subtract it."""
    n = row.shape[0]
    n_blocks = len(nz.block_max)
    padded = row if n == n_blocks * BLOCK else np.concatenate(
        [row, np.full(n_blocks * BLOCK - n, -np.inf, dtype=row.dtype)])
    block_top = padded.reshape(n_blocks, BLOCK).max(axis=1)
    upper = race_scores(block_top, temperature, nz.block_max) + widen
    at = nz.block_arg < n
    sure = race_scores(row[nz.block_arg[at]], temperature, nz.block_max[at]) - widen
    if k == 1:  # the likeliest token's own score: with a peaked row, far above a block maximum's
        b = int(np.argmax(block_top))  # the row's argmax (its first) lies in the first block holding the maximum
        top = np.array([b * BLOCK + int(np.argmax(padded[b * BLOCK:(b + 1) * BLOCK]))])
        sure = np.append(sure, race_scores(row[top], temperature, nz.of(top)) - widen)
    best = np.sort(sure)[-k] if len(sure) >= k else -np.inf
    if best == -np.inf:
        best = np.nextafter(-np.inf, 0)  # some block maximum is banned: any finite score may win
    blocks = np.flatnonzero(upper >= best)
    if not len(blocks):
        return np.empty(0, dtype=np.int64)
    # In those blocks, the ids whose own logit with the block's largest noise reaches it.
    cells = padded.reshape(n_blocks, BLOCK)[blocks]
    reach = race_scores(cells, temperature, nz.block_max[blocks][:, None]) + widen >= best
    ids = (blocks[:, None] * BLOCK + np.arange(BLOCK)[None, :])[reach]
    return ids[row[ids] > -np.inf]
