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

{{/* The export step, as an init container ("init") or the Job's container ("pvc"). */}}
{{- define "keyrank.prepareContainer" -}}
- name: prepare-models
  image: {{ include "keyrank.prepareImage" . }}
  imagePullPolicy: {{ .Values.models.prepareImage.pullPolicy }}
  env:
    - name: KEYRANK_PREPARE_MODEL
      value: {{ .Values.models.model | quote }}
    - name: KEYRANK_PREPARE_OUT
      value: /models
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

{{/* "pvc" mode: pods wait until the export Job has written the gateway manifest
(written last), using their own image's shell. Call with (dict "root" $ "image" "..." "pullPolicy" "..."). */}}
{{- define "keyrank.waitForModels" -}}
- name: wait-for-models
  image: {{ .image }}
  imagePullPolicy: {{ .pullPolicy }}
  command: ["sh", "-c", "until [ -f /models/gateway/manifest.json ] && [ -d /models/triton ]; do echo waiting for the model export; sleep 5; done"]
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
