import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def zoo_dir(tmp_path_factory):
    """Zoo models are built once per session (or reused from $KORCH_ZOO when set)."""
    env = os.environ.get("KORCH_ZOO")
    return Path(env) if env else tmp_path_factory.mktemp("zoo")
