"""Every tuned constant of `auto`, in one place. Where each value comes from (which measurement, on
which machine and models, which half of Spec-Bench) is in docs/auto.md, "Tuned constants", and a
constant no measurement set says so here: a value changes only with a measurement recorded there.
The values were set before the tune/report split of 2026-11-26, on Spec-Bench prompts of both
halves; changes since are measured on the tune half. Those that costs/ needs too (below drafting/)
live in core/tuning.py and are imported here so that this module lists them all. The bin edges,
decay rates and EMA weights below that auto.md's table does not name were set by no measurement: they
are choices of how fast estimates follow the text, not tuned values.

Acceptance estimates are Beta posteriors over bins; the priors below are where a fresh planner
starts, a little below what was measured, and the text at hand overrules them within a few steps.
"""

from __future__ import annotations

from specgen.core.tuned import AUTO_NODES, CURVE_COUPLING, CURVE_EMA, CURVE_OUTLIER  # noqa: F401 (listed here)
from specgen.drafting.sources import MAJORITY, MINORITY, UNANIMOUS

# --- auto's shape (methods.py passes these to AutoDrafter) ----------------------------------------
# No measurement set these two: 16 bounds a greedy draft chain (the planner's priced stop ends it
# sooner), and 4 earlier occurrences of an n-gram are what the trie offers per match.
AUTO_DRAFT_MAX_DEPTH = 16
AUTO_LOOKUP_MATCHES = 4

# --- the step ----------------------------------------------------------------------------------
LONG_PROMPT = 512  # tokens: from here a prompt's context term of the cost curve is worth timing
MAX_ACCEPT, MAX_ACCEPT_LOOP = 0.99, 0.998  # no node is certain: caps on one node's (or siblings') estimate
USEFUL_DEPTH_EVERY = 16  # steps between recomputing how deep lookup chains can pay
HISTORY_BELOW = 10  # other texts are searched when this text's best match is shorter than this
# A draft catch-up (reading committed text the draft has not seen) is charged to the tokens it
# should serve, at most this many: a text may end sooner, and a draft slower to repay gains little.
CATCH_UP_HORIZON = 32

# --- lookup acceptance (AcceptanceModel) -------------------------------------------------------
# Lower edges of the effective-match-length bins (the match plus the drafted tokens above a node).
MATCH_BINS = (1, 2, 3, 4, 5, 7, 10, 15, 24, 40)
LOOKUP_PRIOR = (0.2, 0.3, 0.45, 0.6, 0.7, 0.8, 0.87, 0.92, 0.98, 0.99)
# Per support class of the matched n-gram (sources.py); where a class's tuple ends, LOOKUP_PRIOR goes on.
SUPPORT_PRIOR = {UNANIMOUS: (0.6, 0.8, 0.88, 0.88, 0.92, 0.94),
                 MAJORITY: (0.5, 0.5, 0.5, 0.55, 0.6, 0.75, 0.87, 0.92, 0.95, 0.97),
                 MINORITY: (0.15, 0.25, 0.15, 0.3, 0.3, 0.5, 0.7, 0.8, 0.85, 0.9)}
LOOP_PRIOR = (0.2, 0.3, 0.45, 0.6, 0.7, 0.99, 0.99, 0.99, 0.995, 0.995)  # below 7 tokens: never a loop
Q_BINS = 10  # draft-model nodes: bins of the draft's q (sampling: its race estimate below), prior = q
# Sampling: how likely a draft's first and second race finishers are the target's winner, by the
# margin between them (logit units: logit + T g, so the same at every temperature). Knots of a
# piecewise-linear estimate; gemma-3-270m F32 against its -d self draft, T = 0.8, 1,560 positions
# of Spec-Bench's tune half (2026-11-28, docs/auto.md): margins 0-0.1 / 0.25-0.5 / 1-1.5 / 2-3 /
# over 3 had the first finisher win .48/.82/.86/.97/1.00 and the second .36/.08/.05/.01/.00.
RACE_MARGIN_KNOTS = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0)
RACE_FIRST = (0.45, 0.6, 0.8, 0.82, 0.85, 0.94, 0.98)
RACE_SECOND = (0.33, 0.2, 0.07, 0.05, 0.03, 0.01, 0.0)
RACE_LATER = 0.25  # a third or later finisher: this share of the second's estimate
BIN_WEIGHT, BIN_DECAY = 3.0, 0.97  # a prior's weight in observations; fading of old evidence per update
NEW_TEXT_FADE = 0.5  # what a new text keeps of the old evidence

# --- the draft model (DraftEstimate) -----------------------------------------------------------
ALPHA_PRIOR = 0.7  # first-token acceptance of a greedy chain; optimistic: an untried option is never learned
ALPHA_EMA = 0.1  # weight of one step's outcome in alpha
STEP_COST_EMA = 0.2  # weight of one proposal's measured cost per drafted token
RELAX = 0.02  # per step without the draft, its estimates drift back this far towards their priors

# --- realised against planned (KindRecord) -----------------------------------------------------
EFFICIENCY_EMA = 0.1  # weight of one step's realised/planned rate
EFFICIENCY_CREDIT = 1.5  # how far above its plan a kind's record may climb
EFFICIENCY_RELAX = RELAX / 10  # per step without the kind, its record fades back towards 1
OVERHEAD_EMA = 0.05  # weight of one step in the measured overhead of a step (time beyond its decode)

# --- guards (PlainSpeed, Guard) ----------------------------------------------------------------
PROBE_EVERY, MAX_PROBE_EVERY = 16, 256  # speculative steps between plain probes
PROBE_CLEAR_WIN = 1.3  # speculation this much faster than plain: probe half as often
PLAIN_EMA = 0.3  # weight of one plain step in plain decoding's measured time
# Steps judged together; slower than this share of plain loses. The window has a reason (auto.md),
# the margin none measured: 0.95 tolerates plain's own timing noise.
GUARD_WINDOW, GUARD_MARGIN = 32, 0.95
GUARD_BACKOFF, GUARD_MAX_BACKOFF = 16, 256  # steps a losing kind sits out (doubling per loss)
GUARD_MIN_STEPS, GUARD_WINDOW_TOKENS = 4, 128  # long steps are judged after fewer of them
