"""How every `hybridserving` command prints: aligned tables for people, JSON for scripts, exit codes,
and the errors of a manifest that does not load."""

from __future__ import annotations

import argparse
import io
import json
import math
from collections.abc import Callable
from typing import Any, TextIO

from hybridserving.manifests import ManifestInvalid, load_file

# 0 success, 1 the input is invalid (2, a usage error, is argparse's).
EXIT_OK, EXIT_INVALID = 0, 1


def whole_number(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number within bounds (the API's, where the flag feeds a spec field), so a
    flag out of range is a usage error that names it, not a traceback from the model or the arithmetic."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low or (high is not None and value > high):
            span = f"from {low} to {high}" if high is not None else f"of at least {low}"
            raise argparse.ArgumentTypeError(f"{value} is out of range: use a whole number {span}")
        return value

    return parse


def positive_number(text: str) -> float:
    """An argparse type: a finite number above 0. `float()` takes "nan" and "inf", which no scale or
    size can be: refused here, they would fail deep in the arithmetic or print a meaningless result."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is out of range: use a finite number above 0")
    return value


# C0 and C1 control characters but newline and tab, and DEL: what a terminal acts on rather than shows.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0))}


class Printable(io.TextIOBase):
    """`out` with every control character written as its escape (`\\x1b`). A manifest's keys and
    names, and what a cluster's Events say, reach the output in field paths and messages; a
    terminal would act on an escape sequence in them (clear the screen, retitle the window, hide
    the lines before it) instead of showing it. JSON and YAML already escape them."""

    def __init__(self, out: TextIO) -> None:
        self._out = out

    def write(self, text: str) -> int:
        self._out.write(text.translate(_CONTROLS))
        return len(text)

    def flush(self) -> None:
        self._out.flush()


def write_table(rows: list[list[str]], out: TextIO, indent: str = "") -> None:
    """Columns padded to their widest cell, like `kubectl get`; the first row is the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write(indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip() + "\n")


def write_json(value: Any, out: TextIO) -> None:
    json.dump(value, out, indent=2)
    out.write("\n")


def write_error(out: TextIO, as_json: bool, where: str | None, message: str, fix: str) -> int:
    """A flag's value that does not do (`where`, the flag and the field it feeds; None for what no
    flag or field caused, as a cluster that does not answer), with the fix; as JSON with `-o json`,
    so a script reads an object either way. Returns the exit status."""
    if as_json:
        write_json({"error": {"path": where, "message": message, "fix": fix}}, out)
    else:
        out.write(f"error: {where + ': ' if where is not None else ''}{message}\n  fix: {fix}\n")
    return EXIT_INVALID


def write_manifest_errors(err: ManifestInvalid, out: TextIO, as_json: bool = False) -> None:
    """Every error of every document with its fix; as JSON, a list of documents in the shape
    `validate -o json` gives a file that loads, so a script reads one shape either way."""
    if as_json:
        write_json(
            [{"name": None, "source": doc.source, "valid": False,
              "issues": [{"path": e.path, "message": e.message, "fix": e.fix, "rule": "schema",
                          "severity": "error"} for e in doc.errors]} for doc in err.documents],
            out,
        )
        return
    for doc in err.documents:
        out.write(f"{doc.source}: invalid\n")
        for e in doc.errors:
            out.write(f"  error: {e.path}: {e.message}\n         fix: {e.fix}\n")


def load_manifests(path: str, out: TextIO, as_json: bool) -> list[Any] | None:
    """The fleets in `path`, or None after printing why they do not load (every error with its fix)."""
    try:
        return load_file(path)
    except ManifestInvalid as err:
        write_manifest_errors(err, out, as_json)
        return None
