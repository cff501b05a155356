"""Whether this llama.cpp build decodes batch-invariantly (specgen's patch, specgen/llama/native),
for the tests that check losslessness bit for bit (test_kernels.py, test_lossless_real.py).

Without the patch those checks cannot pass, and skipping them would leave losslessness unchecked
while the suite stays green. So inside `make test`, which builds the patch and sets
SPECGEN_REQUIRE_INVARIANT=1, its absence fails each such test; elsewhere (llama-cpp-python from
PyPI, a GPU build) they are skipped and the skip says why."""

import os
import re

import pytest

REQUIRED = os.environ.get("SPECGEN_REQUIRE_INVARIANT") == "1"


def missing() -> str | None:
    """Why this build does not decode batch-invariantly and what to do, in one line; None when it does."""
    from specgen.llama import tools

    found = re.search(r"SPECGEN_INVARIANT = (\w+)", tools.build_info().system_info)
    if found is None:
        return ("llama.cpp was built without specgen's batch-invariance patch (no SPECGEN_INVARIANT in its "
                "system info; `python -m specgen.llama.build` builds it in)")
    if found.group(1) != "on":
        setting = os.environ.get("SPECGEN_KERNELS")
        return f"specgen's batch invariance is turned off (SPECGEN_KERNELS={setting!r}; unset it)"
    return None


@pytest.fixture
def invariant_build():
    """Fails (inside `make test`) or skips (elsewhere) a test when the build is not batch-invariant."""
    why = missing()
    if why is None:
        return
    if REQUIRED:
        pytest.fail(f"{why}: inside `make test` (SPECGEN_REQUIRE_INVARIANT=1) that is a failure, since "
                    "losslessness on quantized targets would go unchecked", pytrace=False)
    pytest.skip(f"{why}; skipped outside `make test` (SPECGEN_REQUIRE_INVARIANT=1 makes this a failure)")


needs_invariance = pytest.mark.usefixtures("invariant_build")
