"""Measuring: numerical checks against ONNX Runtime, tolerances, busy-machine detection and roofline rates."""
