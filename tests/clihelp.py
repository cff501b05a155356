"""Running the real CLI in a subprocess, and checking the one-line error contract."""

import os
import subprocess
import sys

from harness import SMOLLM2


def specgen(*args, input=None, cwd=None, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "specgen", *args], input=input, capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, **(env or {})}, timeout=timeout)


def gen(*args, input=None):
    return specgen("generate", "-m", SMOLLM2, "--method", "plain", "-n", "8", *args, input=input)


# The one warning a loaded machine adds beside an error: the model's costs were timed while other
# processes ran (models/curves.py). It says so about the machine, not the input.
BUSY = "specgen: warning: other processes used "


def assert_one_line_error(proc, pattern):
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith(BUSY)]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert pattern in lines[0], lines[0]
