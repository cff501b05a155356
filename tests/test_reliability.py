"""Nothing lost, nothing silent: output paths checked before the work, writes that fail later (a
full disk) keep what was finished, damaged state files set aside and rebuilt, values out of range
refused in one line."""

import errno
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from clihelp import assert_one_line_error, specgen
from harness import SMOLLM2
from specgen import reporter
from specgen.errors import ConfigError


# --- output paths, checked before the work -------------------------------------------------------


@pytest.mark.parametrize("option, path, message", [
    ("--json", "/proc/x.json", "--json: cannot write in /proc"),
    ("--json", "{tmp}/missing/x.json", "--json expects a file in an existing folder, found nothing at {tmp}/missing"),
    ("--json", "{tmp}", "--json expects a file to write, found a folder: {tmp}"),
    ("--plot", "/proc/x.svg", "--plot: cannot write in /proc"),
])
def test_bench_refuses_an_unwritable_output_before_the_first_prompt(tmp_path, option, path, message):
    path, message = path.format(tmp=tmp_path), message.format(tmp=tmp_path)
    proc = specgen("bench", "-m", SMOLLM2, "--methods", "plain", "--limit", "1", "-n", "4", option, path)
    assert_one_line_error(proc, message)
    assert "bench:" not in proc.stderr  # no prompt was run


def test_check_writable_leaves_nothing_behind(tmp_path):
    from specgen.files import check_writable

    check_writable(tmp_path / "out.json", "--json")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="found a file at"):
        check_writable(tmp_path / "file" / "out.json", "--json")


# --- writes that fail later ----------------------------------------------------------------------


def test_a_store_on_a_full_disk_is_said_once_and_the_run_goes_on(tmp_path, warnings):
    from specgen.drafting.history import Store

    path = tmp_path / "full.u32"
    path.symlink_to("/dev/full")  # every write: ENOSPC
    store = Store(path)
    store.append([1, 2, 3])
    store.append([4, 5, 6])
    assert store.failed and reporter.failed_writes() == [str(path)]
    assert len(warnings) == 1 and f"could not write {path}: No space left on device" in warnings[0]


def test_a_store_path_under_a_file_does_not_crash(tmp_path, warnings):
    from specgen.drafting.history import Store

    (tmp_path / "history").write_text("not a folder")
    store = Store(tmp_path / "history" / "abc.u32")
    assert len(store.read()) == 0
    store.append([1, 2, 3])
    assert store.failed and len(reporter.failed_writes()) == 1


def test_a_calibration_that_cannot_be_cached_serves_the_run(tmp_path, warnings, monkeypatch):
    import specgen.costs.cache as cache
    from specgen.costs.curve import CostCurve

    def full(path, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(cache, "write_text", full)
    cache.save_cached(tmp_path / "c.json", CostCurve([1, 2], [0.01, 0.015]))
    assert reporter.failed_writes() == [str(tmp_path / "c.json")] and "serves this run only" in warnings[0]


def test_replacing_removes_its_temporary_file_when_the_write_fails(tmp_path):
    from specgen.files import replacing

    with pytest.raises(OSError):
        with replacing(tmp_path / "x.json") as tmp:
            tmp.write_text("half")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def full_home(tmp_path):
    """A SPECGEN_HOME on a 64 KiB tmpfs filled to the last byte (needs the right to mount)."""
    home = tmp_path / "home"
    home.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(home)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with open(home / "filler", "wb") as f:
            with pytest.raises(OSError):
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
    except OSError:
        pass
    yield home
    subprocess.run(["umount", str(home)], capture_output=True)


@pytest.mark.real
def test_a_full_disk_keeps_every_record_and_says_which_write_failed(tmp_path, full_home, smollm2_path):
    prompts = tmp_path / "three.txt"
    prompts.write_text("1, 2, 3, 4,\nThe capital of France is\na, b, c, d,\n")
    proc = specgen("generate", "-m", str(smollm2_path), "--no-chat", "-n", "12", "--json", "-f", str(prompts),
                   env={"SPECGEN_HOME": str(full_home)})
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["prompt_index"] for r in records] == [0, 1, 2] and all(r["text"] for r in records), proc.stderr
    assert proc.returncode == 74 and "Traceback" not in proc.stderr
    assert "could not write" in proc.stderr and "No space left on device" in proc.stderr
    assert [p for p in full_home.rglob(".*") if p.is_file()] == []  # no temporary file left
    for store in full_home.glob("history/*"):
        assert store.stat().st_size == 0  # the failed append was taken back: never half a text


@pytest.mark.real
def test_a_bench_whose_json_cannot_be_written_keeps_its_table(tmp_path, full_home, smollm2_path):
    out = full_home / "b.json"  # creating a file still works on a full disk: writing it does not
    proc = specgen("bench", "-m", str(smollm2_path), "--methods", "plain,lookup", "--limit", "1", "-n", "8",
                   "--json", str(out), env={"SPECGEN_HOME": str(tmp_path / "home2")})
    assert proc.returncode == 74 and "Traceback" not in proc.stderr
    assert "lookup" in proc.stdout and "overall" in proc.stdout  # the table
    assert f"specgen: error: could not write --json {out}: No space left on device" in proc.stderr
    assert not out.exists() and [p for p in full_home.rglob(".*") if p.is_file()] == []


# --- state files read back -----------------------------------------------------------------------


GOOD = {"sizes": [1, 2, 4], "seconds": [0.010, 0.012, 0.016]}


@pytest.mark.parametrize("content", [
    "not json",
    json.dumps([1, 2]),
    json.dumps({**GOOD, "sizes": []}),
    json.dumps({**GOOD, "seconds": [0, 0, 0]}),
    json.dumps({**GOOD, "seconds": [0.01, float("nan"), -1]}),
    json.dumps({**GOOD, "sizes": [1, 2]}),
    json.dumps({**GOOD, "sizes": [4, 2, 1]}),
    json.dumps({**GOOD, "per_context": float("inf")}),
])
def test_a_damaged_calibration_is_set_aside_with_one_warning(tmp_path, warnings, content):
    from specgen.costs.cache import load_cached

    path = tmp_path / "curve.json"
    path.write_text(content)
    assert load_cached(path) is None
    assert not path.exists() and (tmp_path / "curve.json.bad").read_text() == content
    assert len(warnings) == 1 and str(path) in warnings[0] and "moved to curve.json.bad" in warnings[0]


def test_a_sound_calibration_reads_back_as_written(tmp_path, warnings):
    from specgen.costs.cache import load_cached, save_cached
    from specgen.costs.curve import CostCurve

    save_cached(tmp_path / "c.json", CostCurve([1, 2, 4], [0.010, 0.012, 0.016], per_context=1e-7))
    curve = load_cached(tmp_path / "c.json")
    assert curve.sizes == [1, 2, 4] and curve.seconds == [0.010, 0.012, 0.016] and warnings == []


def specgen_caching_every_curve(*args, env):
    """The CLI, caching its calibration even when other processes keep the machine busy (a shared
    test machine would otherwise leave nothing in the cache to damage)."""
    return subprocess.run([sys.executable, "-c", "import specgen.costs.curve as c; c.BUSY_CORES = float('inf'); "
                           "from specgen.cli import main; main()", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


@pytest.mark.real
def test_a_poisoned_calibration_changes_no_text(tmp_path, smollm2_path):
    env = {"SPECGEN_HOME": str(tmp_path)}
    args = ("generate", "-m", str(smollm2_path), "--no-chat", "-n", "48", "-d", "none",
            "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\ndef fact(n):")
    plain = specgen(*args, "--method", "plain", env=env)
    first = specgen_caching_every_curve(*args, "--method", "auto", env=env)  # measures and caches the curve
    [curve] = (tmp_path / "calibration").glob("*.json")
    data = json.loads(curve.read_text())
    data["seconds"] = [float("nan")] + [-1.0] * (len(data["seconds"]) - 1)
    curve.write_text(json.dumps(data))
    again = specgen_caching_every_curve(*args, "--method", "auto", env=env)
    assert again.returncode == 0 and again.stdout == first.stdout == plain.stdout
    assert f"{curve}: not a valid calibration" in again.stderr and Path(f"{curve}.bad").exists()
    assert curve.exists()  # measured again and cached


# --- values --------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag, value, message", [
    ("--seed", "-1", "--seed expects a whole number from 0 to 4294967295, found -1"),
    ("--seed", str(2**32), f"--seed expects a whole number from 0 to 4294967295, found {2**32}"),
    ("--threads", "100000", "--threads expects at most"),
])
def test_values_out_of_range_are_one_line(flag, value, message):
    assert_one_line_error(specgen("generate", "-m", SMOLLM2, flag, value, "hi"), message)


def test_more_threads_than_cores_is_a_warning(warnings):
    from specgen.app.config import THREADS_REFUSED, check_threads
    from specgen.host import default_threads

    cores = default_threads()
    check_threads(cores)
    assert warnings == []
    check_threads(cores + 1)
    assert len(warnings) == 1 and f"more than the {cores} cores" in warnings[0]
    with pytest.raises(ConfigError, match=f"found {THREADS_REFUSED * cores + 1}"):
        check_threads(THREADS_REFUSED * cores + 1)


def test_cache_clear_removes_a_file_where_the_history_folder_should_be(tmp_path):
    (tmp_path / "history").write_bytes(uuid.uuid4().bytes)
    proc = specgen("cache", "clear", env={"SPECGEN_HOME": str(tmp_path)})
    assert proc.returncode == 0 and "history: removed 1 files" in proc.stdout, proc.stderr
    assert not (tmp_path / "history").exists()


@pytest.mark.real
def test_a_damaged_screened_copy_is_set_aside_made_again_and_exact(tmp_path, monkeypatch, warnings):
    import numpy as np

    from specgen.models import resolve as models
    from specgen.app.config import RunConfig
    from specgen.models.manifest import known_sha256, models_dir
    from specgen.app.session import load_session
    from specgen.llama import screen
    from harness import tokens_of

    cfg = RunConfig(target="smollm2-135m-instruct-f32", draft=None, method="plain", chat=False)
    load_session(cfg.loading, ["plain"])  # the real cache holds its screened copy
    path = models.resolve(cfg.target)
    real = screen.screened_path(path, known_sha256(cfg.target, path))
    home = tmp_path / "home"
    (home / "screened").mkdir(parents=True)
    (home / "models").symlink_to(models_dir())
    copy = home / "screened" / real.name
    for suffix in (".gguf", ".json"):
        copy.with_suffix(suffix).symlink_to(real.with_suffix(suffix))
    with np.load(real.with_suffix(".npz")) as norms:
        err_l1, q_l1 = norms["err_l1"].copy(), norms["q_l1"]
    err_l1[7, 0] = np.nan  # a bound that no longer bounds anything
    np.savez(copy.with_suffix(".npz"), err_l1=err_l1, q_l1=q_l1)
    monkeypatch.setenv("SPECGEN_HOME", str(home))

    screened = load_session(cfg.loading, ["plain"])
    assert len(warnings) == 1 and f"{copy}: a damaged screened copy" in warnings[0]
    assert copy.with_name(copy.name + ".bad").is_symlink() and copy.with_suffix(".npz.bad").is_file()
    assert screen.is_derived(copy) and not copy.is_symlink()  # made again
    assert screened.target.screen is not None
    monkeypatch.setenv("SPECGEN_SCREEN", "0")
    own = load_session(cfg.loading, ["plain"])
    prompt = "The three primary colours are"
    assert tokens_of("plain", prompt, target=cfg.target, draft=None, n=48, on=screened) == \
        tokens_of("plain", prompt, target=cfg.target, draft=None, n=48, on=own)
