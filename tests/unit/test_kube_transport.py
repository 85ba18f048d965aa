"""The Lease's API access against a server that accepts and never answers: each call must end after
one timeout, which the renew deadline's margin is computed from."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
from kubernetes import client

from hybridserving.controller.kube import Kube, KubeError


@pytest.fixture
def silent_server() -> Iterator[tuple[str, list[socket.socket]]]:
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.05)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", accepted
    stop.set()
    thread.join()
    for connection in accepted:
        connection.close()
    listener.close()


def test_an_unretried_read_that_times_out_is_sent_once(silent_server: tuple[str, list[socket.socket]]) -> None:
    host, accepted = silent_server
    configuration = client.Configuration()
    configuration.host = host
    shared = Kube(client.ApiClient(configuration=configuration))
    lease = shared.unretried("lease", request_timeout=0.2)
    with pytest.raises(KubeError) as failed:
        lease.get("Lease", "ops", "hybridserving-operator")
    assert failed.value.status == 0
    assert len(accepted) == 1
    assert shared.api.configuration.retries is None  # the shared pool keeps its own settings
