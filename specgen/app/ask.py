"""One generation as one value (Ask), and the one table of bounds every sampling number is checked
against, whichever edge read it (command line, config file, server): each edge parses its own input,
checks it here, and names its own flag or field when a value is out of bounds."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

from specgen.app import samplers
from specgen.app.prompts import Prompt
from specgen.app.structured import GENERIC, Tools, tool_constraint, tool_format
from specgen.core.constraint import ConstraintSpec
from specgen.core.protocol import Model
from specgen.core.sampling import SamplingParams
from specgen.errors import ConfigError, ConstraintError

PENALTY_MAX = 2.0  # OpenAI's range for presence and frequency penalties: [-2, 2]
BIAS_MAX = 100.0  # and for a logit bias: [-100, 100] (or -inf: never this token)
SEED_MAX = 2**32 - 1  # llama.cpp's seeds are 32-bit: bench passes the same seed to its runs


@dataclass(frozen=True)
class Bound:
    """A sampling number: its range [low, high] (`low_open` excludes low; `whole`: an integer), and
    how the command line shows it (cli/options.SAMPLING is made from these rows): `help`, `metavar`,
    a `short` flag. `note` says what a special value means in an error; `says` replaces the command
    line's wording of the range where the range alone reads badly."""

    name: str  # RunConfig's field, the server's field, core's SamplingParams/Penalties value
    low: float
    high: float = math.inf
    low_open: bool = False
    whole: bool = False
    note: str = ""
    says: str = ""
    help: str = ""
    metavar: str = "X"
    short: str = ""

    @property
    def flag(self) -> str:
        return f"--{self.name.replace('_', '-')}"

    def holds(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        return (value > self.low if self.low_open else value >= self.low) and value <= self.high

    @property
    def range_text(self) -> str:
        """`in [0, 1]`, `in (0, 10]`, or (no upper bound) `>= 0`."""
        low = _num(self.low)
        if math.isinf(self.high):
            return f"{'>' if self.low_open else '>='} {low}"
        return f"in {'(' if self.low_open else '['}{low}, {_num(self.high)}]"

    def flag_error(self, flag: str, value: object) -> str:
        """The command line's words (and the config file's: it names the same settings)."""
        note = f" ({self.note})" if self.note else ""
        return f"{flag} {self.says or f'must be {self.range_text}{note}'}, found {value}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


# Every sampling number, once. Where the command line and the server differed, the wider range
# stayed: temperature has no upper bound (llama.cpp's; the server said <= 2), top_k and
# repeat_last_n none either (the server capped them at 2^20 and 2^31 - 1).
BOUNDS = (
    Bound("temperature", 0.0, help="0 = greedy [0].", metavar="T", short="-t"),
    Bound("top_k", 0, whole=True, note="0 = off", help="Sample from the k most likely tokens (0 = off) [0].",
          metavar="K"),
    Bound("top_p", 0.0, 1.0, low_open=True, help="Nucleus sampling mass in (0, 1] [1].", metavar="P"),
    Bound("seed", 0, SEED_MAX, whole=True, says=f"expects a whole number from 0 to {SEED_MAX}",
          help="Seed for sampling: same seed, same output.", metavar="N"),
    Bound("min_p", 0.0, 1.0, help="Keep tokens at least P times as likely as the most likely one (0 = off) [0].",
          metavar="P"),
    Bound("repeat_penalty", 0.0, 10.0, low_open=True, note="1 = off",
          help="Divide the logits of tokens in the last --repeat-last-n (1 = off) [1]."),
    Bound("repeat_last_n", -1, whole=True, says="must be -1 (the whole context), 0 (off) or more",
          help="Tokens the penalties look back over, prompt included (0 = off, -1 = the context) [64].", metavar="N"),
    Bound("presence_penalty", -PENALTY_MAX, PENALTY_MAX,
          help="Subtract X from the logit of a token already there, in [-2, 2] [0]."),
    Bound("frequency_penalty", -PENALTY_MAX, PENALTY_MAX,
          help="Subtract X times its count from a token's logit, in [-2, 2] [0]."),
)
BY_NAME = {b.name: b for b in BOUNDS}

# Other tools' default samplers by name (`bench --sampler`): llama-server's chain as it ships
# (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05), OpenAI's clients' (temperature 1).
SAMPLERS = {
    "llama-server": {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05},
    "openai": {"temperature": 1.0},
    "greedy": {"temperature": 0.0},
}


def with_sampler(name: str | None, given: Overrides) -> Overrides:
    """`given` (the sampling values an edge gave) with a named sampler's settings filling the ones
    not given; a ConfigError naming the samplers for an unknown name."""
    if name is None:
        return given
    if name not in SAMPLERS:
        raise ConfigError(f"--sampler expects one of {', '.join(SAMPLERS)}, found {name!r}")
    return replace(given, **{k: v for k, v in SAMPLERS[name].items() if getattr(given, k) is None})


def out_of_bounds(values: Mapping[str, Any]) -> Bound | None:
    """The first bound a given value (not None) breaks; the edge words the error with its own name."""
    for bound in BOUNDS:
        value = values.get(bound.name)
        if value is not None and not bound.holds(value):
            return bound
    return None


def sampling_params(v: Mapping[str, Any]) -> SamplingParams:
    """Core's SamplingParams from the flat settings (BOUNDS' names, logit_bias as pairs, and
    llama.cpp's `samplers` order where one is given: samplers.follow; a ConfigError where it cannot
    be followed)."""
    order = None
    if v.get("samplers") is not None:
        v, order, _ = samplers.follow(v, v["samplers"])
    return SamplingParams(**{b.name: v[b.name] if b.whole else float(v[b.name]) for b in BOUNDS},
                          logit_bias=tuple(v["logit_bias"]), order=order)


def sampling_values(s: SamplingParams) -> dict[str, Any]:
    """The inverse of sampling_params: what a request's own values replace."""
    return {**{b.name: getattr(s, b.name) for b in BOUNDS}, "logit_bias": s.logit_bias}


def followed(s: SamplingParams, names: tuple[str, ...]) -> tuple[SamplingParams, list[str]]:
    """`s` as llama.cpp's chain `names` applies it (samplers.follow: the samplers it leaves out
    turned off, the order where it differs from specgen's own), and a note for each setting it
    turned off; a ConfigError where specgen cannot follow it."""
    v, order, notes = samplers.follow(sampling_values(s), names)
    return replace(s, **v, order=order), notes


@dataclass(frozen=True)
class Overrides:
    """The sampling values one edge was given for one generation (a request's fields), typed by
    BOUNDS' names: None is not given, the defaults' value holds; and llama.cpp's `samplers` order
    where one was given. over(defaults) is the Ask's sampling: the defaults with these replacing
    their fields, then the order followed."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: tuple[tuple[int, float], ...] | None = None  # (token, added logit), -inf banning
    samplers: tuple[str, ...] | None = None  # llama.cpp's names, in the request's order

    @property
    def given(self) -> dict[str, Any]:
        """The sampling values given, by name (not the order)."""
        return {name: v for name in SamplingParams.__dataclass_fields__ if name != "order"
                and (v := getattr(self, name)) is not None}

    def over(self, defaults: SamplingParams) -> SamplingParams:
        s = replace(defaults, **self.given)
        return s if self.samplers is None else followed(s, self.samplers)[0]

    def notes(self, defaults: SamplingParams) -> list[str]:
        """What the `samplers` order turned off over `defaults`, said plainly (ConfigError: it
        cannot be followed)."""
        return [] if self.samplers is None else followed(replace(defaults, **self.given), self.samplers)[1]


def check_vocabulary(bias: Iterable[tuple[int, float]], n_vocab: int, name: str = "logit_bias", model: str = "",
                     ban: str = "false") -> None:
    """The one rule for a logit bias against the model's vocabulary, whichever edge gave it: it
    names tokens of the vocabulary (`model`'s, where named) and leaves at least one unbanned (with
    every token banned there is nothing to choose). A ConfigError in the edge's words: its `name`
    for the setting, its `ban` for a ban."""
    bias = tuple(bias)
    bad = [t for t, _ in bias if not 0 <= t < n_vocab]
    if bad:
        raise ConfigError(f"{name} expects token ids in [0, {n_vocab}){f' for {model}' if model else ''}, "
                          f"found {bad[0]}")
    if sum(b == -math.inf for _, b in bias) >= n_vocab:
        raise ConfigError(f"{name} expects at least one token left unbanned, found all {n_vocab} tokens of the "
                          f"vocabulary banned ({ban})")


def why_exact_rows(sampling: SamplingParams, constrained: bool, logprobs: int | None = None) -> str | None:
    """The one rule for screening (llama/screen.py keeps exact what decides a row's choice: the
    argmax, or the race's winner and the top-k or min-p set it runs over): what in a generation
    needs the target's own rows, or None when a screened copy's row serves."""
    if constrained:
        return "constrained output"  # the masked argmax, not the row's
    if logprobs is not None:
        return "logprobs"
    if sampling.penalties.active:
        return "penalties and logit bias"  # they move logits the screen approximated
    if not sampling.greedy and sampling.top_p < 1.0 and sampling.top_k <= 0:
        return "top-p without top-k"  # the nucleus needs the whole row's mass
    if not sampling.greedy and sampling.order is not None:
        return "a samplers order"  # screen.py bounds specgen's own chain's sets
    return None


def any_needs_exact_rows(sampling: SamplingParams, prompts: Iterable[Any]) -> bool:
    """Before loading (the Asks need the loaded target): whether any of these prompts' generations,
    under `sampling`, will need the target's own rows (then no screened copy is loaded)."""
    return any(why_exact_rows(sampling, p.constrained) is not None for p in prompts)


@dataclass(frozen=True)
class Ask:
    """What one generation asks for, parsed once at its edge: the prompt and how it is read
    (`chat`: through the chat template), the sampling, the whole constraint (a response format or
    the tools' grammar, its JSON layout set), the token limit, stop strings and logprobs (that many
    alternatives per token; None: none). Make it with `ask_for`, which builds the constraint."""

    prompt: Prompt
    chat: bool
    sampling: SamplingParams = SamplingParams()
    constraint: ConstraintSpec | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    cache_prompt: bool = True  # False: the prompt is read whole, whatever the prompt cache holds
    # auto plans from the curves as loaded, never from clocks, so that its trees (hence the target's
    # batches and their numerics) repeat exactly. None: whether the sampling has a seed; ask_for
    # fixes it from the seed the edge gave (bench's per-trial seeds do not change it).
    reproducible: bool | None = None

    def __post_init__(self) -> None:
        if self.prompt.constrained and self.constraint is None:
            raise ValueError("an Ask whose prompt carries a response format or tools needs its constraint: "
                             "make it with ask_for")

    @property
    def plans_from_curves(self) -> bool:
        """Whether a measured method plans from the fixed curves (a seed was given), not from clocks."""
        return self.sampling.seed is not None if self.reproducible is None else self.reproducible

    @property
    def needs_exact_rows(self) -> bool:
        return self.why_exact_rows is not None

    @property
    def why_exact_rows(self) -> str | None:
        return why_exact_rows(self.sampling, self.constraint is not None, self.logprobs)


def ask_for(target: Model, prompt: Prompt, chat: bool, layout: str, **rest: Any) -> Ask:
    """An Ask for `prompt` as `target` reads it, its constraint made whole here with `layout`."""
    prompt = answered_in_text(prompt, tools_format(target, chat))
    rest.setdefault("reproducible", rest.get("sampling", Ask.sampling).seed is not None)
    return Ask(prompt, chat, constraint=constraint_for(target, prompt, chat, layout), **rest)


def answered_in_text(prompt: Prompt, fmt: str) -> Prompt:
    """tool_choice none (offered functions, no Tools): in the generic format, whose system message
    asks for one JSON object, the answer is its `{"response": ...}` (Tools that allow no call: that
    grammar, read back as content); a hermes answer is free text, as the prompt alone asks. A
    conversation that ends with an assistant message is continued as text."""
    if fmt != GENERIC or prompt.tools is not None or prompt.constraint is not None or not prompt.offered:
        return prompt
    if prompt.after and prompt.after[-1].role == "assistant":
        return prompt
    return replace(prompt, tools=Tools(prompt.offered, "none"))


def constraint_for(target: Model, prompt: Prompt, chat: bool, layout: str) -> ConstraintSpec | None:
    """What the answer must match: the prompt's response format, or its tools' grammar (written as
    the target's template writes calls, when chatting), with JSON laid out as `layout` says."""
    if prompt.tools is not None:
        if prompt.constraint is not None:
            raise ConstraintError("expected either response_format or tools, found both")
        spec = tool_constraint(prompt.tools, tools_format(target, chat))
    else:
        spec = prompt.constraint
    return None if spec is None else ConstraintSpec(spec.kind, spec.text, layout)


def tools_format(model: Model, chat: bool) -> str:
    """How tool calls are written here: the template's own format, or (no template, or not
    chatting) the generic one (structured.py)."""
    return tool_format(model.chat_template if chat else None)

