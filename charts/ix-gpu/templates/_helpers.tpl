{{/* Names ------------------------------------------------------------------------------------ */}}

{{- define "ix-gpu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ix-gpu.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* "<fullname>-webhook" is 8 characters longer: keep it a valid DNS label. */}}
{{- define "ix-gpu.webhook.name" -}}
{{- printf "%s-webhook" (include "ix-gpu.fullname" . | trunc 55 | trimSuffix "-") -}}
{{- end -}}

{{- define "ix-gpu.plugin.name" -}}
{{- printf "%s-plugin" (include "ix-gpu.fullname" . | trunc 56 | trimSuffix "-") -}}
{{- end -}}

{{/* The MutatingWebhookConfiguration is cluster-scoped: the release name keeps it unique. */}}
{{- define "ix-gpu.webhookConfiguration.name" -}}
{{- include "ix-gpu.fullname" . -}}
{{- end -}}

{{- define "ix-gpu.webhook.serviceDNS" -}}
{{- printf "%s.%s.svc" (include "ix-gpu.webhook.name" .) .Release.Namespace -}}
{{- end -}}

{{- define "ix-gpu.certs.secretName" -}}
{{- $mode := .Values.certs.mode -}}
{{- if eq $mode "provided" -}}
{{- required "certs.provided.secretName is required when certs.mode is provided" .Values.certs.provided.secretName -}}
{{- else if eq $mode "self" -}}
{{- default (printf "%s-tls" (include "ix-gpu.webhook.name" .)) .Values.certs.self.secretName -}}
{{- else -}}
{{- printf "%s-tls" (include "ix-gpu.webhook.name" .) -}}
{{- end -}}
{{- end -}}

{{/* Labels ----------------------------------------------------------------------------------- */}}

{{- define "ix-gpu.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "ix-gpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "ix-gpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ix-gpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ix-gpu.webhook.selectorLabels" -}}
{{ include "ix-gpu.selectorLabels" . }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- define "ix-gpu.plugin.selectorLabels" -}}
{{ include "ix-gpu.selectorLabels" . }}
app.kubernetes.io/component: device-plugin
{{- end -}}

{{- define "ix-gpu.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Admission -------------------------------------------------------------------------------- */}}

{{/* Namespaces the webhook never sees: system ones, its own, and the operator's list. */}}
{{- define "ix-gpu.excludedNamespaces" -}}
{{- $ns := list "kube-system" "kube-public" "kube-node-lease" .Release.Namespace -}}
{{- range .Values.webhook.excludedNamespaces -}}
{{- $ns = append $ns . -}}
{{- end -}}
{{- toJson ($ns | uniq) -}}
{{- end -}}

{{/* Resource names of the enabled profiles, as a JSON list. */}}
{{- define "ix-gpu.gpuResources" -}}
{{- $out := list -}}
{{- range $name, $profile := .Values.profiles -}}
{{- if $profile.enabled -}}
{{- $out = concat $out $profile.resources -}}
{{- end -}}
{{- end -}}
{{- toJson ($out | uniq) -}}
{{- end -}}

{{/*
CEL: is the map key `r` a configured GPU resource? Exact names become one `in` test; names
ending in "*" become startsWith tests.
*/}}
{{- define "ix-gpu.cel.isGpuResource" -}}
{{- $exact := list -}}
{{- $tests := list -}}
{{- range (include "ix-gpu.gpuResources" . | fromJsonArray) -}}
{{- if hasSuffix "*" . -}}
{{- $tests = append $tests (printf "r.startsWith('%s')" (trimSuffix "*" .)) -}}
{{- else -}}
{{- $exact = append $exact (printf "'%s'" .) -}}
{{- end -}}
{{- end -}}
{{- if $exact -}}
{{- $tests = prepend $tests (printf "r in [%s]" (join ", " $exact)) -}}
{{- end -}}
{{- join " || " $tests -}}
{{- end -}}

{{/*
CEL: does the pod spec at expression `.spec` ask for a GPU in some container or initContainer,
in limits or requests? Every step is guarded with has(): an evaluation error would apply
failurePolicy Fail to an object that is none of our business.
*/}}
{{- define "ix-gpu.cel.podSpecWantsGpu" -}}
{{- $r := include "ix-gpu.cel.isGpuResource" .root -}}
{{- $c := printf "has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(r, %s)) || (has(c.resources.requests) && c.resources.requests.exists(r, %s)))" $r $r -}}
{{- printf "(has(%s.containers) && %s.containers.exists(c, %s)) || (has(%s.initContainers) && %s.initContainers.exists(c, %s))" .spec .spec $c .spec .spec $c -}}
{{- end -}}
