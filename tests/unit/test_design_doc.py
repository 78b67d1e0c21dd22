"""docs/design.md matches the tree: its knob table is config.py's, row for row
(scripts/knob_table.py writes it), and every file or folder it names exists."""
from __future__ import annotations

import importlib.util
import pathlib
import re
from typing import List

from netreduce import config

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("knob_table", ROOT / "scripts" / "knob_table.py")
knob_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(knob_table)

# Named in the text but not ours: a system header the build looks for.
NOT_IN_THE_TREE = {"isa-l/crc.h"}
BASES = ("", "netreduce", "native", "native/transport", "docs", "frameworks")


def test_the_design_doc_lists_every_knob_as_config_declares_it():
    doc = knob_table.DOC.read_text(encoding="utf-8")
    assert knob_table.rewritten(doc) == doc, "run: python3 scripts/knob_table.py --write"
    rows = doc[doc.index(knob_table.BEGIN):doc.index(knob_table.END)]
    assert all(f"| `{name}` |" in rows for name in config.KNOBS)


def test_a_stale_table_is_seen():
    doc = knob_table.DOC.read_text(encoding="utf-8")
    stale = doc.replace("| `NETREDUCE_RETRANSMIT_MS` | 0.5 |", "| `NETREDUCE_RETRANSMIT_MS` | 50 |")
    assert stale != doc and knob_table.rewritten(stale) == doc


def missing_paths(text: str) -> List[str]:
    """The `file` and `folder/` names in ``text`` that are nowhere in the tree: a path
    with a slash from the root or a top folder (``a/{b,c}.h`` is both), a bare file
    name anywhere."""
    names = set(re.findall(r"`([\w./{},-]+/[\w./{},-]*|[\w-]+\.(?:py|pyi|h|cc|md|toml|sh))`",
                           text))
    everywhere = {p.name for p in ROOT.rglob("*") if ".git" not in p.parts}
    missing = []
    for name in sorted(names - NOT_IN_THE_TREE):
        braces = re.match(r"(.*)\{(.*)\}(.*)", name)
        variants = ([braces.group(1) + x + braces.group(3) for x in braces.group(2).split(",")]
                    if braces else [name])
        for v in (x.rstrip("/") for x in variants):
            found = (any((ROOT / base / v).exists() for base in BASES) if "/" in v
                     else v in everywhere)
            if not found:
                missing.append(v)
    return missing


def test_every_path_the_design_doc_names_exists():
    assert missing_paths(knob_table.DOC.read_text(encoding="utf-8")) == []


def test_the_path_check_sees_a_missing_file():
    assert missing_paths("see `netreduce/no_such.py` and `gone.cc`, not `netreduce/api.py`") == [
        "gone.cc", "netreduce/no_such.py"]
