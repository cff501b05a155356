#!/usr/bin/env python3
"""Run llama.cpp's own server tests (tools/server/tests in a llama.cpp checkout) against `specgen
serve`: their ServerProcess starts whatever LLAMA_SERVER_BIN_PATH names, so this points it at a
shim that turns llama-server's flags into specgen's options and their test models (downloaded
from Hugging Face) into ours (local). Nothing of theirs is copied or changed.

    python scripts/llama_server_tests.py --llama-cpp PATH/TO/llama.cpp [pytest arguments...]

Their tests need aiohttp, filelock, wget and prometheus-client beside pytest, requests and
openai; `--packages DIR` adds a folder of them (pip install --target DIR ...) to the search path.
Results for the copy vendored by llama-cpp-python 0.3.36: docs/serve.md, "llama.cpp's server tests".
"""

from __future__ import annotations

import argparse
import os
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

# Their presets' models (by Hugging Face repo or file) -> a local model of ours; the rest: DEFAULT.
DEFAULT = "smollm2-135m-instruct-q4_1"
MODELS = {"tinygemma3": "gemma-3-270m-q4_k_m"}
# llama-server flags and what they become; None: dropped (said on stderr), with the value it takes.
RENAMED = {"--port": "--port", "--host": "--host", "--temp": "--temperature", "--seed": "--seed",
           "--ctx-size": "--ctx", "--n-predict": "-n", "--api-key": "--api-key", "--threads": "--threads"}
TAKES_VALUE = {"--model", "--model-url", "--model-draft", "--hf-repo", "--hf-file", "--models-dir", "--models-max",
               "--models-preset", "--cors-origins", "--batch-size", "--ubatch-size", "--n-gpu-layers", "--pooling",
               "--alias", "--tags", "--parallel", "-ctk", "-ctv", "-fa", "--slot-save-path", "--grp-attn-n",
               "--grp-attn-w", "--lora", "--spec-type", "--spec-draft-n-max", "--spec-draft-n-min",
               "--spec-synth-len", "--spec-synth-rates", "--reasoning-format", "--reasoning", "--chat-template",
               "--chat-template-file", "--mmproj-url", "--media-path", "--sleep-idle-seconds", "--cache-ram",
               "--tools", "--tools-runtime", "--mcp-servers-config", "--mcp-servers-json", *RENAMED}


def translate(argv: list[str]) -> list[str]:
    """llama-server's command line -> `specgen serve`'s."""
    out, dropped, where = ["--no-store"], [], []
    i = 0
    while i < len(argv):
        flag = argv[i]
        value = argv[i + 1] if flag in TAKES_VALUE and i + 1 < len(argv) else None
        i += 2 if flag in TAKES_VALUE else 1
        if flag == "--n-predict" and value is not None and int(value) < 0:
            continue  # llama-server's -1, no limit: specgen's default without -n
        if flag in RENAMED:
            out += [RENAMED[flag], value]
        elif flag in ("--model", "--hf-repo", "--hf-file") and value:
            where.append(value)
        elif flag == "--alias":
            out += ["--alias", value.split(",")[0]]
        elif flag == "--cors-origins":
            for origin in value.split(","):
                out += ["--cors-origin", origin.strip()]
        else:
            dropped.append(flag if value is None else f"{flag} {value}")
    model = next((ours for key, ours in MODELS.items() if any(key in w for w in where)), DEFAULT)
    if dropped:
        sys.stderr.write(f"llama-server shim: no counterpart in specgen serve, dropped: {' '.join(dropped)}\n")
    sys.stderr.write(f"llama-server shim: {' '.join(where) or '(no model)'} -> {model}\n")
    return ["-m", model, *out]


def as_llama_server(argv: list[str]) -> int:
    cmd = [sys.executable, "-m", "specgen", "serve", *translate(argv)]
    os.execv(cmd[0], cmd)  # their harness terminates this pid: it must be the server itself
    return 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--as-llama-server":
        return as_llama_server(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-cpp", type=Path, default=os.environ.get("LLAMA_CPP_DIR"), required=
                        "LLAMA_CPP_DIR" not in os.environ, help="a llama.cpp source tree (or LLAMA_CPP_DIR)")
    parser.add_argument("--packages", type=Path, help="a folder of their test requirements (pip install --target)")
    args, pytest_args = parser.parse_known_args()
    tests = args.llama_cpp / "tools" / "server" / "tests"
    if not (tests / "utils.py").is_file():
        parser.error(f"expected llama.cpp's server tests in {tests}, found no utils.py there")
    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="specgen-llama-server-") as tmp:
        shim = Path(tmp) / "llama-server"
        shim.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} --as-llama-server \"$@\"\n")
        shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
        env = {**os.environ, "LLAMA_SERVER_BIN_PATH": str(shim), "PORT": str(free_port()),
               "PYTHONPATH": os.pathsep.join([str(repo), *filter(None, [os.environ.get("PYTHONPATH")])])}
        extra = f"sys.path.append({str(args.packages)!r}); " if args.packages else ""
        code = f"import sys; {extra}import pytest; sys.exit(pytest.main(sys.argv[1:]))"
        return subprocess.call([sys.executable, "-c", code, "-p", "no:cacheprovider", *(pytest_args or ["unit"])],
                               cwd=tests, env=env)


if __name__ == "__main__":
    sys.exit(main())
