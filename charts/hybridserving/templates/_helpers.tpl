{{/*
Names, labels and the pieces shared by several templates. The RBAC rules live here once so
that the namespaced Role and its cluster-wide variant (watchAllNamespaces) can never drift.
*/}}

{{- define "hybridserving.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "hybridserving.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A Service's name: (list . "<suffix>"). A Service name is a DNS-1035 label of at most 63
characters, so the fullname is cut to leave room for the suffix (other objects take 253).
*/}}
{{- define "hybridserving.serviceName" -}}
{{- $suffix := index . 1 }}
{{- printf "%s-%s" (include "hybridserving.fullname" (index . 0) | trunc (int (sub 62 (len $suffix))) | trimSuffix "-") $suffix }}
{{- end }}

{{- define "hybridserving.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hybridserving.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "hybridserving.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "hybridserving.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: hybridserving
{{- end }}

{{- define "hybridserving.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "hybridserving.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "hybridserving.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The engine and router images of fleets that name none. */}}
{{- define "hybridserving.engineImage" -}}
{{- include "hybridserving.reference" (required "engineImage: give {repository, tag}, or leave it out for the chart's default" .Values.engineImage) }}
{{- end }}

{{- define "hybridserving.routerImage" -}}
{{- include "hybridserving.reference" (required "routerImage: give {repository, tag}, or leave it out for the chart's default" .Values.routerImage) }}
{{- end }}

{{/* An image reference from {repository, tag, digest}: a digest wins over the tag. */}}
{{- define "hybridserving.reference" -}}
{{- if .digest }}
{{- printf "%s@%s" .repository .digest }}
{{- else }}
{{- printf "%s:%s" .repository .tag }}
{{- end }}
{{- end }}

{{/* The namespaces to reconcile, as a list: watchNamespaces, or the release namespace. */}}
{{- define "hybridserving.namespaces" -}}
{{- $namespaces := .Values.watchNamespaces | default (list .Release.Namespace) | uniq }}
{{- toJson $namespaces }}
{{- end }}

{{/* The Secret holding the operator key: the one named in operatorKey.existingSecret, or the chart's. */}}
{{- define "hybridserving.operatorKeySecret" -}}
{{- .Values.operatorKey.existingSecret | default (printf "%s-operator-key" (include "hybridserving.fullname" .)) -}}
{{- end }}

{{- /* The webhook's serving certificate: the user's Secret, or the one templates/webhook.yaml keeps. */}}
{{- define "hybridserving.webhookSecret" -}}
{{- .Values.webhook.certificate.existingSecret | default (printf "%s-webhook-tls" (include "hybridserving.fullname" .)) -}}
{{- end }}

{{/*
The grace period a stopping replica needs (controller/handlers.py `stop`): the webhook's preStop
pause, the wait for work under way (STOP_GRACE_SECONDS, 20), then the release of the Lease, which
first waits for a renewal in flight (a read and a write) and then reads and writes itself: four
Lease calls, each up to its timeout (controller/leadership.py `Election.request_timeout_seconds`,
with the renew deadline and retry `__main__` derives from the lease). Unset, the grace is this or
45 s, whichever is longer; set shorter, the chart refuses it.
*/}}
{{- define "hybridserving.terminationGracePeriodSeconds" -}}
{{- $lease := float64 .Values.leaderElection.leaseDurationSeconds -}}
{{- $timeout := divf (subf (divf (mulf $lease 2.0) 3.0) (minf 2.0 (divf $lease 4.0))) 2.0 -}}
{{- $pause := ternary 5.0 0.0 .Values.webhook.enabled -}}
{{- $needed := int (ceil (addf $pause 20.0 (mulf 4.0 $timeout))) -}}
{{- $given := .Values.terminationGracePeriodSeconds -}}
{{- if kindIs "invalid" $given -}}
{{- max 45 $needed -}}
{{- else if lt (int $given) $needed -}}
{{- fail (printf "terminationGracePeriodSeconds (%d) is shorter than a stopping replica needs to hand the Lease over: %d s with leaderElection.leaseDurationSeconds %v%s. Raise it to at least %d, or leave it unset" (int $given) $needed .Values.leaderElection.leaseDurationSeconds (ternary " and the webhook on" "" .Values.webhook.enabled) $needed) -}}
{{- else -}}
{{- int $given -}}
{{- end -}}
{{- end -}}
