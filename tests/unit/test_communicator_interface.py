"""The communicator's state is its own (docs/design.md, "Where each concept lives"):
no module but netreduce/worker/communicator.py touches a Communicator's private
attribute or method — its helpers (agreement.py, speculation.py, unmatched.py) use
the interface it gives them ("the state its helpers see"). Read from the source (AST),
so that a new module is held to it without being imported. Tests may still patch
its private methods; the package, the adapters, benchmarks and examples may not."""
from __future__ import annotations

import ast
import pathlib
from typing import Iterator, List, Set, Tuple

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMMUNICATOR = "netreduce/worker/communicator.py"
TOPS = ("netreduce", "frameworks", "benchmarks", "examples")
# Expressions that name a communicator, whatever the attribute: comm._x, self.comm._x,
# self._comm._x, communicator._x, api._communicator()._x, Communicator._x.
COMM_NAMES = {"comm", "_comm", "communicator", "_communicator", "Communicator"}


def _sources() -> Iterator[Tuple[str, ast.AST]]:
    for top in TOPS:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            yield rel, ast.parse(path.read_text(encoding="utf-8"), rel)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def privates_of(tree: ast.AST, only: str = "") -> Set[str]:
    """Private names the classes of ``tree`` (only the class ``only``, if given)
    define: methods and attributes set on self."""
    names: Set[str] = set()
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef) or (only and cls.name != only):
            continue
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(node.name):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and _is_self(node.value) and \
                    isinstance(node.ctx, ast.Store) and _private(node.attr):
                names.add(node.attr)
    return names


def _names_communicator(node: ast.expr) -> bool:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id in COMM_NAMES
    return isinstance(node, ast.Attribute) and node.attr in COMM_NAMES


def reaches_in(rel: str, tree: ast.AST, unique: Set[str]) -> List[str]:
    """'file:line: expr' for each private attribute of a communicator touched in
    ``tree``: any private name on an expression that names one, or one of the
    Communicator's own private names (``unique``: no other class defines them) on
    anything but self."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not _private(node.attr):
            continue
        if _names_communicator(node.value) or (node.attr in unique and not _is_self(node.value)):
            found.append((node.lineno, f"{rel}:{node.lineno}: {ast.unparse(node)}"))
    return [text for _, text in sorted(found)]


def test_no_module_reaches_into_the_communicator():
    trees = dict(_sources())
    mine = privates_of(trees[COMMUNICATOR], only="Communicator")
    assert {"_lock", "_inflight", "_failure", "_exec_q"} <= mine  # the reader reads it
    others = set().union(*(privates_of(t) for rel, t in trees.items() if rel != COMMUNICATOR))
    unique = mine - others
    reaches = [hit for rel, tree in trees.items() if rel != COMMUNICATOR
               for hit in reaches_in(rel, tree, unique)]
    assert not reaches, (
        "private state of the Communicator touched outside communicator.py; add what the "
        "module needs to the Communicator's interface for helpers instead:\n"
        + "\n".join(reaches))


def test_the_check_sees_a_reach():
    """The reader flags each way of reaching in, and nothing of a class's own."""
    code = '''
class Helper:
    def __init__(self, comm):
        self.comm, self._lock = comm, None
    def run(self, box, ag):
        with comm._lock, self._lock, box._lock:
            self.comm._exec_q.put(1)
            ag.comm._failure
            api._communicator()._new
            box._inflight
'''
    hits = reaches_in("x.py", ast.parse(code), unique={"_inflight"})
    assert [h.split(": ", 1)[1] for h in hits] == [
        "comm._lock", "self.comm._exec_q", "ag.comm._failure", "api._communicator()._new",
        "box._inflight"], hits
