"""SGLang 0.5.23's command-line options, and how its parser reads a token of `engine.extraArgs`.

SGLang builds its parser with argparse's default `allow_abbrev=True`, so `--tp-si 4` is
`--tp-size 4` and `--disaggregation-mo decode` is `--disaggregation-mode decode`. A check
that compares whole flag names lets such prefixes through, and the engine then runs a
layout the operator did not plan. `resolve` reads a token the way argparse's
`_parse_optional` does, against the parser's complete option list (`OPTIONS`, from the flag
table dumped from the wheel and kept equal to it by a test that asks the real parser), so the operator decides
without the parser, at admission.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hybridserving.contract import sglang_flag_values, sglang_flags


# argparse's `_negative_number_matcher`: such tokens are values, not options.
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


@dataclass(frozen=True)
class Resolution:
    """What the parser makes of one option token.

    `flag` is the option it stands for (None when the parser knows none); `ambiguous`
    lists the options an abbreviation matches when it matches more than one.
    """

    token: str
    flag: str | None
    ambiguous: tuple[str, ...] = ()


def resolve(token: str, options: frozenset[str] | None = None) -> Resolution | None:
    """How SGLang's parser reads `token`, or None when it is a value rather than an option.

    The order is argparse's (Python 3.11 `_parse_optional` and `_get_option_tuples`): an
    exact option, then `--flag=value` with an exact flag, then every option the part
    before `=` is a prefix of; a single-dash token is matched the same way against the
    single-dash options (SGLang 0.5.23 defines only `-h`).
    """
    known = OPTIONS if options is None else options
    if not token.startswith("-") or token == "-" or _NEGATIVE_NUMBER.match(token) or " " in token:
        return None
    if token in known:
        return Resolution(token, token)
    name = token.split("=", 1)[0]
    if name in known:
        return Resolution(token, name)
    if name.startswith("--"):
        matches = sorted(option for option in known if option.startswith(name))
    else:
        matches = sorted(option for option in known if option.startswith(name) and not option.startswith("--"))
    if len(matches) == 1:
        return Resolution(token, matches[0])
    if matches:
        return Resolution(token, None, tuple(matches))
    return Resolution(token, None)


# Every option string of `sglang serve`'s parser: the dumped flag table plus argparse's own help options.
OPTIONS: frozenset[str] = frozenset(sglang_flags()) | {"-h", "--help"}


def value(args: list[str] | tuple[str, ...], flag: str) -> str | None:
    """The value the parser ends with for `flag` in `args`: its last occurrence wins, however
    abbreviated or written (`--flag V`, `--flag=V`); None when absent."""
    found = None
    for index, arg in enumerate(args):
        read = resolve(arg)
        if read is None or read.flag != flag:
            continue
        found = value_at(args, index) or ""
    return found


def value_at(args: list[str] | tuple[str, ...], index: int) -> str | None:
    """The value the option token at `index` gives its flag (`--flag=V` or the next token), None
    without one."""
    arg = args[index]
    if "=" in arg:
        return arg.split("=", 1)[1]
    return args[index + 1] if index + 1 < len(args) else None


def int_value(args: list[str] | tuple[str, ...], flag: str) -> int | None:
    """`value` as the integer the parser reads; None when absent or not a number."""
    raw = value(args, flag)
    try:
        return None if raw is None else int(raw)
    except ValueError:
        return None


def value_refusal(flag: str, value: str | None) -> str | None:
    """Why SGLang's parser refuses `value` for `flag` (argparse's checks: a choice, an int, a float),
    said after the flag; None where it accepts it or does not check (a missing value is the
    parser's own error, and a value that starts like a flag is read as one)."""
    accepts = sglang_flag_values().get(flag)
    if accepts is None or value is None or resolve(value) is not None:
        return None
    if "choices" in accepts:
        return None if value in accepts["choices"] else (
            f"takes one of {', '.join(accepts['choices'])}, not {value!r}")
    try:
        (int if accepts.get("type") == "int" else float)(value)
    except ValueError:
        return f"takes {'an integer' if accepts.get('type') == 'int' else 'a number'}, not {value!r}"
    return None
