"""llama.cpp's process-wide set-up, below every module that loads or runs a model: its log captured
(shown only with SPECGEN_DEBUG, its last error line kept to explain a failure) and its backend
initialised once."""

from __future__ import annotations

import collections
import ctypes
import os
import sys

import llama_cpp as L

# llama.cpp logs a great deal while loading; keep the last lines to explain failures and show
# everything only when SPECGEN_DEBUG is set.
_recent_log: collections.deque[str] = collections.deque(maxlen=20)


@L.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    line = text.decode("utf-8", errors="replace")
    _recent_log.append(line.rstrip())
    if os.environ.get("SPECGEN_DEBUG"):
        sys.stderr.write(line)


_initialized = False


def init() -> None:
    """Once per process: llama.cpp's log captured (see last_error), its backend initialised."""
    global _initialized
    if not _initialized:
        L.llama_log_set(_log_callback, ctypes.c_void_p(0))
        L.llama_backend_init()
        _initialized = True


def last_error() -> str:
    """The last line llama.cpp logged that names an error or a failure (\"\" if none)."""
    for line in reversed(_recent_log):
        if "error" in line.lower() or "failed" in line.lower():
            return line.strip()
    return ""
