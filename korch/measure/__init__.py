"""Measuring: the one timing harness (timing), the device (device: synchronize, CUDA events, float32
kept IEEE), numerical checks against ONNX Runtime (check) and their tolerances, busy-machine detection
(busy), where the machine's CPUs sit (placement), roofline rates, and the process settings kernels
are timed and run under: the C heap kept between calls (heap) and the spin of torch's OpenMP workers
(openmp)."""
