"""auto's tuned constants that layers below drafting need (the cost curve, calibration's sizes).

They live here, not in drafting/tuning.py, only because costs/ sits below drafting/ and imports point
down; drafting/tuning.py imports each of them, so that one module lists every tuned constant. Each
says the measurement it was set by, or that it has none; docs/auto.md, "Tuned constants", gives the
same.
"""

# auto's largest tree, and the largest size calibration times (costs.curve.BATCH_SIZES ends with
# it), so every tree it weighs is priced from a measurement. Measured: gemma Q4_K_M, 80 tokens cost
# 2.46 ms each, 64 cost 2.50; with chains of up to 80 loop tokens 30 Spec-Bench prompts were modelled
# 0.6% faster, 30 others the same (2026-11-23, before the tune/report split: prompts of both halves).
AUTO_NODES = 80

# The cost curve's live levels (costs.curve.CostCurve.observe). No measurement set CURVE_EMA or
# CURVE_COUPLING: they are choices of how fast a level follows the machine, not tuned values.
CURVE_EMA = 0.1  # weight of one live measurement in the running estimate
# One decode is one sample, and machines hiccup (page faults, a neighbour's burst): bench's first
# gemma F32 batch of 2 once took 635 ms against 47 (2026-11-24), and read through a batch's small
# share of its own level that one decode put the batch level at 5.4x, so auto planned with batches
# 5x too dear for the rest of that prompt and most of the next. A live decode moves a level as if it
# were at most this many times the level it found: a single outlier moves it by at most
# CURVE_EMA * (CURVE_OUTLIER - 1), and a real change still gets there (a 3x slowdown within 30
# decodes). 2.0 was chosen from that one case, not swept.
CURVE_OUTLIER = 2.0
CURVE_COUPLING = 0.1  # a one-token decode's weight in the batch level, relative to a batch's (see observe)
