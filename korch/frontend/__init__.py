"""Front ends: turn an ONNX model into a primitive graph (the rule modules register themselves)."""

from korch.frontend.lowering import FissionResult
from korch.frontend.onnx import (  # noqa: F401  (imported for their registrations)
    rules_attention,
    rules_contrib,
    rules_contrib_attention,
    rules_elementwise,
    rules_grid,
    rules_layout,
    rules_linear,
    rules_pool,
    rules_quant,
    rules_recurrent,
    rules_reduce,
    rules_resize,
    rules_scatter,
    rules_signal,
)
from korch.frontend.onnx.importer import import_onnx, load_model

__all__ = ["FissionResult", "import_onnx", "load_model"]
