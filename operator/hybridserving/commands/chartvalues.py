"""The chart values an operator upgrade will run with, reduced to what decides how fleets are
planned: the default engine and router images and what engine pods are granted (`engineImage`,
`routerImage`, `enginePolicy` in charts/hybridserving/values.yaml).

`upgrade-check --values` reads them so that a fleet the new installation would refuse (an image
outside `allowedImages`; host networking, IPC_LOCK, a node cache or a service account it does not
grant) is found before the upgrade, not after. The fields and their constraints are those of the
chart's values.schema.json and the defaults those of its values.yaml
(tests/tooling/test_chart_values.py holds them together, and holds the result to what the real
`helm template` renders); keys of the file the upgrade does not plan with are not read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import ConfigDict, Field, StrictBool, StrictStr, ValidationError

from hybridserving.api.base import ApiModel
from hybridserving.api.v1alpha1 import DEFAULT_ENGINE_IMAGE, DEFAULT_ROUTER_IMAGE
from hybridserving.core.privileges import DEFAULT_NODE_CACHE_PATHS, EnginePolicy
from hybridserving.manifests import ManifestError, ManifestInvalid, errors_from_validation, read_text, yaml_documents

_REPOSITORY, _TAG = DEFAULT_ENGINE_IMAGE.rsplit(":", 1)
_ROUTER_REPOSITORY, _ROUTER_TAG = DEFAULT_ROUTER_IMAGE.rsplit(":", 1)

# The chart's values.yaml for the keys read. The models hold no defaults for the keys the schema
# requires: a values file that sets one to null removes the default, and the chart then refuses.
DEFAULTS: dict[str, Any] = {
    "engineImage": {"repository": _REPOSITORY, "tag": _TAG, "digest": ""},
    "routerImage": {"repository": _ROUTER_REPOSITORY, "tag": _ROUTER_TAG, "digest": ""},
    "enginePolicy": {"allowHostNetwork": False, "allowIpcLock": False, "allowedImages": [],
                     "allowNodeCache": False, "allowedNodeCachePaths": list(DEFAULT_NODE_CACHE_PATHS),
                     "allowServiceAccount": False},
}

NonEmpty = Annotated[StrictStr, Field(min_length=1)]
HostDirectory = Annotated[StrictStr, Field(min_length=1, pattern="^/")]

ONE_STDIN = ManifestError("(file)", "standard input (-) is named twice, and it can be read only once",
                          "give all but one of them as files")


class ImageValues(ApiModel):
    repository: NonEmpty
    tag: NonEmpty
    digest: Annotated[StrictStr, Field(pattern=r"^(sha256:[a-f0-9]{64})?$")] = ""

    def reference(self) -> str:
        """As the chart's `hybridserving.reference` helper writes it: a digest wins over the tag."""
        return f"{self.repository}@{self.digest}" if self.digest else f"{self.repository}:{self.tag}"


class EnginePolicyValues(ApiModel):
    allow_host_network: StrictBool
    allow_ipc_lock: StrictBool
    allowed_images: list[NonEmpty] = []
    allow_node_cache: StrictBool
    allowed_node_cache_paths: Annotated[list[HostDirectory], Field(min_length=1)] = list(DEFAULT_NODE_CACHE_PATHS)
    allow_service_account: StrictBool


class ChartValues(ApiModel):
    model_config = ConfigDict(extra="ignore")

    engine_image: ImageValues
    router_image: ImageValues
    engine_policy: EnginePolicyValues

    def policy(self) -> EnginePolicy:
        """What the operator's flags would say (templates/deployment.yaml)."""
        p = self.engine_policy
        return EnginePolicy(allow_host_network=p.allow_host_network, allow_ipc_lock=p.allow_ipc_lock,
                            allowed_images=tuple(p.allowed_images), default_image=self.engine_image.reference(),
                            default_router_image=self.router_image.reference(), allow_node_cache=p.allow_node_cache,
                            allowed_node_cache_paths=tuple(p.allowed_node_cache_paths),
                            allow_service_account=p.allow_service_account)


def _merged(documents: list[Any]) -> dict[str, Any]:
    """Values files merged as `helm -f a -f b` merges them: maps key by key, the later file winning;
    anything else (lists and nulls included) replaced whole."""
    out: dict[str, Any] = {}
    for document in documents:
        out = _merge(out, document or {})
    return out


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, Mapping) and isinstance(over, Mapping):
        return {**base, **{k: _merge(base.get(k), v) if k in base else v for k, v in over.items()}}
    return over


def _coalesced(given: Mapping[str, Any], defaults: Mapping[str, Any], at: str, removed: set[str]) -> dict[str, Any]:
    """The given values completed by the chart's defaults as Helm coalesces them: a key given as
    null is deleted, default and all (the way to unset a chart default), and its path added to
    `removed`; a null at a key without a default stays, for the schema to judge."""
    out = dict(given)
    for key, default in defaults.items():
        if key not in out:
            out[key] = default
        elif out[key] is None:
            del out[key]
            removed.add(f"{at}{key}")
        elif isinstance(out[key], Mapping) and isinstance(default, Mapping):
            out[key] = _coalesced(out[key], default, f"{at}{key}.", removed)
    return out


def read(paths: list[str]) -> ChartValues:
    """The values of files `paths` (`-`: standard input) merged in order, as `helm upgrade -f`
    takes them; ManifestInvalid naming the file, and the field with its fix, when one does not do."""
    if paths.count("-") > 1:
        raise ManifestInvalid("<stdin>", [ONE_STDIN])
    documents = []
    for path in paths:
        source, text = read_text(path)
        found = yaml_documents(text, source)
        if len(found) > 1 or (found and not isinstance(found[0], dict)):
            raise ManifestInvalid(source, [ManifestError(
                "(document)", "not a values file: one YAML mapping of chart values is expected",
                "give the file `helm upgrade -f` takes (`helm get values RELEASE -o yaml` writes one)")])
        if found and {"apiVersion", "kind"} <= set(found[0]):
            # A fleet manifest given as values would read as the chart's defaults (no grants), and
            # its fleets judged against those: a false "this version stops planning it".
            raise ManifestInvalid(source, [ManifestError(
                "(document)", f"a Kubernetes object (kind: {found[0]['kind']}), not a values file",
                "give the chart's values (`helm get values RELEASE -o yaml` writes them); fleets are read "
                "from the cluster, or from -f in validate, plan and render")])
        documents.extend(found)
    removed: set[str] = set()
    values = _coalesced(_merged(documents), DEFAULTS, "", removed)
    try:
        return ChartValues.model_validate(values)
    except ValidationError as exc:
        raise ManifestInvalid(", ".join(paths), [
            _unset(e) if e.path in removed else e for e in errors_from_validation(
                exc, reference="`{path}` in the chart's values.yaml and values.schema.json")]) from None


def _unset(error: ManifestError) -> ManifestError:
    return ManifestError(error.path, "set to null, which removes the chart's default, and the chart needs a value",
                         "give a value, or leave the key out to keep the chart's default")
