"""SGLang 0.5.23's command-line options, and how its parser reads a token of `engine.extraArgs`.

SGLang builds its parser with argparse's default `allow_abbrev=True`, so `--tp-si 4` is
`--tp-size 4` and `--disaggregation-mo decode` is `--disaggregation-mode decode`. A check
that compares whole flag names lets such prefixes through, and the engine then runs a
layout the operator did not plan. `resolve` reads a token the way argparse's
`_parse_optional` does, against the parser's complete option list (`OPTIONS`, copied from
the wheel and kept equal to it by a test that asks the real parser), so the operator decides
without the parser, at admission.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


# argparse's `_negative_number_matcher`: such tokens are values, not options.
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


@dataclass(frozen=True)
class Resolution:
    """What the parser makes of one option token.

    `flag` is the option it stands for (None when the parser knows none); `ambiguous`
    lists the options an abbreviation matches when it matches more than one.
    """

    token: str
    flag: str | None
    ambiguous: tuple[str, ...] = ()


def resolve(token: str, options: frozenset[str] | None = None) -> Resolution | None:
    """How SGLang's parser reads `token`, or None when it is a value rather than an option.

    The order is argparse's (Python 3.11 `_parse_optional` and `_get_option_tuples`): an
    exact option, then `--flag=value` with an exact flag, then every option the part
    before `=` is a prefix of; a single-dash token is matched the same way against the
    single-dash options (SGLang 0.5.23 defines only `-h`).
    """
    known = OPTIONS if options is None else options
    if not token.startswith("-") or token == "-" or _NEGATIVE_NUMBER.match(token) or " " in token:
        return None
    if token in known:
        return Resolution(token, token)
    name = token.split("=", 1)[0]
    if name in known:
        return Resolution(token, name)
    if name.startswith("--"):
        matches = sorted(option for option in known if option.startswith(name))
    else:
        matches = sorted(option for option in known if option.startswith(name) and not option.startswith("--"))
    if len(matches) == 1:
        return Resolution(token, matches[0])
    if matches:
        return Resolution(token, None, tuple(matches))
    return Resolution(token, None)


# Every option string of `sglang serve`'s parser in SGLang 0.5.23
# (`python -m support.sglang_parser --dump-flags`, in tests/).
OPTIONS: frozenset[str] = frozenset({
    "--abort-on-priority-when-disabled", "--admin-api-key", "--allow-auto-truncate", "--allowed-media-domains",
    "--api-key", "--asr-max-buffer-seconds", "--asr-max-concurrent-sessions", "--attention-backend",
    "--attention-context-parallel-size", "--attention-data-parallel-size", "--attn-cp-size", "--attn-dp-size",
    "--base-gpu-id", "--batch-notify-size", "--bf16-gemm-backend", "--boundary-reduction",
    "--bucket-e2e-request-latency", "--bucket-inter-token-latency", "--bucket-time-to-first-token",
    "--c128-page-size", "--chat-template", "--checkpoint-engine-wait-weights-before-ready", "--chunked-prefill-size",
    "--completion-template", "--config", "--constrained-json-disable-any-whitespace",
    "--constrained-json-max-whitespace-cnt", "--constrained-json-whitespace-pattern", "--context-bucket",
    "--context-length", "--cp-strategy", "--cpu-offload-gb", "--crash-dump-folder", "--cuda-graph-backend-decode",
    "--cuda-graph-backend-prefill", "--cuda-graph-bs-decode", "--cuda-graph-bs-prefill", "--cuda-graph-config",
    "--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill", "--cuda-graph-max-seq-len-prefill",
    "--cuda-graph-prefill-max-context", "--custom-weight-loader", "--data-parallel-size", "--dcp-comm-backend",
    "--dcp-replicate-q-proj", "--dcp-size", "--debug-cuda-graph", "--debug-tensor-dump-input-file",
    "--debug-tensor-dump-layers", "--debug-tensor-dump-output-folder", "--decode-attention-backend",
    "--decode-context-parallel-size", "--decode-log-interval", "--decoupled-spec-bind-endpoint",
    "--decoupled-spec-connect-endpoints", "--decoupled-spec-rank", "--decoupled-spec-role",
    "--decrypted-config-file", "--decrypted-draft-config-file", "--deepep-config",
    "--deepep-dispatcher-output-dtype", "--deepep-mode", "--deepep-v2-mode", "--default-chat-template-kwargs",
    "--default-priority-value", "--delete-ckpt-after-loading", "--detokenizer-worker-num", "--device",
    "--disable-aiter-allreduce-fusion-in-decode", "--disable-aiter-allreduce-fusion-in-prefill",
    "--disable-attn-tp-gather", "--disable-chunked-prefix-cache", "--disable-cuda-graph",
    "--disable-cuda-graph-padding", "--disable-custom-all-reduce", "--disable-decode-cuda-graph",
    "--disable-fast-image-processor", "--disable-flashinfer-autotune",
    "--disable-flashinfer-cutlass-moe-fp4-allgather", "--disable-hybrid-swa-memory", "--disable-outlines-disk-cache",
    "--disable-overlap-schedule", "--disable-prefill-cuda-graph", "--disable-priority-preemption",
    "--disable-radix-cache", "--disable-shared-experts-fusion", "--disable-tokenizer-batch-decode",
    "--disaggregation-bootstrap-port", "--disaggregation-decode-allocation-policy",
    "--disaggregation-decode-enable-offload-kvcache", "--disaggregation-decode-enable-radix-cache",
    "--disaggregation-decode-extra-slots", "--disaggregation-decode-host-receive-threshold",
    "--disaggregation-decode-polling-interval", "--disaggregation-decode-retraction-backup",
    "--disaggregation-enable-kv-checksum", "--disaggregation-ib-device", "--disaggregation-mode",
    "--disaggregation-transfer-backend", "--dist-init-addr", "--dist-timeout", "--dllm-algorithm",
    "--dllm-algorithm-config", "--dllm-fdfo", "--download-dir", "--dp-size", "--dsa-decode-backend",
    "--dsa-paged-mqa-logits-backend", "--dsa-prefill-backend", "--dsa-topk-backend", "--dsa-triton-union",
    "--dsv4-attn-backend", "--dsv4-prefill-backend", "--dtype", "--dwdp-size",
    "--dynamic-batch-tokenizer-batch-size", "--dynamic-batch-tokenizer-batch-timeout", "--elastic-ep-backend",
    "--elastic-ep-initial-size", "--elastic-ep-join-mode", "--elastic-ep-join-rank-offset",
    "--elastic-ep-scale-timeout", "--enable-adaptive-dispatch-to-encoder", "--enable-aiter-allreduce-fusion",
    "--enable-amd-monokernel", "--enable-attn-tp-input-scattered", "--enable-broadcast-mm-inputs-process",
    "--enable-cache-report", "--enable-cp-decode-attn-tp", "--enable-cudagraph-gc",
    "--enable-custom-logit-processor", "--enable-decoder-swa-bounded-replay", "--enable-deepseek-v4-fp4-indexer",
    "--enable-dense-mlp-attn-tp", "--enable-deterministic-inference", "--enable-dp-attention",
    "--enable-dp-attention-local-control-broadcast", "--enable-dp-lm-head", "--enable-draft-weights-cpu-backup",
    "--enable-dsa-cache-layer-split", "--enable-dsa-fused-indexer", "--enable-dynamic-batch-tokenizer",
    "--enable-dynamic-chunking", "--enable-elastic-expert-backup", "--enable-encoder-swa-bounded-replay",
    "--enable-eplb", "--enable-flashinfer-allreduce-fusion", "--enable-flexkv", "--enable-forward-pass-metrics",
    "--enable-fp32-lm-head", "--enable-fused-moe-sum-all-reduce", "--enable-fused-qk-norm-rope", "--enable-hicache",
    "--enable-hierarchical-cache", "--enable-hisparse", "--enable-http-worker-reuseport", "--enable-http2",
    "--enable-int8-mamba-checkpoint", "--enable-kv-cache-sharding", "--enable-layernorm-sp",
    "--enable-layerwise-nvtx-marker", "--enable-lean-attention", "--enable-linear-replayssm",
    "--enable-linear-replayssm-spec", "--enable-linker-mla-dedup", "--enable-lmcache", "--enable-lora",
    "--enable-lora-overlap-loading", "--enable-mamba-cache-stochastic-rounding", "--enable-megamoe-for-layernorm-sp",
    "--enable-memory-saver", "--enable-metrics", "--enable-metrics-for-all-schedulers", "--enable-mfu-metrics",
    "--enable-mis", "--enable-mixed-chunk", "--enable-mm-global-cache", "--enable-mscclpp",
    "--enable-multi-layer-eagle", "--enable-multimodal", "--enable-nccl-nvls", "--enable-nvidia-megakernel",
    "--enable-p2p-check", "--enable-page-major-kv-layout", "--enable-paged-experts", "--enable-pd-role-switch",
    "--enable-pdmux", "--enable-precise-embedding-interpolation", "--enable-prefill-cp", "--enable-prefill-delayer",
    "--enable-prefix-mm-cache", "--enable-priority-scheduling", "--enable-profile-cuda-graph",
    "--enable-quant-communications", "--enable-request-time-stats-logging", "--enable-response-store",
    "--enable-return-aux-hidden-states", "--enable-return-hidden-states", "--enable-return-indexer-topk",
    "--enable-return-routed-experts", "--enable-scattered-sconv", "--enable-session-radix-cache",
    "--enable-shared-experts-attn-tp", "--enable-single-batch-overlap", "--enable-ssl-refresh",
    "--enable-streaming-session", "--enable-strict-thinking", "--enable-symm-mem", "--enable-tf32-matmul",
    "--enable-tokenizer-batch-encode", "--enable-torch-compile", "--enable-torch-compile-debug-mode",
    "--enable-torch-symm-mem", "--enable-tp-lm-head-all-to-all", "--enable-trace", "--enable-two-batch-overlap",
    "--enable-unified-cache-external-linker", "--enable-unified-memory", "--enable-w4a4-mxfp4-megamoe",
    "--enable-waterfill", "--enable-watermark", "--enable-weights-cpu-backup", "--encoder-bootstrap-port",
    "--encoder-only", "--encoder-register-urls", "--encoder-transfer-backend", "--encoder-urls",
    "--enforce-disable-flashinfer-allreduce-fusion", "--enforce-shared-experts-fusion",
    "--engine-info-bootstrap-port", "--ep", "--ep-dispatch-algorithm", "--ep-num-redundant-experts", "--ep-size",
    "--eplb-algorithm", "--eplb-min-rebalancing-utilization-threshold", "--eplb-rebalance-layers-per-chunk",
    "--eplb-rebalance-num-iterations", "--expert-balancedness-report-mode",
    "--expert-distribution-recorder-buffer-size", "--expert-distribution-recorder-mode", "--expert-parallel-size",
    "--experts-shared-outer-loras", "--export-metrics-to-file", "--export-metrics-to-file-dir",
    "--extra-metric-labels", "--fastapi-root-path", "--file-storage-path", "--flashinfer-a2a-dispatch-type",
    "--flashinfer-allreduce-fusion-backend", "--flashinfer-autotune-skip-ops", "--flashinfer-mla-disable-ragged",
    "--flashinfer-mxfp4-moe-precision", "--flexkv-config-file", "--forward-hooks", "--forward-pass-metrics-ipc-name",
    "--forward-pass-metrics-worker-id", "--fp4-gemm-backend", "--fp8-gemm-backend", "--fuseep-mode",
    "--gated-launch-port", "--gc-threshold", "--gc-warning-threshold-secs", "--generation-tokens-buckets",
    "--gpu-id-step", "--grammar-backend", "--grpc-http-sidecar-port", "--grpc-mode", "--grpc-port",
    "--grpc-response-timeout-secs", "--help", "--hf-chat-template-name", "--hicache-host-memory-fraction",
    "--hicache-host-memory-mode", "--hicache-io-backend", "--hicache-mem-layout", "--hicache-ratio",
    "--hicache-size", "--hicache-storage-backend", "--hicache-storage-backend-extra-config",
    "--hicache-storage-prefetch-policy", "--hicache-storage-prefetch-retry-max-attempts",
    "--hicache-storage-prefetch-retry-poll-interval", "--hicache-write-policy",
    "--hierarchical-sparse-attention-extra-config", "--hisparse-config", "--host",
    "--http2-initial-connection-window-size", "--http2-max-concurrent-streams", "--image-processor-backend",
    "--incremental-streaming-output", "--init-expert-location", "--int8-mamba-ckpt-size", "--is-embedding",
    "--json-model-override-args", "--kt-cpuinfer", "--kt-max-deferred-experts-per-token", "--kt-method",
    "--kt-num-gpu-experts", "--kt-threadpool-count", "--kt-weight-path", "--kv-cache-dtype", "--kv-canary",
    "--kv-canary-real-data", "--kv-canary-sweep-interval", "--kv-events-config", "--language-model-only",
    "--language-only", "--limit-mm-data-per-request", "--linear-attn-backend", "--linear-attn-decode-backend",
    "--linear-attn-prefill-backend", "--linear-attn-verify-backend", "--linear-replayssm-cache-len",
    "--lmcache-config-file", "--load-balance-method", "--load-format", "--load-publish-endpoint",
    "--load-snapshot-publish-interval", "--log-level", "--log-level-http", "--log-requests", "--log-requests-format",
    "--log-requests-level", "--log-requests-target", "--lora-backend", "--lora-drain-wait-threshold",
    "--lora-eviction-policy", "--lora-paths", "--lora-strict-loading", "--lora-target-modules",
    "--lora-use-virtual-experts", "--mamba-backend", "--mamba-cache-philox-rounds", "--mamba-full-memory-ratio",
    "--mamba-max-states-per-path", "--mamba-radix-cache-strategy", "--mamba-ssm-dtype", "--mamba-track-interval",
    "--max-ep-size", "--max-loaded-loras", "--max-lora-chunk-size", "--max-lora-rank", "--max-loras-per-batch",
    "--max-mamba-cache-size", "--max-prefill-tokens", "--max-queued-requests", "--max-running-requests",
    "--max-total-tokens", "--media-url-max-file-size-mb", "--mem-fraction-static", "--min-free-slots-delay",
    "--mlx-enable-sampling", "--mm-attention-backend", "--mm-enable-dp-encoder", "--mm-feature-transport",
    "--mm-global-cache-backend", "--mm-io-worker-num", "--mm-preprocess-cache-size-mb", "--mm-process-config",
    "--mm-processor-worker-num", "--model", "--model-checksum", "--model-config-parser", "--model-impl",
    "--model-loader-extra-config", "--model-path", "--modelexpress-config", "--modelopt-checkpoint-restore-path",
    "--modelopt-checkpoint-save-path", "--modelopt-export-path", "--modelopt-quant", "--moe-a2a-backend",
    "--moe-data-parallel-size", "--moe-dense-tp-size", "--moe-dp-size", "--moe-runner-backend",
    "--monokernel-backend", "--mooncake-ib-device", "--msprobe-dump-config", "--nccl-init-addr", "--nccl-port",
    "--nnodes", "--no-dcp-replicate-q-proj", "--no-dllm-fdfo", "--no-enable-decoder-swa-bounded-replay",
    "--no-enable-dsa-fused-indexer", "--no-enable-fused-qk-norm-rope", "--no-enable-tf32-matmul",
    "--no-enable-tp-lm-head-all-to-all", "--no-experts-shared-outer-loras", "--no-lora-strict-loading",
    "--no-mm-enable-dp-encoder", "--no-ple-offload-embedding", "--no-speculative-enable-w4a4-mxfp4-megamoe",
    "--node-rank", "--num-continuous-decode-steps", "--num-reserved-decode-tokens", "--numa-node",
    "--offload-group-size", "--offload-mode", "--offload-num-in-group", "--offload-prefetch-step",
    "--optimistic-prefill-attempts", "--otlp-service-name", "--otlp-traces-endpoint", "--page-size",
    "--paged-experts-num-resident", "--pdmux-config-path", "--pipeline-parallel-size", "--ple-offload-backend",
    "--ple-offload-dir", "--ple-offload-embedding", "--port", "--pp-async-batch-depth", "--pp-max-micro-batch-size",
    "--pp-size", "--pre-warm-nccl", "--preferred-sampling-params", "--prefill-attention-backend",
    "--prefill-decode-interval", "--prefill-decode-interval-min-bs", "--prefill-delayer-forward-passes-buckets",
    "--prefill-delayer-max-delay-ms", "--prefill-delayer-max-delay-passes", "--prefill-delayer-queue-min-ratio",
    "--prefill-delayer-token-usage-low-watermark", "--prefill-delayer-wait-seconds-buckets",
    "--prefill-kv-cache-dequant-dtype", "--prefill-max-requests", "--prefill-only-disable-kv-cache",
    "--priority-scheduling-preemption-threshold", "--prompt-tokens-buckets", "--qsa-indexer-dtype", "--quantization",
    "--quantization-param-path", "--quantize-and-serve", "--radix-cache-backend", "--radix-eviction-policy",
    "--radix-eviction-policy-config", "--random-seed", "--reasoning-parser",
    "--remote-instance-weight-loader-backend", "--remote-instance-weight-loader-seed-instance-ip",
    "--remote-instance-weight-loader-seed-instance-service-port",
    "--remote-instance-weight-loader-send-weights-group-ports",
    "--remote-instance-weight-loader-start-seed-via-transfer-engine", "--retraction-policy",
    "--return-aux-hidden-state-layer-ids", "--return-hidden-states-mode", "--return-input-ids",
    "--return-output-ids", "--revision", "--rl-on-policy-target", "--rl-quant-profile", "--sampling-backend",
    "--sampling-defaults", "--sampling-mask-max-tokens", "--schedule-conservativeness",
    "--schedule-low-priority-values-first", "--schedule-policy", "--scheduler-recv-interval", "--served-model-name",
    "--shared-experts-tp-size", "--show-time-cost", "--sidecar", "--sidecar-args", "--skip-server-warmup",
    "--skip-tokenizer-init", "--sleep-on-idle", "--sm-group-num", "--smg-grpc-mode", "--smg-http-sidecar-port",
    "--soft-watchdog-timeout", "--spec-trace-dir", "--speculative-accept-threshold-acc",
    "--speculative-accept-threshold-single", "--speculative-adaptive", "--speculative-adaptive-config",
    "--speculative-algorithm", "--speculative-attention-mode", "--speculative-dflash-block-size",
    "--speculative-domino-candidate-pool-size", "--speculative-draft-attention-backend",
    "--speculative-draft-kv-cache-dtype", "--speculative-draft-load-format", "--speculative-draft-model",
    "--speculative-draft-model-path", "--speculative-draft-model-quantization", "--speculative-draft-model-revision",
    "--speculative-draft-sink-size", "--speculative-draft-window-size", "--speculative-dsa-topk-backend",
    "--speculative-dspark-align-verify-tokens-to-graph-tier", "--speculative-dspark-block-size",
    "--speculative-dspark-confidence-sts-path", "--speculative-dspark-sps-table-path", "--speculative-eagle-topk",
    "--speculative-enable-w4a4-mxfp4-megamoe", "--speculative-moe-a2a-backend", "--speculative-moe-runner-backend",
    "--speculative-ngram-capacity", "--speculative-ngram-external-corpus-max-tokens",
    "--speculative-ngram-external-corpus-path", "--speculative-ngram-external-sam-budget",
    "--speculative-ngram-match-type", "--speculative-ngram-max-bfs-breadth", "--speculative-ngram-max-trie-depth",
    "--speculative-ngram-min-bfs-breadth", "--speculative-num-draft-tokens", "--speculative-num-steps",
    "--speculative-token-map", "--speculative-use-block-verification", "--speculative-use-rejection-sampling",
    "--ssl-ca-certs", "--ssl-certfile", "--ssl-keyfile", "--ssl-keyfile-password", "--startup-weight-load-mode",
    "--stream-interval", "--stream-response-default-include-usage", "--strip-thinking-cache",
    "--swa-full-tokens-ratio", "--swa-prefix-tails", "--tbo-token-distribution-threshold", "--tensor-parallel-size",
    "--tokenizer-backend", "--tokenizer-metrics-allowed-custom-labels", "--tokenizer-metrics-custom-labels-header",
    "--tokenizer-mode", "--tokenizer-path", "--tokenizer-worker-num", "--tool-call-parser", "--tool-server",
    "--torch-compile-max-bs", "--tp-size", "--trace-modules", "--triton-attention-num-kv-splits",
    "--triton-attention-reduce-in-fp32", "--triton-attention-split-tile-size", "--trust-mm-content-hashes",
    "--trust-remote-code", "--trust-request-chat-template", "--unified-cache-external-linker-backend",
    "--unified-cache-external-linker-config", "--uno-lora-path", "--use-ray",
    "--uvicorn-access-log-exclude-prefixes", "--warmups", "--watchdog-timeout", "--watermark-config",
    "--weight-cache-mode", "--weight-cache-socket", "--weight-cache-timeout", "--weight-loader-disable-mmap",
    "--weight-loader-drop-cache-after-load", "--weight-loader-prefetch-checkpoints",
    "--weight-loader-prefetch-num-threads", "--weight-version", "-h",
})
