"""Executable plans: the plan directory (plan), its files read and written atomically (store), validation
on load (check), and the runtime that runs kernels in order."""
