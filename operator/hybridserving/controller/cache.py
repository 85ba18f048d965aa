"""The operator's read cache: what it watches, held in memory, so a pass observes without LISTing.

An informer-style store fed from two sides: the watch events kopf already delivers for the
HybridServings and their children (handlers.py), and the responses of the operator's own
writes. A pass therefore reads what it has just written (read-your-writes) before the watch
has echoed it, and observing again after acting costs no request.

Why it cannot make the planner act twice on stale state:

- resourceVersion order: an event or a write response older than the object held is dropped
  (resourceVersions of one etcd grow as integers; client-go's mutation cache compares them so
  too), so a late watch event never undoes a write the pass already saw;
- a slice (kind, namespace, label selector) is served only after a LIST primed it, and only for
  `max_age` seconds; the next read LISTs again. A watch that restarts (an apiserver restart, an
  expired resourceVersion) lists again but reports no deletion that fell into the gap, and a kind
  the gap emptied lists nothing at all, so it yields no event: kopf's listing event of any kind
  drops the slices of every kind (after an outage every watch restarts, and the fleets' own
  listing is never empty), so the next read LISTs and forgets what the gap deleted; a deletion no
  watch and no listing reported is believed at most `max_age`;
- a write refused with 409 or 404 means the cache was behind: that kind's slices in that
  namespace are dropped, so the retry plans from a fresh LIST;
- a write that acts (a role switch's record, an instance's role, a pod's deletion) is conditional
  (resourceVersion or uid, kube.py) and a create of a name that exists is a 409, so a stale read
  turns into a retry, never a second action; status writes only report, and the last one wins;
- a write to the scale subresource answers with a Scale, not the object: it is not stored;
- a deleted object is held as deleting (deletionTimestamp) until the watch reports it gone,
  as a LIST would show a pod in its grace period.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from hybridserving.controller.kube import Fence, Kube, KubeError
from hybridserving.controller.status import now as rfc3339_now

T = TypeVar("T")
Key = tuple[str, str, str]  # (kind, namespace, name)
Slice = tuple[str, str, tuple[tuple[str, str], ...]]  # (kind, namespace, sorted label selector)


def version(obj: dict[str, Any]) -> int | None:
    """The object's resourceVersion as an integer, None when absent or not a number."""
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or "")
    except ValueError:
        return None


def _older(incoming: int | None, held: int | None) -> bool:
    return incoming is not None and held is not None and incoming < held


def _matches(obj: dict[str, Any], labels: Iterable[tuple[str, str]]) -> bool:
    have = (obj.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels)


class ObjectCache:
    """Objects by (kind, namespace, name), and which label slices a LIST has primed and when."""

    def __init__(self, kinds: Iterable[str], max_age: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.kinds = frozenset(kinds)
        self.max_age = max_age
        self.clock = clock
        self._lock = threading.Lock()
        self._objects: dict[Key, dict[str, Any]] = {}
        self._primed: dict[Slice, float] = {}
        self._named: dict[Key, float] = {}  # objects primed by a GET
        self._gone: dict[Key, tuple[int | None, float]] = {}  # deleted: (resourceVersion, when seen)

    @staticmethod
    def _key(kind: str, obj: dict[str, Any]) -> Key:
        meta = obj.get("metadata") or {}
        return kind, meta.get("namespace") or "", meta.get("name") or ""

    def _fresh(self, at: float | None) -> bool:
        return at is not None and self.clock() - at < self.max_age

    # -- feeding

    def apply_event(self, kind: str, type_: str | None, obj: dict[str, Any]) -> None:
        """A watch event (ADDED, MODIFIED, DELETED, or None for kopf's initial listing)."""
        if kind not in self.kinds:
            return
        key = self._key(kind, obj)
        with self._lock:
            if type_ is None:
                self._primed.clear()
                self._named.clear()
            if type_ == "DELETED":
                self._objects.pop(key, None)
                self._gone[key] = (version(obj), self.clock())
                return
            self._put(key, obj)

    def store(self, kind: str, obj: dict[str, Any]) -> None:
        """What a write returned: the object as the API server now holds it."""
        if kind in self.kinds and obj.get("metadata", {}).get("name"):
            with self._lock:
                self._put(self._key(kind, obj), obj)

    def _put(self, key: Key, obj: dict[str, Any]) -> None:
        held = self._objects.get(key)
        if held is not None and _older(version(obj), version(held)):
            return
        gone = self._gone.get(key)
        if gone is not None:
            if gone[0] is None or not _older(gone[0], version(obj)):
                return  # the deletion came after this copy
            del self._gone[key]  # created again
        self._objects[key] = copy.deepcopy(obj)

    def mark_deleting(self, kind: str, namespace: str, name: str) -> None:
        """A delete the API accepted: held as deleting until the watch says it is gone."""
        with self._lock:
            held = self._objects.get((kind, namespace, name))
            if held is not None and not held["metadata"].get("deletionTimestamp"):
                held["metadata"]["deletionTimestamp"] = rfc3339_now()

    def prime(self, kind: str, namespace: str, labels: dict[str, str], items: list[dict[str, Any]],
              list_version: str | None) -> None:
        """A LIST of one slice: it replaces what is held there, except copies newer than the LIST."""
        if kind not in self.kinds:
            return
        selector = tuple(sorted(labels.items()))
        try:
            at = int(list_version or "")
        except ValueError:
            at = max((v for v in map(version, items) if v is not None), default=0)
        listed = {(kind, namespace, i["metadata"]["name"]): i for i in items}
        with self._lock:
            stamp = self.clock()
            for key in [k for k, o in self._objects.items()
                        if k[0] == kind and k[1] == namespace and k not in listed and _matches(o, selector)]:
                if not _older(at, version(self._objects[key]) or 0):
                    del self._objects[key]  # gone before the LIST: a deletion the watch missed
            for key, obj in listed.items():
                self._put(key, obj)
            self._forget_stale(stamp)
            self._primed[(kind, namespace, selector)] = stamp

    def prime_object(self, kind: str, obj: dict[str, Any]) -> None:
        """A GET of one object."""
        if kind in self.kinds:
            key = self._key(kind, obj)
            with self._lock:
                self._put(key, obj)
                self._forget_stale(self.clock())
                self._named[key] = self.clock()

    def _forget_stale(self, now: float) -> None:
        """Drop bookkeeping long past use: a slice or object not primed for two ages would be read
        again anyway, and a deleted fleet's slices would otherwise stay for the life of the process."""
        for s in [s for s, at in self._primed.items() if now - at > 2 * self.max_age]:
            del self._primed[s]
        for key in [k for k, at in self._named.items() if now - at > 2 * self.max_age]:
            del self._named[key]
        for gone in [k for k, (_, seen) in self._gone.items() if now - seen > 2 * self.max_age]:
            del self._gone[gone]

    def invalidate(self, kind: str, namespace: str) -> None:
        """The cache was behind on `kind` in `namespace` (a write met 409/404): LIST it again."""
        with self._lock:
            self._drop_primed(kind, namespace)

    def _drop_primed(self, kind: str, namespace: str) -> None:
        """The next read of `kind` in `namespace` LISTs or GETs again."""
        for s in [s for s in self._primed if s[:2] == (kind, namespace)]:
            del self._primed[s]
        for k in [k for k in self._named if k[:2] == (kind, namespace)]:
            del self._named[k]

    # -- reading

    def list(self, kind: str, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]] | None:
        """Copies of the slice's objects, or None when no recent LIST primed it."""
        selector = tuple(sorted(labels.items()))
        with self._lock:
            if kind not in self.kinds or not self._fresh(self._primed.get((kind, namespace, selector))):
                return None
            return [copy.deepcopy(o) for k, o in sorted(self._objects.items())
                    if k[0] == kind and k[1] == namespace and _matches(o, selector)]

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A copy of the object, or None when it is not held or no recent GET primed it."""
        key = (kind, namespace, name)
        with self._lock:
            held = self._objects.get(key)
            if held is None or not self._fresh(self._named.get(key)):
                return None
            return copy.deepcopy(held)


class CachedKube(Kube):
    """`Kube` whose reads of cached kinds come from an `ObjectCache` and whose writes feed it."""

    def __init__(self, api_client: Any, cache: ObjectCache, component: str = "reconcile", *,
                 fence: Fence | None = None) -> None:
        super().__init__(api_client, component, fence=fence)
        self.cache = cache

    def sibling(self, component: str) -> Kube:
        return type(self)(self.api, self.cache, component, fence=self.fence)

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        held = self.cache.get(kind, namespace, name)
        if held is not None:
            return held
        obj = super().get(kind, namespace, name)
        self.cache.prime_object(kind, obj)
        return obj

    def list_versioned(self, kind: str, namespace: str,
                       labels: dict[str, str]) -> tuple[list[dict[str, Any]], str | None]:
        held = self.cache.list(kind, namespace, labels)
        if held is not None:
            return held, None
        items, list_version = super().list_versioned(kind, namespace, labels)
        self.cache.prime(kind, namespace, labels, items, list_version)
        return items, list_version

    def create(self, kind: str, namespace: str, body: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        if dry_run:  # nothing was stored: nothing to cache
            return super().create(kind, namespace, body, dry_run=True)
        written = self._behind_on_conflict(kind, namespace, lambda: super(CachedKube, self).create(
            kind, namespace, body))
        self.cache.store(kind, written)
        return written

    def patch(self, kind: str, namespace: str, name: str, body: dict[str, Any], *,
              resource_version: str | None = None, uid: str | None = None,
              subresource: str | None = None) -> dict[str, Any]:
        written = self._behind_on_conflict(kind, namespace, lambda: super(CachedKube, self).patch(
            kind, namespace, name, body, resource_version=resource_version, uid=uid, subresource=subresource))
        if subresource in (None, "status"):
            self.cache.store(kind, written)
        return written

    def delete(self, kind: str, namespace: str, name: str, *, uid: str | None = None,
               resource_version: str | None = None) -> None:
        self._behind_on_conflict(kind, namespace, lambda: super(CachedKube, self).delete(
            kind, namespace, name, uid=uid, resource_version=resource_version))
        self.cache.mark_deleting(kind, namespace, name)

    def _behind_on_conflict(self, kind: str, namespace: str, write: Callable[[], T]) -> T:
        try:
            return write()
        except KubeError as exc:
            if exc.conflict:
                self.cache.invalidate(kind, namespace)
            raise
