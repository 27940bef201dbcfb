{{/* The names every object of a release takes. */}}
{{- define "appliance.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "appliance.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component (web, ingest, beat, gpu). */}}
{{- define "appliance.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "appliance.image" -}}
{{ printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) | quote }}
{{- end -}}

{{/*
What every container of the appliance has: the settings (a ConfigMap) and the secrets, mounted
as files from the existing Secret and read through NAME_FILE (appliance/env.py).
*/}}
{{- define "appliance.env" -}}
- name: DATABASE_URL_FILE
  value: /run/secrets/appliance/{{ .Values.secrets.keys.databaseUrl }}
- name: REDIS_URL_FILE
  value: /run/secrets/appliance/{{ .Values.secrets.keys.redisUrl }}
- name: APPLIANCE_SECRET_KEY_FILE
  value: /run/secrets/appliance/{{ .Values.secrets.keys.secretKey }}
- name: APPLIANCE_ENGINE_TOKEN_FILE
  value: /run/secrets/appliance/{{ .Values.secrets.keys.engineToken }}
{{- end -}}

{{- define "appliance.envFrom" -}}
- configMapRef:
    name: {{ include "appliance.fullname" . }}-settings
{{- end -}}

{{- define "appliance.secretMount" -}}
- name: secrets
  mountPath: /run/secrets/appliance
  readOnly: true
{{- end -}}

{{- define "appliance.secretVolume" -}}
- name: secrets
  secret:
    secretName: {{ .Values.secrets.existingSecret }}
    defaultMode: 0440
{{- end -}}

{{/* A container of the appliance: the image, its security context, `manage.py <args>`. */}}
{{- define "appliance.container" -}}
image: {{ include "appliance.image" .root }}
imagePullPolicy: {{ .root.Values.image.pullPolicy }}
args:
{{- range .args }}
  - {{ . | quote }}
{{- end }}
securityContext:
  {{- toYaml .root.Values.securityContext | nindent 2 }}
envFrom:
  {{- include "appliance.envFrom" .root | nindent 2 }}
{{- end -}}

{{/* This pod's name as its node name in the cluster view (manage.py announce_node). */}}
{{- define "appliance.nodeName" -}}
- name: APPLIANCE_NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- end -}}

{{- define "appliance.engineUrl" -}}
{{- $name := include "appliance.fullname" . -}}
{{- printf "tls://%s-gpu-0.%s-gpu:%d" $name $name (int .Values.gpuNodes.engineTls.port) -}}
{{- end -}}
