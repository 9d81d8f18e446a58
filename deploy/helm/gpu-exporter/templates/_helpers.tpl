{{/* The namespace of every namespaced object. */}}
{{- define "gpu-exporter.namespace" -}}
{{- .Values.namespace.name | default .Release.Namespace -}}
{{- end -}}

{{/* The prefix of every object name, derived from the release as `helm create` does: the release
     name when it already says gpu-exporter, else "<release>-gpu-exporter"; fullnameOverride wins.
     The default release "gpu-exporter" gives the names kustomize uses. Prometheus's job label
     does not follow it: the Services carry gpu-exporter.io/job and the ServiceMonitors set
     jobLabel, so the alert rules' job="gpu-exporter" holds under any release name. */}}
{{- define "gpu-exporter.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains "gpu-exporter" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-gpu-exporter" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels of one component (dict "root" $ "component" NAME), with Helm's conventional labels. */}}
{{- define "gpu-exporter.labels" -}}
{{ include "gpu-exporter.selectorLabels" . }}
app.kubernetes.io/part-of: gpu-exporter
{{ include "gpu-exporter.helmLabels" .root }}
{{- end -}}

{{/* The labels only Helm adds (the kustomize install has none of them), given the root context. */}}
{{- define "gpu-exporter.helmLabels" -}}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* Selector labels of one component: the release's instance keeps two releases' pods apart. */}}
{{- define "gpu-exporter.selectorLabels" -}}
app.kubernetes.io/name: gpu-exporter
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Image reference for a repository and an optional digest. */}}
{{- define "gpu-exporter.image" -}}
{{- $tag := .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- if .digest -}}
{{ .repository }}:{{ $tag }}@{{ .digest }}
{{- else -}}
{{ .repository }}:{{ $tag }}
{{- end -}}
{{- end -}}

{{/* The vendors whose DaemonSet is rendered, space-separated: one vendor entry of the values (a
     top-level key with a backend) or a list of them; "all" (or its older spelling "both") is every vendor
     entry the values hold, by name: no vendor is named here. */}}
{{- define "gpu-exporter.vendors" -}}
{{- $entries := list -}}
{{- range $key, $entry := .Values -}}
{{- if and (kindIs "map" $entry) (hasKey $entry "backend") -}}
{{- $entries = append $entries $key -}}
{{- end -}}
{{- end -}}
{{- $wanted := kindIs "slice" .Values.vendor | ternary .Values.vendor (list .Values.vendor) -}}
{{- if has (toString .Values.vendor) (list "all" "both") -}}
{{- $wanted = $entries -}}
{{- end -}}
{{- range $wanted -}}
{{- if not (has . $entries) -}}
{{- fail (printf "values: at '/vendor': %q is no vendor entry (a top-level value with a backend: %s)" . (join ", " $entries)) -}}
{{- end -}}
{{- end -}}
{{- join " " (uniq $wanted) -}}
{{- end -}}

{{/* How Prometheus reaches one daemon under its web config (a webConfig value: the exporter's or the
     profiler's): https and its tlsConfig while tls is on, basicAuth (Secret references) while set.
     Indented for a ServiceMonitor endpoint. */}}
{{- define "gpu-exporter.scrapeAuth" -}}
{{- if .tls }}
scheme: https
{{- with .tlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- with .basicAuth }}
basicAuth:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
