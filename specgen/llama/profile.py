"""Where a decode's time goes, op by op (issue 59's profile): decodes of B tokens timed node by
node through llama.cpp's eval callback, grouped by what the node does (each matrix product by its
weight type, the output layer apart, attention, norms, the rest), beside the same decodes timed
without the callback.

How: a context made with `cb_eval` that asks for every node makes llama.cpp's scheduler compute
the graph one node at a time, calling back after each; the time between two callbacks is that
node's. Computing node by node costs a thread-pool start per node, so the instrumented decode is
slower than a plain one: the plain decode's time is reported beside it, and the shares (not the
absolute times) are what the profile is for. Only this package imports llama_cpp.
"""

from __future__ import annotations

import ctypes
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp as L

from specgen.llama.backend import LlamaContext, LlamaModel

GGML_MAX_SRC = 10
NO_WORK = ("view", "reshape", "permute", "transpose", "cont", "none")  # nodes that only describe memory
KERNEL_SIZES = (1, 2, 4, 8, 16)


class _Tensor(ctypes.Structure):
    """The head of ggml's `struct ggml_tensor` (ggml.h), as far as the name."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * GGML_MAX_SRC), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]


def _ggml() -> ctypes.CDLL:
    """ggml's own library, beside the libllama llama_cpp loaded (its op and type names)."""
    lib = ctypes.CDLL(str(Path(L.llama_cpp._lib._name).with_name("libggml-base.so")))
    lib.ggml_op_desc.restype, lib.ggml_op_desc.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    lib.ggml_type_name.restype, lib.ggml_type_name.argtypes = ctypes.c_char_p, [ctypes.c_int]
    return lib


def category(op: str, name: str, weight_type: str | None, weight_name: str | None = None) -> str:
    """What a node is, for the profile: a product by its weight type (the output layer apart),
    attention, a norm, or its op's own name. `weight_name`, the product's first operand's name, tells
    a model's weight (llama.cpp names them `blk.N....weight`) from the cache (K·Q and V·softmax
    without flash attention); without it, an F32 or F16 operand that no projection's node names is
    taken for the cache."""
    if op in ("MUL_MAT", "MUL_MAT_ID"):
        if name.startswith("result_output"):
            return f"output layer ({weight_type})"
        if weight_name is not None:
            return f"matmul {weight_type}" if weight_name.endswith(".weight") else "attention products"
        if weight_type in ("f32", "f16") and not name.startswith(("attn_", "ffn_", "Qcur", "Kcur", "Vcur")):
            return "attention products"
        return f"matmul {weight_type}"
    if op in ("FLASH_ATTN_EXT", "SOFT_MAX"):
        return "attention"
    if op in ("RMS_NORM", "NORM", "L2_NORM"):
        return "norms"
    return op.lower()


@dataclass
class OpTimes:
    """One decode size's nodes: seconds per category (summed over decodes), nodes per decode."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    nodes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    decodes: int = 0


class _Recorder:
    def __init__(self) -> None:
        self.lib = _ggml()
        self.on, self.last, self.into = False, 0.0, OpTimes()
        self.callback = L.ggml_backend_sched_eval_callback(self._called)

    def _called(self, tensor: int, ask: bool, _user: int) -> bool:
        if ask:
            return self.on  # every node, computed alone, when recording
        now = time.perf_counter()
        t = _Tensor.from_address(tensor)
        op = (self.lib.ggml_op_desc(tensor) or b"?").decode()
        weight = weight_name = None
        if t.src[0]:
            src = _Tensor.from_address(t.src[0])
            weight = (self.lib.ggml_type_name(src.type) or b"?").decode()
            weight_name = src.name.decode(errors="replace")
        key = category(op.upper(), t.name.decode(errors="replace"), weight, weight_name)
        self.into.seconds[key] += now - self.last
        self.into.nodes[key] += 1
        self.last = now
        return True


def _batch(n_past: int, size: int, token: int):
    from specgen.core.protocol import Batch

    b = Batch()
    for i in range(size):
        b.add(token, n_past + i, (0,), True)  # every row asks for logits, as a verified tree's do
    return b


def profile(model: LlamaModel, sizes: tuple[int, ...], n_past: int, repeats: int, threads: int,
            token: int) -> dict:
    """Per decode size: milliseconds per decode by category (instrumented), the instrumented and the
    plain decode's wall time (medians over `repeats`), after `n_past` tokens of context."""
    recorder = _Recorder()
    timed = LlamaContext(model, n_past + max(sizes) + 8, 1, max(n_past, max(sizes)), threads, max(sizes),
                         eval_callback=recorder.callback)
    plain = LlamaContext(model, n_past + max(sizes) + 8, 1, max(n_past, max(sizes)), threads, max(sizes))
    prompt = _batch(0, n_past, token)
    prompt.logits = [False] * (n_past - 1) + [True]
    for ctx in (timed, plain):
        ctx.decode(prompt)
    out = {}
    for size in sizes:
        times, walls, plain_walls = OpTimes(), [], []
        for _ in range(repeats + 1):  # the first of each size warms up and is not kept
            for ctx in (plain, timed):
                ctx.seq_rm(0, n_past, -1)
                recorder.on, recorder.into = ctx is timed, OpTimes()
                start = recorder.last = time.perf_counter()
                ctx.decode(_batch(n_past, size, token))
                wall = time.perf_counter() - start
                if ctx is timed:
                    walls.append(wall)
                    if len(walls) > 1:
                        for k, v in recorder.into.seconds.items():
                            times.seconds[k] += v
                        times.nodes = recorder.into.nodes
                        times.decodes += 1
                else:
                    plain_walls.append(wall)
        recorder.on = False
        n = max(1, times.decodes)
        out[size] = {"ms": {k: round(1000 * v / n, 4) for k, v in sorted(times.seconds.items(), key=lambda kv: -kv[1])},
                     "nodes": dict(times.nodes),
                     "instrumented_ms": round(1000 * _median(walls[1:]), 4),
                     "plain_ms": round(1000 * _median(plain_walls[1:]), 4)}
    return out


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else 0.0


def net(size: dict) -> dict[str, float]:
    """One size's ms by category, less each category's nodes' share of the per-node overhead (the
    mean of the nodes that do no work: what computing one node alone costs)."""
    idle = [k for k in size["ms"] if k in NO_WORK]
    per_node = sum(size["ms"][k] for k in idle) / max(1, sum(size["nodes"][k] for k in idle))
    return {k: max(0.0, v - per_node * size["nodes"][k]) for k, v in size["ms"].items() if k not in NO_WORK}


def in_process(path: str, sizes: tuple[int, ...], n_past: int, repeats: int, threads: int, env: dict) -> dict:
    """profile() in a process of its own with `env` (SPECGEN_KERNELS is read once per process)."""
    import json
    import os
    import subprocess
    import sys

    from specgen.errors import SpecgenError

    cmd = [sys.executable, "-m", "specgen.llama.profile", path, ",".join(map(str, sizes)), str(n_past),
           str(repeats), str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
    if proc.returncode != 0:
        raise SpecgenError(f"the profile of {Path(path).name} failed: "
                           f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}")
    return {int(b): v for b, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def kernel_times(path: str, sizes: tuple[int, ...] = KERNEL_SIZES, n_past: int = 256, repeats: int = 5,
                 threads: int = 2) -> dict:
    """`specgen calibrate --kernels`: each product's ms (by weight type; the output layer apart) and
    the whole decode's, at each B, with specgen's kernels and with llama.cpp's (SPECGEN_KERNELS=0)."""
    runs = {"specgen": in_process(path, sizes, n_past, repeats, threads, {"SPECGEN_KERNELS": "1"}),
            "llama.cpp": in_process(path, sizes, n_past, repeats, threads, {"SPECGEN_KERNELS": "0"})}
    out: dict = {"sizes": list(sizes), "products": {}, "decode_ms": {}}
    for name, by_size in runs.items():
        out["decode_ms"][name] = [by_size[b]["plain_ms"] for b in sizes]
        for b in sizes:
            for k, ms in net(by_size[b]).items():
                if k.startswith(("matmul", "output layer")):
                    out["products"].setdefault(k, {}).setdefault(name, []).append(round(ms, 4))
    return out


if __name__ == "__main__":  # in_process's child: python -m specgen.llama.profile PATH SIZES N_PAST REPEATS THREADS
    import json
    import sys

    _path, _sizes, _past, _repeats, _threads = sys.argv[1:6]
    _model = LlamaModel(_path)
    _token = _model.tokenize(" the", add_special=False)[-1]
    print(json.dumps(profile(_model, tuple(int(x) for x in _sizes.split(",")), int(_past), int(_repeats),
                             int(_threads), _token)))
