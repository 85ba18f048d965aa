"""The simulator's API-key checks against SGLang 0.5.23's own code, from the wheel in the tool cache.

`sglang/srt/utils/auth.py` imports only the standard library ("intentionally lightweight ... so it
can be used in unit tests", lines 1-4), so its `decide_request_auth` runs in the SGLang venv as is,
on every combination of route, header and keys; the simulator must decide the same. Which routes are
`ADMIN_OPTIONAL` is read from the `@auth_level` decorators in `entrypoints/http_server.py`.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
from pathlib import Path

from hybridserving_engine.simulator import auth
from support.sglang_parser import sglang_python

SIMULATOR_SERVER = Path(auth.__file__).with_name("server.py")
KEY, ADMIN = "k-0123", "a-4567"
HEADERS = [None, f"Bearer {KEY}", f"bearer {KEY}", f"Bearer {ADMIN}", "Bearer wrong", KEY, f"Basic {KEY}", "Bearer"]
KEYS = [(KEY, None), (None, ADMIN), (KEY, ADMIN)]

_DECIDE = """
import importlib.util, json, os, sys
root = importlib.util.find_spec("sglang").submodule_search_locations[0]
spec = importlib.util.spec_from_file_location("sglang_auth", os.path.join(root, "srt", "utils", "auth.py"))
mod = sys.modules["sglang_auth"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
out = []
for method, path, level, header, api_key, admin_api_key in json.load(sys.stdin):
    d = mod.decide_request_auth(method=method, path=path, authorization_header=header, api_key=api_key,
                                admin_api_key=admin_api_key, auth_level=mod.AuthLevel(level))
    out.append([d.allowed, d.error_status_code])
print(json.dumps(out))
print(open(os.path.join(root, "srt", "entrypoints", "http_server.py")).read())
"""


def _sglang(cases: list[list[object]]) -> tuple[list[list[object]], str]:
    proc = subprocess.run([str(sglang_python()), "-c", _DECIDE], input=json.dumps(cases), capture_output=True,
                          text=True, check=True)
    first, _, source = proc.stdout.partition("\n")
    return json.loads(first), source


def _admin_routes(source: str) -> set[str]:
    """Paths whose endpoint carries `@auth_level(AuthLevel.ADMIN_OPTIONAL)`."""
    routes: set[str] = set()
    for block in re.split(r"\n(?=@app\.)", source):
        decorators = block.split("\nasync def ")[0].split("\ndef ")[0]
        if "@auth_level(AuthLevel.ADMIN_OPTIONAL)" in decorators:
            routes |= set(re.findall(r'@app\.(?:get|post|put|api_route)\(\s*"([^"]+)"', decorators))
    return routes


def test_the_simulator_refuses_and_admits_exactly_as_sglang() -> None:
    simulated = set(re.findall(r'r\.add_(?:get|post|route)\((?:"[A-Z]+", )?"([^"]+)"', SIMULATOR_SERVER.read_text()))
    paths = sorted(p for p in simulated if "{" not in p and not p.startswith(auth.SIMULATOR_PREFIX))
    assert {"/pause_generation", "/pd_role_switch", "/v1/loads", "/ready", "/metrics"} <= set(paths)
    cases = [[method, path, "admin_optional" if path in auth.ADMIN_OPTIONAL else "normal", header, api_key, admin]
             for method, path, header, (api_key, admin) in itertools.product(("GET", "POST", "OPTIONS"), paths,
                                                                              HEADERS, KEYS)]
    decisions, source = _sglang(cases)
    assert auth.ADMIN_OPTIONAL == _admin_routes(source) & set(paths), "the simulator's admin routes are SGLang's"
    for (method, path, _, header, api_key, admin), (allowed, status) in zip(cases, decisions, strict=True):
        assert auth.allowed(method, path, header, api_key, admin) == allowed, (method, path, header, api_key, admin)
        assert allowed or status == 401, (path, status)
