{{/*
Observability helpers (metrics-key-secret.yaml, servicemonitor.yaml, prometheusrule.yaml).

The router's scrape key: with apiKey.enabled the router's /metrics needs a key, so Prometheus
presents this one, which opens /metrics only (--metrics-key-file). Generated into a Secret and
kept across upgrades (as the cluster credential is), unless metrics.scrapeKey.existingSecret
names a Secret of yours with key "metrics-key".
*/}}
{{- define "tandem.metricsKeySecret" -}}
{{- default (printf "%s-metrics-key" (include "tandem.fullname" .)) .Values.metrics.scrapeKey.existingSecret -}}
{{- end -}}

{{/* True when the chart makes the scrape key's Secret (API keys on, no Secret given). */}}
{{- define "tandem.metricsKeyGenerated" -}}
{{- if and .Values.apiKey.enabled (not .Values.metrics.scrapeKey.existingSecret) -}}true{{- end -}}
{{- end -}}

{{/* The generated scrape key: the one already in the Secret on upgrade, else a new one. */}}
{{- define "tandem.metricsKeyValue" -}}
{{- $memo := .Values.metrics.scrapeKey -}}
{{- if not (hasKey $memo "_value") -}}
{{- $value := "" -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "tandem.metricsKeySecret" .) -}}
{{- if and $existing $existing.data (hasKey $existing.data "metrics-key") -}}
{{- $value = index $existing.data "metrics-key" | b64dec | trim -}}
{{- end -}}
{{- if not $value -}}
{{- $value = randAlphaNum 64 | sha256sum -}}
{{- end -}}
{{- $_ := set $memo "_value" $value -}}
{{- end -}}
{{- index $memo "_value" -}}
{{- end -}}

{{/*
The label matchers that pick this release's series: its namespace, and the jobs of the chart's
ServiceMonitors (a job is its Service's name: the router's, <fullname>-prefill, -decode).
*/}}
{{- define "tandem.metricsSelector" -}}
{{- printf "namespace=\"%s\", job=~\"%s(-prefill|-decode)?\"" .Release.Namespace (include "tandem.fullname" .) -}}
{{- end -}}
