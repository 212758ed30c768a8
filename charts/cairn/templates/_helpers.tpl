{{- define "cairn.name" -}}cairn-operator{{- end }}

{{- define "cairn.fullname" -}}
{{- if contains "cairn" .Release.Name }}{{ .Release.Name | trunc 63 | trimSuffix "-" }}{{ else }}{{ printf "%s-cairn" .Release.Name | trunc 63 | trimSuffix "-" }}{{ end }}
{{- end }}

{{- define "cairn.labels" -}}
app.kubernetes.io/name: {{ include "cairn.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "cairn.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cairn.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "cairn.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "cairn.agentImage" -}}
{{ .Values.agent.image | default (printf "ghcr.io/cairn-dev/cairn-agent:%s" .Chart.AppVersion) }}
{{- end }}

{{/* OTEL_RESOURCE_ATTRIBUTES from a map: key=value pairs, sorted by key, comma-separated. */}}
{{- define "cairn.otlpResourceAttributes" -}}
{{- $pairs := list -}}
{{- range $key, $value := . -}}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}

{{/* agent.pod without its empty settings, as JSON (--agent-pod-defaults); empty: none set. */}}
{{- define "cairn.agentPodDefaults" -}}
{{- $out := dict -}}
{{- range $key, $value := .Values.agent.pod -}}
{{- if $value -}}{{- $_ := set $out $key $value -}}{{- end -}}
{{- end -}}
{{- if $out -}}{{ toJson $out }}{{- end -}}
{{- end -}}

{{- define "cairn.gateway.fullname" -}}{{ include "cairn.fullname" . | trunc 55 | trimSuffix "-" }}-gateway{{- end }}

{{- define "cairn.gateway.selectorLabels" -}}
app.kubernetes.io/name: cairn-gateway
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "cairn.gateway.labels" -}}
{{ include "cairn.gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* Whether the operator mints scoped archive credentials: archive.scoped.enabled when it is
true or false; with auto (the default), whenever an admin credentials Secret is named. */}}
{{- define "cairn.archiveScoped" -}}
{{- $enabled := .Values.archive.scoped.enabled -}}
{{- if kindIs "bool" $enabled -}}
{{- $enabled -}}
{{- else -}}
{{- not (empty .Values.archive.scoped.adminCredentialsSecret) -}}
{{- end -}}
{{- end }}
