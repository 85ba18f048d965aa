"""What a prefill and a decode instance must agree on to serve a request together.

SGLang's decode side asks the prefill's bootstrap server for its layout and raises on a page
size or KV cache dtype it does not share (`disaggregation/common/conn.py:1319-1334`); that
exception is not caught on the way up (`disaggregation/decode.py:1200`, `_resolve_pending_reqs`),
so the decode scheduler dies and takes its server with it (`managers/scheduler.py:6370-6373`,
SIGQUIT to the parent). Other differences (another model, revision, quantization, transfer
backend or engine build) are not checked at all: the KV would arrive in a shape the decode
engine misreads. So while a change of any of these rolls, the router must only ever pair
instances of the same *pairing key*: pods carry it as a label, and each key present in the fleet
gets its own router (`core.rendering`), which discovers only that key's pods.
"""

from __future__ import annotations

from hybridserving.api.v1alpha1 import ROLES, HybridServingSpec
from hybridserving.core import flags, resolution
from hybridserving.core.naming import digest

# Flags whose values the two sides must share (the rest of the argv may differ per role).
PAIRED_FLAGS = (
    "--model-path", "--revision", "--dtype", "--quantization", "--kv-cache-dtype", "--page-size",
    "--disaggregation-transfer-backend", "--speculative-algorithm", "--load-format",
)


def _flag_values(argv: list[str]) -> dict[str, str]:
    """The last value given for each paired flag (argparse keeps the last)."""
    values: dict[str, str] = {}
    for i, token in enumerate(argv[:-1]):
        if token in PAIRED_FLAGS:
            values[token] = argv[i + 1]
    return values


def pairing_key(spec: HybridServingSpec) -> str:
    """The key instances rendered from `spec` pair under; equal keys can exchange KV."""
    per_role = {}
    for role in ROLES:
        resolved = resolution.resolve(spec, role)
        per_role[role] = {
            "flags": _flag_values(flags.render_template(spec, role)),
            "page_size": resolved.page_size,
            "kv_cache_dtype": resolved.kv_cache_dtype,
        }
    weights = spec.model.weights
    return digest({
        "image": spec.engine_image(),
        "model": spec.model.path,
        "weights": None if weights is None else [weights.uri, weights.revision],
        "transfer": spec.transfer.backend,
        "roles": per_role,
    })
