"""Run settings: configs/default.yaml < a -c YAML file < command-line options."""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from specgen.app.ask import BIAS_MAX, BOUNDS, Overrides, out_of_bounds, sampling_params
from specgen.app.stops import stops_of
from specgen.core.constraint import LAYOUTS
from specgen.core.sampling import SamplingParams
from specgen.drafting import methods
from specgen.errors import ConfigError
from specgen.host import DEFAULT_CONFIG, default_threads
from specgen.reporter import reporter


@dataclass(frozen=True)
class Loading:
    """What is fixed when the models load (session.py): the models, the method, the contexts'
    threads and size, where layers go, and what auto drafts from besides the text."""

    target: str
    draft: str | None
    method: str
    threads: int | None
    ctx: int
    gpu_layers: int
    draft_gpu_layers: int
    rpc: str | None
    corpus: str | None
    store: bool | None

    @property
    def rpc_servers(self) -> list[str]:
        return [s.strip() for s in self.rpc.split(",") if s.strip()] if self.rpc else []

    @property
    def corpus_files(self) -> list[Path]:
        return [Path(p.strip()).expanduser() for p in self.corpus.split(",") if p.strip()] if self.corpus else []


@dataclass(frozen=True)
class Defaults:
    """What each generation starts from, whichever edge asks (runner.Runner.ask): the sampling (an
    edge's Overrides replace its fields), the token limit, stop strings, the chat template (None:
    on where the target has one), the system message and the JSON layout."""

    sampling: SamplingParams = SamplingParams()
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    chat: bool | None = None
    system: str | None = None
    json_layout: str = "compact"


@dataclass(frozen=True)
class RunConfig:
    """The settings as the YAML and the command line give them, one flat namespace (configs/*.yaml):
    `loading`, fixed when the models load, and `defaults`, each generation's starting point."""

    target: str = "gemma-3-270m-f32"
    draft: str | None = "gemma-3-270m-q2_k"
    method: str = "auto"
    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    min_p: float = 0.0
    # llama.cpp's penalties over the last repeat_last_n tokens (-1: the whole context, 0: off).
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # (token, added logit) pairs, -inf banning; a file's text, llama.cpp's syntax ("15043+1.5,50256-inf"),
    # is read into them when the config is made (parse_logit_bias).
    logit_bias: tuple[tuple[int, float], ...] | str | None = ()
    stop: str | list | None = None  # stop strings: one, or a list (--stop, repeated; app/stops.py)
    chat: bool | None = None  # None: on when the target has a chat template (instruct models)
    system: str | None = None  # system message for chat prompts
    threads: int | None = None  # None: all cores this process may use
    ctx: int = 4096
    gpu_layers: int = 0
    draft_gpu_layers: int = 0
    rpc: str | None = None  # llama.cpp RPC servers, "host:port,host:port"
    corpus: str | None = None  # text files auto also drafts from, "a.txt,b.md" (history.py)
    store: bool | None = None  # the persistent store of past texts; None: on for generate, off for bench
    json_layout: str = "compact"  # JSON answers under a schema: compact (separators forced) | free (constraint.py)

    def __post_init__(self) -> None:
        if not isinstance(self.logit_bias, tuple):
            object.__setattr__(self, "logit_bias", parse_logit_bias(self.logit_bias))

    @property
    def loading(self) -> Loading:
        return Loading(**{name: getattr(self, name) for name in LOADING})

    @property
    def defaults(self) -> Defaults:
        return Defaults(self.sampling, self.max_tokens, self.stops, self.chat, self.system, self.json_layout)

    @property
    def rpc_servers(self) -> list[str]:
        return self.loading.rpc_servers

    @property
    def corpus_files(self) -> list[Path]:
        return self.loading.corpus_files

    @property
    def stops(self) -> tuple[str, ...]:
        return stops_of(self.stop)

    @property
    def sampling(self) -> SamplingParams:
        return sampling_params({**{b.name: getattr(self, b.name) for b in BOUNDS}, "logit_bias": self.logit_bias})


@dataclass(frozen=True)
class Given:
    """The request defaults one edge gave (the command line's sampling options), typed as the
    server's requests are: the sampling Overrides (ask.py, BOUNDS' names), the token limit and the
    stop strings; None: not given, the -c file or configs/default.yaml decides. Each was checked at
    the edge (cli/options.py) by the rules a config file's values are checked by (check_ranges)."""

    sampling: Overrides = Overrides()
    max_tokens: int | None = None
    stop: tuple[str, ...] | None = None

    @property
    def fields(self) -> dict[str, Any]:
        """The RunConfig fields given (they replace the file's)."""
        rest = {"max_tokens": self.max_tokens, "stop": self.stop}
        return {**self.sampling.given, **{k: v for k, v in rest.items() if v is not None}}


LOADING = tuple(f.name for f in dataclasses.fields(Loading))


_BIAS = re.compile(r"\s*(\d+)\s*([+-])\s*(inf|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+)\s*")


def parse_logit_bias(text: str | Sequence[str] | None) -> tuple[tuple[int, float], ...]:
    """--logit-bias as llama.cpp writes it: TOKEN_ID+BIAS or TOKEN_ID-BIAS, comma-separated (a
    file's text) or repeated (the flags, each maybe comma-separated too); -inf bans the token. A
    later entry for the same token replaces an earlier one."""
    if not text:
        return ()
    out: dict[int, float] = {}
    for item in (piece for given in ([text] if isinstance(text, str) else text) for piece in given.split(",")):
        m = _BIAS.fullmatch(item)
        if m is None:
            raise ConfigError(f"--logit-bias expects TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. 15043+1.5, 50256-inf), "
                              f"found {item.strip()!r}")
        bias = float(m.group(3)) * (-1 if m.group(2) == "-" else 1)
        if bias == math.inf or (math.isfinite(bias) and abs(bias) > BIAS_MAX):
            raise ConfigError(f"--logit-bias expects a bias in [-{BIAS_MAX:g}, {BIAS_MAX:g}] or -inf, found "
                              f"{item.strip()!r}")
        out[int(m.group(1))] = bias
    return tuple(out.items())


def bias_text(bias: tuple[tuple[int, float], ...]) -> str | None:
    """Pairs as a file writes them (parse_logit_bias's inverse; None: none), for reports."""
    return ",".join(f"{t}{'-' if b < 0 else '+'}{abs(b):g}" for t, b in bias) or None


FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}
# The types a settings file may give each field, read off RunConfig's annotations (YAML's 1 is a float too).
_TYPES = {name: tuple(t for arg in (typing.get_args(hint) or (hint,)) for t in ((int, float) if arg is float else (arg,)))
          for name, hint in typing.get_type_hints(RunConfig).items() if name != "logit_bias"}
_TYPES["logit_bias"] = (str, type(None))  # a file gives llama.cpp's text; RunConfig reads it into pairs


# `specgen bench` settings a -c file may also hold (the bench presets in configs/ do).
BENCH_TYPES: dict[str, tuple[type, ...]] = {
    "methods": (str, list), "suite": (str,), "category": (str, type(None)), "per_group": (int, type(None)),
    "limit": (int, type(None)), "repeats": (int,), "split": (str,),
}


def _type_name(types: tuple[type, ...]) -> str:
    names = {str: "text", int: "an integer", float: "a number", bool: "true/false", type(None): "null",
             list: "a list"}
    return " or ".join(dict.fromkeys(names[t] for t in types))


def validate(values: Mapping[str, Any], origin: str) -> dict[str, Any]:
    """Check keys and value types; `origin` names where they came from for the error message."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        norm = key.replace("-", "_")
        if norm not in FIELDS and norm not in BENCH_TYPES:
            raise ConfigError(f"{origin}: unknown key {key!r} (expected one of: "
                              f"{', '.join([*FIELDS, *BENCH_TYPES])})")
        types = _TYPES.get(norm) or BENCH_TYPES[norm]
        # bool is an int in Python; do not let `max_tokens: true` through.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise ConfigError(f"{origin}: {key} must be {_type_name(types)}, found {value!r}")
        if norm == "draft" and isinstance(value, str) and value.lower() == "none":
            value = None
        out[norm] = value
    return out


def _is_endpoint(server: str) -> bool:
    host, _, port = server.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


THREADS_REFUSED = 4  # --threads above this many per core is a typo, not a setting


def check_threads(threads: int | None) -> None:
    """--threads, as every command takes it (also those without a RunConfig)."""
    if threads is None:
        return
    if threads < 1:
        raise ConfigError(f"--threads must be at least 1, found {threads}")
    cores = default_threads()
    if threads > THREADS_REFUSED * cores:
        raise ConfigError(f"--threads expects at most {THREADS_REFUSED * cores} ({THREADS_REFUSED} per core; "
                          f"this machine has {cores}), found {threads}")
    if threads > cores:
        reporter().warn(f"--threads {threads} is more than the {cores} cores here: llama.cpp's threads wait "
                        f"for each other at every step, so this is slower than --threads {cores}")


def check_sampling(cfg: RunConfig) -> None:
    """Every sampling number against the one table (ask.BOUNDS), named by its flag."""
    bad = out_of_bounds({b.name: getattr(cfg, b.name) for b in BOUNDS})
    if bad is not None:
        raise ConfigError(bad.flag_error(bad.flag, getattr(cfg, bad.name)))


def check_max_tokens(max_tokens: int) -> None:
    if max_tokens < 1:
        raise ConfigError(f"--max-tokens must be at least 1, found {max_tokens}")


def check_ctx(ctx: int) -> None:
    if ctx < 16:
        raise ConfigError(f"--ctx must be at least 16 tokens, found {ctx}")


def check_ranges(cfg: RunConfig) -> None:
    methods.get(cfg.method)
    check_max_tokens(cfg.max_tokens)
    check_sampling(cfg)
    stops_of(cfg.stop)
    check_threads(cfg.threads)
    if cfg.rpc is not None and not (cfg.rpc_servers and all(map(_is_endpoint, cfg.rpc_servers))):
        raise ConfigError(f"--rpc expects HOST:PORT[,HOST:PORT...], found {cfg.rpc!r}")
    check_ctx(cfg.ctx)
    if cfg.json_layout not in LAYOUTS:
        raise ConfigError(f"--json-layout expects {' or '.join(LAYOUTS)}, found {cfg.json_layout!r}")
    for path in cfg.corpus_files:
        if not path.is_file():
            raise ConfigError(f"--corpus expects a text file, found {str(path)!r} "
                              f"({'a directory' if path.is_dir() else 'no such file'})")


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: invalid YAML ({getattr(e, 'problem', None) or e})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, found {type(data).__name__}")
    return validate(data, str(path))


def merged_settings(config_file: Path | None, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """defaults.yaml, then the -c file, then command-line options that were given (not None)."""
    values: dict[str, Any] = {}
    if DEFAULT_CONFIG.exists():
        values.update(read_yaml(DEFAULT_CONFIG))
    from_file = read_yaml(config_file) if config_file is not None else {}
    values.update(from_file)
    given = validate({k: v for k, v in overrides.items() if v is not None}, "command line")
    if own_target_without_draft(given, from_file):
        # The default draft belongs to the default target: a target of your own drafts with
        # nothing unless -d (or a -c file) names a draft for it.
        values["draft"] = None
    values.update(given)
    return values


def own_target_without_draft(given: Mapping[str, Any], from_file: Mapping[str, Any]) -> bool:
    """The command line names a target, and neither it nor the -c file names a draft."""
    return "target" in given and "draft" not in given and "draft" not in from_file


def build_config(config_file: Path | None, overrides: Mapping[str, Any], given: Given = Given()) -> RunConfig:
    """The RunConfig for `generate`: bench-only settings in a -c file are ignored here; `given`
    (the command line's sampling options) replaces the settings' fields."""
    return run_config(merged_settings(config_file, overrides), given)


def run_config(values: Mapping[str, Any], given: Given = Given()) -> RunConfig:
    cfg = RunConfig(**{**{k: v for k, v in values.items() if k in FIELDS}, **given.fields})
    check_ranges(cfg)
    return cfg
