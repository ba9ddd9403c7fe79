{{/* Names, labels and the pieces every pod template shares. */}}

{{- define "tandem.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tandem.fullname" -}}
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

{{- define "tandem.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels; call with (dict "ctx" $ "component" "router"). */}}
{{- define "tandem.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tandem.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end -}}

{{/* Standard labels; call with (dict "ctx" $ "component" "router"). */}}
{{- define "tandem.labels" -}}
helm.sh/chart: {{ include "tandem.chart" .ctx }}
{{ include "tandem.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: tandem
{{- end -}}

{{- define "tandem.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tandem.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The image of a role; call with (dict "ctx" $ "role" .Values.prefill) or role = {}. */}}
{{- define "tandem.image" -}}
{{- $img := .ctx.Values.image -}}
{{- $over := default (dict) .role.image -}}
{{- $repo := default $img.repository $over.repository -}}
{{- $tag := default (default .ctx.Chart.AppVersion $img.tag) $over.tag -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}

{{/* A model named in values (model.name, a draft model) as the processes see it: under the
PVC's mount with model.pvc.enabled. Call with (dict "ctx" $ "name" NAME). */}}
{{- define "tandem.modelFile" -}}
{{- if .ctx.Values.model.pvc.enabled -}}
{{- printf "%s/%s" (trimSuffix "/" .ctx.Values.model.pvc.mountPath) (trimPrefix "/" .name) -}}
{{- else -}}
{{- .name -}}
{{- end -}}
{{- end -}}

{{/* Where the model is, as the processes see it. */}}
{{- define "tandem.modelPath" -}}
{{- include "tandem.modelFile" (dict "ctx" . "name" .Values.model.name) -}}
{{- end -}}

{{/* One word of a shell command line, quoted when it needs it (as Python's shlex.quote). */}}
{{- define "tandem.shquote" -}}
{{- if regexMatch "^[A-Za-z0-9_@%+=:,./-]+$" . -}}
{{- . -}}
{{- else -}}
{{- printf "'%s'" (replace "'" "'\"'\"'" .) -}}
{{- end -}}
{{- end -}}

{{/* The served model id: model.servedName, else the alias, the .gguf file's stem or the
directory's name (tandem/common/model_spec.py's served_name, as the processes would pick it). */}}
{{- define "tandem.servedName" -}}
{{- default (trimSuffix ".gguf" (base .Values.model.name)) .Values.model.servedName -}}
{{- end -}}

{{/*
The router's model flags in deployments mode, as a YAML list: --model as the workers get it
(the router reads only its tokenizer and config.json, tandem/router/model_files.py: no torch, no
conversion), --tokenizer when model.tokenizer says where else to read them. In ray mode
tandem up gives the router its own --model; --tokenizer goes through --router-arg.
*/}}
{{- define "tandem.routerModelArgs" -}}
{{- $args := list (printf "--model=%s" (include "tandem.modelPath" .)) -}}
{{- with .Values.model.tokenizer -}}
{{- $args = append $args (printf "--tokenizer=%s" .) -}}
{{- end -}}
{{- toYaml (append $args (printf "--model-name=%s" (include "tandem.servedName" .))) -}}
{{- end -}}

{{/*
Logging, tracing and metric-name flags of every process, as YAML list items ("" when every
value is at its default: each process keeps its own default). The router and both worker
Deployments get them as args; in ray mode tandem up takes the same flags and passes them to the
router and every worker actor (tandem/launcher/engine_flags.py observability_argv).
*/}}
{{- define "tandem.observabilityArgs" -}}
{{- $o := .Values.observability -}}
{{- $args := list -}}
{{- if ne $o.logFormat "text" -}}
{{- $args = append $args (printf "--log-format=%s" $o.logFormat) -}}
{{- end -}}
{{- if ne (upper $o.logLevel) "INFO" -}}
{{- $args = append $args (printf "--log-level=%s" (upper $o.logLevel)) -}}
{{- end -}}
{{- with $o.tracing -}}
{{- if .otlpEndpoint -}}
{{- $args = append $args (printf "--otlp-endpoint=%s" .otlpEndpoint) -}}
{{- $args = append $args (printf "--otlp-protocol=%s" .otlpProtocol) -}}
{{- if ne (float64 .sampleRatio) 1.0 -}}
{{- $args = append $args (printf "--trace-sample-ratio=%v" .sampleRatio) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if ne $.Values.metrics.compat "vllm" -}}
{{- $args = append $args (printf "--metrics-compat=%s" $.Values.metrics.compat) -}}
{{- end -}}
{{- if $args -}}
{{- toYaml $args -}}
{{- end -}}
{{- end -}}

{{/* Pod termination: preStop sleep + drain + 15 s to stop the server and close the engine. */}}
{{- define "tandem.grace" -}}
{{- add .preStopSleepSeconds .drainTimeoutSeconds 15 -}}
{{- end -}}

{{- define "tandem.preStop" -}}
lifecycle:
  preStop:
    exec:
      command: ["/bin/sh", "-c", "sleep {{ .preStopSleepSeconds }}"]
{{- end -}}

{{/*
Probes. The router over HTTP (HTTPS with tls): startup and liveness on /livez (200 while the
process serves at all), readiness on /health (200 only while a request sent now is served: a
prefill and decode path is ready; 503 otherwise), so a Service sends it traffic only then. A
worker on grpc.health.v1 (kubelet's native gRPC probe; SERVING once the model is loaded), the
startup probe covering the model load; the kubelet's gRPC probe speaks no TLS, so a worker
with workerTls is probed on its plain /metrics (served once the model is loaded, 503 when the
engine is gone; a TCP connect would pass as soon as the gRPC port is bound, before the model
loads). Call with (dict "port" 50051 "startup" .startupProbe "router" true "https" false
"httpPort" 8000), or (dict "port" 50061 "startup" .startupProbe "tls" false "metricsPort" 9090)
for a worker.
*/}}
{{- define "tandem.probes" -}}
{{- $live := printf "grpc:\n  port: %v" .port -}}
{{- if .tls -}}
{{- $live = printf "httpGet:\n  path: /metrics\n  port: %v\n  scheme: HTTP" .metricsPort -}}
{{- end -}}
{{- $ready := $live -}}
{{- if .router -}}
{{- $scheme := ternary "HTTPS" "HTTP" (.https | default false) -}}
{{- $live = printf "httpGet:\n  path: /livez\n  port: %v\n  scheme: %s" .httpPort $scheme -}}
{{- $ready = printf "httpGet:\n  path: /health\n  port: %v\n  scheme: %s" .httpPort $scheme -}}
{{- end -}}
startupProbe:
  {{- $live | nindent 2 }}
  periodSeconds: {{ .startup.periodSeconds }}
  failureThreshold: {{ .startup.failureThreshold }}
  timeoutSeconds: 5
readinessProbe:
  {{- $ready | nindent 2 }}
  periodSeconds: 5
  failureThreshold: 2
  timeoutSeconds: 3
livenessProbe:
  {{- $live | nindent 2 }}
  periodSeconds: 15
  failureThreshold: 4
  timeoutSeconds: 5
{{- end -}}

{{/* Resources with the role's accelerator added to requests and limits. */}}
{{- define "tandem.workerResources" -}}
{{- $res := deepCopy (default (dict) .resources) -}}
{{- if gt (int .accelerator.count) 0 -}}
{{- $limits := default (dict) $res.limits -}}
{{- $_ := set $limits .accelerator.resourceName (int .accelerator.count) -}}
{{- $_ := set $res "limits" $limits -}}
{{- $requests := default (dict) $res.requests -}}
{{- $_ := set $requests .accelerator.resourceName (int .accelerator.count) -}}
{{- $_ := set $res "requests" $requests -}}
{{- end -}}
{{- toYaml $res -}}
{{- end -}}

{{/* Secrets' names. */}}
{{- define "tandem.apiKeySecret" -}}
{{- default (printf "%s-api-keys" (include "tandem.fullname" .)) .Values.apiKey.existingSecret -}}
{{- end -}}
{{- define "tandem.tlsSecret" -}}
{{- default (printf "%s-tls" (include "tandem.fullname" .)) .Values.tls.existingSecret -}}
{{- end -}}
{{- define "tandem.clusterSecretName" -}}
{{- default (printf "%s-cluster-secret" (include "tandem.fullname" .)) .Values.clusterSecret.existingSecret -}}
{{- end -}}

{{/* True when the chart keeps the credential in a Secret it makes (not given, not insecure). */}}
{{- define "tandem.clusterSecretGenerated" -}}
{{- if not (or .Values.clusterSecret.existingSecret .Values.clusterSecret.insecure) -}}true{{- end -}}
{{- end -}}

{{/*
The chart's cluster credential, hex (32 random bytes). On upgrade it is the one already in the
Secret (lookup); on install, or offline (helm template: lookup finds nothing), a new one. It is
made once per render and remembered, so the Secret and every pod's checksum agree.
*/}}
{{- define "tandem.clusterSecretValue" -}}
{{- $memo := .Values.clusterSecret -}}
{{- if not (hasKey $memo "_value") -}}
{{- $value := "" -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "tandem.clusterSecretName" .) -}}
{{- if and $existing $existing.data (hasKey $existing.data "cluster-secret") -}}
{{- $value = index $existing.data "cluster-secret" | b64dec | trim -}}
{{- end -}}
{{- if not $value -}}
{{- $value = randAlphaNum 64 | sha256sum -}}
{{- end -}}
{{- $_ := set $memo "_value" $value -}}
{{- end -}}
{{- index $memo "_value" -}}
{{- end -}}

{{/*
The pod annotation that rolls the pods when a secret the chart renders changes (API keys, TLS
values, the generated credentials); call with $. Pod metadata is readable far more widely than
Secrets, and a plain hash of API keys would let anyone who reads it test guesses offline, so
it is a digest keyed with a random salt of the release's own (tandem.checksumSalt): it says
"changed" and nothing else.
*/}}
{{- define "tandem.secretChecksums" -}}
{{- $material := list (include (print .Template.BasePath "/secrets.yaml") .) -}}
{{- if include "tandem.clusterSecretGenerated" . -}}
{{- $material = append $material (include "tandem.clusterSecretValue" .) -}}
{{- end -}}
checksum/secrets: {{ printf "%s\n%s" (include "tandem.checksumSalt" .) (join "\n" $material) | sha256sum }}
{{- end -}}

{{/* The salt of tandem.secretChecksums (64 hex), in Secret <fullname>-checksum-salt: the one
already there on upgrade (lookup), else a new one. */}}
{{- define "tandem.checksumSalt" -}}
{{- include "tandem.keptRandom" (dict "ctx" . "name" (printf "%s-checksum-salt" (include "tandem.fullname" .)) "key" "salt") -}}
{{- end -}}

{{/*
A random value (64 hex) kept in a Secret across upgrades: the one in Secret .name (key .key)
when it exists (lookup; nothing offline), else a new one. Made once per render and remembered
(in .Values._kept, which nothing renders), so every template that includes it agrees.
*/}}
{{- define "tandem.keptRandom" -}}
{{- if not (hasKey .ctx.Values "_kept") -}}
{{- $_ := set .ctx.Values "_kept" (dict) -}}
{{- end -}}
{{- $memo := .ctx.Values._kept -}}
{{- $slot := printf "%s/%s" .name .key -}}
{{- if not (hasKey $memo $slot) -}}
{{- $value := "" -}}
{{- $existing := lookup "v1" "Secret" .ctx.Release.Namespace .name -}}
{{- if and $existing $existing.data (hasKey $existing.data .key) -}}
{{- $value = index $existing.data .key | b64dec | trim -}}
{{- end -}}
{{- if not $value -}}
{{- $value = randAlphaNum 64 | sha256sum -}}
{{- end -}}
{{- $_ := set $memo $slot $value -}}
{{- end -}}
{{- index $memo $slot -}}
{{- end -}}

{{/* The router's API keys: the chart generates one when keys are on and none is given. */}}
{{- define "tandem.apiKeyGenerated" -}}
{{- if and .Values.apiKey.enabled (not .Values.apiKey.existingSecret) (not .Values.apiKey.keys) -}}true{{- end -}}
{{- end -}}
{{- define "tandem.apiKeyValue" -}}
{{- include "tandem.keptRandom" (dict "ctx" . "name" (include "tandem.apiKeySecret" .) "key" "api-keys") -}}
{{- end -}}

{{/* Ray's token (ray.auth): the Secret's name, and the generated value (64 hex). */}}
{{- define "tandem.rayTokenSecret" -}}
{{- default (printf "%s-ray-token" (include "tandem.fullname" .)) .Values.ray.auth.existingSecret -}}
{{- end -}}
{{- define "tandem.rayTokenValue" -}}
{{- include "tandem.keptRandom" (dict "ctx" . "name" (include "tandem.rayTokenSecret" .) "key" "auth_token") -}}
{{- end -}}

{{/* The environment that turns Ray's token auth on in a Ray container (RAY_AUTH_MODE, and
RAY_AUTH_TOKEN from the Secret), as YAML list items. */}}
{{- define "tandem.rayAuthEnv" -}}
- {name: RAY_AUTH_MODE, value: token}
- name: RAY_AUTH_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "tandem.rayTokenSecret" . }}
      key: auth_token
{{- end -}}

{{/* The credential flag of every member process (router, workers, tandem up), as a list. */}}
{{- define "tandem.credentialArgs" -}}
{{- if .Values.clusterSecret.insecure }}
- --insecure
{{- else }}
- --cluster-secret-file=/etc/tandem/cluster/cluster-secret
{{- end }}
{{- end -}}

{{/* TLS flags of every worker (both roles): mTLS on gRPC, TLS on KV transfers. */}}
{{- define "tandem.workerTlsArgs" -}}
{{- if .Values.workerTls.enabled }}
- --tls-cert=/etc/tandem/worker-tls/tls.crt
- --tls-key=/etc/tandem/worker-tls/tls.key
- --tls-client-ca=/etc/tandem/worker-tls/ca.crt
{{- end }}
{{- if .Values.kvTls.enabled }}
- --kv-tls-cert=/etc/tandem/kv-tls/tls.crt
- --kv-tls-key=/etc/tandem/kv-tls/tls.key
- --kv-tls-ca=/etc/tandem/kv-tls/ca.crt
{{- end }}
{{- end -}}

{{/* The router's flags shared by both modes (tandem router and tandem up pass them on). */}}
{{- define "tandem.routerSecurityArgs" -}}
{{- if .Values.apiKey.enabled }}
- --api-key-file=/etc/tandem/api-keys/api-keys
- --metrics-key-file=/etc/tandem/metrics-key/metrics-key
{{- else if .Values.apiKey.allowUnauthenticated }}
{{- /* Only when the values say so (tandem.validate refuses keys off without it; NOTES warns). */}}
- --allow-unauthenticated
{{- end }}
{{- if .Values.tls.enabled }}
- --tls-cert=/etc/tandem/tls/tls.crt
- --tls-key=/etc/tandem/tls/tls.key
{{- end }}
{{- if include "tandem.loraRuntimeUpdates" . }}
- --admin-key-file=/etc/tandem/admin-keys/admin-keys
{{- end }}
{{- if .Values.workerTls.enabled }}
- --worker-ca=/etc/tandem/worker-tls/ca.crt
- --worker-cert=/etc/tandem/worker-tls/tls.crt
- --worker-key=/etc/tandem/worker-tls/tls.key
{{- end }}
{{- end -}}

{{/* Volumes: the model PVC and the secrets a pod needs; role is "router", "worker" or "head". */}}
{{- define "tandem.volumes" -}}
{{- /* Call with (dict "ctx" $ "role" head|router|worker ["ranks" accelerators a worker pod]). */}}
{{- $v := .ctx.Values -}}
{{- /* What the processes write under a read-only root filesystem (tandem.volumeMounts). */}}
- name: tmp
  emptyDir: {}
- name: home
  emptyDir: {}
{{- if $v.model.pvc.enabled }}
- name: model
  persistentVolumeClaim:
    claimName: {{ $v.model.pvc.claimName }}
    readOnly: {{ $v.model.pvc.readOnly }}
{{- end }}
{{- if and (ne .role "worker") $v.apiKey.enabled }}
- name: api-keys
  secret:
    secretName: {{ include "tandem.apiKeySecret" .ctx }}
{{- end }}
{{- if and (ne .role "worker") $v.apiKey.enabled }}
- name: metrics-key
  secret:
    secretName: {{ include "tandem.metricsKeySecret" .ctx }}
    items:
      - {key: metrics-key, path: metrics-key}
{{- end }}
{{- if and (ne .role "worker") $v.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "tandem.tlsSecret" .ctx }}
{{- end }}
{{- if and (ne .role "worker") (include "tandem.loraRuntimeUpdates" .ctx) }}
- name: admin-keys
  secret:
    secretName: {{ $v.lora.runtimeUpdates.existingSecret }}
    items:
      - {key: admin-keys, path: admin-keys}
{{- end }}
{{- if and (eq .role "worker") $v.lora.enabled $v.lora.pvc.enabled }}
- name: adapters
  persistentVolumeClaim:
    claimName: {{ $v.lora.pvc.claimName }}
    readOnly: {{ $v.lora.pvc.readOnly }}
{{- end }}
{{- if $v.workerTls.enabled }}
- name: worker-tls
  secret:
    secretName: {{ $v.workerTls.existingSecret }}
{{- end }}
{{- if and (eq .role "worker") $v.kvTls.enabled }}
- name: kv-tls
  secret:
    secretName: {{ $v.kvTls.existingSecret }}
{{- end }}
{{- if not $v.clusterSecret.insecure }}
# 288 = 0440: the owner and the pod's group (podSecurityContext.fsGroup) read it.
- name: cluster-secret
  secret:
    secretName: {{ include "tandem.clusterSecretName" .ctx }}
    defaultMode: 288
    items:
      - {key: cluster-secret, path: cluster-secret}
{{- end }}
{{- if and (eq .role "head") $v.autoscaling.enabled }}
- name: autoscale
  configMap:
    name: {{ include "tandem.fullname" .ctx }}-autoscale
{{- end }}
{{- if gt (int (default 0 .ranks)) 1 }}
{{- /* A tensor-parallel worker's ranks meet over NCCL, which keeps its buffers in /dev/shm:
a container's own is 64 MiB, too little for it. */}}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: 2Gi
{{- end }}
{{- end -}}

{{- define "tandem.volumeMounts" -}}
{{- $v := .ctx.Values -}}
- name: tmp                    # Ray's session directory, temp files (private credential files)
  mountPath: /tmp
- name: home                   # the image user's home: compiler caches (Triton, torch)
  mountPath: /home/tandem
{{- if $v.model.pvc.enabled }}
- name: model
  mountPath: {{ $v.model.pvc.mountPath }}
  readOnly: {{ $v.model.pvc.readOnly }}
{{- end }}
{{- if and (ne .role "worker") $v.apiKey.enabled }}
- name: api-keys
  mountPath: /etc/tandem/api-keys
  readOnly: true
{{- end }}
{{- if and (ne .role "worker") $v.apiKey.enabled }}
- name: metrics-key
  mountPath: /etc/tandem/metrics-key
  readOnly: true
{{- end }}
{{- if and (ne .role "worker") $v.tls.enabled }}
- name: tls
  mountPath: /etc/tandem/tls
  readOnly: true
{{- end }}
{{- if and (ne .role "worker") (include "tandem.loraRuntimeUpdates" .ctx) }}
- name: admin-keys
  mountPath: /etc/tandem/admin-keys
  readOnly: true
{{- end }}
{{- if and (eq .role "worker") $v.lora.enabled $v.lora.pvc.enabled }}
- name: adapters
  mountPath: {{ $v.lora.pvc.mountPath }}
  readOnly: {{ $v.lora.pvc.readOnly }}
{{- end }}
{{- if $v.workerTls.enabled }}
- name: worker-tls
  mountPath: /etc/tandem/worker-tls
  readOnly: true
{{- end }}
{{- if and (eq .role "worker") $v.kvTls.enabled }}
- name: kv-tls
  mountPath: /etc/tandem/kv-tls
  readOnly: true
{{- end }}
{{- if not $v.clusterSecret.insecure }}
- name: cluster-secret
  mountPath: /etc/tandem/cluster
  readOnly: true
{{- end }}
{{- if and (eq .role "head") $v.autoscaling.enabled }}
- name: autoscale
  mountPath: /etc/tandem/autoscale
  readOnly: true
{{- end }}
{{- if gt (int (default 0 .ranks)) 1 }}
- name: dshm                   # NCCL's buffers between a tensor-parallel worker's ranks
  mountPath: /dev/shm
{{- end }}
{{- end -}}

{{/*
Engine flags both worker roles get, as a YAML list (--model apart: tandem up takes its own).
A prefill worker's KV cache must match the decode worker's layout, so the dtype (prefill's;
tandem.validate checks decode's equals it) and the KV cache dtype are one per release.
*/}}
{{- define "tandem.sharedEngineArgs" -}}
{{- $v := .Values -}}
{{- $args := list (printf "--dtype=%s" $v.prefill.dtype) -}}
{{- if ne $v.engine.quantization "auto" -}}
{{- $args = append $args (printf "--quantization=%s" $v.engine.quantization) -}}
{{- end -}}
{{- if ne $v.engine.kvCacheDtype "auto" -}}
{{- $args = append $args (printf "--kv-cache-dtype=%s" $v.engine.kvCacheDtype) -}}
{{- end -}}
{{- if gt (int $v.model.maxModelLen) 0 -}}
{{- $args = append $args (printf "--max-model-len=%d" (int $v.model.maxModelLen)) -}}
{{- end -}}
{{- toYaml (concat $args (include "tandem.loraArgs" . | fromYamlArray)) -}}
{{- end -}}

{{/*
LoRA flags of every worker (both roles: the KV handoff checks the adapter on each side), as a
YAML list ([] with lora.enabled false): each module as --lora-modules=NAME=PATH, its path under
lora.pvc's mount when that is on. In ray mode tandem up passes --allow-runtime-lora-updates to
the router too (tandem/launcher/engine_flags.py ROUTER_FLAGS).
*/}}
{{- define "tandem.loraArgs" -}}
{{- $l := .Values.lora -}}
{{- $args := list -}}
{{- if $l.enabled -}}
{{- $args = append $args "--enable-lora" -}}
{{- range $l.modules -}}
{{- $path := .path -}}
{{- if $l.pvc.enabled -}}
{{- $path = printf "%s/%s" (trimSuffix "/" $l.pvc.mountPath) (trimPrefix "/" .path) -}}
{{- end -}}
{{- $args = append $args (printf "--lora-modules=%s=%s" .name $path) -}}
{{- end -}}
{{- range $key, $flag := dict "maxLoras" "--max-loras" "maxLoraRank" "--max-lora-rank" "maxCpuLoras" "--max-cpu-loras" -}}
{{- if gt (int (index $l $key)) 0 -}}
{{- $args = append $args (printf "%s=%d" $flag (int (index $l $key))) -}}
{{- end -}}
{{- end -}}
{{- if $l.runtimeUpdates.enabled -}}
{{- $args = append $args "--allow-runtime-lora-updates" -}}
{{- end -}}
{{- end -}}
{{- toYaml $args -}}
{{- end -}}

{{/* True when the router serves the runtime LoRA routes (behind the admin Secret). */}}
{{- define "tandem.loraRuntimeUpdates" -}}
{{- if and .Values.lora.enabled .Values.lora.runtimeUpdates.enabled -}}true{{- end -}}
{{- end -}}

{{/*
Engine flags of one worker role alone, its extraArgs last (they win), as a YAML list: the
Deployment's args, or tandem up's --prefill-arg / --decode-arg. An accelerator.count above 1
makes each worker a tensor-parallel group of that many ranks, one per device
(--tensor-parallel-size); accelerator.expertParallel adds --enable-expert-parallel.
Call with (dict "ctx" $ "name" "prefill").
*/}}
{{- define "tandem.roleEngineArgs" -}}
{{- $w := index .ctx.Values .name -}}
{{- $args := list (printf "--device=%s" $w.device) -}}
{{- /* More than one accelerator: the worker is a tensor-parallel group, a rank on each. */ -}}
{{- if gt (int $w.accelerator.count) 1 -}}
{{- $args = append $args (printf "--tensor-parallel-size=%d" (int $w.accelerator.count)) -}}
{{- end -}}
{{- /* Whole routed experts per rank of a MoE model (vLLM's flag; no-op on a dense one). */ -}}
{{- if $w.accelerator.expertParallel -}}
{{- $args = append $args "--enable-expert-parallel" -}}
{{- end -}}
{{- if gt (int $w.threads) 0 -}}
{{- $args = append $args (printf "--threads=%d" (int $w.threads)) -}}
{{- end -}}
{{- if gt (int (default 0 $w.maxNumSeqs)) 0 -}}
{{- $args = append $args (printf "--max-num-seqs=%d" (int $w.maxNumSeqs)) -}}
{{- end -}}
{{- if gt (float64 (default 0 $w.kvCacheMemoryGb)) 0.0 -}}
{{- $args = append $args (printf "--kv-cache-memory-gb=%v" $w.kvCacheMemoryGb) -}}
{{- end -}}
{{- $spec := default (dict "method" "none") $w.speculative -}}
{{- if ne $spec.method "none" -}}
{{- $args = append $args (printf "--speculative=%s" $spec.method) -}}
{{- if gt (int (default 0 $spec.numTokens)) 0 -}}
{{- $args = append $args (printf "--num-speculative-tokens=%d" (int $spec.numTokens)) -}}
{{- end -}}
{{- if $spec.draftModel -}}
{{- $args = append $args (printf "--draft-model=%s" (include "tandem.modelFile" (dict "ctx" .ctx "name" $spec.draftModel))) -}}
{{- end -}}
{{- if gt (int (default 0 $spec.draftLayers)) 0 -}}
{{- $args = append $args (printf "--draft-layers=%d" (int $spec.draftLayers)) -}}
{{- end -}}
{{- end -}}
{{- toYaml (concat $args (default (list) $w.extraArgs)) -}}
{{- end -}}

{{- define "tandem.podEnv" -}}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end -}}

{{/* The worker roles this release runs, space-separated: "prefill decode", or "decode" alone
when prefill.maxReplicas is 0 (a colocated deployment: decode workers prefill their own
prompts, and nothing of the prefill role is rendered). */}}
{{- define "tandem.workerRoles" -}}
{{- if gt (int .Values.prefill.maxReplicas) 0 }}prefill {{ end }}decode
{{- end -}}

{{/* Checks the schema cannot express; rendered (as nothing) by service.yaml. */}}
{{- define "tandem.validate" -}}
{{- range $name := list "prefill" "decode" }}
{{- $w := index $.Values $name }}
{{- if or (gt (int $w.minReplicas) (int $w.replicas)) (gt (int $w.replicas) (int $w.maxReplicas)) }}
{{- fail (printf "%s: need minReplicas <= replicas <= maxReplicas (got %v <= %v <= %v)" $name $w.minReplicas $w.replicas $w.maxReplicas) }}
{{- end }}
{{- end }}
{{- if ne .Values.prefill.dtype .Values.decode.dtype }}
{{- fail (printf "prefill.dtype (%s) and decode.dtype (%s) must be equal: the KV cache a prefill worker ships must match the decode worker's layout" .Values.prefill.dtype .Values.decode.dtype) }}
{{- end }}
{{- range $name := list "prefill" "decode" }}
{{- $w := index $.Values $name }}
{{- $count := int $w.accelerator.count }}
{{- if and (hasPrefix "cuda" $w.device) (eq $count 0) }}
{{- fail (printf "%s.device is %s but %s.accelerator.count is 0: the pod would get no GPU" $name $w.device $name) }}
{{- end }}
{{- if and (eq $w.device "cpu") (gt $count 0) }}
{{- fail (printf "%s.device is cpu but %s.accelerator.count is %d: the pod would hold an accelerator it never uses" $name $name $count) }}
{{- end }}
{{- end }}
{{- with .Values.decode.speculative }}
{{- if and (eq .method "draft") (not .draftModel) (eq (int .draftLayers) 0) }}
{{- fail "decode.speculative.method draft needs draftModel or draftLayers" }}
{{- end }}
{{- /* The engine refuses this at start (tandem/engine/config.py): a group's draft runs whole
on rank 0, and the target's own first layers are split over the ranks. */}}
{{- $count := int $.Values.decode.accelerator.count }}
{{- if and (eq .method "draft") (not .draftModel) (gt (int .draftLayers) 0) (gt $count 1) }}
{{- fail (printf "decode.speculative.draftLayers %d (a draft of the target's own first layers) does not run with decode.accelerator.count %d: each worker is a tensor-parallel group of %d ranks, over which those layers are split. Set decode.speculative.draftModel (a draft checkpoint, run whole on rank 0), use method ngram, or decode.accelerator.count 1" (int .draftLayers) $count $count) }}
{{- end }}
{{- end }}
{{- with .Values.lora }}
{{- if and (not .enabled) (or .modules .runtimeUpdates.enabled) }}
{{- fail "lora.modules and lora.runtimeUpdates need lora.enabled=true" }}
{{- end }}
{{- if and .runtimeUpdates.enabled (not .runtimeUpdates.existingSecret) }}
{{- fail "lora.runtimeUpdates.enabled needs lora.runtimeUpdates.existingSecret: a Secret with key admin-keys (the admin routes are never open, and never open with an API key)" }}
{{- end }}
{{- $seen := dict }}
{{- range .modules }}
{{- if hasKey $seen .name }}
{{- fail (printf "lora.modules: the name %s is given twice" .name) }}
{{- end }}
{{- $_ := set $seen .name true }}
{{- end }}
{{- end }}
{{- if and (not .Values.apiKey.enabled) (not .Values.apiKey.allowUnauthenticated) }}
{{- fail "apiKey.enabled is false: the router would serve anyone who reaches it. Keep API keys on (the chart generates one), or set apiKey.allowUnauthenticated=true to say so" }}
{{- end }}
{{- if and (eq .Values.mode "ray") (semverCompare "<2.52.0-0" .Values.ray.rayVersion) }}
{{- fail (printf "ray.rayVersion %s: the chart runs Ray with token auth (RAY_AUTH_MODE=token), which needs Ray 2.52.0 or newer" .Values.ray.rayVersion) }}
{{- end }}
{{- if and (eq .Values.mode "deployments") .Values.autoscaling.enabled (eq .Values.autoscaling.kind "hpa") }}
{{- range $name := splitList " " (include "tandem.workerRoles" $) }}
{{- if eq (int (index $.Values $name).minReplicas) 0 }}
{{- fail (printf "%s.minReplicas: an HPA cannot scale to 0 (use autoscaling.kind=keda)" $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}
