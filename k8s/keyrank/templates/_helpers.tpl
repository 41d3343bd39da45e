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

{{/* The export step, as init containers ("init") or the Job's containers ("pvc"): one per served model,
each into /models/<name>, or the one model into /models. */}}
{{- define "keyrank.prepareContainer" -}}
{{- $served := include "keyrank.servedModels" . | fromJsonArray -}}
{{- if $served -}}
{{- range $i, $m := $served }}
{{ include "keyrank.prepareOne" (dict "root" $ "container" (printf "prepare-model-%d" $i) "model" $m.model "out" (printf "/models/%s" $m.name)) }}
{{- end -}}
{{- else -}}
{{ include "keyrank.prepareOne" (dict "root" . "container" "prepare-models" "model" .Values.models.model "out" "/models") }}
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

{{/* Triton's repository with models.served: each model's prepared triton/cross_encoder under its name
(config.pbtxt renamed, the version folder linked), written into the "repository" emptyDir. */}}
{{- define "keyrank.servedRepository" -}}
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
      sed 's/^name: .*/name: "{{ .name }}"/' /models/{{ .name }}/triton/cross_encoder/config.pbtxt > /repository/{{ .name }}/config.pbtxt
      ln -sfn /models/{{ .name }}/triton/cross_encoder/1 /repository/{{ .name }}/1
      # Its interaction graphs (keyrank finetune --install-into), named for it as the gateway asks for them.
      for graph in /models/{{ .name }}/triton/*-features; do
        [ -f "$graph/config.pbtxt" ] || continue
        served="{{ .name }}:${graph##*/}"
        mkdir -p "/repository/$served"
        sed "s/^name: .*/name: \"$served\"/" "$graph/config.pbtxt" > "/repository/$served/config.pbtxt"
        ln -sfn "$graph/1" "/repository/$served/1"
      done
      {{- end }}
  securityContext:
    {{- toYaml .root.Values.containerSecurityContext | nindent 4 }}
  resources:
    requests: {cpu: 10m, memory: 16Mi}
    limits: {memory: 64Mi}
  volumeMounts:
    - name: models
      mountPath: /models
      readOnly: true
    - name: repository
      mountPath: /repository
{{- end -}}

{{/* "pvc" mode: pods wait until the export Job has written the gateway manifest
(written last), using their own image's shell. Call with (dict "root" $ "image" "..." "pullPolicy" "..."). */}}
{{- define "keyrank.waitForModels" -}}
- name: wait-for-models
  image: {{ .image }}
  imagePullPolicy: {{ .pullPolicy }}
  {{- $served := include "keyrank.servedModels" .root | fromJsonArray }}
  {{- $dirs := list "/models" }}
  {{- if $served }}{{ $dirs = list }}{{ range $served }}{{ $dirs = append $dirs (printf "/models/%s" .name) }}{{ end }}{{ end }}
  {{- $ready := list }}
  {{- range $dirs }}{{ $ready = append $ready (printf "[ -f %s/gateway/manifest.json ] && [ -d %s/triton ]" . .) }}{{ end }}
  command: ["sh", "-c", {{ printf "until %s; do echo waiting for the model export; sleep 5; done" (join " && " $ready) | quote }}]
  securityContext:
    {{- toYaml .root.Values.containerSecurityContext | nindent 4 }}
  resources:
    requests: {cpu: 10m, memory: 16Mi}
    limits: {memory: 64Mi}
  volumeMounts:
    - name: models
      mountPath: /models
      readOnly: true
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
