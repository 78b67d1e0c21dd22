#!/usr/bin/env python3
"""The import rules, checked: the layer contracts of pyproject.toml ([tool.importlinter],
import-linter) and no import cycle anywhere in netreduce/, frameworks/ or benchmarks/.

    python3 scripts/check_imports.py            # both; exit status 0 when they hold

import-linter reads a package from the file system, and the checkout is not the
package as it installs: frameworks/<name>/ becomes netreduce.<name> only through
setup.py's mapping, and the native binding is a compiled module, which an import
graph cannot see (an import of netreduce._native would read as one of the package
itself, and through its __init__ of the whole public API). So the contracts run
over a staged copy of the installed layout: every .py file of netreduce/, each
frameworks/<name>/ at netreduce/<name>/ (setup.py's FRAMEWORKS), and the binding's
typed surface, netreduce/_native.pyi, as netreduce/_native.py. Nothing is built or
installed; the copy lives in a temporary directory.

The cycle check reads every module's imports from the source with ast — at module
level and inside functions alike, so that no import hidden in a function escapes it
— under the names they import by: the installed ones for the package and the
adapters, and for the benchmark scripts both benchmarks.<name> and the bare <name>
that benchmarks/ on sys.path gives them.
"""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set

REPO = Path(__file__).resolve().parents[1]


def frameworks(repo: Path = REPO) -> Dict[str, str]:
    """setup.py's FRAMEWORKS: installed package name -> source folder."""
    tree = ast.parse((repo / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "FRAMEWORKS"
                                                for t in node.targets):
            return dict(ast.literal_eval(node.value))
    raise SystemExit("setup.py has no FRAMEWORKS mapping")


def _python_files(top: Path) -> Iterable[Path]:
    for path in sorted(top.rglob("*.py")):
        if "__pycache__" not in path.parts:
            yield path


def installed_layout(repo: Path = REPO) -> Dict[str, Path]:
    """Every module of the package as it installs: dotted name -> source file."""
    out: Dict[str, Path] = {}

    def add(package: str, top: Path) -> None:
        for path in _python_files(top):
            rel = path.relative_to(top).with_suffix("")
            parts = [package] + list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path

    add("netreduce", repo / "netreduce")
    for name, folder in frameworks(repo).items():
        if (repo / folder / "__init__.py").exists():
            add(name, repo / folder)
    return out


def stage(dest: Path, repo: Path = REPO) -> Path:
    """Copy the installed layout under ``dest`` (dest/netreduce/...); returns dest."""
    for name, src in installed_layout(repo).items():
        rel = Path(*name.split("."))
        target = dest / (rel / "__init__.py" if src.name == "__init__.py" else rel.with_suffix(".py"))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
    shutil.copyfile(repo / "netreduce" / "_native.pyi", dest / "netreduce" / "_native.py")
    return dest


def lint(staged: Path, config: Path = REPO / "pyproject.toml",
         args: Iterable[str] = ()) -> subprocess.CompletedProcess:
    """lint-imports over ``staged``, with the contracts of ``config``: ``staged`` comes
    first on the path, so its netreduce is the one analysed (an editable install's
    finder is asked only after the path)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(staged), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-c",
                           "import sys; from importlinter.cli import lint_imports_command; "
                           "sys.argv[0] = 'lint-imports'; lint_imports_command()",
                           str(config), "--no-cache", *args],
                          cwd=staged, env=env, capture_output=True, text=True)


# -- cycles ---------------------------------------------------------------------------
def source_modules(repo: Path = REPO) -> Dict[str, Path]:
    """The package and the adapters under their installed names, the benchmarks as
    benchmarks.<name>."""
    out = installed_layout(repo)
    for path in _python_files(repo / "benchmarks"):
        rel = path.relative_to(repo).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph(modules: Dict[str, Path]) -> Dict[str, Set[str]]:
    """module -> the modules it imports (module level and inside functions)."""
    scripts = {name.split(".", 1)[1]: name for name in modules
               if name.startswith("benchmarks.") and name.count(".") == 1}
    edges: Dict[str, Set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: List[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            for name in names:
                if module.startswith("benchmarks.") and name.split(".")[0] in scripts:
                    name = "benchmarks." + name  # a script's sibling, by its bare name
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                # a package's own __init__ runs first anyway: not an edge of a cycle
                if name and name != module and not module.startswith(name + "."):
                    edges[module].add(name)
    return edges


def cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on: Set[str] = set()
    found: List[List[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def main(argv: Optional[List[str]] = None) -> int:
    found = cycles(import_graph(source_modules()))
    for comp in found:
        print("import cycle: " + " <-> ".join(comp))
    print(f"import cycles: {len(found)}")
    with tempfile.TemporaryDirectory(prefix="netreduce-imports-") as tmp:
        out = lint(stage(Path(tmp)), args=argv or [])
    sys.stdout.write(out.stdout)
    sys.stderr.write(out.stderr)
    return 1 if found or out.returncode else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
