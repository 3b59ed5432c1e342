"""The package's layering, read from the source: the engine (``minidet/`` but ``apps/`` and ``testing/``) never
imports the programs or the test support, and no module imports itself back through others."""

from __future__ import annotations

import ast
from pathlib import Path

import minidet

PACKAGE = Path(minidet.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The minidet modules that ``path`` imports anywhere in it (function-level imports included)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: the package, up level - 1 parents
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in modules and t != name}
    return found


def graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports(p, modules) for p in paths}


def test_the_engine_imports_neither_the_programs_nor_the_test_support():
    outside = ("minidet.apps", "minidet.testing")
    wrong = {m: sorted(t for t in deps if t.startswith(outside))
             for m, deps in graph().items() if not m.startswith(outside)}
    assert not {m: d for m, d in wrong.items() if d}


def test_no_import_cycle():
    deps = graph()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = path[path.index(module):] + [module]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        for target in sorted(deps[module]):
            # importing a package's module runs the package's __init__ first, which is not a cycle by itself
            if not module.startswith(target + "."):
                visit(target, path + [module])
        done.add(module)

    for module in sorted(deps):
        visit(module, [])


def test_no_source_file_is_ignored_by_git():
    """A file that .gitignore matches never reaches a clone (a pattern meant for a program's output folder once
    hid ``apps/outputs/``): every .py file of the package, the tests and the tools is one git would commit."""
    import shutil
    import subprocess

    root = PACKAGE.parent.parent
    if shutil.which("git") is None or not (root / ".git").exists():
        import pytest
        pytest.skip("not a git checkout")
    files = [str(p.relative_to(root)) for top in ("src", "tests", "tools")
             for p in (root / top).rglob("*.py") if "__pycache__" not in p.parts]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=root, input="\n".join(files),
                             capture_output=True, text=True).stdout.split()
    assert not ignored, f"ignored by .gitignore: {ignored}"

