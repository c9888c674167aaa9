import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
# the shared helpers (helpers.py, faulty_backends.py, ...) and the stage folders, whose test modules
# share fixtures by import (test_solver imports test_candidates' random graphs)
STAGES = sorted(str(d) for d in HERE.iterdir() if d.is_dir() and d.name.isidentifier() and d.name[0] != "_")
sys.path[:0] = [str(HERE), *STAGES]


@pytest.fixture(scope="session")
def zoo_dir(tmp_path_factory):
    """Zoo models are built once per session (or reused from $KORCH_ZOO when set)."""
    env = os.environ.get("KORCH_ZOO")
    return Path(env) if env else tmp_path_factory.mktemp("zoo")


def pytest_collection_modifyitems(config, items):
    """Every test under tests/e2e/ is end to end (marked e2e) without saying so in each file."""
    e2e = HERE / "e2e"
    for item in items:
        if e2e in item.path.parents:
            item.add_marker(pytest.mark.e2e)
