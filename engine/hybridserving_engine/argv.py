"""Reading SGLang flags out of an argv, for the launcher and the preflight checks."""

from __future__ import annotations

from typing import overload


@overload
def flag_value(argv: list[str], flag: str, default: str) -> str: ...
@overload
def flag_value(argv: list[str], flag: str, default: None = None) -> str | None: ...
def flag_value(argv: list[str], flag: str, default: str | None = None) -> str | None:
    """The value of `flag` (`--flag v` or `--flag=v`), the last one winning as in argparse."""
    value = default
    for i, item in enumerate(argv):
        if item == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif item.startswith(flag + "="):
            value = item.split("=", 1)[1]
    return value


def has_flag(argv: list[str], flag: str) -> bool:
    return any(item == flag or item.startswith(flag + "=") for item in argv)
