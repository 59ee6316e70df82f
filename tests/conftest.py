import os
import tempfile

import pytest
import torch

# Every test session compiles into its own cache, so builds are exercised and
# results never depend on what an earlier run left in ~/.cache/tailjit.
_CACHE = tempfile.mkdtemp(prefix="tailjit-test-cache-")
os.environ.setdefault("TAILJIT_CACHE_DIR", _CACHE)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
