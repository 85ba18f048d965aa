"""The local pod runner: what the kubelet and the container runtime do for engine pods, on loopback.

On the local cluster (fake GPU nodes from kwok) no kubelet runs, so an engine pod is only an
API object. The pod runner watches engine pods bound to fake nodes and, for each leader pod,
runs the real launcher (`hybridserving-engine`, SGLang simulator backend) at the pod's IP,
which kwok hands out from a 127.x range: volumes materialised from the API, the role file kept
current like a downward-API volume, the pod's readiness probe mirrored into its status,
restarts counted, SIGTERM and the grace period honoured on deletion. See docs/podrunner.md.

    python -m hybridserving_engine.podrunner --kubeconfig K [--namespace N]
"""
