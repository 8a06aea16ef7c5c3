{{/* Names, labels, images and the environment every dwell container shares. */}}

{{- define "dwell.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dwell.fullname" -}}
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

{{/* The name of one component's resources: dwell.component (dict "root" $ "component" "x") */}}
{{- define "dwell.component" -}}
{{- printf "%s-%s" (include "dwell.fullname" .root | trunc 52 | trimSuffix "-") .component -}}
{{- end -}}

{{- define "dwell.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of a component: dwell.selectorLabels (dict "root" $ "component" "x") */}}
{{- define "dwell.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dwell.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "dwell.labels" -}}
helm.sh/chart: {{ include "dwell.chart" .root }}
{{ include "dwell.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: dwell
{{- end -}}

{{/* registry/repository:tag, the tag defaulting to the chart's appVersion */}}
{{- define "dwell.imageRef" -}}
{{- $tag := default .root.Chart.AppVersion .image.tag -}}
{{- if .image.registry -}}
{{- printf "%s/%s:%s" .image.registry .image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" .image.repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "dwell.redisHost" -}}
{{- if .Values.redis.enabled -}}
{{- include "dwell.component" (dict "root" . "component" "redis") -}}
{{- else -}}
{{- required "redis.external.host is required when redis.enabled is false" .Values.redis.external.host -}}
{{- end -}}
{{- end -}}

{{- define "dwell.redisPort" -}}
{{- if .Values.redis.enabled -}}6379{{- else -}}{{ int .Values.redis.external.port }}{{- end -}}
{{- end -}}

{{- define "dwell.redisDb" -}}
{{- if .Values.redis.enabled -}}0{{- else -}}{{ int .Values.redis.external.db }}{{- end -}}
{{- end -}}

{{- define "dwell.redisSecret" -}}
{{- default (include "dwell.component" (dict "root" . "component" "redis")) .Values.redis.auth.existingSecret -}}
{{- end -}}

{{- define "dwell.redisPasswordKey" -}}
{{- if .Values.redis.auth.existingSecret -}}
{{- .Values.redis.auth.existingSecretPasswordKey -}}
{{- else -}}
redis-password
{{- end -}}
{{- end -}}

{{- define "dwell.kafkaBootstrap" -}}
{{- if .Values.kafka.enabled -}}
{{- $kafka := include "dwell.component" (dict "root" . "component" "kafka") -}}
{{- printf "%s-0.%s-headless.%s.svc:9092" $kafka $kafka .Release.Namespace -}}
{{- else -}}
{{- required "kafka.external.bootstrap is required when kafka.enabled is false" .Values.kafka.external.bootstrap -}}
{{- end -}}
{{- end -}}

{{/* DWELL_<KEY> entries of a settings map: dwell.settingsEnv .Values.x.config */}}
{{- define "dwell.settingsEnv" -}}
{{- range $key, $value := . }}
- name: DWELL_{{ upper $key }}
  {{- /* YAML numbers arrive as float64: print whole ones as integers, not 1e+06 */}}
  {{- if and (kindIs "float64" $value) (eq $value (float64 (int64 $value))) }}
  value: {{ int64 $value | toString | quote }}
  {{- else }}
  value: {{ $value | toString | quote }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* The environment of every dwell container: the common settings, Kafka, and Redis
     with its password from the Secret (the URL refers to it by $(REDIS_PASSWORD), so
     the password never appears in a manifest). */}}
{{- define "dwell.env" -}}
- name: DWELL_HTTP_HOST
  value: "0.0.0.0"
- name: DWELL_KAFKA_BOOTSTRAP
  value: {{ include "dwell.kafkaBootstrap" . | quote }}
- name: DWELL_KAFKA_REPLICATION_FACTOR
  value: {{ .Values.kafka.replicationFactor | toString | quote }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "dwell.redisSecret" . }}
      key: {{ include "dwell.redisPasswordKey" . }}
- name: DWELL_REDIS_URL
  value: {{ printf "redis://:$(REDIS_PASSWORD)@%s:%s/%s" (include "dwell.redisHost" .) (include "dwell.redisPort" .) (include "dwell.redisDb" .) | quote }}
{{- include "dwell.settingsEnv" .Values.config }}
{{- end -}}

{{/* The probes of a dwell HTTP process on its `http` port */}}
{{- define "dwell.probes" -}}
startupProbe:
  httpGet: {path: /healthz, port: http}
  periodSeconds: 2
  failureThreshold: 60
livenessProbe:
  httpGet: {path: /healthz, port: http}
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /readyz, port: http}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
{{- end -}}

{{/* Pod-level fields every dwell pod has: dwell.podCommon $ */}}
{{- define "dwell.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}

{{/* Where a component's pods may run: dwell.scheduling .Values.<component> */}}
{{- define "dwell.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* One of the three HTTP services' containers:
     dwell.serviceContainer (dict "root" $ "component" "policy" "port" 8081) */}}
{{- define "dwell.serviceContainer" -}}
{{- $values := index .root.Values .component -}}
- name: {{ .component }}
  image: {{ include "dwell.imageRef" (dict "root" .root "image" .root.Values.image) }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  command: ["python", "-m", "dwell.{{ .component }}"]
  env:
    {{- include "dwell.env" .root | nindent 4 }}
    - name: DWELL_HTTP_PORT
      value: {{ .port | quote }}
    {{- if eq .component "policy" }}
    {{- /* the policy service serves the tracker's figures on Pulsar's topic stats path */}}
    - name: DWELL_TRACKER_URL
      value: {{ printf "http://%s:8083" (include "dwell.component" (dict "root" .root "component" "tracker")) | quote }}
    {{- end }}
    {{- include "dwell.settingsEnv" $values.config | trim | nindent 4 }}
    {{- include "dwell.authEnv" .root | nindent 4 }}
  ports:
    - name: http
      containerPort: {{ .port }}
  {{- include "dwell.probes" . | nindent 2 }}
  resources:
    {{- toYaml $values.resources | nindent 4 }}
  securityContext:
    {{- toYaml .root.Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: tmp
      mountPath: /tmp
    {{- include "dwell.authVolumeMount" .root | nindent 4 }}
{{- end -}}

{{/* The pod template of one of the three HTTP services */}}
{{- define "dwell.servicePod" -}}
{{- $values := index .root.Values .component -}}
metadata:
  labels:
    {{- include "dwell.labels" . | nindent 4 }}
  {{- with $values.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  {{- include "dwell.podCommon" .root | trim | nindent 2 }}
  automountServiceAccountToken: false
  containers:
    {{- include "dwell.serviceContainer" . | nindent 4 }}
  volumes:
    - name: tmp
      emptyDir: {}
    {{- include "dwell.authVolume" .root | nindent 4 }}
  {{- include "dwell.scheduling" $values | trim | nindent 2 }}
{{- end -}}

{{/* The ClusterIP Service of a component: dwell.service (dict "root" $ "component" "x" "port" n) */}}
{{- define "dwell.service" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "dwell.component" . }}
  labels:
    {{- include "dwell.labels" . | nindent 4 }}
spec:
  type: ClusterIP
  selector:
    {{- include "dwell.selectorLabels" . | nindent 4 }}
  ports:
    - name: http
      port: {{ .port }}
      targetPort: http
{{- end -}}

{{/* The `data` volume claim of the in-chart Redis and Kafka: dwell.dataVolumeClaim .Values.x.persistence */}}
{{- define "dwell.dataVolumeClaim" -}}
- metadata:
    name: data
  spec:
    accessModes: [ReadWriteOnce]
    {{- with .storageClass }}
    storageClassName: {{ . }}
    {{- end }}
    resources:
      requests:
        storage: {{ .size }}
{{- end -}}
