import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import harness  # noqa: E402 (after the path it is found on)
from harness import GEMMA, SMOLLM2, serve_directory  # noqa: E402,F401 (names test modules once took from here)


@pytest.fixture(scope="session", autouse=True)
def shared_servers():
    """harness.server()'s processes, each stopped (and checked to exit cleanly) when the run ends."""
    yield
    harness.stop_servers()


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from specgen.models import resolve as models

    return models.resolve(SMOLLM2)


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    from specgen.models import resolve as models

    return models.resolve(GEMMA)


@pytest.fixture(scope="session")
def smollm2(smollm2_path):
    return harness.model(SMOLLM2)


@pytest.fixture(scope="session")
def gemma(gemma_path):
    return harness.model(GEMMA)


@pytest.fixture(scope="session")
def smollm2_f32():
    return harness.model(harness.SMOLLM2_F32)


@pytest.fixture(scope="session")
def gemma_f32():
    return harness.model(harness.GEMMA_F32)


@pytest.fixture
def warnings(monkeypatch):
    """What lower layers warn about (reporter.reporter()), and a fresh list of failed writes."""
    from specgen import reporter

    class Recorder(reporter.Reporter):
        def __init__(self):
            self.warnings = []

        def warn(self, message):
            self.warnings.append(message)

    recorder = Recorder()
    monkeypatch.setattr(reporter, "_failed_writes", [])
    old = reporter.use(recorder)
    yield recorder.warnings
    reporter.use(old)


@pytest.fixture
def isolated_home(tmp_path, monkeypatch):
    """A SPECGEN_HOME of its own, for tests that write to the model cache."""
    monkeypatch.setenv("SPECGEN_HOME", str(tmp_path / "home"))
    return tmp_path / "home"
