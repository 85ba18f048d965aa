{{/*
The operator's permissions, split by scope. They are the rules of
operator/hybridserving/controller/rbac.py (tests/tooling/test_chart_static.py renders the chart and
fails when the two differ); change both together. Namespaced resources are granted per watched
namespace (a Role), or cluster-wide only with watchAllNamespaces; the ClusterRole holds only
what exists at cluster scope, read-only (the admission webhook's configuration is the chart's
own, templates/webhook.yaml, so the operator needs no rule for it). No wildcard, and no get,
list or watch on Secrets: the operator never fetches one. It writes one Secret per fleet (create
and patch, by server-side apply): the engines' API key, which it derives from its own key and the
fleet's uid instead of storing. That patch still reads: the apiserver answers a PATCH with the
whole object, so the operator's token can read any Secret where it may patch them (every watched
namespace, or every namespace with watchAllNamespaces; docs/security.md).
*/}}

{{/* Rules granted in each watched namespace (a Role), or cluster-wide with watchAllNamespaces. */}}
{{- define "hybridserving.namespacedRules" -}}
# Read the fleets (never their spec: no update or patch).
- apiGroups: ["hybridserving.io"]
  resources: ["hybridservings"]
  verbs: ["get", "list", "watch"]
# Report status and conditions.
- apiGroups: ["hybridserving.io"]
  resources: ["hybridservings/status"]
  verbs: ["get", "patch"]
# Resize fleets whose built-in scaler is on (spec.replicas, as HPA does).
- apiGroups: ["hybridserving.io"]
  resources: ["hybridservings/scale"]
  verbs: ["get", "patch"]
# One instance object per engine instance.
- apiGroups: ["hybridserving.io"]
  resources: ["hybridservinginstances"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Instance phase, ready pods, nodes.
- apiGroups: ["hybridserving.io"]
  resources: ["hybridservinginstances/status"]
  verbs: ["get", "patch"]
# ownerReferences with blockOwnerDeletion on fleets and instances.
- apiGroups: ["hybridserving.io"]
  resources: ["hybridservings/finalizers", "hybridservinginstances/finalizers"]
  verbs: ["update"]
# Engine pods (gangs), their rendezvous Services, the engine ConfigMaps.
- apiGroups: [""]
  resources: ["pods", "services", "configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The router's identity.
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The router.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Each configuration applied, kept for rollback (bounded history).
- apiGroups: ["apps"]
  resources: ["controllerrevisions"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Per-role disruption budgets.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Who may reach the engines (the fleet, its router, the operator).
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# One gang Workload per instance (spec.gang.mode: Workload).
- apiGroups: ["scheduling.k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "create", "patch", "delete"]
# The router may read pods of its namespace (service discovery); the operator holds that itself.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Each fleet's engine API key, written (server-side apply), never fetched: the key is derived, not
# stored. A PATCH answers with the Secret, so this also reads any Secret here (docs/security.md).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create", "patch"]
# An Event for every decision.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{/* Rules that only exist cluster-wide (a ClusterRole), always read-only. */}}
{{- define "hybridserving.clusterRules" -}}
# kopf discovers and follows custom resource definitions; the operator compares the installed
# CRDs' schema digests with its own (a LIST by name; never written).
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
# kopf lists and watches namespaces even when given explicit --namespace names (without it,
# every start retries for about a minute before falling back).
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
