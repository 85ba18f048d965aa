"""The 2D reshard: prefill CP layer-split KV handed to a decode DCP group (Mind Lab 2026, §4-6).

Prefill with CP layer-split keeps, on each CP rank, every page of the prompt but only a
contiguous range of layers; decode with DCP keeps, on each DCP rank, every layer but only
the pages p with p mod N_dcp = d. So each (prefill rank r, decode rank d) path carries
exactly layers(r) x pages(d), written straight into decode's local slot p div N_dcp. The
transfer page is the physical page (64 tokens), not the DCP allocator's virtual page.

Sending the whole sequence to every DCP rank and resharding afterwards moves N_dcp times
the bytes and throws (N_dcp - 1)/N_dcp of them away; the plan reports both so the
operator can show what the reshard saves. Only the MLA latent travels this way; the DSA
index keys and any per-request state go with the request outside these figures.
`docs/performance-model.md` (Sources) gives the full reference for Mind Lab 2026.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from hybridserving.core.capacity import KvCacheDtype, kv_dtype_factor
from hybridserving.api.profiles import ModelArchitecture

DEFAULT_PAGE_SIZE = 64


def layer_bounds(layers: int, prefill_cp: int) -> np.ndarray:
    """Boundaries of the CP ranks' layer ranges: rank r owns [bounds[r], bounds[r+1]).

    SGLang's split: base = L div N, extra = L mod N, start(r) = r*base + min(r, extra), so
    the first `extra` ranks take one layer more (78 on 8: 10,10,10,10,10,10,9,9). The same
    formula at r = N gives L, so one vectorised expression yields every boundary.
    """
    if layers < 1 or prefill_cp < 1:
        raise ValueError("layers and prefill_cp must be >= 1")
    base, extra = divmod(layers, prefill_cp)
    ranks = np.arange(prefill_cp + 1, dtype=np.int64)
    return ranks * base + np.minimum(ranks, extra)


def filter_pages(pages: ArrayLike, decode_dcp: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """The pages DCP rank `rank` owns (p mod N_dcp = rank) and their local slots (p div N_dcp).

    This is the filter the prefill side applies before each RDMA write, so the data lands
    in decode's sharded layout with no reshard afterwards.
    """
    if not 0 <= rank < decode_dcp:
        raise ValueError(f"rank {rank} is outside the DCP group of {decode_dcp}")
    indices = np.asarray(pages, dtype=np.int64)
    owned = indices[indices % decode_dcp == rank]
    return owned, owned // decode_dcp


@dataclass(frozen=True, eq=False)
class TransferPlan:
    """Who sends what to whom for one request: layer ranges, page shards and bytes per path."""

    prefill_cp: int
    decode_dcp: int
    tokens: int
    page_size: int
    bytes_per_token_layer: int
    layer_bounds: np.ndarray
    pages: tuple[np.ndarray, ...]
    slots: tuple[np.ndarray, ...]
    rank_tokens: np.ndarray
    path_bytes: np.ndarray

    @property
    def layer_counts(self) -> np.ndarray:
        return np.diff(self.layer_bounds)

    @property
    def total_pages(self) -> int:
        return sum(len(owned) for owned in self.pages)

    @property
    def total_bytes(self) -> int:
        """Bytes the N_cp x N_dcp paths move together: the request's KV, once."""
        return int(self.path_bytes.sum())

    @property
    def naive_bytes(self) -> int:
        """Bytes of sending the whole KV to every DCP rank and resharding there."""
        return self.decode_dcp * self.total_bytes

    @property
    def discarded_fraction(self) -> float:
        """Share of the naive transfer that decode would throw away: (N_dcp - 1)/N_dcp."""
        return 1.0 - self.total_bytes / self.naive_bytes

    def layer_ranges(self) -> list[tuple[int, int]]:
        bounds = self.layer_bounds.tolist()
        return list(itertools.pairwise(bounds))

    def summary(self) -> dict[str, Any]:
        """A JSON-ready digest: counts and first/last pages, never the page arrays themselves."""

        def edge(values: np.ndarray, at: int) -> int | None:
            return int(values[at]) if len(values) else None

        return {
            "prefillCp": self.prefill_cp,
            "decodeDcp": self.decode_dcp,
            "tokens": self.tokens,
            "pageSize": self.page_size,
            "pages": self.total_pages,
            "bytesPerTokenLayer": self.bytes_per_token_layer,
            "layerRanges": [list(bounds) for bounds in self.layer_ranges()],
            "decodeRanks": [
                {
                    "rank": rank,
                    "pages": len(owned),
                    "firstPage": edge(owned, 0),
                    "lastPage": edge(owned, -1),
                    "firstSlot": edge(slots, 0),
                    "lastSlot": edge(slots, -1),
                    "tokens": int(self.rank_tokens[rank]),
                    "bytes": int(self.path_bytes[:, rank].sum()),
                }
                for rank, (owned, slots) in enumerate(zip(self.pages, self.slots, strict=True))
            ],
            "paths": self.path_bytes.size,
            "pathBytes": self.path_bytes.tolist(),
            "maxPathBytes": int(self.path_bytes.max()),
            "totalBytes": self.total_bytes,
            "naiveBytes": self.naive_bytes,
            "discardedFraction": self.discarded_fraction,
        }


def plan_transfer(
    arch: ModelArchitecture,
    prefill_cp: int,
    decode_dcp: int,
    tokens: int,
    page_size: int = DEFAULT_PAGE_SIZE,
    *,
    kv_cache_dtype: KvCacheDtype = "fp8_e4m3",
) -> TransferPlan:
    """Plan the 2D reshard of one request of `tokens` tokens from N_cp prefill to N_dcp decode ranks.

    Path (r, d) moves layers(r) x real tokens on d's pages x bytes per token per layer; the
    last page counts only the tokens it holds.
    """
    if arch.mla_layers != arch.layers:
        raise ValueError(
            f"the 2D reshard splits layers that all keep a per-token latent; {arch.hf_architecture} "
            f"has {arch.layers - arch.mla_layers} layers with per-request state instead"
        )
    if decode_dcp < 1 or tokens < 1 or page_size < 1:
        raise ValueError("decode_dcp, tokens and page_size must be >= 1")
    bounds = layer_bounds(arch.layers, prefill_cp)
    total_pages = -(-tokens // page_size)
    sequence = np.arange(total_pages, dtype=np.int64)
    shards = [filter_pages(sequence, decode_dcp, rank) for rank in range(decode_dcp)]
    rank_tokens = np.array([len(owned) for owned, _ in shards], dtype=np.int64) * page_size
    rank_tokens[(total_pages - 1) % decode_dcp] -= total_pages * page_size - tokens
    per_token_layer = arch.kv_bytes_per_token_layer * kv_dtype_factor(kv_cache_dtype)
    return TransferPlan(
        prefill_cp=prefill_cp,
        decode_dcp=decode_dcp,
        tokens=tokens,
        page_size=page_size,
        bytes_per_token_layer=per_token_layer,
        layer_bounds=bounds,
        pages=tuple(owned for owned, _ in shards),
        slots=tuple(slots for _, slots in shards),
        rank_tokens=rank_tokens,
        path_bytes=np.outer(np.diff(bounds), rank_tokens) * per_token_layer,
    )
