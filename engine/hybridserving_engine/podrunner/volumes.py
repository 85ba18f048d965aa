"""Pod volumes as files on the local disk, written the way the kubelet writes them.

The launcher reads its per-role flags from a projected ConfigMap volume and its role from a
downward-API file, and it reacts to changes of both: so the runner must give the same
contents and the same update semantics. The kubelet's atomic writer publishes a new version
by writing a fresh timestamped directory and swapping the `..data` symlink; every visible
file is a symlink through `..data`, so a reader never sees half of an update. The same
scheme is used here.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ConfigMapReader = Callable[[str], Mapping[str, str] | None]
"""Returns a ConfigMap's `data` by name, or None when it does not exist."""


class MissingSource(Exception):
    """A volume source the pod needs does not exist yet; the kubelet waits for it too."""


def _quote(value: str) -> str:
    """Go's %q, as the kubelet writes label and annotation values in a whole-map file."""
    return json.dumps(value, ensure_ascii=False)


def field_value(pod: Mapping[str, Any], field_path: str) -> str:
    """The value of a downward-API `fieldRef.fieldPath` for this pod."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    for prefix, mapping in (("metadata.labels", meta.get("labels")), ("metadata.annotations", meta.get("annotations"))):
        mapping = mapping or {}
        if field_path == prefix:
            return "\n".join(f"{k}={_quote(v)}" for k, v in sorted(mapping.items()))
        if field_path.startswith(prefix + "['") and field_path.endswith("']"):
            value: str = mapping.get(field_path[len(prefix) + 2:-2], "")
            return value
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
    }
    if field_path not in simple:
        raise ValueError(f"unsupported downward-API field {field_path!r}")
    return simple[field_path] or ""


def _config_map_files(source: Mapping[str, Any], read: ConfigMapReader) -> dict[str, str]:
    data = read(source["name"])
    if data is None:
        if source.get("optional"):
            return {}
        raise MissingSource(f"ConfigMap {source['name']} does not exist")
    items = source.get("items")
    if not items:
        return dict(data)
    return {item["path"]: data[item["key"]] for item in items if item["key"] in data}


def _downward_files(source: Mapping[str, Any], pod: Mapping[str, Any]) -> dict[str, str]:
    return {
        item["path"]: field_value(pod, item["fieldRef"]["fieldPath"])
        for item in source.get("items") or []
        if "fieldRef" in item
    }


def volume_files(volume: Mapping[str, Any], pod: Mapping[str, Any], read: ConfigMapReader) -> dict[str, str] | None:
    """The files of one pod volume, by relative path; None for a volume with no API content
    (emptyDir, and projected service-account tokens, which the engine does not use)."""
    if "configMap" in volume:
        return _config_map_files(volume["configMap"], read)
    if "downwardAPI" in volume:
        return _downward_files(volume["downwardAPI"], pod)
    if "projected" in volume:
        files: dict[str, str] = {}
        for source in volume["projected"].get("sources") or []:
            if "configMap" in source:
                files.update(_config_map_files(source["configMap"], read))
            elif "downwardAPI" in source:
                files.update(_downward_files(source["downwardAPI"], pod))
        return files
    return None


class AtomicDirectory:
    """A directory whose files are replaced all at once, like a kubelet-managed volume."""

    DATA = "..data"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.path.mkdir(parents=True, exist_ok=True)
        self._current: dict[str, str] | None = None

    def write(self, files: Mapping[str, str]) -> bool:
        """Publish `files` as the new content; False (and nothing written) when unchanged."""
        files = dict(files)
        if files == self._current:
            return False
        version = Path(tempfile.mkdtemp(prefix="..", dir=self.path))
        for rel, content in files.items():
            target = version / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        link = self.path / self.DATA
        tmp_link = self.path / "..data_tmp"
        tmp_link.unlink(missing_ok=True)
        tmp_link.symlink_to(version.name)
        old = os.readlink(link) if link.is_symlink() else None
        os.replace(tmp_link, link)
        for rel in {p.split("/", 1)[0] for p in files}:
            visible = self.path / rel
            if not visible.is_symlink():
                visible.symlink_to(Path(self.DATA) / rel)
        for rel in {p.split("/", 1)[0] for p in self._current or {}} - {p.split("/", 1)[0] for p in files}:
            (self.path / rel).unlink(missing_ok=True)
        if old:
            shutil.rmtree(self.path / old, ignore_errors=True)
        self._current = files
        return True


WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def pin_wildcard_host(content: str, pod_ip: str) -> str:
    """Engine flags that bind every interface (`--host 0.0.0.0`) bound to the pod IP instead.

    In a pod, the wildcard means the pod's own network namespace. Local processes share the
    host's, so a wildcard bind would listen on every interface of the machine and collide
    between pods: the pod IP (127.x from kwok) is what the wildcard stands for. Only JSON
    documents holding argv lists are touched; anything else is returned as is.
    """
    try:
        doc = json.loads(content)
    except ValueError:
        return content
    changed = False

    def walk(node: Any) -> Any:
        nonlocal changed
        if isinstance(node, list) and all(isinstance(a, str) for a in node):
            out = list(node)
            for i, token in enumerate(out[:-1]):
                if token == "--host" and out[i + 1] in WILDCARD_HOSTS:
                    out[i + 1] = pod_ip
                    changed = True
            return out
        if isinstance(node, list):
            return [walk(n) for n in node]
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        return node

    pinned = walk(doc)
    return json.dumps(pinned, indent=1, sort_keys=True) if changed else content
