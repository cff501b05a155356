"""Running the real CLI in a subprocess, and checking the one-line error contract."""

import os
import subprocess
import sys

from conftest import SMOLLM2


def specgen(*args, input=None, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "specgen", *args], input=input, capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, **(env or {})}, timeout=300)


def gen(*args, input=None):
    return specgen("generate", "-m", SMOLLM2, "--method", "plain", "-n", "8", *args, input=input)


def assert_one_line_error(proc, pattern):
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert pattern in lines[0], lines[0]
