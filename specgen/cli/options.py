"""What every command shares: help as Click apps show it, the exit codes, and the options more than
one command takes, defined once."""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Annotated, Callable, List, Optional

import typer

from specgen.app.ask import BOUNDS, Bound, Overrides, out_of_bounds
from specgen.app.config import Given, check_max_tokens, parse_logit_bias
from specgen.app.stops import stops_of
from specgen.drafting.methods import METHODS
from specgen.errors import ConfigError


def conventional_help(params) -> None:
    """Help as Click and Typer apps have long shown it: a flag takes no value, so nothing stands
    beside it (Typer 0.29 writes `<bool>` there, and `<str>` beside arguments a metavar already
    names), and a help text's brackets are text ("[the cores ...]"), not Rich markup to swallow.
    Valued options name what they take with a metavar (N, MODEL, FILE) where they are declared."""
    from rich.markup import escape

    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
        if isinstance(param, typer.core.TyperArgument) and param.metavar:
            param.display_type_rich = lambda ctx: None
        if param.help:
            param.help = escape(param.help)


class _HelpFlag:
    """`--help` is a flag like any other: no `<bool>` beside it."""

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option


class Command(_HelpFlag, typer.core.TyperCommand):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        conventional_help(self.params)


class Group(_HelpFlag, typer.core.TyperGroup):
    pass


def new_typer(**kwargs) -> typer.Typer:
    return typer.Typer(cls=Group, no_args_is_help=True, **kwargs)


EXIT_INTERRUPTED = 130
EXIT_SOME_FAILED = 1  # a many-prompt run finished, but some prompts failed
EXIT_WRITE_FAILED = 74  # the work was done and shown, but a file could not be written (sysexits' EX_IOERR)

# Options more than one command takes, defined once so that a flag means the same everywhere
# (tests/test_cli_options.py checks the commands against each other). None: not given, so the
# -c file or configs/default.yaml decides (config.merged_settings).
Target = Annotated[Optional[str], typer.Option("-m", "--target", metavar="MODEL",
                                               help="Target model: GGUF path or models.txt name.")]
Draft = Annotated[Optional[str], typer.Option("-d", "--draft", metavar="MODEL", help="Draft model (path or "
                                              "name), 'self' (derived from the target: see `specgen draft derive`) "
                                              "or 'none'.")]
MaxTokens = Annotated[Optional[int], typer.Option("-n", "--max-tokens", metavar="N",
                                                  help="Tokens to generate per answer [256].")]
LogitBias = Annotated[Optional[List[str]], typer.Option("--logit-bias", metavar="TOKEN_ID(+/-)BIAS", help="Add BIAS "
                                                        "to a token's logit (e.g. 15043+1, 50256-inf); repeatable.")]
Stop = Annotated[Optional[List[str]], typer.Option("--stop", metavar="TEXT", help="End the text just before TEXT "
                                                   "(not shown; finish reason stop); repeatable.")]


def _sampling_option(b: Bound):
    """A sampling number's option, from its row of the one table (app/ask.BOUNDS)."""
    return Annotated[Optional[int if b.whole else float],
                     typer.Option(*filter(None, (b.short, b.flag)), metavar=b.metavar, help=b.help)]


# The sampling options, declared once: every command that generates takes them all (with_sampling),
# read into one Given (read_sampling).
SAMPLING = {"max_tokens": MaxTokens, **{b.name: _sampling_option(b) for b in BOUNDS}, "logit_bias": LogitBias,
            "stop": Stop}


def with_sampling(command: Callable) -> Callable:
    """A command that takes the sampling options: its parameter `sampling` stands for all of
    SAMPLING on the command line (in that place, in that order) and arrives as one typed Given
    (read_sampling). A shim: Typer reads a command's options off its signature, one parameter per
    option, and has no way to declare a group of them as one parameter, so this writes SAMPLING's
    options into the signature Typer reads in the place of `sampling`."""
    signature = inspect.signature(command, eval_str=True)
    params = list(signature.parameters.values())
    at = [p.name for p in params].index("sampling")
    options = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY if params[at].kind == params[at].KEYWORD_ONLY
                                 else inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=annotation)
               for name, annotation in SAMPLING.items()]

    @functools.wraps(command)
    def wrapper(**kwargs):
        return command(sampling=read_sampling({name: kwargs.pop(name, None) for name in SAMPLING}), **kwargs)

    del wrapper.__wrapped__  # typer reads the signature below, not the command's
    wrapper.__signature__ = signature.replace(parameters=params[:at] + options + params[at + 1:])
    # Evaluated already (eval_str): typer's get_type_hints would read strings in this module's globals.
    wrapper.__annotations__ = {p.name: p.annotation for p in wrapper.__signature__.parameters.values()}
    return wrapper


def read_sampling(values: dict) -> Given:
    """The command line's edge: the sampling options (SAMPLING's names; None: not given) as one
    Given, the typed values the server's edge makes of a request's fields (ask.Overrides), checked
    here by the rules a config file's values are checked by (ask.BOUNDS, config.check_max_tokens,
    config.parse_logit_bias, stops.stops_of), a ConfigError in the flag's words."""
    if values["max_tokens"] is not None:
        check_max_tokens(values["max_tokens"])
    bad = out_of_bounds(values)
    if bad is not None:
        raise ConfigError(bad.flag_error(bad.flag, values[bad.name]))
    bias = parse_logit_bias(values["logit_bias"]) if values["logit_bias"] else None
    stop = tuple(values["stop"]) if values["stop"] else None
    stops_of(stop)
    return Given(Overrides(**{b.name: values[b.name] for b in BOUNDS}, logit_bias=bias), values["max_tokens"], stop)


Method = Annotated[Optional[str], typer.Option("--method", metavar="NAME", help="Decoding method (default: auto). "
                                               + "; ".join(f"{m.name}: {m.summary}" for m in METHODS.values()) + ".")]
Chat = Annotated[Optional[bool], typer.Option("--chat/--no-chat", help="Apply the model's chat template "
                                              "[on when the model has one].")]
System = Annotated[Optional[str], typer.Option("--system", metavar="TEXT", help="System message (chat templates).")]
Config = Annotated[Optional[Path], typer.Option("-c", "--config", metavar="FILE", help="YAML presets (see configs/).")]
Threads = Annotated[Optional[int], typer.Option("--threads", metavar="N",
                                                help="CPU threads [the cores other processes leave free].")]
Ctx = Annotated[Optional[int], typer.Option("--ctx", metavar="N", help="Context size in tokens [4096].")]
GpuLayers = Annotated[Optional[int], typer.Option("--gpu-layers", metavar="N",
                                                  help="Target layers to offload to the GPU [0].")]
DraftGpuLayers = Annotated[Optional[int], typer.Option("--draft-gpu-layers", metavar="N",
                                                       help="Draft layers to offload [0].")]
Rpc = Annotated[Optional[str], typer.Option("--rpc", metavar="HOST:PORT,...", help="llama.cpp RPC servers "
                                            "HOST:PORT,... to offload --gpu-layers onto (see `specgen rpc-server`).")]
Corpus = Annotated[Optional[List[Path]], typer.Option("--corpus", metavar="FILE", help="A text file auto also drafts "
                                                      "from (documents or code being edited); repeat for more.")]
Store = Annotated[Optional[bool], typer.Option("--store/--no-store", help="Draft from, and add to, the store of past "
                                               "generations in the specgen cache (generate: on, bench: off).")]
JsonSchema = Annotated[Optional[str], typer.Option("--json-schema", metavar="FILE|JSON", help="The output must be JSON "
                                                   "matching this JSON Schema (a file, or the schema itself).")]
Grammar = Annotated[Optional[Path], typer.Option("--grammar", metavar="FILE", help="The output must match this "
                                                 "grammar (GBNF as llama.cpp writes it, or Lark).")]
JsonObject = Annotated[bool, typer.Option("--json-object", help="The output must be a JSON object (any).")]
JsonLayout = Annotated[Optional[str], typer.Option("--json-layout", metavar="compact|free", help="JSON under a "
                                                   "schema: compact fixes json.dumps's layout (separators "
                                                   "forced, faster); free lets the model place whitespace, "
                                                   "as llama.cpp does [compact].")]


def constraint_option(json_schema: str | None, grammar: Path | None, json_object: bool):
    """The --json-schema / --grammar / --json-object choice as a ConstraintSpec (at most one)."""
    from specgen.core.constraint import ConstraintSpec
    from specgen.errors import ConfigError

    given = [name for name, v in (("--json-schema", json_schema), ("--grammar", grammar), ("--json-object", json_object))
             if v]
    if len(given) > 1:
        raise ConfigError(f"expected one of --json-schema, --grammar, --json-object, found {' and '.join(given)}")
    if json_object:
        return ConstraintSpec("json_object")
    if grammar is not None:
        return ConstraintSpec("gbnf", _read(grammar, "--grammar"))
    if json_schema is None:
        return None
    text = json_schema if json_schema.lstrip().startswith("{") else _read(Path(json_schema), "--json-schema")
    from specgen.app.structured import schema_spec

    return schema_spec(_json(text), "--json-schema")


def _read(path: Path, option: str) -> str:
    from specgen.errors import ConfigError

    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{option} expects a readable file, found {path} ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{option} expects a UTF-8 text file, found binary data in {path}") from None


def _json(text: str) -> object:
    import json

    from specgen.errors import ConfigError

    try:
        return json.loads(text)
    except ValueError as e:
        raise ConfigError(f"--json-schema expects JSON, found an error: {e}") from None
