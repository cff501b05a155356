"""llama.cpp beyond models and contexts: quantizing a GGUF, what the installed build computes on, and
RPC servers to split a model across machines."""

from __future__ import annotations

import ctypes
import platform
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import llama_cpp as L

from specgen.errors import ModelError
from specgen.host import default_threads
from specgen.llama.runtime import init as _init, last_error as _last_error


_FTYPES = {"F32": L.LLAMA_FTYPE_ALL_F32, "F16": L.LLAMA_FTYPE_MOSTLY_F16, "BF16": L.LLAMA_FTYPE_MOSTLY_BF16,
           "Q8_0": L.LLAMA_FTYPE_MOSTLY_Q8_0, "Q6_K": L.LLAMA_FTYPE_MOSTLY_Q6_K,
           "Q5_K_M": L.LLAMA_FTYPE_MOSTLY_Q5_K_M, "Q4_K_M": L.LLAMA_FTYPE_MOSTLY_Q4_K_M,
           "Q5_1": L.LLAMA_FTYPE_MOSTLY_Q5_1, "Q5_0": L.LLAMA_FTYPE_MOSTLY_Q5_0, "Q4_1": L.LLAMA_FTYPE_MOSTLY_Q4_1,
           "Q4_0": L.LLAMA_FTYPE_MOSTLY_Q4_0, "Q3_K_M": L.LLAMA_FTYPE_MOSTLY_Q3_K_M,
           "Q2_K": L.LLAMA_FTYPE_MOSTLY_Q2_K}


# Types a vocabulary matrix (embedding, output) may take on its own: 32-wide blocks fit any n_embd
# a model is likely to have, where the K-quants' 256-wide blocks do not (gemma-3-270m: 640).
HEAD_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q8_0": 8, "F16": 1}  # ggml_type ids


def quantize(src: Path, dst: Path, ftype: str, n_threads: int | None = None, head_type: str | None = None) -> None:
    """Write `src` re-quantized to `ftype` (llama.cpp's quantize; requantizing allowed), with the
    token embedding and output matrices in `head_type` when given (else llama.cpp's choice)."""
    _init()
    if ftype not in _FTYPES:
        raise ModelError(f"unknown quantization type {ftype!r}: expected one of {', '.join(_FTYPES)}")
    if head_type is not None and head_type not in HEAD_TYPES:
        raise ModelError(f"unknown head type {head_type!r}: expected one of {', '.join(HEAD_TYPES)}")
    params = L.llama_model_quantize_default_params()
    params.nthread = n_threads or default_threads()
    params.ftype = _FTYPES[ftype]
    if head_type is not None:
        params.token_embedding_type = params.output_tensor_type = HEAD_TYPES[head_type]
    params.allow_requantize = True
    rc = L.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise ModelError(f"llama.cpp quantize {src.name} -> {ftype} failed (code {rc}): {_last_error()}")


def retype(src: Path, dst: Path, types: dict[str, str]) -> list[str]:
    """Write `src` with every F32 matrix whose name contains a key of `types` (the first that matches)
    quantized by ggml to that type ("ffn_down": "Q2_K"), the rest as they were; returns the names
    changed. For weight types that no llama.cpp file type gives the shapes at hand (Q2_K needs rows
    of 256 values, which smollm2's and gemma-3's Q2_K files have only in ffn_down, made Q3_K there)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader
    from llama_cpp import _ggml

    from specgen.llama import gguf as gguf_files

    quantize = _ggml.libggml.ggml_quantize_chunk
    quantize.restype = ctypes.c_size_t
    quantize.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                         ctypes.c_int64, ctypes.c_void_p]
    reader = GGUFReader(src)
    tensors, changed = [], []
    for t in reader.tensors:
        want = next((v for k, v in types.items() if k in t.name), None)
        if want is None or t.tensor_type != GGMLQuantizationType.F32 or t.data.ndim < 2:
            tensors.append((t.name, t.data, t.tensor_type))
            continue
        qtype = GGMLQuantizationType[want]
        block, size = GGML_QUANT_SIZES[qtype]
        rows = np.ascontiguousarray(t.data, dtype=np.float32).reshape(-1, t.data.shape[-1])
        if rows.shape[1] % block:
            raise ModelError(f"{t.name}: rows of {rows.shape[1]} values do not split into {want}'s blocks of {block}")
        out = np.empty((rows.shape[0], rows.shape[1] // block * size), dtype=np.uint8)
        quantize(int(qtype), rows.ctypes.data, out.ctypes.data, 0, rows.shape[0], rows.shape[1], None)
        tensors.append((t.name, out.reshape(*t.data.shape[:-1], out.shape[1]), qtype))
        changed.append(t.name)
    gguf_files.write_tensors(gguf_files.copy_metadata(reader, dst), tensors)
    return changed


@dataclass(frozen=True)
class BuildInfo:
    llama_cpp_python: str
    system_info: str
    machine: str
    rpc: bool
    library: str = ""  # the loaded libraries' files (name:size:mtime): which build this is, beyond its words

    @property
    def accelerator(self) -> str:
        """cuda | metal | cpu: the backend the build computes on locally."""
        if "CUDA" in self.system_info:
            return "cuda"
        return "metal" if "METAL" in self.system_info.upper() else "cpu"


def build_info() -> BuildInfo:
    _init()
    return BuildInfo(L.__version__, L.llama_print_system_info().decode(errors="replace").strip(),
                     platform.machine(), bool(L.llama_supports_rpc()), _library_files())


def _library_files() -> str:
    """The llama.cpp libraries beside the loaded libllama, as name:size:mtime: a rebuilt library whose
    system info reads the same (faster kernels under the same names) is another build for what is
    cached per build (the calibration cache's curves)."""
    here = Path(L.llama_cpp._lib._name).parent
    files = sorted(p for p in here.glob("lib*.so*") if p.is_file() and not p.is_symlink())
    return ";".join(f"{p.name}:{p.stat().st_size}:{int(p.stat().st_mtime)}" for p in files)


# --- llama.cpp RPC: split a model across machines running an RPC server ---------------------------

RPC_REBUILD_HINT = "reinstall specgen's build (python -m specgen.llama.build), which turns GGML_RPC on"
_rpc_added: set[str] = set()


def _ggml():
    """libggml (the backend registry), loaded by llama-cpp-python next to libllama."""
    from llama_cpp._ggml import libggml

    lib = libggml
    lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_register.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_register.restype = None
    lib.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    lib.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    return lib


def _rpc_function(name: str, restype, argtypes):
    _init()
    if not L.llama_supports_rpc():
        raise ModelError(f"--rpc needs a llama.cpp build with the RPC backend, and this one has none: "
                         f"{RPC_REBUILD_HINT}")
    lib = _ggml()
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    address = lib.ggml_backend_reg_get_proc_address(reg, name.encode()) if reg else None
    if not address:
        raise ModelError(f"this llama.cpp build's RPC backend lacks {name}: {RPC_REBUILD_HINT}")
    return ctypes.CFUNCTYPE(restype, *argtypes)(address), lib


def add_rpc_servers(endpoints: Sequence[str]) -> None:
    """Register RPC servers as devices (llama.cpp's --rpc); models loaded afterwards offload their
    GPU layers (--gpu-layers) onto them."""
    add_server, lib = _rpc_function("ggml_backend_rpc_add_server", ctypes.c_void_p, [ctypes.c_char_p])
    for endpoint in endpoints:
        if endpoint in _rpc_added:
            continue
        # ggml aborts the whole process when it cannot connect: try the address ourselves first.
        host, _, port = endpoint.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
        except OSError as e:
            raise ModelError(f"cannot reach the RPC server at {endpoint} ({e.strerror or e}): expected "
                             "`specgen rpc-server` or llama.cpp's rpc-server listening there") from None
        reg = add_server(endpoint.encode())
        if not reg:
            raise ModelError(f"the RPC server at {endpoint} refused the connection (a different protocol "
                             f"version?){': ' + _last_error() if _last_error() else ''}")
        lib.ggml_backend_register(reg)
        _rpc_added.add(endpoint)


GGML_BACKEND_DEVICE_TYPE_CPU = 0


def serve_rpc(endpoint: str, n_threads: int | None = None, cache_dir: str | None = None) -> None:
    """Serve this machine's CPU as an RPC device at `endpoint` (host:port); blocks until killed."""
    start, lib = _rpc_function("ggml_backend_rpc_start_server", None,
                               [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
                                ctypes.POINTER(ctypes.c_void_p)])
    cpu = lib.ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)
    devices = (ctypes.c_void_p * 1)(cpu)
    start(endpoint.encode(), cache_dir.encode() if cache_dir else None, n_threads or default_threads(), 1, devices)
