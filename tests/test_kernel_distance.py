"""scripts/kernel_distance.py's settings name kernels the native code knows (a list that names a kernel
the build lacks, or misses one it has, measures something other than its label), and its table renders."""

import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "specgen" / "llama" / "native"


def _script():
    spec = importlib.util.spec_from_file_location("kernel_distance", ROOT / "scripts" / "kernel_distance.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _products() -> set[str]:
    """The product kernels' SPECGEN_KERNELS keys: few_columns.h's PRODUCTS and the packed kernels' NAMEs."""
    names = set(re.findall(r'\{ "(\w+)", GGML_TYPE_', (NATIVE / "few_columns.h").read_text()))
    for header in NATIVE.glob("*.h"):
        names |= set(re.findall(r'NAME = "(\w+)"', header.read_text()))
    assert {"q4_1", "f32", "f32x16", "f16x16", "q4_1x16"} <= names
    return names


def _listed(setting: dict) -> set[str]:
    return set(setting["SPECGEN_KERNELS"].split(","))


def test_each_listed_setting_names_only_kernels_the_code_has():
    products = _products()
    for name, env in _script().CONFIGS.items():
        if "," in env["SPECGEN_KERNELS"]:
            assert _listed(env) <= products | {"attention"}, name


def test_products_alone_is_every_product_kernel_and_ggmls_f32_arithmetic_every_kernel_but_the_16_lane_ones():
    configs, products = _script().CONFIGS, _products()
    assert _listed(configs["specgen, products alone"]) == products
    assert _listed(configs["specgen, ggml's F32 arithmetic"]) == (products - {"f32x16", "f16x16"}) | {"attention"}


def test_render_writes_one_row_per_setting_after_the_header(tmp_path):
    script = _script()
    stats = dict(perplexity=19.8554, against_llama_cpp=dict(kld_mean=0.004421, kld_p99=0.02291, kld_max=0.0946,
                                                            top1_agreement=0.9603),
                 against_f32_kv=dict(kld_mean=0.00404, kld_p99=0.02, kld_max=0.09, top1_agreement=0.962))
    path = tmp_path / "d.json"
    path.write_text(json.dumps(dict(model="m", tokens=2000, configs={"specgen": stats, "llama.cpp": stats})))
    lines = script.render([str(path)]).splitlines()
    assert lines[:2] == script.HEADER
    assert lines[2] == "| m | 2000 | specgen | 19.855 | 0.00442 / 0.0229 / 0.0946 | 96.0% | 0.00404 | 96.2% |"
    assert len(lines) == 4
