"""Orchestration: lower bounds on kernel costs, the binary linear program, solve-measure-re-solve with a
certified gap, and the alternatives the solver turned down."""
