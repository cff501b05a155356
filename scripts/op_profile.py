#!/usr/bin/env python3
"""Where a decode of B tokens spends its time, op by op (issue 59): each model at B = 1, 4, 8, 16,
with specgen's kernels and batch invariance (the wheel's default) and with llama.cpp's own kernels
(SPECGEN_KERNELS=0), each in its own process (the setting is read once per process), in rounds
whose order rotates. specgen/llama/profile.py times the nodes through llama.cpp's eval callback;
a node computed alone pays a thread-pool start, measured on the nodes that do no work (views,
reshapes, permutes) and taken off every category ("net"); the plain decode's time, without the
callback, is kept beside the instrumented one.

    python scripts/op_profile.py --out docs/results/profile/DATE.json
    python scripts/op_profile.py --table docs/results/profile/DATE.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

MODELS = ["smollm2-135m-instruct-q4_1", "gemma-3-270m-q4_k_m"]
SETTINGS = {"specgen": {},
            # specgen's product kernels, attention through ggml's per-row loop (what specgen had before
            # its own attention, native/attention.h)
            "specgen, ggml's attention": {"SPECGEN_KERNELS": "q8_0,q4_0,q4_1,q5_0,q5_1,q2_k,q3_k,q4_k,q5_k,q6_k,f16,f32"},
            # F32 weights through ggml's one-row code (what specgen had before its F32 kernel)
            "specgen, ggml's F32 products": {"SPECGEN_KERNELS": "q8_0,q4_0,q4_1,q5_0,q5_1,q2_k,q3_k,q4_k,q5_k,q6_k,f16,attention"},
            # without the Q2_K, Q3_K, Q5_K and F16 kernels (what specgen had before them): ggml's one-row code
            "specgen, ggml's Q2_K/Q3_K/Q5_K/F16 products": {"SPECGEN_KERNELS": "q8_0,q4_0,q4_1,q5_0,q5_1,q4_k,q6_k,f32,attention"},
            # F32 and F16 weights through ggml's vec_dot arithmetic (what specgen had before its own 16-lane
            # arithmetic for them, few_float.h's `lanes`, AVX-512 only)
            "specgen, ggml's F32 arithmetic": {"SPECGEN_KERNELS": "q8_0,q4_0,q4_1,q5_0,q5_1,q2_k,q3_k,q4_k,q5_k,q6_k,f16,f32,q4_0x16,q4_1x16,q5_0x16,q5_1x16,q8_0x16,q3_kx16,q4_kx16,q5_kx16,q6_kx16,attention"},
            # Q4_K and Q6_K weights through vec_dot's arithmetic (specgen's few-column kernels) instead of
            # specgen's packed layouts for them (packed_q4_k.h, packed_q6_k.h)
            "specgen, vec_dot's Q4_K/Q6_K arithmetic": {"SPECGEN_KERNELS": "q8_0,q4_0,q4_1,q5_0,q5_1,q2_k,q3_k,q4_k,q5_k,q6_k,f16x16,f32x16,f16,f32,q4_0x16,q4_1x16,q5_0x16,q5_1x16,q8_0x16,q3_kx16,q5_kx16,attention"},
            # Q4_0, Q5_1 and Q5_K weights through vec_dot's arithmetic instead of specgen's packed layouts
            # for them (packed_q4_0.h, packed_q5_1.h, packed_q5_k.h: the derived smollm2 models)
            "specgen, vec_dot's Q4_0/Q5_1/Q5_K arithmetic": {"SPECGEN_KERNELS": "q8_0,q4_0,q4_1,q5_0,q5_1,q2_k,q3_k,q4_k,q5_k,q6_k,f16x16,f32x16,f16,f32,q4_1x16,q5_0x16,q8_0x16,q4_kx16,q6_kx16,attention"},
            "llama.cpp's kernels": {"SPECGEN_KERNELS": "0"}}
DEFAULT_SETTINGS = ["specgen", "specgen, ggml's attention", "llama.cpp's kernels"]
SIZES = [1, 4, 8, 16]
N_PAST = 256  # tokens of context before each timed decode


def one(model: str, sizes: list[int], repeats: int, threads: int, n_past: int = N_PAST) -> dict:
    from specgen.llama.backend import LlamaModel
    from specgen.llama.profile import profile
    from specgen.models.resolve import resolve

    m = LlamaModel(resolve(model))
    token = m.tokenize(" the", add_special=False)[-1]
    return profile(m, tuple(sizes), n_past, repeats, threads, token)


def measure(args: argparse.Namespace) -> dict:
    from specgen.bench.results import run_info
    from specgen.host import cpu_name, cpu_sample, others_cores

    before = cpu_sample()
    runs = []
    for r in range(args.rounds):
        order = args.settings[r % len(args.settings):] + args.settings[:r % len(args.settings)]
        for model in args.models:
            for setting in order:
                cmd = [sys.executable, __file__, "--one", model, "--sizes", ",".join(map(str, args.sizes)),
                       "--repeats", str(args.repeats), "--threads", str(args.threads), "--n-past", str(args.n_past)]
                proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **SETTINGS[setting]})
                if proc.returncode != 0:
                    sys.exit(f"op_profile: {model} ({setting}) failed: {proc.stderr.strip().splitlines()[-1:]}")
                runs.append({"round": r, "model": model, "setting": setting,
                             "sizes": json.loads(proc.stdout.strip().splitlines()[-1])})
    from specgen.llama.tools import build_info

    return {"run": run_info(), "machine": {"cpu": cpu_name(), "cores": os.cpu_count(),
                                          "others_cores": others_cores(before, cpu_sample()),
                                          "build": build_info().system_info},
            "settings": {"threads": args.threads, "repeats": args.repeats, "rounds": args.rounds, "n_past": args.n_past,
                         "sizes": args.sizes, "env": {k: SETTINGS[k] for k in args.settings}}, "runs": runs}


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def _isa(machine: dict) -> str:
    """", specgen's kernels built for avx2" where the results file names the build's instruction set."""
    found = re.search(r"SPECGEN_KERNELS = (\w+)", machine.get("build", ""))
    return f", specgen's kernels built for {found.group(1)}" if found else ""


def table(path: Path) -> str:
    from specgen.llama.profile import net

    """Per model and setting: ms per decode by category (net of the per-node overhead, median over
    rounds) at each B, each category's c(B)/c(1), and the plain decode's ms."""
    data = json.loads(Path(path).read_text())
    s, machine = data["settings"], data["machine"]
    lines = [f"*{data['run'].get('date', '?')} · commit {str(data['run'].get('commit', '?'))[:10]} · {machine['cpu']}, "
             f"{machine['cores']} cores{_isa(machine)}, {s['threads']} threads (other processes used {machine['others_cores']:.2f} "
             f"cores meanwhile) · {s['n_past']} tokens of context, every row's logits · median of {s['rounds']} "
             f"rounds x {s['repeats']} decodes · results: [{Path(path).name}](results/profile/{Path(path).name})*", ""]
    sizes = [str(b) for b in s["sizes"]]
    for model in dict.fromkeys(r["model"] for r in data["runs"]):
        for setting in dict.fromkeys(r["setting"] for r in data["runs"]):
            mine = [r for r in data["runs"] if r["model"] == model and r["setting"] == setting]
            nets = [{b: net(r["sizes"][b]) for b in sizes} for r in mine]
            cats = sorted({k for n in nets for b in sizes for k in n[b]},
                          key=lambda k: -_median([n[sizes[-1]].get(k, 0.0) for n in nets]))
            lines += [f"**{model}, {setting}**", "",
                      "| ms per decode | " + " | ".join(f"B={b}" for b in sizes) + f" | c({sizes[-1]})/c(1) |",
                      "|---|" + "---|" * (len(sizes) + 1)]
            for k in cats:
                ms = [_median([n[b].get(k, 0.0) for n in nets]) for b in sizes]
                ratio = f"{ms[-1] / ms[0]:.1f}" if ms[0] > 0.005 else ""
                if max(ms) >= 0.05:
                    lines.append(f"| {k} | " + " | ".join(f"{m:.2f}" for m in ms) + f" | {ratio} |")
            plain = [_median([r["sizes"][b]["plain_ms"] for r in mine]) for b in sizes]
            lines += [f"| **decode, no callback** | " + " | ".join(f"**{m:.2f}**" for m in plain) +
                      f" | **{plain[-1] / plain[0]:.2f}** |", ""]
    return "\n".join(lines).rstrip("\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--table", type=Path)
    ap.add_argument("--one")
    ap.add_argument("--models", type=lambda v: v.split(","), default=MODELS)
    ap.add_argument("--sizes", type=lambda v: [int(x) for x in v.split(",")], default=SIZES)
    ap.add_argument("--settings", type=lambda v: v.split(";"), default=DEFAULT_SETTINGS,
                    help=f"';'-separated, of: {'; '.join(SETTINGS)}")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-past", type=int, default=N_PAST, help="tokens of context before each timed decode")
    args = ap.parse_args()
    unknown = [x for x in args.settings if x not in SETTINGS]
    if unknown:
        ap.error(f"--settings: expected names from {'; '.join(SETTINGS)}, found {'; '.join(unknown)}")
    if args.one:
        print(json.dumps(one(args.one, args.sizes, args.repeats, args.threads, args.n_past)))
    elif args.table:
        print(table(args.table))
    elif args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(measure(args), indent=1) + "\n")
        print(table(args.out))
    else:
        ap.error("give --out FILE (measure) or --table FILE (render)")


if __name__ == "__main__":
    main()
