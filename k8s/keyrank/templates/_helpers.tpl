{{/* Names and labels shared by every template. */}}

{{- define "keyrank.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "keyrank.fullname" -}}
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

{{- define "keyrank.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of one component: call with (dict "root" $ "component" "gateway"). */}}
{{- define "keyrank.selectorLabels" -}}
app.kubernetes.io/name: {{ include "keyrank.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "keyrank.labels" -}}
helm.sh/chart: {{ include "keyrank.chart" .root }}
{{ include "keyrank.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: keyrank
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "keyrank.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "keyrank.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "keyrank.gatewayName" -}}{{ include "keyrank.fullname" . }}-gateway{{- end -}}
{{- define "keyrank.tritonName" -}}{{ include "keyrank.fullname" . }}-triton{{- end -}}
{{/* The headless Service of Triton's gRPC port: DNS answers with every ready pod's address. */}}
{{- define "keyrank.tritonGrpcName" -}}{{ include "keyrank.fullname" . }}-triton-grpc{{- end -}}

{{/* The gateway's Triton target (KEYRANK_TRITON_URL): triton.url for a Triton of your own, else the
headless Service (round_robin: the gateway balances every request over every pod) or, for a mesh that
balances gRPC itself (pick_first), the ClusterIP Service. */}}
{{- define "keyrank.tritonURL" -}}
{{- $tr := .Values.triton -}}
{{- if not $tr.enabled -}}
{{- if not $tr.url -}}
{{- fail "triton.enabled=false needs triton.url: the gRPC target of the Triton the gateway should use (e.g. dns:///triton-grpc.ml.svc.cluster.local:8001)" -}}
{{- end -}}
{{- $tr.url -}}
{{- else -}}
{{- if $tr.url -}}
{{- fail (printf "triton.url (%s) is for a Triton the chart does not deploy: set triton.enabled=false as well, or leave triton.url empty" $tr.url) -}}
{{- end -}}
{{- $service := ternary (include "keyrank.tritonGrpcName" .) (include "keyrank.tritonName" .) (eq .Values.gateway.tritonBalancing "round_robin") -}}
{{- printf "dns:///%s.%s.svc.%s:%v" $service .Release.Namespace .Values.clusterDomain $tr.service.grpcPort -}}
{{- end -}}
{{- end -}}

{{/* Triton's image: the NGC GPU image, or the CPU image with triton.gpu.enabled=false. */}}
{{- define "keyrank.tritonImage" -}}
{{- $tr := .Values.triton -}}
{{- if $tr.gpu.enabled -}}
{{ $tr.image.repository }}:{{ $tr.image.tag }}
{{- else -}}
{{ $tr.cpu.image.repository }}:{{ $tr.cpu.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{- define "keyrank.tritonPullPolicy" -}}
{{- ternary .Values.triton.image.pullPolicy .Values.triton.cpu.image.pullPolicy .Values.triton.gpu.enabled -}}
{{- end -}}

{{/* The Triton repository `keyrank prepare` wrote for this kind of Triton: triton/ (onnxruntime
backend, KIND_GPU) or triton-embedded/ (Python backend on CPU). */}}
{{- define "keyrank.tritonRepository" -}}
{{- ternary "triton" "triton-embedded" .Values.triton.gpu.enabled -}}
{{- end -}}

{{/* A duration of the form 15s, 1m, 2h in seconds. */}}
{{- define "keyrank.seconds" -}}
{{- $m := regexFind "^[0-9]+[smh]$" (toString .) -}}
{{- if not $m -}}{{- fail (printf "%q: a duration like 15s, 1m or 2h" (toString .)) -}}{{- end -}}
{{- $n := trimSuffix "s" (trimSuffix "m" (trimSuffix "h" $m)) | int -}}
{{- if hasSuffix "h" $m }}{{ mul $n 3600 }}{{ else if hasSuffix "m" $m }}{{ mul $n 60 }}{{ else }}{{ $n }}{{ end -}}
{{- end -}}

{{/* The rate window of the autoscaling and alert queries: autoscaling.window, at least 4 scrape
intervals (rate() needs samples to spare), or exactly 4 when unset. */}}
{{- define "keyrank.window" -}}
{{- $scrape := include "keyrank.seconds" .Values.serviceMonitor.interval | int -}}
{{- if .Values.autoscaling.window -}}
{{- $window := include "keyrank.seconds" .Values.autoscaling.window | int -}}
{{- if lt $window (mul 4 $scrape) -}}
{{- fail (printf "autoscaling.window %s is under 4 scrape intervals (serviceMonitor.interval %s): rate() would see too few samples" .Values.autoscaling.window .Values.serviceMonitor.interval) -}}
{{- end -}}
{{- .Values.autoscaling.window -}}
{{- else -}}
{{- printf "%ds" (mul 4 $scrape) -}}
{{- end -}}
{{- end -}}

{{/* PromQL label matchers of one component's pods in this release (Deployment pods are named
<deployment>-<template hash>-<suffix>). Call with (dict "root" $ "component" "triton"). */}}
{{- define "keyrank.podMatchers" -}}
{{- $name := ternary (include "keyrank.tritonName" .root) (include "keyrank.gatewayName" .root) (eq .component "triton") -}}
namespace="{{ .root.Release.Namespace }}", pod=~"{{ $name }}-[a-z0-9]+-[a-z0-9]+"
{{- end -}}
{{- define "keyrank.modelsClaim" -}}
{{- default (printf "%s-models" (include "keyrank.fullname" .)) .Values.models.pvc.existingClaim -}}
{{- end -}}

{{- define "keyrank.apiKeySecret" -}}
{{- default (printf "%s-api-key" (include "keyrank.fullname" .)) .Values.gateway.apiKey.existingSecret -}}
{{- end -}}

{{- define "keyrank.prepareImage" -}}
{{ .Values.models.prepareImage.repository }}:{{ .Values.models.prepareImage.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* models.served, checked: [{name, model}] with distinct names that can be folder and Triton model
names, and a default among them; [] for the one model of models.model. */}}
{{- define "keyrank.servedModels" -}}
{{- $names := list -}}
{{- range $i, $m := .Values.models.served -}}
{{- if not (and (kindIs "map" $m) $m.name $m.model) -}}
{{- fail (printf "models.served[%d] must be {name, model}, got %v" $i $m) -}}
{{- end -}}
{{- if not (regexMatch "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$" $m.name) -}}
{{- fail (printf "models.served[%d].name %q: letters, digits, '.', '_', '-' only (at most 64, starting with a letter or digit)" $i $m.name) -}}
{{- end -}}
{{- if has $m.name $names -}}
{{- fail (printf "models.served[%d].name %q is given twice" $i $m.name) -}}
{{- end -}}
{{- $names = append $names $m.name -}}
{{- end -}}
{{- if and .Values.models.default (not (has .Values.models.default $names)) -}}
{{- fail (printf "models.default %q is not one of models.served's names %v" .Values.models.default $names) -}}
{{- end -}}
{{- toJson .Values.models.served -}}
{{- end -}}

{{/* The default model's name with models.served ("" without). */}}
{{- define "keyrank.defaultModel" -}}
{{- $served := include "keyrank.servedModels" . | fromJsonArray -}}
{{- if $served -}}{{ .Values.models.default | default (index $served 0).name }}{{- end -}}
{{- end -}}

{{/* One model's export key: "<name>-<hash>", the hash of what makes the export (the model, the
TensorRT option, the prepare image: a new keyrank version exports anew). In "pvc" mode it is the
export's folder, exports/<key> of the claim, so a new model version never overwrites the one that
pods of the running release serve. Call with (dict "root" $ "name" "..." "model" "..."). */}}
{{- define "keyrank.exportKey" -}}
{{- $inputs := dict "model" .model "tensorrtFp16" .root.Values.models.tensorrtFp16 "image" (include "keyrank.prepareImage" .root) -}}
{{- printf "%s-%s" .name (toJson $inputs | sha256sum | trunc 16) -}}
{{- end -}}

{{/* Every export of the release as JSON [{name, model, key, mount}]: mount is where pods see it,
/models (the one model of models.model, named "model") or /models/<name> (models.served). */}}
{{- define "keyrank.exports" -}}
{{- $served := include "keyrank.servedModels" . | fromJsonArray -}}
{{- $out := list -}}
{{- if $served -}}
{{- range $served -}}
{{- $out = append $out (dict "name" .name "model" .model "mount" (printf "/models/%s" .name) "key" (include "keyrank.exportKey" (dict "root" $ "name" .name "model" .model))) -}}
{{- end -}}
{{- else -}}
{{- $out = list (dict "name" "model" "model" .Values.models.model "mount" "/models" "key" (include "keyrank.exportKey" (dict "root" . "name" "model" "model" .Values.models.model))) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* A short hash of every export key of the release (names the export Job, keys the engine cache). */}}
{{- define "keyrank.exportsHash" -}}
{{- $keys := list -}}
{{- range (include "keyrank.exports" . | fromJsonArray) }}{{ $keys = append $keys .key }}{{ end -}}
{{- join "," $keys | sha256sum | trunc 10 -}}
{{- end -}}

{{/* The export step, as init containers ("init": into the pod's /models) or the Job's containers
("pvc": into exports/<key> of the claim): one per served model, or one for models.model. */}}
{{- define "keyrank.prepareContainer" -}}
{{- $pvc := eq .Values.models.provisioning "pvc" -}}
{{- $several := not (empty (include "keyrank.servedModels" . | fromJsonArray)) -}}
{{- range $i, $e := include "keyrank.exports" . | fromJsonArray }}
{{ include "keyrank.prepareOne" (dict "root" $ "container" (ternary (printf "prepare-model-%d" $i) "prepare-models" $several) "model" $e.model "out" (ternary (printf "/models/exports/%s" $e.key) $e.mount $pvc)) }}
{{- end -}}
{{- end -}}

{{- define "keyrank.prepareOne" -}}
{{- with .root -}}
- name: {{ $.container }}
  image: {{ include "keyrank.prepareImage" . }}
  imagePullPolicy: {{ .Values.models.prepareImage.pullPolicy }}
  env:
    - name: KEYRANK_PREPARE_MODEL
      value: {{ $.model | quote }}
    - name: KEYRANK_PREPARE_OUT
      value: {{ $.out }}
    - name: KEYRANK_PREPARE_TENSORRT_FP16
      value: {{ ternary "1" "0" .Values.models.tensorrtFp16 | quote }}
    {{- with .Values.models.prepareEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  securityContext:
    {{- toYaml .Values.containerSecurityContext | nindent 4 }}
  resources:
    {{- toYaml .Values.models.prepareResources | nindent 4 }}
  volumeMounts:
    - name: models
      mountPath: /models
    - name: tmp
      mountPath: /tmp
{{- end -}}
{{- end -}}

{{/* Triton's repository with models.served: each model's prepared triton/cross_encoder (triton-embedded/
on CPU) under its name (config.pbtxt renamed, its TensorRT engine cache folder made its own, the version
folder linked), written into the "repository" emptyDir. */}}
{{- define "keyrank.servedRepository" -}}
{{- $repo := include "keyrank.tritonRepository" .root -}}
- name: model-repository
  image: {{ .image }}
  imagePullPolicy: {{ .pullPolicy }}
  command:
    - sh
    - -c
    - |
      set -eu
      {{- range (include "keyrank.servedModels" .root | fromJsonArray) }}
      mkdir -p /repository/{{ .name }}
      sed -e 's/^name: .*/name: "{{ .name }}"/' -e 's#"/tmp/keyrank_trt_cache"#"/tmp/keyrank_trt_cache/{{ .name }}"#' /models/{{ .name }}/{{ $repo }}/cross_encoder/config.pbtxt > /repository/{{ .name }}/config.pbtxt
      ln -sfn /models/{{ .name }}/{{ $repo }}/cross_encoder/1 /repository/{{ .name }}/1
      # Its interaction graphs (keyrank finetune --install-into), named for it as the gateway asks for them.
      for graph in /models/{{ .name }}/{{ $repo }}/*-features; do
        [ -f "$graph/config.pbtxt" ] || continue
        served="{{ .name }}:${graph##*/}"
        mkdir -p "/repository/$served"
        sed -e "s/^name: .*/name: \"$served\"/" -e "s#\"/tmp/keyrank_trt_cache\"#\"/tmp/keyrank_trt_cache/$served\"#" "$graph/config.pbtxt" > "/repository/$served/config.pbtxt"
        ln -sfn "$graph/1" "/repository/$served/1"
      done
      {{- end }}
  securityContext:
    {{- toYaml .root.Values.containerSecurityContext | nindent 4 }}
  resources:
    requests: {cpu: 10m, memory: 16Mi}
    limits: {memory: 64Mi}
  volumeMounts:
    {{- include "keyrank.modelsMounts" .root | trim | nindent 4 }}
    - name: repository
      mountPath: /repository
{{- end -}}

{{/* "pvc" mode: pods wait until the export of this release's model version is complete (its gateway
manifest is written last), using their own image's shell. An older export never satisfies it: each
version has its own folder. Call with (dict "root" $ "image" "..." "pullPolicy" "..."). */}}
{{- define "keyrank.waitForModels" -}}
- name: wait-for-models
  image: {{ .image }}
  imagePullPolicy: {{ .pullPolicy }}
  {{- $ready := list }}
  {{- $keys := list }}
  {{- range (include "keyrank.exports" .root | fromJsonArray) }}
  {{- $keys = append $keys .key }}
  {{- $ready = append $ready (printf "[ -f /claim/exports/%s/gateway/manifest.json ]" .key) }}
  {{- end }}
  {{- if .root.Values.triton.enabled }}
  {{- range (include "keyrank.exports" .root | fromJsonArray) }}
  {{- $ready = append $ready (printf "[ -d /claim/exports/%s/%s ]" .key (include "keyrank.tritonRepository" $.root)) }}
  {{- end }}
  {{- end }}
  command: ["sh", "-c", {{ printf "until %s; do echo waiting for the model export %s; sleep 5; done" (join " && " $ready) (join " " $keys) | quote }}]
  securityContext:
    {{- toYaml .root.Values.containerSecurityContext | nindent 4 }}
  resources:
    requests: {cpu: 10m, memory: 16Mi}
    limits: {memory: 64Mi}
  volumeMounts:
    - name: models
      mountPath: /claim
      readOnly: true
{{- end -}}

{{/* Where a container sees the models: /models (an emptyDir in "init" mode; in "pvc" mode the
claim's exports/<key> of this release's model version), or /models/<name> for each served model. */}}
{{- define "keyrank.modelsMounts" -}}
{{- if eq .Values.models.provisioning "pvc" -}}
{{- range (include "keyrank.exports" . | fromJsonArray) }}
- name: models
  mountPath: {{ .mount }}
  subPath: exports/{{ .key }}
  readOnly: true
{{- end }}
{{- else -}}
- name: models
  mountPath: /models
  readOnly: true
{{- end -}}
{{- end -}}

{{/* The models volume of a pod. */}}
{{- define "keyrank.modelsVolume" -}}
- name: models
{{- if eq .Values.models.provisioning "pvc" }}
  persistentVolumeClaim:
    claimName: {{ include "keyrank.modelsClaim" . }}
    readOnly: true
{{- else }}
  emptyDir:
    sizeLimit: {{ .Values.models.emptyDirSizeLimit }}
{{- end }}
{{- end -}}

{{/* Init containers of a pod that reads /models: same arguments as waitForModels. */}}
{{- define "keyrank.modelsInitContainers" -}}
{{- if eq .root.Values.models.provisioning "pvc" -}}
{{ include "keyrank.waitForModels" . }}
{{- else if eq .root.Values.models.provisioning "init" -}}
{{ include "keyrank.prepareContainer" .root }}
{{- else -}}
{{- fail (printf "models.provisioning must be init or pvc, got %q" .root.Values.models.provisioning) }}
{{- end }}
{{- end -}}
