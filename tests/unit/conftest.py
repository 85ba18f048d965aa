"""The operator's key in the unit tests: the production default is empty and refused."""

from __future__ import annotations

import pytest

from hybridserving.controller import reconcile, switching
from support.fleets import OPERATOR_KEY


@pytest.fixture(autouse=True)
def operator_key(monkeypatch: pytest.MonkeyPatch) -> bytes:
    monkeypatch.setitem(reconcile.reconcile.__kwdefaults__, "operator_key", OPERATOR_KEY)
    monkeypatch.setitem(switching.SwitchController.__init__.__kwdefaults__, "operator_key", OPERATOR_KEY)
    return OPERATOR_KEY
