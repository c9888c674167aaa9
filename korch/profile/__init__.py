"""Profiling: every (candidate, backend) pair compiled, checked and timed (profiler) by jobs that run in
worker processes (jobs; workers locally or ray_pool on a cluster), with results kept in the SQLite
profile database (database); the rewrites' before/after timings (rewrite_timing)."""
