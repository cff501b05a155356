import contextlib
import http.server
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

SMOLLM2 = "smollm2-135m-instruct-q4_1"
GEMMA = "gemma-3-270m-q4_k_m"


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
    from specgen.llama.backend import LlamaModel

    return LlamaModel(smollm2_path)


@pytest.fixture(scope="session")
def gemma(gemma_path):
    from specgen.llama.backend import LlamaModel

    return LlamaModel(gemma_path)


@pytest.fixture(scope="session")
def smollm2_f32():
    from specgen.models import resolve as models
    from specgen.llama.backend import LlamaModel

    return LlamaModel(models.resolve("smollm2-135m-instruct-f32"))


@pytest.fixture(scope="session")
def gemma_f32():
    from specgen.models import resolve as models
    from specgen.llama.backend import LlamaModel

    return LlamaModel(models.resolve("gemma-3-270m-f32"))


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


@contextlib.contextmanager
def serve_directory(directory: Path):
    """A quiet local HTTP server for `directory`; yields its base URL (URL pulls without internet)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(directory), **kw)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
