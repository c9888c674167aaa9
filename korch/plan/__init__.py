"""Executable plans: the plan directory (plan) and its typed metadata (meta), its files read and
written atomically (store), validation on load (check), and the runtime that runs kernels in order."""
