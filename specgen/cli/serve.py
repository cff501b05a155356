"""`specgen serve`: options into a session, served over HTTP with OpenAI's API (specgen/serve/)."""

from __future__ import annotations

import ipaddress
import signal
import socket
from typing import Optional

import typer

from specgen.app.config import Given, build_config, read_yaml
from specgen.app.session import load_session
from specgen.cli.options import (Config, Corpus, Ctx, Draft, DraftGpuLayers, GpuLayers, JsonLayout, Method, Rpc,
                                 Store, System, Target, Threads, with_sampling)
from specgen.cli.render import note, warn
from specgen.errors import ConfigError


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _check_listen(host: str, port: int) -> None:
    """Fail before loading the model, in one line, where the address cannot be listened on."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(infos[0][4])
    except OSError as e:
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


@with_sampling
def serve(
    target: Target = None,
    draft: Draft = None,
    method: Method = None,
    sampling: Given = Given(),  # the sampling options, typed at the edge (with_sampling)
    system: System = None,
    config: Config = None,
    threads: Threads = None,
    ctx: Ctx = None,
    gpu_layers: GpuLayers = None,
    draft_gpu_layers: DraftGpuLayers = None,
    rpc: Rpc = None,
    corpus: Corpus = None,
    store: Store = None,
    json_layout: JsonLayout = None,
    host: str = typer.Option("127.0.0.1", "--host", metavar="ADDR", help="Address to listen on (0.0.0.0: every "
                             "interface; then give --api-key)."),
    port: int = typer.Option(8080, "--port", metavar="N", help="TCP port."),
    api_key: Optional[str] = typer.Option(None, "--api-key", metavar="KEY", envvar="SPECGEN_API_KEY",
                                          help="Require `Authorization: Bearer KEY` on every route but /health."),
    max_queue: int = typer.Option(16, "--max-queue", metavar="N", help="Requests that may wait while one is "
                                  "decoded; more get 503 with Retry-After."),
    alias: Optional[str] = typer.Option(None, "--alias", metavar="NAME", help="The model id /v1/models lists and "
                                        "responses name [the model's name]."),
    prompt_cache: bool = typer.Option(True, "--prompt-cache/--no-prompt-cache", help="Keep the last "
                                      "conversation's KV: a request that begins with the same tokens reads only "
                                      "the rest; --no-prompt-cache reads every prompt whole, as a fresh server "
                                      "does (the same bits)."),
    prompt_cache_mb: int = typer.Option(1024, "--prompt-cache-mb", metavar="MIB", help="Host memory for other "
                                        "conversations' KV besides the live one (least recently used dropped "
                                        "first); a request resumes the one it shares most with. 0: the last "
                                        "conversation only."),
    cors: Optional[list[str]] = typer.Option(None, "--cors", "--cors-origin", metavar="ORIGIN", help="Let web pages "
                                             "from ORIGIN call the server from a browser (repeatable; * for any) "
                                             "[none: browsers keep pages of other sites out]."),
) -> None:
    """Serve the model over HTTP with OpenAI's API: /v1/chat/completions, /v1/completions, /v1/models;
    and llama-server's: /completion, /props, /tokenize, /detokenize, /metrics.

    Requests run one at a time, each with its own sampling settings (the options here are the
    defaults; without -n, until the model stops or the context ends); every response carries
    llama-server's `timings` and a `speculative` object.

    \b
    Examples:
      specgen serve -m smollm2-135m-instruct-q4_1
      curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\
        -d '{"messages": [{"role": "user", "content": "Hi"}]}'
    """
    import uvicorn

    from specgen.serve.app import Api
    from specgen.serve.worker import Slot, Worker

    if not 0 < port < 65536:
        raise ConfigError(f"--port expects 1..65535, found {port}")
    if alias is not None and not alias.strip():
        raise ConfigError("--alias expects a name, found nothing")
    if max_queue < 0:
        raise ConfigError(f"--max-queue must be at least 0, found {max_queue}")
    if prompt_cache_mb < 0:
        raise ConfigError(f"--prompt-cache-mb must be at least 0, found {prompt_cache_mb}")
    cfg = build_config(config, dict(
        target=target, draft=draft, method=method, system=system, threads=threads, ctx=ctx, gpu_layers=gpu_layers,
        draft_gpu_layers=draft_gpu_layers, rpc=rpc, store=store, json_layout=json_layout, corpus=",".join(map(str, corpus)) if corpus else None),
        sampling)
    _check_listen(host, port)
    if not _loopback(host) and api_key is None:
        warn(f"serving on {host} without --api-key: anyone who can reach this port can use the model")
    session = load_session(cfg.loading, screen=False)  # requests may sample: the target's own logits, not a screened copy's
    # A request without max_tokens runs until the model stops or the context ends (llama-server's
    # n_predict -1), unless -n (or the -c file) sets a default.
    given = sampling.max_tokens is not None or (config is not None and "max_tokens" in read_yaml(config))
    default_max = cfg.max_tokens if given else None
    worker = Worker(Slot(cfg, session, prompt_cache, prompt_cache_mb << 20), max_queue, default_max)
    warm_grammar(session.target)
    model_id = alias or session.target_label
    api = Api(worker, model_id, cfg.method, api_key, tuple(cors or ()))
    note(f"serving {model_id} ({cfg.method}) at http://{host}:{port}/v1")
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then raises the signal again for the handler
    # it found: a quiet one makes that a clean exit 0 rather than death by signal.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    try:
        uvicorn.run(api.app, host=host, port=port, log_level="warning", access_log=False)
    finally:
        worker.close()
    note("server stopped")


def warm_grammar(target) -> None:
    """Build the target's grammar tokenizer (0.4 s for 49k tokens, ~4 s for 262k) in the background
    at start-up, so that the first request with a response_format or tools does not wait for it."""
    import threading

    from specgen.llama.grammar import tokenizer

    threading.Thread(target=tokenizer, args=(target,), name="specgen-grammar-warm", daemon=True).start()
