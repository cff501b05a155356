"""How far specgen's own arithmetic moves a model's next-token distributions from stock llama.cpp's.

Decodes a text one token at a time (plain decoding's path) eight ways, each in a process of its own
(SPECGEN_KERNELS is read once per process), the same build:
  specgen                 specgen's batch-invariant kernels (the default)
  specgen, attention alone   batch invariance, specgen's attention, ggml's one-row products
  specgen, products alone    batch invariance, specgen's product kernels (its own packed Q4_0 .. Q6_K and, on
                          AVX-512, 16-lane F32/F16 arithmetic included), ggml's per-row attention loop
  specgen, ggml's F32 arithmetic   specgen's kernels, but F32 and F16 weights through ggml's vec_dot
                          arithmetic instead of specgen's 16-lane one (f32x16, f16x16): on an F32 model
                          what that arithmetic alone adds; elsewhere the same as `specgen`
  specgen, ggml's one-row code   batch invariance with ggml's one-row code only
  llama.cpp               SPECGEN_KERNELS=0: llama.cpp's own kernels, as it ships
  llama.cpp, no repack    the same with llama.cpp's weight repacking off (use_extra_bufts = false)
  llama.cpp, F32 KV cache llama.cpp's kernels with keys, values and attention in F32 (no flash
                          attention): nearer the exact sums, a second reference
and reports, against `llama.cpp` and against the F32-cache reference, the mean, 99th percentile and
largest KL divergence of the next-token distribution, top-1 agreement, and each one's perplexity on
the text: specgen's distance set beside llama.cpp's own distance between repack on and off (nil on
F32 models: llama.cpp repacks no F32 weights), and its attention's beside llama.cpp's F16 rounding
(issue 69's safeguard).

    python scripts/kernel_distance.py MODEL TEXT OUT.json [--tokens N] [--threads 1]
    python scripts/kernel_distance.py --render OUT.json ...     # the table docs/ shows

TEXT: a text available offline, e.g. Debian's /usr/share/common-licenses/GPL-3.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

CONFIGS = {"specgen": {"SPECGEN_KERNELS": "1"},
           "specgen, attention alone": {"SPECGEN_KERNELS": "attention"},
           "specgen, products alone": {"SPECGEN_KERNELS": "q8_0,q4_0,q4_1,q5_0,q5_1,q2_k,q3_k,q4_k,q5_k,q6_k,f16x16,f32x16,"
                                                          "f16,f32,q4_0x16,q4_1x16,q5_0x16,q5_1x16,q8_0x16,q3_kx16,q4_kx16,q5_kx16,q6_kx16"},
           # specgen with F32 and F16 weights through ggml's vec_dot arithmetic (`floats`) instead of its own
           # 16-lane arithmetic (few_float.h's `lanes`, f32x16/f16x16, AVX-512 only): on an F32 model, `specgen`
           # less that arithmetic (set beside `specgen`, what it alone moves); without F32/F16 weights, `specgen`
           "specgen, ggml's F32 arithmetic": {"SPECGEN_KERNELS": "q8_0,q4_0,q4_1,q5_0,q5_1,q2_k,q3_k,q4_k,q5_k,q6_k,f16,f32,"
                                                                 "q4_0x16,q4_1x16,q5_0x16,q5_1x16,q8_0x16,q3_kx16,q4_kx16,q5_kx16,q6_kx16,attention"},
           "specgen, ggml's one-row code": {"SPECGEN_KERNELS": "ggml"},
           "llama.cpp": {"SPECGEN_KERNELS": "0"},
           "llama.cpp, no repack": {"SPECGEN_KERNELS": "0", "KERNEL_DISTANCE_NO_REPACK": "1"},
           "llama.cpp, F32 KV cache": {"SPECGEN_KERNELS": "0", "KERNEL_DISTANCE_F32_KV": "1"}}
REFERENCE = "llama.cpp"
CLOSER = "llama.cpp, F32 KV cache"  # no F16 rounding of keys, values or scores: nearer the exact sums


def worker(model: str, text_file: str, n: int, threads: int, out: str) -> None:
    """Decode the text's first n tokens one at a time; log-softmax rows into a float32 memmap."""
    from specgen.llama import backend
    from specgen.models import resolve

    if os.environ.get("KERNEL_DISTANCE_NO_REPACK"):
        defaults = backend.L.llama_model_default_params

        def no_repack():
            params = defaults()
            params.use_extra_bufts = False
            return params

        backend.L.llama_model_default_params = no_repack
    if os.environ.get("KERNEL_DISTANCE_F32_KV"):
        context_defaults = backend.L.llama_context_default_params

        def f32_kv():
            params = context_defaults()
            params.type_k = params.type_v = 0  # GGML_TYPE_F32
            params.flash_attn_type = 0  # disabled: K Q and the weighted V in F32
            return params

        backend.L.llama_context_default_params = f32_kv
    from specgen.core.kv import evaluate

    m = backend.LlamaModel(resolve.resolve(model))
    tokens = m.tokenize(Path(text_file).read_text(encoding="utf-8"))[:n + 1]
    ctx = m.new_context(len(tokens) + 8, n_threads=threads)
    rows = np.lib.format.open_memmap(out, mode="w+", dtype=np.float32, shape=(len(tokens) - 1, m.n_vocab))
    row = evaluate(ctx, tokens[:1])
    for i in range(1, len(tokens)):
        z = row.astype(np.float64)
        z -= z.max()
        rows[i - 1] = (z - np.log(np.exp(z).sum())).astype(np.float32)
        row = evaluate(ctx, [tokens[i]], i)
    rows.flush()
    np.save(out + ".tokens.npy", np.array(tokens[1:], dtype=np.int64))


def against(ref: np.ndarray, x: np.ndarray, n: int) -> dict:
    """KL(ref || x) per position (mean, 99th percentile, largest) and top-1 agreement."""
    kld, top1 = [], 0
    for i in range(n):
        p_log, q_log = ref[i].astype(np.float64), x[i].astype(np.float64)
        kld.append(float(np.sum(np.exp(p_log) * (p_log - q_log))))
        top1 += int(np.argmax(p_log) == np.argmax(q_log))
    return dict(kld_mean=float(np.mean(kld)), kld_p99=float(np.quantile(kld, 0.99)), kld_max=float(np.max(kld)),
                top1_agreement=top1 / n)


def compare(files: dict[str, str]) -> dict:
    truth = np.load(files[REFERENCE] + ".tokens.npy")
    n = len(truth)
    refs = {name: np.load(files[name], mmap_mode="r") for name in (REFERENCE, CLOSER)}
    out = {}
    for name, path in files.items():
        x = np.load(path, mmap_mode="r")
        nll = -float(sum(x[i, truth[i]] for i in range(n)))
        out[name] = dict(perplexity=float(np.exp(nll / n)), against_llama_cpp=against(refs[REFERENCE], x, n),
                         against_f32_kv=against(refs[CLOSER], x, n))
    return out


HEADER = ["| model | tokens | decoded with | perplexity | KL to llama.cpp (mean / p99 / max) | top-1 = llama.cpp's "
          "| KL to F32-cache llama.cpp (mean) | top-1 = its |", "|---|---|---|---|---|---|---|---|"]


def rows(d: dict) -> list[str]:
    """One results file's table rows (kept in the file as `table`, so a page's figures are found there)."""
    out = []
    for name, c in d["configs"].items():
        a, b = c["against_llama_cpp"], c["against_f32_kv"]
        out.append(f"| {d['model']} | {d['tokens']} | {name} | {c['perplexity']:.3f} | {a['kld_mean']:.5f} / "
                   f"{a['kld_p99']:.4f} / {a['kld_max']:.4f} | {100 * a['top1_agreement']:.1f}% | "
                   f"{b['kld_mean']:.5f} | {100 * b['top1_agreement']:.1f}% |")
    return out


def render(files: list[str]) -> str:
    """The markdown table docs/screening-and-kernels.md shows (`--render FILE.json ...`)."""
    return "\n".join(HEADER + [r for f in files for r in rows(json.loads(Path(f).read_text()))])


def main() -> None:
    if sys.argv[1:2] == ["--render"]:
        print(render(sys.argv[2:]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.model, args.text, args.tokens, args.threads, args.worker)
        return
    with tempfile.TemporaryDirectory(prefix="specgen-kdist-") as tmp:
        files = {}
        for i, (name, env) in enumerate(CONFIGS.items()):
            files[name] = f"{tmp}/{i}.npy"
            subprocess.run([sys.executable, __file__, args.model, args.text, args.out, "--tokens", str(args.tokens),
                            "--threads", str(args.threads), "--worker", files[name]],
                           env={**os.environ, **env}, check=True, stderr=subprocess.DEVNULL)
        stats = compare(files)
        n = int(len(np.load(files[REFERENCE] + ".tokens.npy")))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    from specgen.host import cpu_flags, cpu_name

    result = dict(run=dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                           command=["python", "scripts/kernel_distance.py", *sys.argv[1:]], commit=commit),
                  machine=dict(cpu=cpu_name(), avx512="avx512f" in cpu_flags(), threads=args.threads),
                  model=args.model, text=args.text, tokens=n, reference=REFERENCE, configs=stats)
    result["table"] = rows(result)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
