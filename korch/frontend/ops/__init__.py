"""Builders both front ends lower with (activations, math functions, matmuls, normalizations,
indexing, scatters, pooling, resampling, attention): ONNX's rules (frontend/onnx) and ATen's
(frontend/torch) import them from here, neither from the other's rule modules."""
