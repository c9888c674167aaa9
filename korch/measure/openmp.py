"""How long torch's idle OpenMP workers spin before they sleep: korch sets it for its process (and
the profiler's workers, which inherit the environment) before torch loads, as GNU OpenMP reads
GOMP_SPINCOUNT once, when it is loaded.

After each parallel loop GNU OpenMP's workers wait for the next by spinning, 300,000 times by
default, on the cores the rest of the process needs. In a plan that mixes runtimes, the ONNX Runtime
or OpenVINO kernel after an Inductor or vendor kernel then shares the cores with workers waiting
for nothing (BENCHMARKS.md, "the solver's plans in sequence"); with OMP_SPINCOUNT spins they go to
sleep soon after. Nothing is set where the user set GOMP_SPINCOUNT or OMP_WAIT_POLICY, or where
torch was imported before korch (the process's OpenMP is already configured, and its profiling
workers should run kernels as it does)."""

from __future__ import annotations

import os
import sys

from korch.config import OMP_SPINCOUNT


def set_spin() -> bool:
    """GOMP_SPINCOUNT set to OMP_SPINCOUNT unless the user chose or torch is loaded; whether it was."""
    if "torch" in sys.modules or "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ:
        return False
    os.environ["GOMP_SPINCOUNT"] = str(OMP_SPINCOUNT)
    return True


set_spin()
