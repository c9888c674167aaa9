"""The package reads as the pipeline: a module imports only from its own stage, from stages before
it, and from the shared base (errors, config); no import cycle between modules, counting imports
made inside functions (the imports of every module are read from its source, not executed)."""

import ast
from pathlib import Path

import pytest

import korch

ROOT = Path(korch.__file__).parent
# the stages in pipeline order; a module's stage is its first package below korch (or its own name)
STAGES = [
    "errors",
    "config",
    "ir",
    "frontend",
    "rewrite",
    "search",
    "measure",
    "backends",
    "profile",
    "orchestrate",
    "plan",
    "pipeline",
    "torch_backend",
    "__init__",
    "cli",
]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def korch_imports(path: Path) -> set[str]:
    """The korch modules `path` imports anywhere in its source (a `from x import y` that names a
    submodule counts as importing it)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "korch"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            if base.split(".")[0] != "korch":
                continue
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES}
    return {m for m in found if m in MODULES}


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def stage(module: str) -> int:
    parts = module.split(".")
    return STAGES.index(parts[1] if len(parts) > 1 else "__init__")


GRAPH = {m: korch_imports(p) - {m} for m, p in MODULES.items()}


def test_every_module_has_a_stage():
    unknown = [m for m in MODULES if (m.split(".") + ["__init__"])[1] not in STAGES]
    assert not unknown, f"modules outside the stages: {unknown}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_only_earlier_stages(module):
    later = sorted(d for d in GRAPH[module] if stage(d) > stage(module) and d != "korch")
    assert not later, f"{module} (stage {STAGES[stage(module)]}) imports later stages: {later}"


def test_no_import_cycle():
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for d in sorted(GRAPH[m]):
            # a package imports its own modules (registrations); a module importing its package's
            # __init__ for a name is an edge too
            if state.get(d) == 1:
                return path + [m, d]
            if d not in state and (cycle := visit(d, path + [m])):
                return cycle
        state[m] = 2
        return None

    for m in sorted(MODULES):
        if m not in state and (cycle := visit(m, [])):
            start = cycle.index(cycle[-1])
            pytest.fail("import cycle: " + " -> ".join(cycle[start:]))


def test_modules_and_functions_stay_short():
    """A newcomer reads a module in one sitting: no file over 600 lines, no function over 80."""
    long_files = [
        f"{m}: {n} lines" for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > 600
    ]
    long_functions = [
        f"{m}.{f.name}: {f.end_lineno - f.lineno + 1} lines"
        for m, p in MODULES.items()
        for f in ast.walk(ast.parse(p.read_text()))
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.end_lineno - f.lineno + 1 > 80
    ]
    assert not long_files and not long_functions, long_files + long_functions
