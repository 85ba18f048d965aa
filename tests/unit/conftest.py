"""Shared unit-test fixtures: the operator's key (the production default is empty and refused) and
a fleet applied to the in-memory apiserver."""

from __future__ import annotations

import pytest

from hybridserving.controller import reconcile, switching
from support.apiserver import MemoryApi
from support.fleets import OPERATOR_KEY, SPEC


@pytest.fixture(autouse=True)
def operator_key(monkeypatch: pytest.MonkeyPatch) -> bytes:
    monkeypatch.setitem(reconcile.reconcile.__kwdefaults__, "operator_key", OPERATOR_KEY)
    monkeypatch.setitem(switching.SwitchController.__init__.__kwdefaults__, "operator_key", OPERATOR_KEY)
    return OPERATOR_KEY


@pytest.fixture
def api() -> MemoryApi:
    """A fleet applied, nothing reconciled yet."""
    fresh = MemoryApi()
    fresh.user_apply(SPEC)
    return fresh
