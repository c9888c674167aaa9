"""Settings shared by every stage."""

VERSION = "0.1.0"  # korch's version (pyproject.toml says the same); plans and the database record it
