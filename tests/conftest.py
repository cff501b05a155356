import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

SMOLLM2 = "smollm2-135m-instruct-q4_1"
GEMMA = "gemma-3-270m-q4_k_m"


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    from specgen import models

    return models.resolve(SMOLLM2)


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    from specgen import models

    return models.resolve(GEMMA)


@pytest.fixture(scope="session")
def smollm2(smollm2_path):
    from specgen.backend import LlamaModel

    return LlamaModel(smollm2_path)


@pytest.fixture(scope="session")
def gemma(gemma_path):
    from specgen.backend import LlamaModel

    return LlamaModel(gemma_path)


@pytest.fixture(scope="session")
def smollm2_f32():
    from specgen import models
    from specgen.backend import LlamaModel

    return LlamaModel(models.resolve("smollm2-135m-instruct-f32"))


@pytest.fixture(scope="session")
def gemma_f32():
    from specgen import models
    from specgen.backend import LlamaModel

    return LlamaModel(models.resolve("gemma-3-270m-f32"))


@pytest.fixture
def isolated_home(tmp_path, monkeypatch):
    """A SPECGEN_HOME of its own, for tests that write to the model cache."""
    monkeypatch.setenv("SPECGEN_HOME", str(tmp_path / "home"))
    return tmp_path / "home"
