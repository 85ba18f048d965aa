"""Where the engine's weights come from.

The shape is the one KServe (`storageUri`) and llm-d (`modelArtifacts.uri`) users already
write: one URI whose scheme names the source, plus the secret that unlocks it.

* `hf://org/model` — a hub repository; the token comes from a Secret key and reaches the
  pods through `valueFrom` only (it never appears in an object the operator writes).
  `cache: Node` fills a directory on each node once (an init step, under a per-node lock)
  and every later pod on that node (restart, gang restart, role switch) reuses it.
* `pvc://claim/sub/path` — a PersistentVolumeClaim mounted read-only by every pod
  (ReadOnlyMany), filled by whatever the platform uses.
* `oci://registry/repo:tag` — an OCI image mounted as a read-only volume (Kubernetes image
  volumes, where the cluster supports them; where its apiserver drops them, no engine pod is
  created and the fleet says why: controller/reconcile.py `image_volume_refused`).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from hybridserving.api.base import ApiModel, FieldInvalid, Format, cel

URI_MAX_LENGTH = 1024
WeightsCache = Literal["None", "Node"]

URI = Format(
    r"^(hf://[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?|pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?"
    r"(/[^\t\n\f\r ]*)?|oci://[^\t\n\f\r ]+)$",
    "a weights URI",
    "hf://org/model (a hub repository), pvc://claim[/path] (a PersistentVolumeClaim, its name in lowercase) or "
    "oci://registry/repo:tag (an image), without spaces, e.g. hf://deepseek-ai/DeepSeek-V3")
REVISION = Format("^[A-Za-z0-9._/-]+$", "a hub revision",
                  "a branch, tag or commit of letters, digits, '.', '_', '/' or '-', e.g. main or a commit hash")
ENDPOINT = Format(r"^https?://[^\t\n\f\r ]+$", "a hub endpoint",
                  "an http:// or https:// URL without spaces, e.g. https://hf-mirror.example.com")
HOST_PATH = Format(r"^/[^\t\n\f\r ]*$", "an absolute host path",
                   "'/' first and no spaces, e.g. /var/lib/hybridserving/models")


class SecretKeyRef(ApiModel):
    name: str = Field(min_length=1, max_length=253, description="Secret in the fleet's namespace.")
    key: str = Field(default="HF_TOKEN", min_length=1, max_length=253, description="Key holding the token.")


class WeightsSpec(ApiModel):
    model_config = ConfigDict(
        **ApiModel.model_config,
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("self.cache == 'None' || self.uri.startsWith('hf://')",
                    "cache: Node fills a node-local directory from the hub; it applies to hf:// sources only "
                    "(a PVC or image volume is already shared)", "cache"),
                cel("!has(self.tokenSecretRef) || self.uri.startsWith('hf://')",
                    "tokenSecretRef is the hub token; it applies to hf:// sources only", "tokenSecretRef"),
            ]
        },
    )

    uri: Annotated[str, Field(max_length=URI_MAX_LENGTH), URI] = Field(
        description="hf://org/model (hub), pvc://claim[/path] (PersistentVolumeClaim, mounted read-only) or "
        "oci://image (image volume).",
    )
    revision: Annotated[str, Field(max_length=128), REVISION] | None = Field(
        default=None,
        description="Hub revision (branch, tag or commit); pin a commit for reproducible fleets.",
    )
    token_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Hub token from a Secret key; passed to pods by reference only."
    )
    endpoint: Annotated[str, Field(max_length=512), ENDPOINT] | None = Field(
        default=None,
        description="Hub endpoint (HF_ENDPOINT) for a mirror or an in-cluster hub proxy.",
    )
    cache: WeightsCache = Field(
        default="None",
        description="hf:// only. None: each engine downloads at start. Node: fill a node-local directory once "
        "per node (an init step) and reuse it for every later pod there.",
    )
    node_cache_path: Annotated[str, Field(max_length=512), HOST_PATH] = Field(
        default="/var/lib/hybridserving/models",
        description="Host directory of the node-local cache (cache: Node).",
    )
    size_bytes: int | None = Field(
        default=None, ge=0,
        description="Size of one copy, for status.weights.bytesTotal when the hub lists no file sizes "
        "(cache: Node; the Hub itself lists them).",
    )

    @model_validator(mode="after")
    def _source_fits(self) -> WeightsSpec:
        if self.cache != "None" and self.scheme != "hf":
            raise FieldInvalid("cache", "cache: Node applies to hf:// sources only")
        if self.token_secret_ref is not None and self.scheme != "hf":
            raise FieldInvalid("tokenSecretRef", "tokenSecretRef applies to hf:// sources only")
        if self.scheme == "pvc" and any(part in ("", ".", "..") for part in self.location.rstrip("/").split("/")[1:]):
            # The apiserver refuses such a subPath on the pods, long after the fleet was admitted.
            raise FieldInvalid("uri", "the path of a pvc:// source is relative to the claim's root, with no '..', "
                               "'.' or empty part (e.g. pvc://models/deepseek-v3)")
        return self

    @property
    def scheme(self) -> Literal["hf", "pvc", "oci"]:
        scheme = self.uri.split("://", 1)[0]
        assert scheme in ("hf", "pvc", "oci"), "the pattern admits these schemes only"
        return scheme  # type: ignore[return-value]

    @property
    def location(self) -> str:
        """The URI without its scheme: repo id, claim[/path] or image reference."""
        return self.uri.split("://", 1)[1]

    @property
    def claim(self) -> tuple[str, str]:
        """(claim name, sub path) of a pvc:// source."""
        claim, _, sub = self.location.partition("/")
        return claim, re.sub(r"/+$", "", sub)
