"""From a RunConfig to results: load models once, then run prompts one after another."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from .config import DRAFT_METHODS, RunConfig
from .auto import AutoDrafter
from .costs import CostCurve, TimedContext, cache_key, load_cached, measure, measure_context, save_cached
from .drafters import Drafter, LookupDrafter, ModelDrafter
from .engine import Event, FinishEvent, GenerationRequest, generate_plain, generate_speculative
from .errors import ConfigError
from .kv import prefill
from .prompts import Prompt
from .sampling import SamplingParams
from .protocol import Context, Model
from .stats import RunStats
from .vocab import check_compatible, sample_ids

IMPLEMENTED_METHODS = ("auto", "plain", "lookup", "chain", "tree", "staged")
TARGET_SEQS = 32  # sequence ids a speculative target context reserves for tree branches
DRAFT_SEQS = 64  # the draft also needs one per branch it expands


@dataclass
class PromptResult:
    prompt_index: int
    text: str
    stats: RunStats
    finish_reason: str  # length | stop | interrupted


@dataclass
class LoadedModels:
    target: Model
    target_ctx: Context
    draft: Model | None
    target_label: str
    draft_label: str | None
    draft_ctx: Context | None = None
    costs: CostCurve | None = None  # c_target(B), measured for `auto`
    draft_costs: CostCurve | None = None


def load_models(cfg: RunConfig, methods: tuple[str, ...] | None = None) -> LoadedModels:
    """Resolve (pulling if needed) and load the target, and the draft when a method can use one.

    `methods`: every method these models will run (bench runs several on the same contexts)."""
    from . import backend, models

    methods = methods or (cfg.method,)
    for method in methods:
        if method not in IMPLEMENTED_METHODS:
            raise ConfigError(f"--method {method} is not available in this version yet "
                              f"(available: {', '.join(IMPLEMENTED_METHODS)})")
        if method in DRAFT_METHODS and cfg.draft is None:
            raise ConfigError(f"--method {method} needs a draft model (-d MODEL); "
                              "--method lookup drafts without one")
    if cfg.rpc_servers:
        backend.add_rpc_servers(cfg.rpc_servers)  # before loading: layers offload onto these devices
    target = backend.LlamaModel(models.resolve(cfg.target), gpu_layers=cfg.gpu_layers)
    n_ctx = min(cfg.ctx, target.n_ctx_train) if target.n_ctx_train > 0 else cfg.ctx
    speculative = any(m != "plain" for m in methods)
    ctx = target.new_context(n_ctx, n_seq_max=TARGET_SEQS if speculative else 1, n_threads=cfg.threads)
    draft, draft_ctx = None, None
    if cfg.draft is not None and any(m in DRAFT_METHODS or m == "auto" for m in methods):
        draft = backend.LlamaModel(models.resolve(cfg.draft), gpu_layers=cfg.draft_gpu_layers)
        ids = sample_ids(min(target.n_vocab, draft.n_vocab))
        check_compatible(target.vocab_info(ids), draft.vocab_info(ids), cfg.target, cfg.draft)
        draft_ctx = draft.new_context(n_ctx, n_seq_max=DRAFT_SEQS, n_threads=cfg.threads)
    return LoadedModels(target, ctx, draft, cfg.target, cfg.draft if draft is not None else None, draft_ctx)


def cost_curve(model: Model, ctx: Context, n_threads: int | None, refresh: bool = False) -> CostCurve:
    """c(B) for a model on this machine: from the calibration cache, else measured (< 1 s) and cached."""
    from . import backend, models
    from .build import cpu_name

    build = backend.build_info().system_info
    key = cache_key(model.path, build, getattr(ctx, "n_threads", n_threads or 0), ctx.n_ctx, cpu_name())
    path = models.specgen_home() / "calibration" / f"{key}.json"
    curve = None if refresh else load_cached(path)
    if curve is None:
        ctx.clear()
        curve = measure(ctx, 0, model.tokenize("The", add_special=False)[0])
        ctx.clear()
        save_cached(path, curve)
    curve.cache_path = path
    return curve


def make_drafter(method: str, loaded: LoadedModels, cfg: RunConfig) -> Drafter | None:
    """The drafter behind a method (None: plain decoding)."""
    if method == "lookup":
        return LookupDrafter()
    if method not in DRAFT_METHODS:
        return None
    assert loaded.draft_ctx is not None
    if method == "chain":
        return ModelDrafter(loaded.draft_ctx, cfg.sampling, branching=1, max_nodes=6, min_prob=0.3)
    lookup = LookupDrafter() if method == "staged" else None
    return ModelDrafter(loaded.draft_ctx, cfg.sampling, branching=2, max_nodes=6, max_depth=4, lookup=lookup)


def use_chat(cfg: RunConfig, model: Model) -> bool:
    """--chat/--no-chat, defaulting to on exactly when the GGUF carries a chat template."""
    return cfg.chat if cfg.chat is not None else bool(getattr(model, "chat_template", None))


def encode_prompt(model: Model, prompt: Prompt, chat: bool, system: str | None = None) -> list[int]:
    """Prompt tokens: through the chat template, or (base models) the turns joined by blank lines."""
    messages = prompt.messages(system)
    if not chat:
        text = "\n\n".join(m["content"] for m in messages)
        return model.tokenize(text, add_special=True, parse_special=False)
    rendered = model.format_chat(messages)
    tokens = model.tokenize(rendered, add_special=True, parse_special=True)
    # Templates usually write the BOS text themselves; tokenizing with add_special adds another.
    if len(tokens) >= 2 and tokens[0] == tokens[1] == getattr(model, "bos", None):
        tokens = tokens[1:]
    return tokens


def make_auto(loaded: LoadedModels, cfg: RunConfig) -> AutoDrafter:
    """The planner, with measured cost curves; live decodes keep refining them (unless a seed asks
    for reproducible runs: then the cached calibration alone, so the same trees every run)."""
    reproducible = cfg.seed is not None  # then plan from the cached curves, never from clocks
    if loaded.costs is None:
        loaded.costs = cost_curve(loaded.target, loaded.target_ctx, cfg.threads)
        if not reproducible:
            loaded.target_ctx = TimedContext(loaded.target_ctx, loaded.costs)
        if loaded.draft_ctx is not None:
            loaded.draft_costs = cost_curve(loaded.draft, loaded.draft_ctx, cfg.threads)
            if not reproducible:
                loaded.draft_ctx = TimedContext(loaded.draft_ctx, loaded.draft_costs)
    lookup = LookupDrafter()
    model = None
    if loaded.draft_ctx is not None:
        # A chain, as the planner's cost model assumes (one draft decode per drafted token, fewer
        # where the lookup stage hits); the planner sets its length each step. Its proposals are
        # the draft's argmax even when sampling: deterministic drafts are verified by sample-and-match,
        # which makes the same draws as plain decoding, so a seed gives plain's exact output whatever
        # auto chose at each step (its choices follow measured timings, which vary run to run).
        # The draft reads the prompt only when auto first uses it (as a catch-up the planner
        # prices): on a long prompt where lookup does the work, it never does.
        model = ModelDrafter(loaded.draft_ctx, SamplingParams(), branching=1, max_nodes=8, max_depth=16,
                             lookup=lookup, lazy_prefill=True)
    auto = AutoDrafter(loaded.costs, lookup, model, loaded.draft_costs, reproducible=reproducible)
    auto.on_long_prompt = lambda tokens: measure_context_once(loaded, tokens)
    return auto


def measure_context_once(loaded: LoadedModels, tokens: list[int]) -> None:
    """After the first long prompt's prefill: how much each context token adds to a decode (cached
    with the curve, so once per model and machine). Timed on the raw contexts: not a live step.
    The target's context holds the prompt; auto's draft reads it lazily, so for this one
    measurement it reads it here, and is cleared again after (as the lazy draft expects)."""
    pairs = [(loaded.costs, loaded.target_ctx, True), (loaded.draft_costs, loaded.draft_ctx, False)]
    for curve, ctx, holds_prompt in pairs:
        if curve is None or ctx is None or curve.per_context_at:
            continue
        raw = ctx.inner if isinstance(ctx, TimedContext) else ctx
        if not holds_prompt:
            prefill(raw, tokens)
        measure_context(raw, curve, len(tokens) - 1, tokens[-1])
        if not holds_prompt:
            raw.clear()
        if curve.cache_path is not None:
            save_cached(curve.cache_path, curve)


class Runner:
    def __init__(self, cfg: RunConfig, loaded: LoadedModels):
        self.cfg = cfg
        self.m = loaded
        self.chat = use_chat(cfg, loaded.target)
        self._auto: AutoDrafter | None = None

    def stream(self, prompt: Prompt, stats: RunStats, max_tokens: int | None = None) -> Iterator[Event]:
        tokens = encode_prompt(self.m.target, prompt, self.chat, self.cfg.system)
        request = GenerationRequest(tokens, max_tokens or self.cfg.max_tokens, self.cfg.sampling)
        if self.cfg.method == "auto":
            # One planner for the whole run: what it learns about acceptance carries over prompts.
            if self._auto is None:
                self._auto = make_auto(self.m, self.cfg)  # wraps the contexts: before using them
            drafter: Drafter | None = self._auto
        else:
            drafter = make_drafter(self.cfg.method, self.m, self.cfg)
        if drafter is None:
            return generate_plain(self.m.target, self.m.target_ctx, request, stats)
        return generate_speculative(self.m.target, self.m.target_ctx, request, stats, drafter)

    def complete(self, prompt: Prompt, stats: RunStats, max_tokens: int | None = None) -> tuple[str, str]:
        """Run a prompt to the end without streaming: (text, finish reason)."""
        pieces, reason = [], "length"
        for event in self.stream(prompt, stats, max_tokens):
            if isinstance(event, FinishEvent):
                pieces.append(event.tail)
                reason = event.reason
            else:
                pieces.append(event.text)
        return "".join(pieces), reason

    def record(self, result: PromptResult) -> dict[str, Any]:
        """The --json record (field names are a contract: scripts depend on them)."""
        return {
            "prompt_index": result.prompt_index,
            "text": result.text,
            "method": self.cfg.method,
            "target": self.m.target_label,
            "draft": self.m.draft_label,
            "temperature": self.cfg.temperature,
            **result.stats.record_fields(),
            "finish_reason": result.finish_reason,
        }
