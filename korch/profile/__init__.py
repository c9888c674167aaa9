"""Profiling: every (candidate, backend) pair compiled, checked and timed in worker processes (locally or
on Ray), with results kept in the SQLite profile database."""
