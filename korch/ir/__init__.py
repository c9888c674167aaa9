"""The intermediate representation: tensor types (tensor_type), the primitives and their table
(prims: kind, shape rule in shapes, numpy reference in numpy_ops, FLOPs and views counted in work),
primitive graphs (graph), their JSON form (serialize), a graph run by the references (reference) and
arrays across numpy and torch (tensors)."""
