"""Keeps one control-plane component running, as a kubelet keeps a static pod's container.

    python supervise.py [--settle S] [--backoff S] [--burst N] -- COMMAND...

With leader election, as in a real control plane, kube-scheduler and kube-controller-manager
exit when they cannot renew their lease within the renew deadline (an apiserver outage longer
than that), and the scheduler exits when it finds its cache corrupted. A real control plane
relies on the kubelet (or systemd) to start them again, with fresh caches; without that a local
scheduler that exited leaves every later pod Pending. The local cluster's processes outlive
the Python process that started them (`devcluster up` returns), so the supervisor is a process
of its own, the leader of the component's process group. It hands a SIGTERM or SIGINT on to
the component, so it is stopped by signalling it alone: a Kubernetes component that gets a
second signal exits at once, without releasing its lease. SIGKILL goes to the whole group.

A run that ends within `--settle` seconds of its start never came up. The first run ending so
(a broken command line, a port taken meanwhile) or `--burst` such runs in a row end the
supervisor with the component's exit status, so the cluster reports a component that crash-loops
as dead instead of hiding it behind a live supervisor. Standard library only: it runs as a
script, outside the package's import path.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from types import FrameType

# A run that lasted this long came up: the first run ending sooner is a command line that does
# not start, and a scheduler cannot lose its lease sooner (the renew deadline is 10 s).
SETTLE_SECONDS = 10.0
# Back-off doubles per run that did not come up, capped as the kubelet caps a crash loop's
# (there at 5 min; a local cluster wants its scheduler back within a test's patience).
MAX_BACKOFF_SECONDS = 8.0
# How soon a signal reaches the component, and a stop request ends a back-off.
POLL_SECONDS = 0.1


def exit_status(returncode: int) -> int:
    """A shell's status for a child's return code: 128 + N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _say(name: str, msg: str) -> None:
    # The component's log: the supervisor writes to the output it hands the component.
    print(f"devcluster supervisor: {name} {msg}", file=sys.stderr, flush=True)


def supervise(cmd: list[str], settle: float, backoff: float, burst: int) -> int:
    """Run `cmd` until the supervisor is asked to stop (SIGTERM, SIGINT) or `cmd` stops coming
    up; the exit status is the component's last.

    The handler only records a signal, and the loop hands each one on to the running component
    exactly once: a handler that signalled the component itself would race the start of a run, and
    a signal arriving just after it could reach the component twice."""
    name = os.path.basename(cmd[0])
    received: list[int] = []

    def stop(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    failed_starts = 0
    first = True
    while True:
        started = time.monotonic()
        child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        handed_on = 0
        code = None
        while code is None:
            while handed_on < len(received):
                child.send_signal(received[handed_on])
                handed_on += 1
            try:
                code = child.wait(POLL_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        if received:
            return exit_status(code)
        ran = time.monotonic() - started
        failed_starts = failed_starts + 1 if ran < settle else 0
        if failed_starts and (first or failed_starts >= burst):
            _say(name, f"exited {code} {ran:.1f} s after its start, {failed_starts} time(s) in a row; "
                       "not starting it again")
            return exit_status(code)
        first = False
        delay = min(backoff * 2 ** max(failed_starts - 1, 0), MAX_BACKOFF_SECONDS)
        _say(name, f"exited {code} after {ran:.1f} s; starting it again in {delay:.1f} s")
        until = time.monotonic() + delay
        while not received and time.monotonic() < until:
            time.sleep(POLL_SECONDS)
        if received:
            return exit_status(code)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Restart a control-plane component that exits.")
    ap.add_argument("--settle", type=float, default=SETTLE_SECONDS,
                    help="seconds a run must last to count as started (default %(default)s)")
    ap.add_argument("--backoff", type=float, default=1.0,
                    help="seconds before a restart, doubled per run that did not start (default %(default)s)")
    ap.add_argument("--burst", type=int, default=5,
                    help="runs in a row that did not start before giving up (default %(default)s)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...")
    ns = ap.parse_args(argv)
    cmd = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not cmd:
        ap.error("no command to supervise")
    return supervise(cmd, ns.settle, ns.backoff, ns.burst)


if __name__ == "__main__":
    sys.exit(main())
