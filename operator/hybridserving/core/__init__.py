"""The pure core: no Kubernetes client, no kopf, no network. Everything here is a function of typed values."""
