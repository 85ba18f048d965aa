"""How every `hybridserving` command prints: aligned tables for people, JSON for scripts."""

from __future__ import annotations

import json
from typing import Any, TextIO


def write_table(rows: list[list[str]], out: TextIO, indent: str = "") -> None:
    """Columns padded to their widest cell, like `kubectl get`; the first row is the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write(indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip() + "\n")


def write_json(value: Any, out: TextIO) -> None:
    json.dump(value, out, indent=2)
    out.write("\n")
