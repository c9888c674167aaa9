"""Measuring: the one timing harness (timing), the device (device: synchronize, CUDA events, float32
kept IEEE), numerical checks against ONNX Runtime (check) and their tolerances, busy-machine detection
(busy) and roofline rates."""
