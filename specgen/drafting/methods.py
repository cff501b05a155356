"""The decoding methods: one table of what each needs, how its drafter is built, and its defaults.

Config validation, the CLI's help and checks, bench's default list, the session loader and the
tests all read this table; nothing else spells out a method's name or hyperparameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from specgen.drafting.tuning import AUTO_DRAFT_MAX_DEPTH, AUTO_LOOKUP_MATCHES, AUTO_NODES
from specgen.errors import ConfigError, ModelError

if TYPE_CHECKING:  # the builders import what they build: the CLI reads this table at start-up
    from specgen.core.protocol import Context, Drafter, Model
    from specgen.core.sampling import SamplingParams
    from specgen.costs.curve import CostCurve
    from specgen.drafting.history import History

# Whether a method drafts with a second model.
NO_DRAFT, NEEDS_DRAFT, DRAFT_IF_GIVEN = "no", "needs", "if given"
JUMP = "jump"  # jump-forward: constrained benches' second baseline (bench tables show speed over it)


@dataclass(frozen=True)
class DrafterInputs:
    """What a drafter may be built from, handed out by the session for one method."""

    sampling: SamplingParams
    draft_ctx: Context | None = None
    costs: CostCurve | None = None  # c_target(B), for auto
    draft_costs: CostCurve | None = None  # c_draft(B), for auto with a draft model
    reproducible: bool = False  # a seed was given: plan from the curves, never from clocks
    on_long_prompt: Callable[[list[int]], None] | None = None
    history: "History | None" = None  # other texts auto drafts from (history.py)


@dataclass(frozen=True)
class Method:
    name: str
    summary: str
    draft: str  # NO_DRAFT | NEEDS_DRAFT | DRAFT_IF_GIVEN
    build: Callable[[dict[str, Any], DrafterInputs], Drafter | None]  # (params, inputs) -> drafter
    params: dict[str, Any] = field(default_factory=dict)  # the drafter's hyperparameters
    # Plans from measured costs: its inputs carry the cost curves, timed contexts and other texts
    # to draft from, and its drafter lives as long as the runner, so what it learns carries over.
    measured: bool = False
    # A baseline of constrained benches: bench runs it (after plain) wherever prompts carry a
    # grammar, and leaves it out of unconstrained runs' default list, where it would be plain again.
    constrained_baseline: bool = False
    # Drafts a tool call's free fields from the conversation's earlier calls and messages too
    # (calls.py), where a request offers tools.
    call_aware: bool = False

    @property
    def speculative(self) -> bool:
        return self.name != "plain"

    def drafter(self, inputs: DrafterInputs) -> Drafter | None:
        return self.build(dict(self.params), inputs)


def _lookup(params: dict[str, Any], inputs: DrafterInputs) -> Drafter:
    from specgen.drafting.lookup import LookupDrafter

    return LookupDrafter(**params)


def _model(params: dict[str, Any], inputs: DrafterInputs) -> Drafter:
    from specgen.drafting.model import ModelDrafter, Staged

    if not params.pop("lookup", False):
        return ModelDrafter(inputs.draft_ctx, inputs.sampling, **params)
    return Staged.build(inputs.draft_ctx, inputs.sampling, **params)


def _jump(params: dict[str, Any], inputs: DrafterInputs) -> Drafter:
    from specgen.drafting.forced import JumpDrafter

    return JumpDrafter()


def _auto(params: dict[str, Any], inputs: DrafterInputs) -> Drafter:
    from specgen.drafting.auto import AutoDrafter
    from specgen.drafting.lookup import LookupDrafter
    from specgen.drafting.model import ModelDrafter

    draft_params, lookup, model = params.pop("draft"), LookupDrafter(), None
    if inputs.draft_ctx is not None:
        # A chain, as the planner's cost model assumes (one draft decode per drafted token, fewer
        # where the lookup stage hits); the planner sets its length each step. Greedy: the draft's
        # argmax. Sampling: the draft's winner of the race the target will run (core/race.py),
        # with its runner-up as a leaf beside it where the margin makes that worth a row.
        # The draft reads the prompt only when auto first uses it (as a catch-up the planner
        # prices): on a long prompt where lookup does the work, it never does.
        model = ModelDrafter(inputs.draft_ctx, inputs.sampling, lookup=lookup, lazy_prefill=True, **draft_params)
    return AutoDrafter(inputs.costs, lookup, model, inputs.draft_costs if model is not None else None,
                       reproducible=inputs.reproducible, on_long_prompt=inputs.on_long_prompt, history=inputs.history,
                       **params)


_TREE = dict(branching=2, max_nodes=6, max_depth=4)

METHODS: dict[str, Method] = {m.name: m for m in (
    Method("auto", "per step, whatever measured costs and learned acceptance say is fastest", DRAFT_IF_GIVEN,
           _auto, dict(max_nodes=AUTO_NODES, max_depth=AUTO_NODES - 1, lookup_matches=AUTO_LOOKUP_MATCHES,
                       draft=dict(branching=1, max_depth=AUTO_DRAFT_MAX_DEPTH, leaves=1)), measured=True, call_aware=True),
    Method("plain", "one target decode per token (the baseline)", NO_DRAFT, lambda params, inputs: None),
    # jump stays forced tokens alone, without call-aware drafting: it is the jump-forward decoding
    # SGLang and vLLM ship, the baseline whose ratio to auto says what drafting adds.
    Method(JUMP, "jump-forward: plain decoding that batches a grammar's forced tokens into the next decode, "
           "drafting nothing else (without a constraint, plain)", NO_DRAFT, _jump, constrained_baseline=True),
    Method("chain", "the draft model drafts a chain", NEEDS_DRAFT, _model,
           dict(branching=1, max_nodes=6, min_prob=0.3)),
    Method("tree", "the draft model drafts a best-first tree", NEEDS_DRAFT, _model, _TREE),
    Method("staged", "a tree from the draft model, with prompt lookup drafting for the draft", NEEDS_DRAFT, _model,
           {**_TREE, "lookup": True}),
    Method("lookup", "prompt lookup: n-gram matches in the prompt and the output, no model", NO_DRAFT, _lookup),
)}
NAMES = tuple(METHODS)


def get(name: str, option: str = "--method", expects: str = "must be one of") -> Method:
    """The method called `name`; else a ConfigError naming `option` and every method."""
    method = METHODS.get(name)
    if method is None:
        raise ConfigError(f"{option} {expects} {', '.join(NAMES)}, found {name!r}")
    return method


def usable(has_draft: bool, constrained: bool = False) -> tuple[str, ...]:
    """Every method that can run with (or without) a draft model: bench's default list (the
    constrained baselines only for constrained prompts)."""
    return tuple(n for n, m in METHODS.items()
                 if (has_draft or m.draft != NEEDS_DRAFT) and (constrained or not m.constrained_baseline))


def baselines(constrained: bool) -> tuple[str, ...]:
    """What bench always runs, first: plain, and under a grammar jump-forward too (the speed the
    grammar's forced tokens give without drafting; a method's ratio over it is drafting's gain)."""
    return ("plain", *(n for n, m in METHODS.items() if constrained and m.constrained_baseline))


def check_runnable(method: Method, has_draft: bool) -> None:
    if method.draft == NEEDS_DRAFT and not has_draft:
        raise ConfigError(f"--method {method.name} needs a draft model (-d MODEL); "
                          f"--method lookup drafts without one")


def check_rollback(method: Method, model: Model, label: str, role: str = "target") -> None:
    """Speculation drops rejected drafts from the KV cache by sequence id; a recurrent or hybrid
    model's state cannot be cut back that way, and would go on from text that was never committed."""
    if method.speculative and not model.can_rollback:
        raise ModelError(f"--method {method.name} needs a {role} whose cache can drop rejected drafts, but "
                         f"{label} is a recurrent or hybrid model: use --method plain")
