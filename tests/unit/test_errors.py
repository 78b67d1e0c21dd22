"""One error hierarchy (docs/design.md, "Error reporting"): every exception class the
package defines derives from NetReduceError, and library code raises no bare builtin
— read from the source, so that a new module is held to it without being imported."""
from __future__ import annotations

import ast
import builtins
import pathlib
import re
from typing import Dict, Iterator, List, Set, Tuple

import pytest

from netreduce import config, errors

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILTIN_ERRORS = {name for name, value in vars(builtins).items()
                  if isinstance(value, type) and issubclass(value, BaseException)}

# The builtins that stay, each with its reason: (file, builtin) -> why.
ALLOWED = {
    # a meta-path finder's protocol: the import system expects an ImportError
    ("netreduce/_source_tree.py", "ImportError"): "the import system's own type",
    # a module's __getattr__ (PEP 562) answers an unknown name so
    ("netreduce/__init__.py", "AttributeError"): "PEP 562's protocol",
    # horovod.torch's DistributedOptimizer raises exactly these (Horovod users catch them)
    ("frameworks/torch/optimizer.py", "AssertionError"): "Horovod's type",
    # TensorFlow's allocator failed: what Python code catches for memory
    ("frameworks/tensorflow/op_bridge.py", "MemoryError"): "out of memory",
    # SIGTERM turned into Ctrl-C so that the testbed's cleanup runs the same way
    ("netreduce/testbed/testbed.py", "KeyboardInterrupt"): "a signal as Ctrl-C",
    # argparse's sub-command dispatch: unreachable
    ("netreduce/testbed/cli.py", "AssertionError"): "unreachable",
}


def _sources() -> Iterator[Tuple[str, ast.AST]]:
    for top in ("netreduce", "frameworks"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            yield rel, ast.parse(path.read_text(encoding="utf-8"), rel)


def bare_builtins(rel: str, tree: ast.AST) -> List[str]:
    """'file:line: Name' for each builtin exception raised or built in ``tree``; an
    abstract method's argument-less ``raise NotImplementedError`` is no error."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name, abstract = node.func.id, not node.args and not node.keywords
        elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Name):
            name, abstract = node.exc.id, True
        else:
            continue
        if name not in BUILTIN_ERRORS or (rel, name) in ALLOWED:
            continue
        if name == "NotImplementedError" and abstract:
            continue
        found.append((node.lineno, f"{rel}:{node.lineno}: {name}"))
    return [text for _, text in sorted(found)]


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):  # errors.NetReduceError, _core.NetReduceError
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def outside_hierarchy(trees: List[Tuple[str, ast.AST]]) -> List[str]:
    """Exception classes defined in ``trees`` whose ancestry does not reach
    NetReduceError (bases matched by name across the package)."""
    bases: Dict[str, List[str]] = {}
    where: Dict[str, str] = {}
    for rel, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases.setdefault(node.name, []).extend(_base_name(b) for b in node.bases)
                where.setdefault(node.name, f"{rel}:{node.lineno}")

    def reaches(name: str, target: Set[str], seen: Set[str]) -> bool:
        if name in target:
            return True
        if name in seen or name not in bases:
            return False
        seen.add(name)
        return any(reaches(b, target, seen) for b in bases[name])

    bad = []
    for name in bases:
        if name == "NetReduceError":
            continue
        is_exception = any(reaches(b, BUILTIN_ERRORS, set()) or b in BUILTIN_ERRORS
                           for b in bases[name])
        if is_exception and not reaches(name, {"NetReduceError"}, set()):
            bad.append(f"{where[name]}: class {name}({', '.join(bases[name])})")
    return bad


def test_no_builtin_exception_raised_bare():
    found = [hit for rel, tree in _sources() for hit in bare_builtins(rel, tree)]
    assert not found, ("raise a netreduce.errors type (with the builtin as a second base "
                       "where callers catch it), or add an ALLOWED entry with its reason:\n"
                       + "\n".join(found))


def test_the_issue_grep_finds_nothing():
    # The literal check of issue 34 (a line-based grep), over the same files.
    pattern = re.compile(r"raise (ValueError|TypeError|RuntimeError|KeyError|Exception)\(")
    hits = [f"{rel}:{n}" for rel, _ in _sources()
            for n, line in enumerate((ROOT / rel).read_text().splitlines(), 1)
            if pattern.search(line)]
    assert not hits, hits


def test_every_exception_class_derives_from_netreduce_error():
    bad = outside_hierarchy(list(_sources()))
    assert not bad, "\n".join(bad)


def test_the_scans_find_what_they_look_for():
    # The two checks above can fail: each finds its defect in a small made-up module.
    sample = ast.parse(
        "class LocalError(Exception): ...\n"
        "class Derived(LocalError): ...\n"
        "class Good(errors.NetReduceError): ...\n"
        "class Abstract:\n"
        "    def f(self): raise NotImplementedError\n"
        "def g(x):\n"
        "    if x: raise ValueError(f'bad {x}')\n"
        "    return KeyError('k')\n")
    assert bare_builtins("m.py", sample) == ["m.py:7: ValueError", "m.py:8: KeyError"]
    assert outside_hierarchy([("m.py", sample)]) == [
        "m.py:1: class LocalError(Exception)", "m.py:2: class Derived(LocalError)"]


def test_the_room_errors_keep_their_builtin():
    from netreduce.launcher.spawn import LaunchError
    from netreduce.protocol.auth import AuthError
    from netreduce.switch.commands import RequestError
    for kind in (AuthError, RequestError, LaunchError, errors.ConfigError,
                 errors.UnknownKnobError, errors.UnsupportedError):
        assert issubclass(kind, errors.NetReduceError), kind
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.UnknownKnobError, KeyError)
    assert issubclass(errors.UnsupportedError, NotImplementedError)


def test_a_bad_knob_is_a_config_error_and_still_a_value_error(monkeypatch):
    monkeypatch.setenv("NETREDUCE_TIMEOUT", "soon")
    with pytest.raises(errors.ConfigError, match="NETREDUCE_TIMEOUT='soon'"):
        config.get("NETREDUCE_TIMEOUT")
    with pytest.raises(ValueError):
        config.get("NETREDUCE_TIMEOUT")
    with pytest.raises(KeyError, match="not a netreduce knob"):
        config.set_for_process("NETREDUCE_NO_SUCH_KNOB", "1")
