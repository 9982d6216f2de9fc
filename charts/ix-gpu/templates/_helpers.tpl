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

{{- define "ix-gpu.dra.name" -}}
{{- printf "%s-dra" (include "ix-gpu.fullname" . | trunc 59 | trimSuffix "-") -}}
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

{{- define "ix-gpu.dra.selectorLabels" -}}
{{ include "ix-gpu.selectorLabels" . }}
app.kubernetes.io/component: dra-plugin
{{- end -}}

{{/*
Whether the plugin talks to the API server ("true"/"false"): to publish node labels, to read its
node's config label (per-node configs), with DRA its allocation label and the DRA driver's
ResourceSlices, or with flags.usevolcano its node's pods. The ServiceAccount and the pod (whose
setting wins) say the same, so RBAC that is granted is also usable.
*/}}
{{- define "ix-gpu.plugin.apiAccess" -}}
{{- or .Values.plugin.nodeLabels (not (empty .Values.plugin.nodeConfigs)) .Values.dra.enabled (eq (include "ix-gpu.plugin.usevolcano" .) "true") -}}
{{- end -}}

{{/*
Whether any ix-config of the release turns flags.usevolcano on ("true"/"false"): plugin.config, or
a named per-node config. The plugin then reads its node's pods and writes three annotations of
the pod it binds (plugin-rbac.yaml).
*/}}
{{- define "ix-gpu.plugin.usevolcano" -}}
{{- $on := .Values.plugin.config.flags.usevolcano | default false -}}
{{- range $name, $config := .Values.plugin.nodeConfigs -}}
{{- if dig "flags" "usevolcano" false (deepCopy $config) -}}
{{- $on = true -}}
{{- end -}}
{{- end -}}
{{- $on -}}
{{- end -}}

{{- define "ix-gpu.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* "<fullname>-metrics": the Service (and ServiceMonitor) of both components' /metrics. */}}
{{- define "ix-gpu.metrics.name" -}}
{{- printf "%s-metrics" (include "ix-gpu.fullname" . | trunc 55 | trimSuffix "-") -}}
{{- end -}}

{{/* Admission -------------------------------------------------------------------------------- */}}

{{/*
Namespaces the webhook never sees: system ones, its own, and config.policy.excludedNamespaces.
The same list goes into the namespaceSelector and into the config the webhook loads.
*/}}
{{- define "ix-gpu.excludedNamespaces" -}}
{{- $ns := list "kube-system" "kube-public" "kube-node-lease" .Release.Namespace -}}
{{- $policy := default dict .Values.config.policy -}}
{{- range $policy.excludedNamespaces -}}
{{- $ns = append $ns . -}}
{{- end -}}
{{- toJson ($ns | uniq) -}}
{{- end -}}

{{/*
The exact names of the excluded namespaces, for the namespaceSelector (kubernetes.io/metadata.name
NotIn). A glob ("team-*") is no label value, and the apiserver refuses a selector holding one: globs
go to CEL (ix-gpu.cel.namespaceNotExcluded) instead.
*/}}
{{- define "ix-gpu.excludedNamespaceNames" -}}
{{- $names := list -}}
{{- range (include "ix-gpu.excludedNamespaces" . | fromJsonArray) -}}
{{- if not (regexMatch "[*?\\[]" .) -}}
{{- $names = append $names . -}}
{{- end -}}
{{- end -}}
{{- toJson $names -}}
{{- end -}}

{{/*
CEL for matchConditions: the request's namespace matches none of the excluded namespace globs; empty
when there is none. The config allows only "*" and "?" and namespace characters ([-a-z0-9]) in a glob,
so the regular expression needs no escapes. Without matchConditions (webhook.matchConditions false)
objects in those namespaces are still sent, and the webhook itself leaves them alone.
*/}}
{{- define "ix-gpu.cel.namespaceNotExcluded" -}}
{{- $res := list -}}
{{- range (include "ix-gpu.excludedNamespaces" . | fromJsonArray) -}}
{{- if regexMatch "[*?]" . -}}
{{- $res = append $res (. | replace "*" ".*" | replace "?" ".") -}}
{{- end -}}
{{- end -}}
{{- if $res -}}
{{- printf "!request.namespace.matches('^(%s)$')" (join "|" $res) -}}
{{- end -}}
{{- end -}}

{{/*
The webhook's config as it loads it: `config` as given, with the excluded namespaces above. A copy,
so that rendering never changes .Values.
*/}}
{{- define "ix-gpu.config" -}}
{{- $config := deepCopy .Values.config -}}
{{- $policy := default dict $config.policy -}}
{{- $_ := set $policy "excludedNamespaces" (include "ix-gpu.excludedNamespaces" . | fromJsonArray) -}}
{{- /* false: the profile's mode in every GPU container, those served only through DRA claims too
(where the core's own default keeps the image's value); auto and true leave that default. */ -}}
{{- if eq (toString .Values.webhook.keepImageLibraryPath) "false" -}}
{{- $_ = set $policy "keepImageLibraryPathInClaims" false -}}
{{- end -}}
{{- $_ = set $config "policy" $policy -}}
{{- if eq (include "ix-gpu.keepImageLibraryPath" .) "true" -}}
{{- range $profile := $config.profiles -}}
{{- range $var := $profile.env -}}
{{- if and (eq $var.name "LD_LIBRARY_PATH") (has $var.mode (list "prepend-path" "append-path")) -}}
{{- $_ = set $var "mode" (printf "%s-if-set" $var.mode) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{/* "true" when LD_LIBRARY_PATH is merged only into a value the pod spec sets, in every GPU
container (webhook.keepImageLibraryPath; auto: every GPU comes through CDI, whose linker-cache hook
finds the driver). Where it is not, the webhook still does so per container for those served only
through DRA claims (config.policy.keepImageLibraryPathInClaims), unless keepImageLibraryPath is false. */}}
{{- define "ix-gpu.keepImageLibraryPath" -}}
{{- $keep := .Values.webhook.keepImageLibraryPath -}}
{{- if eq (toString $keep) "auto" -}}
{{- or (not .Values.plugin.enabled) (eq .Values.plugin.deviceListStrategy "cdi") -}}
{{- else -}}
{{- $keep -}}
{{- end -}}
{{- end -}}

{{/* Resource names (exact or glob) of the configured profiles, as a JSON list. */}}
{{- define "ix-gpu.gpuResources" -}}
{{- $out := list -}}
{{- range .Values.config.profiles -}}
{{- $out = concat $out .resources -}}
{{- end -}}
{{- toJson ($out | uniq) -}}
{{- end -}}

{{/*
Where the apiserver sends one configured workload, as JSON {name, group, version, resource}. The
group and version come from its apiVersion ("" and "v1" for a Pod); the resource is its `resource`,
else the guess Kubernetes makes for a kind it does not know (lower case; -s → -ses, -y → -ies,
else + s), as the core's Workload.resource_name() makes it. A glob becomes "*" in the rule and
"all" in the webhook name, "<resource>.<version>[.<group>].ix-gpu.io".
*/}}
{{- define "ix-gpu.workload.registration" -}}
{{- $parts := splitList "/" .apiVersion -}}
{{- $group := "" -}}
{{- $version := last $parts -}}
{{- if gt (len $parts) 1 -}}
{{- $group = first $parts -}}
{{- end -}}
{{- $glob := "[*?\\[]" -}}
{{- if regexMatch $glob $group -}}{{- $group = "*" -}}{{- end -}}
{{- if regexMatch $glob $version -}}{{- $version = "*" -}}{{- end -}}
{{- $resource := .resource -}}
{{- if not $resource -}}
{{- $singular := lower .kind -}}
{{- if regexMatch $glob .kind -}}
{{- $resource = "*" -}}
{{- else if hasSuffix "s" $singular -}}
{{- $resource = printf "%ses" $singular -}}
{{- else if hasSuffix "y" $singular -}}
{{- $resource = printf "%sies" (trimSuffix "y" $singular) -}}
{{- else -}}
{{- $resource = printf "%ss" $singular -}}
{{- end -}}
{{- end -}}
{{- $name := list (replace "*" "all" $resource) (replace "*" "all" $version) -}}
{{- if $group -}}
{{- $name = append $name (replace "*" "all" $group) -}}
{{- end -}}
{{- $name = append $name "ix-gpu.io" -}}
{{- toJson (dict "name" (join "." $name | lower) "group" $group "version" $version "resource" $resource) -}}
{{- end -}}

{{/*
CEL: is the map key `r` a configured GPU resource? Exact names become one `in` test, names whose
only glob is a trailing "*" startsWith tests, other globs ("*" and "?" anywhere, as the core's
fnmatch reads them) a regular expression. Resource names hold no other regex metacharacter than
".", which is written "[.]" so the CEL string needs no escapes.
*/}}
{{- define "ix-gpu.cel.isGpuResource" -}}
{{- $exact := list -}}
{{- $tests := list -}}
{{- range (include "ix-gpu.gpuResources" . | fromJsonArray) -}}
{{- $prefix := trimSuffix "*" . -}}
{{- if not (regexMatch "[*?]" .) -}}
{{- $exact = append $exact (printf "'%s'" .) -}}
{{- else if not (regexMatch "[*?]" $prefix) -}}
{{- $tests = append $tests (printf "r.startsWith('%s')" $prefix) -}}
{{- else -}}
{{- $re := . | replace "." "[.]" | replace "*" ".*" | replace "?" "." -}}
{{- $tests = append $tests (printf "r.matches('^%s$')" $re) -}}
{{- end -}}
{{- end -}}
{{- if $exact -}}
{{- $tests = prepend $tests (printf "r in [%s]" (join ", " $exact)) -}}
{{- end -}}
{{- join " || " $tests -}}
{{- end -}}

{{/* DRA DeviceClass names the configured profiles map (deviceClasses), as a JSON list. */}}
{{- define "ix-gpu.deviceClasses" -}}
{{- $out := list -}}
{{- range .Values.config.profiles -}}
{{- $out = concat $out (default list .deviceClasses) -}}
{{- end -}}
{{- toJson ($out | uniq) -}}
{{- end -}}

{{/*
CEL: does the pod spec at expression `.spec` (known to be a map) ask for a GPU in some container
or initContainer, in limits or requests, or (while a profile maps a DRA DeviceClass) through a DRA
claim, `resources.claims`? Which device class a claim requests is in its ResourceClaim or
ResourceClaimTemplate, which CEL cannot read: the webhook learns it. Every step is guarded with
`in` and type(): an evaluation error would apply failurePolicy Fail to an object that is none of
our business, and a custom resource's fields can hold anything.
*/}}
{{- define "ix-gpu.cel.podSpecWantsGpu" -}}
{{- $r := include "ix-gpu.cel.isGpuResource" .root -}}
{{- $q := "'%s' in c.resources && type(c.resources.%s) == map && c.resources.%s.exists(r, %s)" -}}
{{- $claims := "" -}}
{{- if (include "ix-gpu.deviceClasses" .root | fromJsonArray) -}}
{{- $claims = " || ('claims' in c.resources && type(c.resources.claims) == list && size(c.resources.claims) > 0)" -}}
{{- end -}}
{{- $c := printf "type(c) == map && 'resources' in c && type(c.resources) == map && ((%s) || (%s)%s)" (printf $q "limits" "limits" "limits" $r) (printf $q "requests" "requests" "requests" $r) $claims -}}
{{- $list := "('%s' in %s && type(%s.%s) == list && %s.%s.exists(c, %s))" -}}
{{- printf "%s || %s" (printf $list "containers" .spec .spec "containers" .spec "containers" $c) (printf $list "initContainers" .spec .spec "initContainers" .spec "initContainers" $c) -}}
{{- end -}}

{{/*
CEL: does the node at expression `.expr`, followed along the template path `.segments`, lead to a
pod template that asks for a GPU? The segments are those of a workload's templatePaths, read as
the core reads them: "name" a map key, "*" every key of a map, "name[*]" every item of a list.
*/}}
{{- define "ix-gpu.cel.atPath" -}}
{{- $e := .expr -}}
{{- if not .segments -}}
{{- printf "type(%s) == map && 'spec' in %s && type(%s.spec) == map && (%s)" $e $e $e (include "ix-gpu.cel.podSpecWantsGpu" (dict "root" .root "spec" (printf "%s.spec" $e))) -}}
{{- else -}}
{{- $seg := first .segments -}}
{{- $next := dict "root" .root "segments" (rest .segments) "depth" (add1 .depth) -}}
{{- if eq $seg "*" -}}
{{- $k := printf "k%d" (int .depth) -}}
{{- $_ := set $next "expr" (printf "%s[%s]" $e $k) -}}
{{- printf "type(%s) == map && %s.exists(%s, %s)" $e $e $k (include "ix-gpu.cel.atPath" $next) -}}
{{- else if hasSuffix "[*]" $seg -}}
{{- $key := trimSuffix "[*]" $seg -}}
{{- $items := printf "%s['%s']" $e $key -}}
{{- $i := printf "i%d" (int .depth) -}}
{{- $_ := set $next "expr" $i -}}
{{- printf "type(%s) == map && '%s' in %s && type(%s) == list && %s.exists(%s, %s)" $e $key $e $items $items $i (include "ix-gpu.cel.atPath" $next) -}}
{{- else -}}
{{- $_ := set $next "expr" (printf "%s['%s']" $e $seg) -}}
{{- printf "type(%s) == map && '%s' in %s && %s" $e $seg $e (include "ix-gpu.cel.atPath" $next) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* CEL: does the object ask for a GPU in a pod template at one of the workload's templatePaths? */}}
{{- define "ix-gpu.cel.workloadWantsGpu" -}}
{{- $tests := list -}}
{{- range .workload.templatePaths -}}
{{- $segments := list -}}
{{- if ne . "." -}}
{{- $segments = splitList "." . -}}
{{- end -}}
{{- $tests = append $tests (printf "(%s)" (include "ix-gpu.cel.atPath" (dict "root" $.root "expr" "object" "segments" $segments "depth" 0))) -}}
{{- end -}}
{{- join " || " $tests -}}
{{- end -}}

{{- /* The node labels the device plugin publishes (ix_gpu.devicemodel.labels.PUBLISHED; a chart test
       keeps the two equal), as a CEL list: the only labels its ServiceAccount may change. */}}
{{- define "ix-gpu.publishedNodeLabels" -}}
["ix-gpu.io/gpu.product", "ix-gpu.io/gpu.vendor", "ix-gpu.io/gpu.count", "ix-gpu.io/gpu.memory", "ix-gpu.io/gpu.replicas"]
{{- end }}

{{/* Listen addresses ------------------------------------------------------------------------- */}}

{{/* One listen-address argument, quoted: a bare `- --host=::` ends in a colon, which YAML reads as
a mapping key. Empty where the component's extraEnv sets the flag's variable (IX_GPU_METRICS_HOST
from the downward API was the way to pick an address before listenAddress, and a flag would
silently win over it). Takes a dict: flag, variable, address, extraEnv. */}}
{{- define "ix-gpu.listenArg" -}}
{{- $names := list -}}
{{- range .extraEnv -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- if not (has .variable $names) -}}
{{- printf "--%s=%s" .flag .address | quote -}}
{{- end -}}
{{- end -}}
