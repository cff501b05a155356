"""The method table is the one place methods are defined: config validation, bench's defaults and
the CLI read it; a target whose cache cannot drop rejected drafts is refused for every method but
plain; and an installed (non-editable) specgen finds its manifest and default config."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fakes import FakeModel, NoisyDraft
from specgen.drafting import methods as M
from specgen.app.config import RunConfig, build_config
from specgen.costs.curve import CostCurve
from specgen.errors import ConfigError, ModelError
from specgen.app.session import open_session

ROOT = Path(__file__).resolve().parent.parent
FLAT = CostCurve([1, 32], [0.010, 0.012])


def test_config_validation_and_bench_defaults_come_from_the_table():
    with pytest.raises(ConfigError, match="--method must be one of " + ", ".join(M.NAMES)):
        build_config(None, {"method": "magic"})
    assert set(M.usable(has_draft=True, constrained=True)) == set(M.METHODS)
    assert set(M.usable(has_draft=False, constrained=True)) == {n for n, m in M.METHODS.items()
                                                                if m.draft != M.NEEDS_DRAFT}
    # Unconstrained, jump-forward would be plain decoding again: not in the default list.
    assert set(M.usable(has_draft=True)) == set(M.METHODS) - {"jump"}
    assert M.baselines(constrained=True) == ("plain", "jump") and M.baselines(constrained=False) == ("plain",)
    assert {"plain", "lookup", "auto"} <= set(M.usable(has_draft=False))
    with pytest.raises(ConfigError, match="--method chain needs a draft model"):
        M.check_runnable(M.METHODS["chain"], has_draft=False)


def test_every_method_builds_the_drafter_its_table_row_describes():
    target = FakeModel(n_vocab=16)
    session = open_session(RunConfig(target="t", draft="d").loading, list(M.METHODS.values()), target,
                           NoisyDraft(target), lambda model, ctx: CostCurve([1, 32], [0.010, 0.012]))
    for name, method in M.METHODS.items():
        drafter = method.drafter(session.drafter_inputs(method, RunConfig().sampling))
        assert (drafter is None) == (name == "plain"), name
    assert session.timed_target_ctx is not None and session.context_for(M.METHODS["auto"]) is session.timed_target_ctx
    assert session.context_for(M.METHODS["lookup"]) is session.target_ctx


@pytest.mark.parametrize("role", ["target", "draft"])
def test_a_model_that_cannot_roll_back_is_refused_for_speculation(role):
    target = FakeModel(n_vocab=16)
    draft = NoisyDraft(target)
    (target if role == "target" else draft).can_rollback = False
    cfg = RunConfig(target="rwkv.gguf", draft="rwkv-draft.gguf")
    for name in ("lookup", "chain", "tree", "staged", "auto") if role == "target" else ("chain", "auto"):
        with pytest.raises(ModelError, match=f"--method {name} needs a {role} whose cache can drop rejected "
                                             "drafts, but .* is a recurrent or hybrid model: use --method plain"):
            open_session(cfg.loading, [M.METHODS[name]], target, draft, lambda model, ctx: FLAT)
    open_session(cfg.loading, [M.METHODS["plain"]], target, draft)  # plain decoding never rolls back


def test_an_installed_wheel_finds_the_manifest_and_the_default_config(tmp_path):
    """`pip install .` (not editable): the wheel carries models.txt and configs/, and specgen reads
    them from where it is installed."""
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    wheel = next(wheels.glob("specgen-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"specgen/models.txt", "specgen/configs/default.yaml", "specgen/suites/builtin.jsonl",
            "specgen/templates/hermes-tools.jinja"} <= names  # models.txt's template: entries read it
    install = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                              str(wheel)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr
    probe = ("from specgen import host; from specgen.app import config; from specgen.models import manifest; "
             "print(host.PACKAGE_DIR); print(len(manifest.load_manifest())); print(config.build_config(None, {}).target)")
    env = {k: v for k, v in os.environ.items() if k != "SPECGEN_MODELS_TXT"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                         env={**env, "PYTHONPATH": str(site)}, timeout=120)
    assert out.returncode == 0, out.stderr
    package_dir, n_models, default_target = out.stdout.split("\n")[:3]
    assert Path(package_dir) == site / "specgen"  # the installed copy, not this checkout
    assert int(n_models) >= 5 and default_target == "gemma-3-270m-f32"
