"""From the settings fixed at load (config.Loading, RunConfig.loading) to loaded models: the target
(screened where that is exact), the draft, their contexts, and, for methods that plan from measured
costs (auto), the cost curves with one timing wrapper per context, made once at load and used by
those methods alone: every other method decodes on the raw contexts, so its decodes never move the
curves. runner.py runs prompts on a session.
"""

from __future__ import annotations

import contextlib
import copy
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from specgen.models import resolve as models
from specgen.app.config import Loading
from specgen.models.curves import cost_curve
from specgen.models.manifest import describe, known_sha256
from specgen.app.prompts import decode_utf8
from specgen.core.kv import prefill
from specgen.core.protocol import Context, Model
from specgen.core.sampling import SamplingParams
from specgen.core.vocab import SubsetContext, check_compatible, check_subset, sample_ids
from specgen.costs.cache import save_cached
from specgen.costs.curve import BATCH_SIZES, CostCurve
from specgen.costs.measure import measure_context
from specgen.costs.timed import CostAwareContext, TimedContext
from specgen.drafting import methods as M
from specgen.drafting.history import History, Store, store_path, vocab_key
from specgen.files import set_aside
from specgen.host import specgen_home
from specgen.reporter import reporter, write_failed

TARGET_SEQS = 32  # sequence ids a speculative target context reserves for tree branches
TARGET_OUTPUTS = max(BATCH_SIZES)  # logits rows it has room for from the start: its largest decode
DRAFT_SEQS = 64  # the draft also needs one per branch it expands


@dataclass(frozen=True)
class Session:
    target: Model
    target_ctx: Context
    target_label: str
    draft: Model | None = None
    draft_ctx: Context | None = None
    draft_label: str | None = None
    costs: CostCurve | None = None  # c_target(B), measured for `auto`
    draft_costs: CostCurve | None = None
    # auto's view of the contexts: timed into the curves; the target's decodes at their cheapest
    # sizes (CostAwareContext)
    timed_target_ctx: Context | None = None
    timed_draft_ctx: Context | None = None
    # What an Ask with a seed plans from (Ask.reproducible): the curves as loaded, never timed (no
    # clocks: its trees, hence its batches and their numerics, repeat exactly), and the target
    # through them at their cheapest sizes. Per Ask, not per load: a request's own seed is one.
    fixed_costs: CostCurve | None = None
    fixed_draft_costs: CostCurve | None = None
    fixed_target_ctx: Context | None = None
    history: History | None = None  # other texts auto drafts from: earlier ones, the store, a corpus

    def forget_texts(self) -> None:
        """Earlier texts of this process stop counting as a source (bench: a warm-up, a repeat)."""
        if self.history is not None:
            self.history.forget_texts()

    def drafter_inputs(self, method: M.Method, sampling: SamplingParams,
                       reproducible: bool = False) -> M.DrafterInputs:
        """What `method`'s drafter is built from; a measured method (auto) gets the timed contexts,
        or (`reproducible`: the Ask has a seed) the fixed curves."""
        if not method.measured:
            return M.DrafterInputs(sampling, self.draft_ctx)
        if reproducible:
            return M.DrafterInputs(sampling, self.draft_ctx, self.fixed_costs, self.fixed_draft_costs,
                                   reproducible=True, on_long_prompt=self.measure_context_once,
                                   history=self.history)
        return M.DrafterInputs(sampling, self.timed_draft_ctx or self.draft_ctx, self.costs, self.draft_costs,
                               on_long_prompt=self.measure_context_once, history=self.history)

    def context_for(self, method: M.Method, reproducible: bool = False) -> Context:
        if method.measured and reproducible and self.fixed_target_ctx:
            return self.fixed_target_ctx
        return self.timed_target_ctx if method.measured and self.timed_target_ctx else self.target_ctx

    def costs_for(self, reproducible: bool) -> CostCurve | None:
        """The target's curve a measured method prices with: the fixed one for a seeded Ask."""
        return self.fixed_costs if reproducible else self.costs

    def measure_context_once(self, tokens: list[int]) -> None:
        """After the first long prompt's prefill: how much each context token adds to a decode
        (cached with the curve, so once per model and machine). Timed on the raw contexts: not a
        live step. The target's context holds the prompt; auto's draft reads it lazily, so for this
        one measurement it reads it here, and is cleared again after (as the lazy draft expects)."""
        pairs = [(self.costs, self.target_ctx, True), (self.draft_costs, self.draft_ctx, False)]
        for curve, ctx, holds_prompt in pairs:
            if curve is None or ctx is None or curve.per_context_at:
                continue
            if not holds_prompt:
                prefill(ctx, tokens)
            measure_context(ctx, curve, len(tokens) - 1, tokens[-1])
            if not holds_prompt:
                ctx.clear()
            if curve.cache_path is not None:
                save_cached(curve.cache_path, curve)


def load_session(cfg: Loading, method_names: Sequence[str] | None = None, store_default: bool = True,
                 screen: bool = True) -> Session:
    """Resolve (pulling if needed) and load the target, and the draft when a method can use one.

    `method_names`: every method these models will run (bench runs several on one session);
    `store_default`: whether auto uses the persistent store of past texts unless cfg.store says;
    `screen`: whether the target may be loaded from its screened copy: the caller says no where a
    generation will need the target's own rows (ask.why_exact_rows: the request defaults' sampling,
    a constraint; a server, whose requests may sample, always)."""
    from specgen.llama import backend, tools  # loads llama.cpp: not at start-up, for commands without a model

    chosen = [M.get(name) for name in (method_names or (cfg.method,))]
    for method in chosen:
        M.check_runnable(method, cfg.draft is not None)
    if cfg.rpc_servers:
        tools.add_rpc_servers(cfg.rpc_servers)  # before loading: layers offload onto these devices
    target = load_target(cfg, screen)
    draft = None
    if cfg.draft is not None and any(m.draft != M.NO_DRAFT for m in chosen):
        path = models.self_draft(cfg.target) if cfg.draft == models.SELF else models.resolve(cfg.draft)
        draft = backend.LlamaModel(path, gpu_layers=cfg.draft_gpu_layers)
    return open_session(cfg, chosen, target, draft, store_default=store_default)


def load_target(cfg: Loading, screen_greedy: bool = True) -> Model:
    """The target, loaded from its screened copy (screen.py; derived once, cached) when every
    choice will be an argmax that screening keeps exact: greedy decoding, on a CPU-only build,
    of a target whose output matrix is F32 or F16 and a good share of it (screen.MIN_SHARE).
    `SPECGEN_SCREEN=0` turns it off."""
    from specgen.llama import backend, screen, tools

    path = models.resolve(cfg.target)
    if not (screen_greedy and screenable(cfg, tools.build_info().accelerator)):
        return backend.LlamaModel(path, gpu_layers=cfg.gpu_layers)
    backend.check_gguf_file(path)  # a clear line for a missing file or a directory, before its stat
    sha = known_sha256(cfg.target, path)
    copy = screen.screened_path(path, sha) if sha else None
    head = _screened_head(copy, path) if copy is not None and screen.is_derived(copy) else None
    if head is None:
        # Load the target to see whether a copy would pay (hashing it only then, for the name).
        model = backend.LlamaModel(path)
        if not screen.worth_screening(model.meta("general.file_type"), model.n_vocab, model.n_embd,
                                      path.stat().st_size):
            return model
        copy = screen.screened_path(path, describe(cfg.target, path)["sha256"])
        head = _screened_head(copy, path) if screen.is_derived(copy) else None
        if head is None:
            try:
                with reporter().spinner(f"screening {path.name}: a {screen.SCREEN_TYPE} copy of its output layer "
                                        "(once)"):
                    if not screen.derive(path, copy):
                        return model
            except OSError as e:
                write_failed(copy, e, "the target runs without a screened copy")
                return model
            head = screen.load(copy, path)
        model.close()
    target = backend.LlamaModel(copy, screen=head)
    target.source_path = str(path)
    return target


def _screened_head(copy: Path, source: Path):
    """The screened copy's head, or None after setting a damaged copy aside (it is made again)."""
    from specgen.llama import screen

    try:
        return screen.load(copy, source)
    except (OSError, ValueError, KeyError, TypeError) as e:
        parts = [copy.with_suffix(suffix) for suffix in screen.SUFFIXES if copy.with_suffix(suffix).exists()]
        for part in parts[1:]:
            with contextlib.suppress(OSError):
                os.replace(part, part.with_name(part.name + ".bad"))
        set_aside(parts[0], f"a damaged screened copy ({e}; its sidecar files moved with it)")
        return None


def screenable(cfg: Loading, accelerator: str) -> bool:
    """Whether the target's argmaxes are computed on the CPU (screen.py's bound is for ggml's CPU
    Q8_0 product; a GPU may take another route) and screening was not turned off. What the
    generations ask must not need the target's own rows either: load_session's caller says
    (ask.why_exact_rows)."""
    return (cfg.gpu_layers == 0 and not cfg.rpc_servers and accelerator == "cpu"
            and os.environ.get("SPECGEN_SCREEN", "1") != "0")


def open_history(cfg: Loading, target: Model, store_default: bool) -> History:
    """auto's sources beyond the current text: this process's earlier texts, the persistent store
    of the target's tokenizer (`store`: on unless cfg.store says otherwise), and --corpus files."""
    store = None
    if cfg.store if cfg.store is not None else store_default:
        store = Store(store_path(specgen_home(), vocab_key(target.vocab_info(sample_ids(target.n_vocab)))))
    corpus = [target.tokenize(decode_utf8(path.read_bytes(), str(path)), add_special=False)
              for path in cfg.corpus_files]
    return History(store, corpus)


def open_session(cfg: Loading, chosen: Sequence[M.Method], target: Model, draft: Model | None = None,
                 curves: Callable[[Model, Context], CostCurve] | None = None, store_default: bool = True) -> Session:
    """Contexts, checks and (for auto) cost curves and timing wrappers for loaded models.
    `curves`: how a model's cost curve is had (default: the calibration cache, else measured)."""
    for method in chosen:
        M.check_rollback(method, target, cfg.target)
        if draft is not None and method.draft != M.NO_DRAFT:
            M.check_rollback(method, draft, str(cfg.draft), role="draft")
    n_ctx = min(cfg.ctx, target.n_ctx_train) if target.n_ctx_train > 0 else cfg.ctx
    speculative = any(m.speculative for m in chosen)
    ctx = target.new_context(n_ctx, n_seq_max=TARGET_SEQS if speculative else 1, n_threads=cfg.threads,
                             n_outputs=TARGET_OUTPUTS if speculative else 1)
    draft_ctx = None
    if draft is not None:
        draft_ctx = draft.new_context(n_ctx, n_seq_max=DRAFT_SEQS, n_threads=cfg.threads)
        subset = draft.subset_of_target
        if subset is None:
            ids = sample_ids(min(target.n_vocab, draft.n_vocab))
            check_compatible(target.vocab_info(ids), draft.vocab_info(ids), cfg.target, str(cfg.draft))
        else:  # every draft method then works in target ids, through this one adapter
            check_subset(target, draft, subset, cfg.target, str(cfg.draft))
            draft_ctx = SubsetContext(draft_ctx, subset, target.n_vocab)
    session = Session(target, ctx, cfg.target, draft, draft_ctx, cfg.draft if draft is not None else None)
    if not any(m.measured for m in chosen):
        return session
    session = replace(session, history=open_history(cfg, target, store_default))
    curve_of = curves or cost_curve
    costs = curve_of(target, ctx)
    draft_costs = curve_of(draft, draft_ctx) if draft is not None and draft_ctx is not None else None
    # A seeded Ask plans from a copy of the curves as loaded, which no clock moves (Session.fixed_*).
    fixed, fixed_draft = copy.deepcopy(costs), copy.deepcopy(draft_costs)
    # Sizes whose live timings disagree with a curve's shape are re-measured, and kept in the cache.
    return replace(session, costs=costs, draft_costs=draft_costs,
                   timed_target_ctx=TimedContext(ctx, costs, live=True, on_reshape=_keep),
                   timed_draft_ctx=TimedContext(draft_ctx, draft_costs, on_reshape=_keep)
                   if draft_costs is not None else None,
                   fixed_costs=fixed, fixed_draft_costs=fixed_draft, fixed_target_ctx=CostAwareContext(ctx, fixed))


def _keep(curve: CostCurve) -> None:
    if curve.cache_path is not None:
        save_cached(curve.cache_path, curve)
