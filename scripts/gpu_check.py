"""The GPU check in one lease (docs/gpu.md): `pack` here, `run` there (or here with --cpu, the rehearsal).

pack (here, in the project's venv): the llama_cpp package of the cached wheel (the CUDA build for
sm_90, or with --cpu this host's CPU build) with its libraries once each, the wheels that the GPU
machine's image lacks, and a model small enough to travel with them, into gpu-payload/ (ignored
by git; the device call carries it), with SHA256SUMS, checked against the 64 MiB a call carries.

run (there, with the image's python3; stdlib only until the payload is installed): check the sums,
install into a target folder, derive the other models, then the real-model tests with every layer
offloaded, `specgen calibrate` and `specgen bench` for every method, each step timed and bounded,
everything written to --out (at most 8 files: what the device tool brings back).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAYLOAD = REPO / "gpu-payload"
CALL_LIMIT = 64 * 2**20  # what one device call carries: working tree and carried paths together
# The model that travels: smollm2-135m's first blocks in Q4_0 (ggml's most common quantized path on
# every backend), its embedding (tied to the output) in Q4_0 too, which llama.cpp's choice (Q8_0)
# would make twice as large.
BASE_MODEL = "smollm2-135m-instruct-f32"
CUDA_ARCH = "90-real"  # H100 and H200
# What llama_cpp needs at import, and `specgen bench --json` (gguf), which the GPU machine's image
# lacks (its package list: docs/gpu.md; gguf's own needs, tqdm and requests, are there).
CARRIED_WHEELS = ["diskcache", "gguf"]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


# --- pack -------------------------------------------------------------------------------------


def cached_wheel(cpu: bool) -> Path:
    sys.path.insert(0, str(REPO))
    from specgen.host import specgen_home
    from specgen.llama import build

    env = {k: v for k, v in os.environ.items() if k not in ("SPECGEN_CUDA_ARCH", "SPECGEN_CMAKE_ARGS")}
    plan = build.plan_build(env) if cpu else build.plan_cuda(CUDA_ARCH)
    cache = specgen_home() / "wheels" / f"llama_cpp_python-{build.LLAMA_CPP_PYTHON_VERSION}-{plan.key}"
    wheels = sorted(cache.glob("llama_cpp_python-*.whl"))
    if not wheels:
        how = "--wheel-only" if cpu else f"--cuda --cuda-arch {CUDA_ARCH}"
        how = f"python -m specgen.llama.build {how}"
        sys.exit(f"gpu-check: no {'CPU' if cpu else 'CUDA'} wheel cached in {cache}: build it first ({how})")
    return wheels[0]


def pack_llama(wheel: Path, dest: Path) -> None:
    """llama_cpp/ of the wheel as a .tar.xz, each library once: the wheel holds every one under three
    names (.so, .so.0, .so.0.x.y); the loader needs the soname, Python the plain name (a link)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(wheel) as zf, tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name in sorted(zf.namelist()):
            if not name.startswith("llama_cpp/") or name.endswith("/"):
                continue
            base = Path(name).name
            if "/lib/" in name and re.search(r"\.so\.\d+\.", base):
                continue  # libX.so.0.25.3: the soname libX.so.0 carries the same bytes
            info = tarfile.TarInfo(name)
            if "/lib/" in name and base.endswith(".so") and f"{name}.0" in zf.namelist():
                info.type, info.linkname = tarfile.SYMTYPE, f"{base}.0"
                tar.addfile(info)
                continue
            data = zf.read(name)
            info.size, info.mode = len(data), 0o755 if ".so" in base else 0o644
            tar.addfile(info, io.BytesIO(data))
    dest.write_bytes(buf.getvalue())


def keep_layers(src: Path, dst: Path, n_layers: int) -> None:
    """`src` cut to its first `n_layers` blocks (same embedding, norm and tokenizer): the same kernels
    and shapes as the whole model, at a size that travels with the libraries in one call."""
    from gguf import GGUFReader

    from specgen.llama.gguf import copy_metadata, write_tensors

    reader = GGUFReader(src)
    arch = reader.get_field("general.architecture").contents()
    edits = {f"{arch}.block_count": n_layers}

    def edit(key, value):
        if key == "general.name":
            return f"{value} (first {n_layers} layers)"
        return edits.get(key, value)

    writer = copy_metadata(reader, dst, edit)
    kept = [t for t in reader.tensors if not t.name.startswith("blk.") or int(t.name.split(".")[1]) < n_layers]
    write_tensors(writer, [(t.name, t.data, t.tensor_type) for t in kept])


def tree_size() -> int:
    """Bytes of what a device call sends besides carried paths: tracked and untracked-not-ignored files."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         capture_output=True, check=True).stdout
    return sum((REPO / p).stat().st_size for p in out.decode().split("\0") if p and (REPO / p).is_file())


def pack(args) -> None:
    sys.path.insert(0, str(REPO))
    from specgen.models import resolve as models

    wheel = cached_wheel(args.cpu)
    shutil.rmtree(args.dir, ignore_errors=True)
    (args.dir / "wheels").mkdir(parents=True)
    pack_llama(wheel, args.dir / "llama_cpp.tar.xz")
    from specgen.llama.tools import quantize

    model = args.dir / f"smollm2-135m-l{args.layers}-q4_0.gguf"
    cut = args.dir / "cut-f32.gguf.tmp"
    keep_layers(models.resolve(BASE_MODEL), cut, args.layers)
    quantize(cut, model, "Q4_0", head_type="Q4_0")
    cut.unlink()
    for name in CARRIED_WHEELS:
        from importlib.metadata import version

        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
               "3.12", "-d", str(args.dir / "wheels"), f"{name}=={version(name)}"]
        if subprocess.run(cmd).returncode != 0:
            sys.exit(f"gpu-check: cannot download the {name} wheel")
    files = sorted(p for p in args.dir.rglob("*") if p.is_file())
    sums = "".join(f"{sha256(p)}  {p.relative_to(args.dir)}\n" for p in files)
    (args.dir / "SHA256SUMS").write_text(sums)
    payload = sum(p.stat().st_size for p in files)
    total = payload + tree_size()
    kind = "CPU (rehearsal)" if args.cpu else f"CUDA {CUDA_ARCH}"
    print(f"gpu-check: packed {kind} from {wheel.name} ({wheel.stat().st_size / 2**20:.1f} MiB wheel)")
    for p in files:
        print(f"  {p.stat().st_size / 2**20:7.2f} MiB  {p.relative_to(args.dir)}")
    print(f"  payload {payload / 2**20:.2f} MiB + working tree {(total - payload) / 2**20:.2f} MiB = "
          f"{total / 2**20:.2f} MiB of the {CALL_LIMIT // 2**20} MiB a call carries")
    if total > CALL_LIMIT:
        sys.exit(f"gpu-check: {total / 2**20:.1f} MiB is over what one call carries; pack with fewer --layers")


# --- run --------------------------------------------------------------------------------------


@dataclass
class Step:
    name: str
    rc: int
    seconds: float
    command: str


class Runner:
    """Runs each step with a time bound and within the run's deadline (so that the device call ends
    in time and its files come back), appends its output to one log, records rc and time."""

    def __init__(self, out: Path, env: dict[str, str], deadline: float):
        self.out, self.env, self.deadline, self.steps = out, env, deadline, []
        self.log = open(out / "check.log", "a", buffering=1)

    def __call__(self, name: str, cmd: list[str], timeout: int) -> int:
        started = time.time()
        timeout = int(min(timeout, self.deadline - started))
        self.log.write(f"\n=== {name}: {' '.join(cmd)}\n")
        try:
            if timeout <= 0:
                raise subprocess.TimeoutExpired(cmd, 0)
            rc = subprocess.run(cmd, env=self.env, stdout=self.log, stderr=subprocess.STDOUT, timeout=timeout,
                                cwd=REPO).returncode
        except subprocess.TimeoutExpired:
            rc = 124
            self.log.write(f"=== {name}: stopped after {timeout} s\n")
        step = Step(name, rc, round(time.time() - started, 1), " ".join(cmd))
        self.steps.append(step)
        print(f"gpu-check: {name}: {'ok' if rc == 0 else f'FAILED (rc {rc})'} in {step.seconds} s", flush=True)
        return rc


def check_sums(payload: Path) -> None:
    sums = payload / "SHA256SUMS"
    if not sums.is_file():
        sys.exit(f"gpu-check: no {sums}: carry gpu-payload (made by `scripts/gpu-check.sh pack`)")
    for line in sums.read_text().splitlines():
        want, rel = line.split("  ", 1)
        path = payload / rel
        if not path.is_file() or sha256(path) != want:
            sys.exit(f"gpu-check: {rel} is missing or damaged (sha256 differs from SHA256SUMS)")


def cuda_library_dirs(python: str) -> list[str]:
    """Where the GPU machine keeps libcudart and libcublas (its PyTorch's nvidia wheels, a toolkit)."""
    code = "import site,glob;print('\\n'.join(sorted({p.rsplit('/',1)[0] for s in site.getsitepackages() " \
           "for p in glob.glob(s+'/nvidia/*/lib/libcu*.so*')})))"
    found = subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.split()
    toolkit = ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib")
    return [*found, *(d for d in toolkit if Path(d).is_dir())]


def run(args) -> int:
    started = time.time()
    out, work = args.out.resolve(), args.work.resolve()
    out.mkdir(parents=True, exist_ok=True)
    check_sums(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    site, home, models = work / "site", work / "home", work / "models"
    for d in (site, home, models):
        d.mkdir(parents=True)
    with tarfile.open(args.dir / "llama_cpp.tar.xz") as tar:
        tar.extractall(site, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(site)
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{REPO}", SPECGEN_HOME=str(home), PYTHONUNBUFFERED="1",
               SPECGEN_SCREEN="0")  # no screened copies: the GPU takes another route (session.screenable)
    if not args.cpu:
        found = [*cuda_library_dirs(args.python), env.get("LD_LIBRARY_PATH")]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, found))
    step = Runner(out, env, started + args.deadline)
    py = [args.python]
    wheels = sorted(str(p) for p in (args.dir / "wheels").glob("*.whl"))
    if wheels:
        step("install", [*py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target",
                         str(site), *wheels], 120)
    layers = "0" if args.cpu else "99"
    info = ("from specgen.llama import tools; i = tools.build_info(); print(i.system_info); "
            f"assert i.accelerator == {'cpu' if args.cpu else 'cuda'!r}, 'computes on ' + i.accelerator")
    if step("build-info", [*py, "-c", info], 60) != 0:
        if not args.cpu:  # which CUDA library the loader did not find
            step("ldd", ["ldd", *map(str, (site / "llama_cpp/lib").glob("libggml-cuda.so*"))], 30)
        return finish(out, step, started, "the installed llama.cpp does not load or computes elsewhere")
    carried = next(args.dir.glob("*.gguf"))
    q4_0, f32, q4_1 = models / carried.name, models / "target-f32.gguf", models / "draft-q4_1.gguf"
    shutil.copyfile(carried, q4_0)
    derive = ("import sys; from pathlib import Path; from specgen.llama.tools import quantize; "
              "quantize(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])")
    step("derive-f32", [*py, "-c", derive, str(q4_0), str(f32), "F32"], 120)
    step("derive-q4_1", [*py, "-c", derive, str(f32), str(q4_1), "Q4_1"], 120)
    pairs = f"{f32}:{q4_0},{q4_0}:{q4_1}"
    step.env = dict(env, SPECGEN_CHECK_PAIRS=pairs, SPECGEN_CHECK_GPU_LAYERS=layers)
    step("tests", [*py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
                   "tests/test_device_check.py",
                   f"--junitxml={out / 'junit.xml'}"], args.test_timeout)
    step.env = env
    specgen = [*py, "-m", "specgen"]
    step("calibrate", [*specgen, "calibrate", str(f32), "--gpu-layers", layers, "--refresh"], 180)
    step("bench", [*specgen, "bench", "-m", str(f32), "-d", str(q4_0), "--gpu-layers", layers, "--draft-gpu-layers",
                   layers, "--per-group", "1", "-n", str(args.tokens), "--json", str(out / "bench.json")],
         args.bench_timeout)
    curves = {p.name: json.loads(p.read_text()) for p in sorted((home / "calibration").glob("*.json"))}
    (out / "calibration.json").write_text(json.dumps(curves, indent=1))
    return finish(out, step, started, None)


def finish(out: Path, step: Runner, started: float, error: str | None) -> int:
    failed = [s.name for s in step.steps if s.rc != 0]
    smi = shutil.which("nvidia-smi")
    gpu = subprocess.run([smi, "-L"], capture_output=True, text=True).stdout.strip() if smi else "none"
    result = {"ok": not failed and error is None, "failed": failed, "error": error, "gpu": gpu,
              "seconds": round(time.time() - started, 1), "steps": [asdict(s) for s in step.steps]}
    (out / "results.json").write_text(json.dumps(result, indent=1))
    print(f"gpu-check: {'all steps passed' if result['ok'] else 'FAILED: ' + ', '.join(failed or [str(error)])} "
          f"in {result['seconds']} s; results in {out}")
    return 0 if result["ok"] else 1


def main() -> None:
    parser = argparse.ArgumentParser(prog="scripts/gpu-check.sh", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("pack", "run"):
        p = sub.add_parser(name)
        p.add_argument("--cpu", action="store_true", help="the rehearsal: this host's CPU build, nothing offloaded")
        p.add_argument("--dir", type=Path, default=PAYLOAD, help="the payload folder [gpu-payload]")
    sub.choices["pack"].add_argument("--layers", type=int, default=6, help="blocks of the model kept [6]")
    run_p = sub.choices["run"]
    run_p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu-check-out"))
    run_p.add_argument("--work", type=Path, default=Path("/tmp/specgen-gpu-check"))
    run_p.add_argument("--python", default=sys.executable, help="the Python that runs specgen [this one]")
    run_p.add_argument("--tokens", type=int, default=48, help="bench: tokens per answer [48]")
    run_p.add_argument("--test-timeout", type=int, default=200)
    run_p.add_argument("--bench-timeout", type=int, default=200)
    run_p.add_argument("--deadline", type=int, default=480, help="seconds for the whole run; steps past it "
                       "are stopped, so results come back inside the device call's limit [480]")
    args = parser.parse_args()
    if args.command == "pack":
        pack(args)
    else:
        sys.exit(run(args))


if __name__ == "__main__":
    main()
