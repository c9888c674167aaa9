"""The in-place correction of the cost model (korch.plan.refine): what running inside a plan adds
to each kernel of a backend, and the price of a kernel not measured in place."""

import pytest

from korch.config import IN_PLACE_FLOOR
from korch.plan.refine import corrected, extra_per_kernel


def test_in_place_calibration_takes_no_per_kernel_cost_from_one_kernel_and_may_lower_a_cost():
    """What running inside a plan adds to each kernel (korch.plan.refine.extra_per_kernel): one
    whole-graph kernel 0.26 ms faster in place once priced every other ONNX Runtime kernel 0.26 ms
    cheaper (down to nothing), and a 305-kernel plan was predicted at 0.84 ms; it ran in 57. Kernels
    that run faster in place than alone are priced lower (the median difference, negative)."""
    assert extra_per_kernel([("onnxruntime", 7.212, 6.951)]) == {}
    assert extra_per_kernel([("onnxruntime", 7.212, 7.951)]) == {}
    faster = [("inductor", 0.30, 0.20), ("inductor", 0.10, 0.05), ("inductor", 0.40, 0.38)]
    assert extra_per_kernel(faster) == {"inductor": pytest.approx(-0.05)}
    slower = [("vendor", 0.10, 0.13), ("vendor", 0.20, 0.22), ("vendor", 0.05, 0.10)]
    slower.append(("onnxruntime", 1.0, 0.5))  # one kernel of its backend: nothing for onnxruntime
    assert extra_per_kernel(slower) == {"vendor": pytest.approx(0.03)}


def test_a_negative_correction_lowers_a_cost_down_to_the_floor():
    """The in-place correction of a kernel not measured in place (korch.plan.refine.corrected): its
    isolated time plus its backend's extra per kernel, which may lower it, never below
    IN_PLACE_FLOOR of the isolated time."""
    assert corrected(1.0, 0.25) == pytest.approx(1.25)
    assert corrected(1.0, -0.25) == pytest.approx(0.75)  # lowered
    assert corrected(0.1, -0.25) == pytest.approx(0.1 * IN_PLACE_FLOOR)  # floored, not negative
    assert corrected(0.1, -0.25) > 0
