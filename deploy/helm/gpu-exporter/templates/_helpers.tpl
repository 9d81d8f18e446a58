{{/* The namespace of every namespaced object. */}}
{{- define "gpu-exporter.namespace" -}}
{{- .Values.namespace.name | default .Release.Namespace -}}
{{- end -}}

{{/* Labels of one component; object names stay fixed ("gpu-exporter..."), because the
     alert rules and dashboards select job="gpu-exporter", the Service's name. */}}
{{- define "gpu-exporter.labels" -}}
app.kubernetes.io/name: gpu-exporter
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: gpu-exporter
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

{{/* The vendors whose DaemonSet is rendered. */}}
{{- define "gpu-exporter.vendors" -}}
{{- if eq .Values.vendor "both" -}}nvidia amd{{- else -}}{{ .Values.vendor }}{{- end -}}
{{- end -}}
