"""The intermediate representation: primitives (prims), primitive graphs (graph), their JSON form (serialize),
the numpy reference that defines each primitive's values, and arrays across numpy and torch (tensors)."""
