"""llama.cpp's sampler chain order (llama-server's `samplers` field, SillyTavern's sampler
priority), followed exactly for the samplers specgen has.

llama-server builds a request's chain from its `samplers`: logit_bias first, then each sampler the
list names, in its order, then the draw. A truncation sees the logits as the steps before it left
them, so top_p's nucleus and min_p's floor are taken at the temperature where "temperature" comes
before them and at 1 where it comes after (llama.cpp's default order puts it last). A sampler the
list leaves out does not act, whatever its setting (without "temperature", the draw is at 1); a name
llama-server does not know is skipped. The order becomes SamplingParams.order, which core/sampling.py
applies in the one place that decides the eligible set for plain decoding and verification alike.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from specgen.errors import ConfigError

# llama-server's names (a list reads these only) and letters (a string of them).
NAMES = ("dry", "top_k", "top_p", "top_n_sigma", "typ_p", "min_p", "temperature", "xtc", "infill", "penalties",
         "adaptive_p")
LETTERS = {"d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "s": "top_n_sigma", "m": "min_p",
           "t": "temperature", "x": "xtc", "i": "infill", "e": "penalties", "a": "adaptive_p"}
# Samplers specgen does not have, with the request fields that turn each on (serve/fields.py refuses
# them unless at their neutral value): left out of the list, llama-server does not apply them either.
OTHERS = {"dry": ("dry_multiplier",), "typ_p": ("typical_p", "typ_p"), "top_n_sigma": ("top_n_sigma",),
          "xtc": ("xtc_probability",), "adaptive_p": ("adaptive_target",), "temperature": ("dynatemp_range",)}
# Each of specgen's samplers at the values that turn it off.
OFF: dict[str, dict[str, float]] = {
    "penalties": {"repeat_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0},
    "top_k": {"top_k": 0}, "top_p": {"top_p": 1.0}, "min_p": {"min_p": 0.0}, "temperature": {"temperature": 1.0},
}
# specgen's own chain (SamplingParams.order None) as llama.cpp's names: exact unless min-p acts at a
# temperature other than 1 (specgen's min-p reads the logits before temperature; see reported()).
OWN = ("penalties", "top_k", "temperature", "top_p", "min_p")


def parse(given: object) -> tuple[tuple[str, ...], list[str]]:
    """(the sampler names in order, the names llama-server skips); ConfigError for another type or
    for infill (llama.cpp's infill sampler acts on every token; specgen has none)."""
    if isinstance(given, str):
        items = [LETTERS.get(c, c) for c in given]
    elif isinstance(given, list) and all(isinstance(s, str) for s in given):
        items = given
    else:
        raise ConfigError(f"samplers expects a list of sampler names or a string of their letters, found "
                          f"{json.dumps(given)[:60]}")
    names = tuple(s for s in items if s in NAMES)
    if "infill" in names:
        raise ConfigError(f"samplers is not supported with infill (found {json.dumps(given)[:60]}): llama.cpp's "
                          "infill sampler is not implemented")
    return names, [s for s in items if s not in NAMES]


def acting(values: Mapping[str, Any]) -> list[str]:
    """specgen's samplers that change the choice at these settings (BOUNDS' names)."""
    t = values["temperature"]
    penalizes = values["repeat_last_n"] != 0 and (values["repeat_penalty"] != 1 or values["frequency_penalty"] != 0
                                                  or values["presence_penalty"] != 0)
    return [name for name, on in (("penalties", penalizes), ("top_k", values["top_k"] > 0),
                                  ("top_p", values["top_p"] < 1), ("min_p", values["min_p"] > 0),
                                  ("temperature", t != 1)) if on]


def follow(values: Mapping[str, Any], names: tuple[str, ...]) -> tuple[dict[str, Any], tuple[str, ...] | None,
                                                                        list[str]]:
    """The flat sampling settings as the chain `names` applies them: (the settings, each of specgen's
    samplers the list leaves out turned off; the order of those that act, None where specgen's own
    chain makes the same choices; a note for each setting the list turned off). ConfigError where
    specgen cannot follow the order: the penalties after another sampler that acts (specgen applies
    them to the row first), or a sampler that acts named twice."""
    v, notes = dict(values), []
    for name in acting(values):
        if name not in names:
            v.update(OFF[name])
            shown = ", ".join(f"{k} {_num(values[k])}" for k in OFF[name] if values[k] != OFF[name][k])
            notes.append(f"{shown} changed nothing: samplers leaves out {name}, as llama-server's chain would"
                         + (" (the draw is at temperature 1)" if name == "temperature" else ""))
    on = acting(v)
    twice = [n for n in on if names.count(n) > 1]
    if twice:
        raise ConfigError(f"samplers expects each sampler that acts once, found {twice[0]} "
                          f"{names.count(twice[0])} times")
    order = tuple(n for n in names if n in on)
    if "penalties" in order and order[0] != "penalties":
        raise ConfigError(f"samplers expects penalties before every other sampler that acts (specgen applies them "
                          f"to the logits first), found penalties after {order[0]}")
    steps = tuple(n for n in order if n != "penalties")
    return v, (None if _own_choices(steps, v) else steps), notes


def _own_choices(steps: tuple[str, ...], v: Mapping[str, Any]) -> bool:
    """Whether specgen's own chain (top-k, the nucleus at T, min-p before T) chooses as `steps`
    (the samplers that act, in order) do: greedy ignores every truncation; top-k commutes with
    temperature and min-p; the nucleus must follow temperature and top-k, min-p precede temperature,
    and the nucleus come first of the two."""
    if v["temperature"] <= 0:
        return True
    at = {n: i for i, n in enumerate(steps)}
    after = lambda a, b: a not in at or b not in at or at[a] > at[b]  # noqa: E731
    return after("top_p", "temperature") and after("top_p", "top_k") and after("temperature", "min_p") \
        and after("min_p", "top_p")


def reported(values: Mapping[str, Any]) -> list[str]:
    """The order llama-server would need to choose as specgen's own chain does at these settings
    (/props): OWN, or min-p before temperature where min-p acts at a temperature other than 1
    without a nucleus (with both, no order of llama.cpp's does: OWN is the nearest)."""
    on = acting(values)
    if "min_p" in on and "temperature" in on and values["temperature"] > 0 and "top_p" not in on:
        return ["penalties", "top_k", "min_p", "temperature", "top_p"]
    return list(OWN)


def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)
