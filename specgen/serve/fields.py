"""Every request field OpenAI and llama-server document that specgen does not act on: each is accepted
only at a value that changes nothing (typical_p 1, mirostat 0, n 1, ...) and otherwise refused by
name with a 400, never silently ignored.

Three kinds:
- REFUSED: a sampling or output setting specgen does not implement: its neutral value is accepted
  (it asks for nothing), any other is a 400 naming it.
- DEPENDENT: a setting that only tunes another one (dry_base tunes the DRY multiplier, ...): with that one neutral it changes nothing, whatever its value; else the 400
  names the setting that would act.
- INERT: bookkeeping that never changes the text (user, metadata, n_keep, ...): accepted.
The fields specgen acts on (temperature, cache_prompt, top_p, top_k, min_p, seed, the penalties, logit_bias,
logprobs, max_tokens, stop, response_format, json_schema, grammar, tools, ...) are read in requests.py.
ROUTES: what each route that takes a JSON body knows; any other field is a 400 naming it, as OpenAI
answers a misspelt one (a "temprature" silently ignored would leave the user sampling at the default).
"""

from __future__ import annotations

import json
from typing import Callable

from specgen.app.ask import BY_NAME


def _is(*values) -> Callable[[object], bool]:
    return lambda v: v is None or any(v == x and type(v) is not bool or v is x for x in values)


def _empty(v: object) -> bool:
    return v is None or v == {} or v == [] or v == ""


def _false(v: object) -> bool:
    return v is None or v is False


# name: (neutral?, why it is refused)
REFUSED: dict[str, tuple[Callable[[object], bool], str]] = {
    "typical_p": (_is(1), "locally typical sampling is not implemented (send 1)"),
    "typ_p": (_is(1), "locally typical sampling is not implemented (send 1)"),
    "top_n_sigma": (_is(-1), "top-n-sigma sampling is not implemented (send -1)"),
    "dynatemp_range": (_is(0), "dynamic temperature is not implemented (send 0)"),
    "mirostat": (_is(0), "mirostat is not implemented (send 0)"),
    "dry_multiplier": (_is(0), "DRY is not implemented (send 0)"),
    "xtc_probability": (_is(0), "XTC is not implemented (send 0)"),
    "post_sampling_probs": (_false, "token probabilities are those before temperature and truncation (send false)"),
    "min_keep": (_is(0), "min_keep is not implemented (send 0)"),
    "ignore_eos": (_false, "ignore_eos is not implemented: generation ends at the model's end token"),
    "n": (_is(1), "only one completion choice is allowed"),
    "n_cmpl": (_is(1), "only one completion choice is allowed"),
    "best_of": (_is(1), "only one completion choice is allowed"),
    "echo": (_false, "echo is not supported"),
    "suffix": (_empty, "suffix (fill-in-the-middle) is not supported"),
    "input_prefix": (_empty, "infill is not supported"),
    "input_suffix": (_empty, "infill is not supported"),
    "n_indent": (_is(0), "n_indent is not supported"),
    "t_max_predict_ms": (_is(0), "t_max_predict_ms is not supported"),
    "functions": (_empty, "the legacy functions field is not supported: use tools"),
    "function_call": (_is("none"), "the legacy function_call field is not supported: use tool_choice"),
    "parse_tool_calls": (_is(True), "tool calls are always parsed"),
    "continue_final_message": (_is(True), "a conversation that ends in an assistant message is always continued "
                                          "from it (send true)"),
    "audio": (_empty, "audio output is not supported"),
    "modalities": (lambda v: v is None or v == ["text"], "only text output is supported"),
    "prediction": (_empty, "predicted outputs are not supported"),
    "reasoning_effort": (_empty, "reasoning_effort is not supported"),
    "reasoning_control": (_false, "reasoning control is not supported"),
    "generation_prompt": (_empty, "generation_prompt is not supported"),
    "verbosity": (_empty, "verbosity is not supported"),
    "web_search_options": (_empty, "web search is not supported"),
    "chat_template_kwargs": (_empty, "chat_template_kwargs is not supported"),
    "add_generation_prompt": (_is(True), "add_generation_prompt false is not supported"),
    "return_tokens": (_false, "return_tokens is not supported"),
    "response_fields": (_empty, "response_fields is not supported"),
    "lora": (_empty, "LoRA adapters are not supported"),
    "id_slot": (_is(-1, 0), "the server has one slot, 0"),
    "grammar_lazy": (_false, "lazy grammars are not supported"),
    "grammar_triggers": (_empty, "grammar triggers are not supported"),
    "preserved_tokens": (_empty, "preserved_tokens is not supported"),
    "verbose": (_false, "the __verbose debug object is not sent"),
    "adaptive_target": (_is(-1), "the adaptive-p sampler is not implemented (send -1)"),
}

# name: the settings it tunes; it changes nothing while they are all neutral.
DEPENDENT: dict[str, tuple[str, ...]] = {
    "dynatemp_exponent": ("dynatemp_range",),
    "mirostat_tau": ("mirostat",),
    "mirostat_eta": ("mirostat",),
    "dry_base": ("dry_multiplier",),
    "dry_allowed_length": ("dry_multiplier",),
    "dry_penalty_last_n": ("dry_multiplier",),
    "dry_sequence_breakers": ("dry_multiplier",),
    "xtc_threshold": ("xtc_probability",),
    "adaptive_decay": ("adaptive_target",),
}

# Never change the text: who asked, caching and reporting hints (the prompt cache keeps what it can
# whatever they say; timings come with the last chunk anyway), what OpenAI would store, where llama.cpp samples.
INERT = ("user", "metadata", "store", "service_tier", "safety_identifier", "prompt_cache_key",
         "prompt_cache_retention", "n_keep", "n_discard", "n_cache_reuse", "timings_per_token",
         "return_progress", "sse_ping_interval", "backend_sampling")

# Read by requests.py for every generation (chat or completion): they act, or check() refuses them.
# The sampling numbers are ask.BOUNDS' (one table for every edge).
_GENERATION = ("model", "max_tokens", "max_completion_tokens", "n_predict", *BY_NAME, "penalty_last_n", "logit_bias",
               "samplers", "reasoning_format", "stop", "stream",
               "stream_options", "logprobs", "n_probs", "response_format", "json_schema", "grammar",
               "cache_prompt", *REFUSED, *DEPENDENT, *INERT)
_CHAT = frozenset(("messages", "tools", "tool_choice", "parallel_tool_calls", "top_logprobs", *_GENERATION))
_COMPLETION = frozenset(("prompt", "tools", *_GENERATION))  # tools: refused by name (a chat's)
_EMBEDDINGS = frozenset(("input", "content", "model", "encoding_format", "dimensions", "embd_normalize", "user"))

# Each route that takes a JSON body -> the fields it knows (app.py answers exactly these paths).
ROUTES: dict[str, frozenset[str]] = {
    "/v1/chat/completions": _CHAT, "/chat/completions": _CHAT,
    "/apply-template": _CHAT,  # a chat request, read whole, rendered and not generated
    "/v1/completions": _COMPLETION, "/completions": _COMPLETION, "/completion": _COMPLETION,
    "/tokenize": frozenset(("content", "add_special", "parse_special", "with_pieces")),
    "/detokenize": frozenset(("tokens",)),
    "/v1/embeddings": _EMBEDDINGS, "/embeddings": _EMBEDDINGS, "/embedding": _EMBEDDINGS,
}

class Refusal(Exception):
    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.name, self.message = name, message


def _found(value: object) -> str:
    return json.dumps(value)[:60]


def check(body: dict, chat_template: str | None = None) -> None:
    """Raise Refusal for the first field that would ask for something specgen does not do."""
    for name, (neutral, why) in REFUSED.items():
        if name in body and not neutral(body[name]):
            raise Refusal(name, f"{name} is not supported at {_found(body[name])}: {why}")
    reasoning = body.get("reasoning_format")
    if reasoning not in (None, "none") and not (reasoning == "auto" and "<think>" not in (chat_template or "")):
        raise Refusal("reasoning_format", f"reasoning_format is not supported at {_found(reasoning)}: reasoning is "
                                          "not separated from the answer (send \"none\")")

