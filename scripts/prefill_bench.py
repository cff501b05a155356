#!/usr/bin/env python3
"""Prompt processing: specgen's prefill against llama.cpp's llama-bench, same model, same threads.

Each round runs every configuration once over every prompt size, in an order rotated from round to
round, each in its own process: llama-bench (`-p SIZES -n 0 -r 1`, its own n_batch/n_ubatch
defaults unless given) and specgen's prefill (`kv.prefill` on the context a speculative session
makes) in decodes of at most INVARIANT_ROWS tokens (what `specgen serve` reads every prompt in, and
since 2026-11-29 `generate` too, on every type with specgen's kernel: backend.prompt_chunk) and in
decodes of n_batch (what `generate` read other types than Q4_1 and Q5_1 in before). Each process first reads a 32-token prompt (a warm-up, not reported), then one prompt
of each size, random token ids as llama-bench uses. The threads are fixed (specgen would otherwise
follow the cores other processes leave free). Wall-clock and CPU time are both kept: on a busy
machine, with one thread, CPU time is what other work disturbs least. `--append` adds another run's
rounds (other threads or sizes, fewer configurations) to a results file.

    python scripts/prefill_bench.py --llama-bin DIR --out docs/results/prefill/DATE.json
    python scripts/prefill_bench.py --llama-bin DIR --threads 2 --sizes 512 --append --out FILE
    python scripts/prefill_bench.py --table docs/results/prefill/DATE.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

WARMUP = 32
# name -> (how it runs, its settings): "llama-bench" takes extra flags, "specgen" a chunk
# ("cache" = kv.INVARIANT_ROWS, "batch" = the context's n_batch) and environment.
CONFIGS = {
    "llama.cpp (llama-bench)": ("llama-bench", {"flags": []}),
    "specgen, decodes of 128 (serve, and generate as backend.prompt_chunk says)": ("specgen", {"chunk": "cache", "env": {}}),
    "specgen, decodes of 512 (n_batch)": ("specgen", {"chunk": "batch", "env": {}}),
    # specgen's Python on the very libraries llama-bench runs (no specgen patch, repacked weights)
    "specgen, decodes of 512, on llama-bench's libraries": ("specgen", {"chunk": "batch", "env": {"LLAMA_CPP_LIB_PATH": "{llama_bin}"}}),
}
# For finding where a gap comes from (--configs): llama.cpp in decodes of 128 like the cache's, and
# specgen's wheel with its patch off (SPECGEN_KERNELS=0: llama.cpp's kernels everywhere).
EXTRA = {
    "llama.cpp, -ub 128": ("llama-bench", {"flags": ["-ub", "128"]}),
    "llama.cpp, -b 512 -ub 512": ("llama-bench", {"flags": ["-b", "512", "-ub", "512"]}),
    "specgen, SPECGEN_KERNELS=0": ("specgen", {"chunk": "batch", "env": {"SPECGEN_KERNELS": "0"}}),
    "specgen, SPECGEN_KERNELS=0, chunks of 128": ("specgen", {"chunk": "cache", "env": {"SPECGEN_KERNELS": "0"}}),
}


def prompt_ids(n: int, n_vocab: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(n_vocab) for _ in range(n)]


def one(model: str, sizes: list[int], chunk: str, threads: int) -> dict[int, tuple[float, float]]:
    """In this process: seconds of specgen's prefill of one prompt of each size (after a warm-up),
    wall-clock and this process's CPU time (all its threads, spinning included).
    `kv.prefill` leaves the last token for the first decoding step, so a prompt of n + 1 tokens is
    read to time n tokens, as llama-bench's n."""
    from specgen.app.config import RunConfig
    from specgen.app.session import TARGET_OUTPUTS, TARGET_SEQS, load_target
    from specgen.core.kv import INVARIANT_ROWS, prefill

    target = load_target(RunConfig(target=model).loading, screen_greedy=False)  # as `specgen serve` loads it
    ctx = target.new_context(max(sizes) + 64, n_seq_max=TARGET_SEQS, n_threads=threads, n_outputs=TARGET_OUTPUTS)
    size = INVARIANT_ROWS if chunk == "cache" else None
    out = {}
    for n in [WARMUP, *sizes]:
        tokens = prompt_ids(n + 1, target.n_vocab, n)
        t0, c0 = time.perf_counter(), time.process_time()
        prefill(ctx, tokens, chunk=size)
        out[n] = time.perf_counter() - t0, time.process_time() - c0
    ctx.close()
    return {n: s for n, s in out.items() if n != WARMUP}


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def llama_bench(binary: Path, path: str, sizes: list[int], threads: int, flags: list[str]) -> dict[int, tuple]:
    """Seconds of each size's prompt as llama-bench reports it, and its CPU time: that of a process
    reading the warm-up prompt and this one, less that of a process reading the warm-up prompt alone
    (so it includes creating one more context, which specgen's CPU time does not)."""
    def run(ns: list[int]) -> tuple[dict[int, float], float]:
        cmd = [str(binary), "-m", path, "-p", ",".join(map(str, ns)), "-n", "0", "-r", "1", "--no-warmup",
               "-t", str(threads), "-o", "jsonl", *flags]
        cpu = children_cpu()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        return {r["n_prompt"]: r["samples_ns"][-1] / 1e9 for r in rows}, children_cpu() - cpu

    _, base = run([WARMUP])
    out = {}
    for n in sizes:
        wall, cpu = run([WARMUP, n])
        out[n] = wall[n], cpu - base
    return out


def specgen_run(model: str, sizes: list[int], chunk: str, threads: int, env: dict) -> dict[int, tuple]:
    cmd = [sys.executable, __file__, "--one", model, "--sizes", ",".join(map(str, sizes)), "--chunk", chunk,
           "--threads", str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
    if proc.returncode != 0:
        sys.exit(f"prefill_bench: specgen's run failed: {proc.stderr.strip().splitlines()[-1:]}")
    return {int(n): tuple(s) for n, s in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def measure(args: argparse.Namespace, configs: dict) -> dict:
    from specgen.models import resolve as models
    from specgen.bench.results import run_info
    from specgen.host import cpu_name, cpu_sample, others_cores

    binary = args.llama_bin / "llama-bench"
    samples = []
    data = {"run": run_info(), "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "shared": args.shared},
            "settings": {"threads": args.threads, "rounds": args.rounds, "sizes": args.sizes,
                         "configs": {name: {"kind": k, **how} for name, (k, how) in configs.items()},
                         "llama_bench": str(binary)},
            "samples": samples}
    if args.append and args.out.is_file():  # another run's rounds (other threads, other sizes) beside these
        data = json.loads(args.out.read_text())
        samples = data["samples"]
        settings = data["settings"]
        settings["threads"] = sorted({*settings["threads"], *args.threads})
        settings["sizes"] = sorted({*settings["sizes"], *args.sizes})
        data.setdefault("appended", []).append(run_info())
    for model, threads in [(m, t) for m in args.models for t in args.threads]:
        path = str(models.resolve(model))
        for r in range(args.rounds):
            names = list(configs)
            names = names[r % len(names):] + names[:r % len(names)]
            for name in names:
                kind, how = configs[name]
                before = cpu_sample()
                if kind == "llama-bench":
                    seconds = llama_bench(binary, path, args.sizes, threads, how["flags"])
                else:
                    env = {k: v.format(llama_bin=args.llama_bin) for k, v in how["env"].items()}
                    seconds = specgen_run(model, args.sizes, how["chunk"], threads, env)
                busy = others_cores(before, cpu_sample())
                for n, (wall, cpu) in seconds.items():
                    samples.append({"model": model, "threads": threads, "config": name, "round": r, "n_prompt": n, "seconds": wall,
                                    "cpu_seconds": cpu, "others_cores": None if busy is None else round(busy, 2)})
                args.out.write_text(json.dumps({**data, "load_average": list(os.getloadavg())}, indent=1) + "\n")
                print(f"{model} t={threads} round {r} {name}: " + ", ".join(f"{n}: {w:.2f} s" for n, (w, _) in seconds.items()),
                      file=sys.stderr, flush=True)
    return data


def _ratio(base: dict[int, float], other: dict[int, float]) -> list[float]:
    """llama.cpp's seconds over another configuration's, round by round (above 1: faster)."""
    return sorted(base[r] / other[r] for r in other if r in base and other[r])


def table(path: Path) -> str:
    """A results file as docs/serve.md shows it: per model, threads and prompt size, llama.cpp's
    median seconds and each specgen configuration's speed against it (above 1: faster): the median
    of the per-round ratios of wall-clock times (their range), and with one thread first the ratio
    of median CPU times, what a busy machine disturbs least (a thread waiting for a core uses none;
    with two, a thread spinning at a barrier for a descheduled one does)."""
    data = json.loads(Path(path).read_text())
    m, s = data["machine"], data["settings"]
    names = list(s["configs"])
    lines = [f"*{data['run']['date'][:10]} · commit {data['run']['commit'][:10]} · {m['cpu']}, {m['cores']} cores"
             f"{', shared with other work' if m['shared'] else ''} · {s['rounds']} interleaved rounds · results: "
             f"[{Path(path).name}](results/prefill/{Path(path).name})*", "",
             f"| model | threads | prompt tokens | {names[0]}: seconds | " + " | ".join(f"{n}: speed" for n in names[1:])
             + " |",
             "|---|---|---|---|" + "---|" * (len(names) - 1)]
    models = list(dict.fromkeys(x["model"] for x in data["samples"]))
    keys = sorted({(models.index(x["model"]), x["threads"], x["n_prompt"]) for x in data["samples"]})
    for m_index, threads, n in keys:
        def rounds(name: str, field: str) -> dict[int, float]:
            return {x["round"]: x[field] for x in data["samples"] if x["model"] == models[m_index] and
                    x["threads"] == threads and x["n_prompt"] == n and x["config"] == name}
        base = rounds(names[0], "seconds")
        cells = [f"{statistics.median(base.values()):.2f} ({min(base.values()):.2f}-{max(base.values()):.2f})"]
        if threads == 1:
            cells[0] = f"CPU {statistics.median(rounds(names[0], 'cpu_seconds').values()):.2f} · wall {cells[0]}"
        for name in names[1:]:
            wall = _ratio(base, rounds(name, "seconds"))
            if not wall:  # not run at these threads (an appended run of fewer configurations)
                cells.append("-")
                continue
            cell = f"{statistics.median(wall):.2f}x ({wall[0]:.2f}-{wall[-1]:.2f})"
            if threads == 1:
                cpu = statistics.median(rounds(names[0], "cpu_seconds").values()) / \
                    statistics.median(rounds(name, "cpu_seconds").values())
                cell = f"CPU **{cpu:.2f}x** · wall {cell}"
            cells.append(cell)
        lines.append(f"| {models[m_index]} | {threads} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--table":
        print(table(Path(sys.argv[2])))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--one", metavar="MODEL", help=argparse.SUPPRESS)  # a specgen run's own process
    parser.add_argument("--chunk", choices=["batch", "cache"], default="batch", help=argparse.SUPPRESS)
    parser.add_argument("--models", type=lambda v: v.split(","),
                        default=["smollm2-135m-instruct-q4_1", "gemma-3-270m-q4_k_m"])
    parser.add_argument("--sizes", type=lambda v: [int(x) for x in v.split(",")], default=[128, 512, 1024])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2])
    parser.add_argument("--configs", type=lambda v: v.split(";"), default=list(CONFIGS),
                        help=f"';'-separated, the first is the reference; from: {'; '.join([*CONFIGS, *EXTRA])}")
    parser.add_argument("--llama-bin", type=Path, help="the folder of llama.cpp's llama-bench")
    parser.add_argument("--shared", action="store_true", help="say the machine was shared with other work")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--append", action="store_true", help="add these rounds to --out's")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.sizes, args.chunk, args.threads[0])))
        return
    if args.llama_bin is None or args.out is None:
        parser.error("--llama-bin and --out are needed")
    known = {**CONFIGS, **EXTRA}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    measure(args, {name: known[name] for name in args.configs})  # written as it goes
    print(table(args.out))


if __name__ == "__main__":
    main()
