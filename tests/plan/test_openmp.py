"""korch.measure.openmp: the spin of GNU OpenMP's idle workers, set in the environment before torch loads
(each case in a fresh interpreter: the setting is made once, at import)."""

import os
import subprocess
import sys

import pytest

from korch.config import OMP_SPINCOUNT

SHOW = "import os; print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))"


def fresh(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize(
    "code, env, want",
    [
        ("import korch, torch; " + SHOW, {}, f"{OMP_SPINCOUNT} None"),  # korch first: set
        ("import korch; " + SHOW, {"GOMP_SPINCOUNT": "77"}, "77 None"),  # the user's choice kept
        ("import korch; " + SHOW, {"OMP_WAIT_POLICY": "ACTIVE"}, "None ACTIVE"),  # ... or policy
        ("import torch, korch; " + SHOW, {}, "None None"),  # torch already loaded: nothing set
    ],
)
def test_the_spin_is_set_only_before_torch_and_only_unless_chosen(code, env, want):
    assert fresh(code, **env) == want


def test_a_child_process_inherits_it():
    """The profiler's workers are child processes: they run kernels with the parent's setting."""
    code = "import korch, subprocess, sys; subprocess.run([sys.executable, '-c', \"" + SHOW + '"])'
    assert fresh(code) == f"{OMP_SPINCOUNT} None"
