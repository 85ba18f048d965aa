"""The operator: kopf watches feeding one level-triggered reconcile per HybridServing.

`kube` is the only module that talks to the Kubernetes API; `reconcile` observes, calls the
pure planner (`hybridserving.core.planner`), acts and reports; `handlers` wires kopf's watches
to a coalescing queue; `status`, `metrics` and `rbac` say what the operator reports and needs.
"""
