"""HybridServing: prefill/decode-disaggregated SGLang fleets of hybrid models on Kubernetes."""

__version__ = "0.1.0"
