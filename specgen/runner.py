"""From a RunConfig to results: load models once, then run prompts one after another."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from .config import DRAFT_METHODS, RunConfig
from .drafters import LookupDrafter
from .engine import Event, GenerationRequest, generate_plain, generate_speculative
from .errors import ConfigError
from .prompts import Prompt
from .protocol import Context, Model
from .stats import RunStats
from .vocab import check_compatible, sample_ids

# `auto` is plain decoding until the planner lands; chain/tree/staged come with the draft-model drafters.
IMPLEMENTED_METHODS = ("auto", "plain", "lookup")
MAX_BRANCHES = 8  # sequence ids a speculative context reserves for tree branches


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


def load_models(cfg: RunConfig) -> LoadedModels:
    """Resolve (pulling if needed) and load the target, and the draft when the method can use one."""
    from . import backend, models

    if cfg.method not in IMPLEMENTED_METHODS:
        raise ConfigError(f"--method {cfg.method} is not available in this version yet "
                          f"(available: {', '.join(IMPLEMENTED_METHODS)})")
    target = backend.LlamaModel(models.resolve(cfg.target), gpu_layers=cfg.gpu_layers)
    n_ctx = min(cfg.ctx, target.n_ctx_train) if target.n_ctx_train > 0 else cfg.ctx
    ctx = target.new_context(n_ctx, n_seq_max=1 if cfg.method == "plain" else MAX_BRANCHES,
                             n_threads=cfg.threads)
    draft = None
    if cfg.draft is not None and cfg.method not in ("plain", "lookup"):
        draft = backend.LlamaModel(models.resolve(cfg.draft), gpu_layers=cfg.draft_gpu_layers)
        ids = sample_ids(min(target.n_vocab, draft.n_vocab))
        check_compatible(target.vocab_info(ids), draft.vocab_info(ids), cfg.target, cfg.draft)
    elif cfg.method in DRAFT_METHODS:
        raise ConfigError(f"--method {cfg.method} needs a draft model (-d MODEL); "
                          "--method lookup drafts without one")
    return LoadedModels(target, ctx, draft, cfg.target, cfg.draft if draft is not None else None)


def use_chat(cfg: RunConfig, model: Model) -> bool:
    """--chat/--no-chat, defaulting to on exactly when the GGUF carries a chat template."""
    return cfg.chat if cfg.chat is not None else bool(getattr(model, "chat_template", None))


def encode_prompt(model: Model, text: str, chat: bool) -> list[int]:
    if not chat:
        return model.tokenize(text, add_special=True, parse_special=False)
    rendered = model.format_chat([{"role": "user", "content": text}])
    tokens = model.tokenize(rendered, add_special=True, parse_special=True)
    # Templates usually write the BOS text themselves; tokenizing with add_special adds another.
    if len(tokens) >= 2 and tokens[0] == tokens[1] == getattr(model, "bos", None):
        tokens = tokens[1:]
    return tokens


class Runner:
    def __init__(self, cfg: RunConfig, loaded: LoadedModels):
        self.cfg = cfg
        self.m = loaded
        self.chat = use_chat(cfg, loaded.target)

    def stream(self, prompt: Prompt, stats: RunStats) -> Iterator[Event]:
        tokens = encode_prompt(self.m.target, prompt.text, self.chat)
        request = GenerationRequest(tokens, self.cfg.max_tokens, self.cfg.sampling)
        if self.cfg.method == "lookup":
            return generate_speculative(self.m.target, self.m.target_ctx, request, stats, LookupDrafter())
        return generate_plain(self.m.target, self.m.target_ctx, request, stats)

    def record(self, result: PromptResult) -> dict[str, Any]:
        """The --json record (field names are a contract: scripts depend on them)."""
        s = result.stats
        return {
            "prompt_index": result.prompt_index,
            "text": result.text,
            "n_tokens": s.n_tokens,
            "method": self.cfg.method,
            "target": self.m.target_label,
            "draft": self.m.draft_label,
            "temperature": self.cfg.temperature,
            "target_calls": s.target_calls,
            "drafted": s.drafted,
            "accepted": s.accepted,
            "acceptance_rate": round(s.acceptance_rate, 4),
            "mean_accepted": round(s.mean_accepted, 4),
            "prefill_s": round(s.prefill_s, 4),
            "decode_s": round(s.decode_s, 4),
            "tokens_per_s": round(s.tokens_per_s, 2),
            "finish_reason": result.finish_reason,
        }
