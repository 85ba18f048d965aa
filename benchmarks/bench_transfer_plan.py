"""How long planning the 2D reshard takes for a 500 K-token request (GLM-5.2, prefill CP 8 x decode DCP 4).

The plan is computed on the prefill side for every request before its RDMA writes, so it
must stay far below the transfer itself (~0.5-2 ms at 4-32 K tokens): the target is well
under 10 ms at 500 K tokens (~7.8 K pages, 32 paths).

    python benchmarks/bench_transfer_plan.py [--json] [--repetitions 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from hybridserving.api.profiles import resolve_profile
from hybridserving.core.transfer import plan_transfer

TARGET_S = 10e-3


def measure(profile: str, prefill_cp: int, decode_dcp: int, tokens: int, repetitions: int) -> dict:
    """Median and minimum wall time of `plan_transfer` after a warm-up, with the plan's figures."""
    arch = resolve_profile(profile)
    for _ in range(10):
        plan = plan_transfer(arch, prefill_cp, decode_dcp, tokens)
    timings = []
    for _ in range(repetitions):
        start = time.perf_counter()
        plan = plan_transfer(arch, prefill_cp, decode_dcp, tokens)
        timings.append(time.perf_counter() - start)
    summary = plan.summary()
    return {
        "profile": profile,
        "repetitions": repetitions,
        "medianSeconds": statistics.median(timings),
        "minSeconds": min(timings),
        "targetSeconds": TARGET_S,
        "meetsTarget": statistics.median(timings) < TARGET_S,
        "plan": {key: summary[key] for key in ("tokens", "pages", "paths", "layerRanges", "totalBytes", "naiveBytes",
                                                "discardedFraction", "maxPathBytes", "pathBytes")},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--repetitions", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=500_000)
    parser.add_argument("--profile", default="glm-5.2")
    parser.add_argument("--prefill-cp", type=int, default=8)
    parser.add_argument("--decode-dcp", type=int, default=4)
    args = parser.parse_args(argv)
    result = measure(args.profile, args.prefill_cp, args.decode_dcp, args.tokens, args.repetitions)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    plan = result["plan"]
    print(f"plan_transfer {args.profile}: {plan['tokens']:,} tokens = {plan['pages']:,} pages, "
          f"CP{args.prefill_cp} x DCP{args.decode_dcp} = {plan['paths']} paths")
    print(f"  median {result['medianSeconds'] * 1e3:.3f} ms, min {result['minSeconds'] * 1e3:.3f} ms "
          f"over {args.repetitions} runs (target < {TARGET_S * 1e3:.0f} ms)")
    print(f"  layer ranges {plan['layerRanges']}")
    print(f"  total {plan['totalBytes'] / 1e9:.2f} GB, naive {plan['naiveBytes'] / 1e9:.2f} GB "
          f"({plan['discardedFraction']:.0%} discarded), largest path {plan['maxPathBytes'] / 1e6:.0f} MB")
    for rank, row in enumerate(plan["pathBytes"]):
        print(f"  prefill rank {rank}: " + ", ".join(f"{value / 1e6:.0f} MB" for value in row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
