"""The flags the simulator models parse to what SGLang 0.5.23's own parser makes of them.

The simulator accepts every flag of `sglang serve` (the dumped flag table) but reads only those that
change what it serves; for those, its parser must give SGLang's defaults and types, so that an
argv the operator renders behaves in the simulator as on an engine. SGLang's parser runs from the
wheel in the tool cache (`tools/sglang-parser.sh`).
"""

from __future__ import annotations

import pytest

from hybridserving_engine.simulator.args import build_parser
from support.sglang_parser import SGLangParserUnavailable, parse_many, sglang_python

ARGVS = [
    ["--model-path", "m"],
    ["--model-path", "m", "--watchdog-timeout", "2.5", "--soft-watchdog-timeout", "1"],
]


def test_every_modelled_flag_parses_as_sglang_parses_it() -> None:
    try:
        sglang_python()
    except SGLangParserUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    for argv, sglang in zip(ARGVS, parse_many(ARGVS), strict=True):
        simulated = {k: v for k, v in vars(build_parser().parse_args(argv)).items() if not k.startswith("unmodelled_")}
        assert {k: sglang[k] for k in simulated} == simulated, argv
