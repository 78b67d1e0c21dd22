#!/usr/bin/env python3
"""docs/design.md's knob table, written from netreduce/config.py (the one place a knob
is declared): every knob in declaration order, its default and its help.

    python3 scripts/knob_table.py          # exit 1, with a diff, if the table is stale
    python3 scripts/knob_table.py --write  # rewrite it between the markers

tests/unit/test_design_doc.py runs the check."""
from __future__ import annotations

import difflib
import pathlib
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "design.md"
BEGIN = ("<!-- knob table: written by scripts/knob_table.py from netreduce/config.py; "
         "edit the knobs there -->")
END = "<!-- end of the knob table -->"


def default_text(knob: Any) -> str:
    value = knob.default
    if knob.type.__name__ == "bytes" and value:
        for suffix, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
            if value % scale == 0:
                return f"{value // scale}{suffix}"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value) if value != "" else "empty"


def table() -> str:
    sys.path.insert(0, str(ROOT))
    from netreduce import config
    rows = ["| knob | default | what it sets |", "|---|---|---|"]
    for knob in config.KNOBS.values():
        text = " ".join(knob.help.split()).replace("|", "\\|")
        rows.append(f"| `{knob.name}` | {default_text(knob)} | {text} |")
    return "\n".join([BEGIN, *rows, END])


def rewritten(doc: str) -> str:
    start, stop = doc.index(BEGIN), doc.index(END) + len(END)
    return doc[:start] + table() + doc[stop:]


def main(argv: list) -> int:
    doc = DOC.read_text(encoding="utf-8")
    new = rewritten(doc)
    if "--write" in argv:
        DOC.write_text(new, encoding="utf-8")
        return 0
    if new != doc:
        sys.stdout.writelines(difflib.unified_diff(doc.splitlines(True), new.splitlines(True),
                                                   "docs/design.md", "from config.py"))
        print("docs/design.md's knob table is stale: python3 scripts/knob_table.py --write")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
