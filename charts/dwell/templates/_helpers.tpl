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

{{/* registry/repository@digest when a digest is set, else registry/repository:tag with
     the tag defaulting to the chart's appVersion */}}
{{- define "dwell.imageRef" -}}
{{- $repo := .image.repository -}}
{{- if .image.registry -}}
{{- $repo = printf "%s/%s" .image.registry .image.repository -}}
{{- end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repo .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .root.Chart.AppVersion .image.tag) -}}
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
{{- if .Values.redis.enabled -}}{{ include "dwell.port" "redis" }}{{- else -}}{{ int .Values.redis.external.port }}{{- end -}}
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
{{- printf "%s-0.%s-headless.%s.svc:%s" $kafka $kafka .Release.Namespace (include "dwell.port" "kafka") -}}
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
  value: {{ printf "%s://:$(REDIS_PASSWORD)@%s:%s/%s" (ternary "rediss" "redis" .Values.redis.tls.enabled) (include "dwell.redisHost" .) (include "dwell.redisPort" .) (include "dwell.redisDb" .) | quote }}
{{- include "dwell.securityEnv" . | nindent 0 }}
{{- include "dwell.settingsEnv" .Values.config }}
{{- end -}}

{{/* The probes of a dwell HTTP process on its `http` port (HTTPS with tls.enabled) */}}
{{- define "dwell.probes" -}}
{{- $scheme := include "dwell.scheme" .root | upper -}}
startupProbe:
  httpGet: {path: /healthz, port: http, scheme: {{ $scheme }}}
  periodSeconds: 2
  failureThreshold: 60
livenessProbe:
  httpGet: {path: /healthz, port: http, scheme: {{ $scheme }}}
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet: {path: /readyz, port: http, scheme: {{ $scheme }}}
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
     dwell.serviceContainer (dict "root" $ "component" "policy"
       "port" (include "dwell.port" "policy" | int)) */}}
{{- define "dwell.serviceContainer" -}}
{{- $values := index .root.Values .component -}}
- name: {{ .component }}
  image: {{ include "dwell.imageRef" (dict "root" .root "image" .root.Values.image) }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  {{- if .root.Values.devReload }}
  {{- /* watchfiles comes with uvicorn[standard]: it restarts the service when Tilt or
         skaffold sync a changed source into the venv */}}
  command: ["watchfiles", "--filter", "python", "python -m dwell.{{ .component }}",
            "/opt/venv/lib/python3.11/site-packages/dwell"]
  {{- else }}
  command: ["python", "-m", "dwell.{{ .component }}"]
  {{- end }}
  env:
    {{- include "dwell.env" .root | nindent 4 }}
    - name: DWELL_HTTP_PORT
      value: {{ .port | quote }}
    {{- if has .component (list "policy" "admission") }}
    {{- /* the policy service serves the tracker's figures on Pulsar's topic stats path;
           admission hands a cancel to the tracker, which holds the index */}}
    - name: DWELL_TRACKER_URL
      value: {{ printf "%s://%s:%s" (include "dwell.scheme" .root) (include "dwell.component" (dict "root" .root "component" "tracker")) (include "dwell.port" "tracker") | quote }}
    {{- end }}
    {{- if eq .component "tracker" }}
    {{- /* a container restarted in its pod takes its own bookkeeping lease back at once */}}
    - name: DWELL_BOOKKEEPING_LEASE_HOLDER
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    {{- end }}
    {{- include "dwell.settingsEnv" $values.config | trim | nindent 4 }}
    {{- include "dwell.authEnv" .root | nindent 4 }}
    {{- include "dwell.kafkaLoginEnv" (dict "root" .root "principal" (printf "dwell-%s" .component)) | nindent 4 }}
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
    {{- include "dwell.securityMounts" .root | nindent 4 }}
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
    {{- include "dwell.securityVolumes" .root | nindent 4 }}
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

{{/* The Secret with the HTTP ports' certificate: tls.existingSecret, else the one the
     cert-manager Certificate writes. */}}
{{- define "dwell.tlsSecret" -}}
{{- default (include "dwell.component" (dict "root" . "component" "tls")) .Values.tls.existingSecret -}}
{{- end -}}

{{- define "dwell.scheme" -}}
{{- if .Values.tls.enabled -}}https{{- else -}}http{{- end -}}
{{- end -}}

{{/* The settings of dwell's connections (dwell/security.py): Kafka's SASL and TLS, the
     Redis ACL user and CA, TLS of the HTTP port. Passwords come from Secrets by
     secretKeyRef and files (certificates, CAs) from mounted Secrets: no secret value in a
     manifest. */}}
{{- define "dwell.securityEnv" -}}
{{- $k := .Values.kafka.security -}}
{{- if include "dwell.kafkaLocked" . }}
{{- /* the login itself: dwell.kafkaLoginEnv, per process */}}
{{- include "dwell.kafkaLockedProtocolEnv" . | nindent 0 }}
{{- else }}
- name: DWELL_KAFKA_SECURITY_PROTOCOL
  value: {{ $k.protocol | quote }}
{{- end }}
{{- if and (hasPrefix "SASL_" $k.protocol) (not (include "dwell.kafkaLocked" .)) }}
- name: DWELL_KAFKA_SASL_MECHANISM
  value: {{ $k.saslMechanism | quote }}
{{- if eq $k.saslMechanism "OAUTHBEARER" }}
- name: DWELL_KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL
  value: {{ required "kafka.security.oauthbearer.tokenEndpointUrl is required for OAUTHBEARER" $k.oauthbearer.tokenEndpointUrl | quote }}
- name: DWELL_KAFKA_SASL_OAUTHBEARER_CLIENT_ID
  value: {{ required "kafka.security.oauthbearer.clientId is required for OAUTHBEARER" $k.oauthbearer.clientId | quote }}
{{- with $k.oauthbearer.scope }}
- name: DWELL_KAFKA_SASL_OAUTHBEARER_SCOPE
  value: {{ . | quote }}
{{- end }}
- name: DWELL_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET
{{- else }}
- name: DWELL_KAFKA_SASL_USERNAME
  value: {{ required "kafka.security.username is required for SASL" $k.username | quote }}
- name: DWELL_KAFKA_SASL_PASSWORD
{{- end }}
  valueFrom:
    secretKeyRef:
      name: {{ required "kafka.security.existingSecret is required for SASL" $k.existingSecret }}
      key: {{ $k.existingSecretPasswordKey }}
{{- end }}
{{- if $k.caSecret }}
- name: DWELL_KAFKA_SSL_CA_LOCATION
  value: /etc/dwell/kafka-ca/{{ $k.caSecretKey }}
{{- end }}
{{- with .Values.redis.auth.username }}
- name: DWELL_REDIS_USERNAME
  value: {{ . | quote }}
{{- end }}
{{- if .Values.redis.tls.caSecret }}
- name: DWELL_REDIS_TLS_CA_CERT_FILE
  value: /etc/dwell/redis-ca/{{ .Values.redis.tls.caSecretKey }}
{{- end }}
{{- if .Values.tls.enabled }}
- name: DWELL_TLS_ENABLED
  value: "true"
- name: DWELL_TLS_CERTIFICATE_FILE_PATH
  value: /etc/dwell/tls/tls.crt
- name: DWELL_TLS_KEY_FILE_PATH
  value: /etc/dwell/tls/tls.key
{{- with .Values.tls.trustCertsKey }}
- name: DWELL_TLS_TRUST_CERTS_FILE_PATH
  value: /etc/dwell/tls/{{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The mounts and volumes of the files dwell.securityEnv names (nothing when unused) */}}
{{- define "dwell.securityMounts" -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: /etc/dwell/tls
  readOnly: true
{{- end }}
{{- if .Values.kafka.security.caSecret }}
- name: kafka-ca
  mountPath: /etc/dwell/kafka-ca
  readOnly: true
{{- end }}
{{- if .Values.redis.tls.caSecret }}
- name: redis-ca
  mountPath: /etc/dwell/redis-ca
  readOnly: true
{{- end }}
{{- end -}}

{{- define "dwell.securityVolumes" -}}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "dwell.tlsSecret" . }}
{{- end }}
{{- with .Values.kafka.security.caSecret }}
- name: kafka-ca
  secret:
    secretName: {{ . }}
{{- end }}
{{- with .Values.redis.tls.caSecret }}
- name: redis-ca
  secret:
    secretName: {{ . }}
{{- end }}
{{- end -}}

{{/* spark.sparkConf with the JVM options the Spark app's Kafka clients need added to any
     the user set: with OAUTHBEARER, Kafka's Java client (4.0 on) fetches tokens only from
     an endpoint allowed by a system property (dwell.security.java_oauth_system_properties). */}}
{{- define "dwell.sparkConf" -}}
{{- $conf := deepCopy (.Values.spark.sparkConf | default dict) -}}
{{- if .Values.spark.authenticate.enabled }}
{{- /* The driver's RPC port takes only peers holding the secret (a pod that reaches it
       could otherwise run code in the driver, whose ServiceAccount creates pods), and the
       traffic is encrypted. A file both sides mount, not Spark's generated secret, which
       it hands the executors in an environment variable anyone listing pods can read. */}}
{{- $_ := set $conf "spark.authenticate" "true" }}
{{- $_ := set $conf "spark.network.crypto.enabled" "true" }}
{{- $_ := set $conf "spark.authenticate.secret.file" (printf "%s/%s" (include "dwell.sparkAuthDir" .) (include "dwell.sparkAuthKey" .)) }}
{{- end }}
{{- $k := .Values.kafka.security -}}
{{- if and (hasPrefix "SASL_" $k.protocol) (eq $k.saslMechanism "OAUTHBEARER") }}
{{- $opt := printf "-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls=%s" $k.oauthbearer.tokenEndpointUrl }}
{{- range $key := list "spark.driver.extraJavaOptions" "spark.executor.extraJavaOptions" }}
{{- $_ := set $conf $key (trim (printf "%s %s" (toString (get $conf $key | default "")) $opt)) }}
{{- end }}
{{- end }}
{{- toYaml $conf }}
{{- end -}}

{{/* Spark's RPC authentication secret (spark.authenticate): the Secret, the key, where
     the driver and the executors mount it. */}}
{{- define "dwell.sparkAuthSecret" -}}
{{- default (printf "%s-auth" (include "dwell.component" (dict "root" . "component" "spark"))) .Values.spark.authenticate.existingSecret -}}
{{- end -}}
{{- define "dwell.sparkAuthKey" -}}spark-auth-secret{{- end -}}
{{- define "dwell.sparkAuthDir" -}}/etc/dwell/spark-auth{{- end -}}

{{- define "dwell.sparkAuthVolumeMount" -}}
{{- if .Values.spark.authenticate.enabled }}
- name: spark-auth
  mountPath: {{ include "dwell.sparkAuthDir" . }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "dwell.sparkAuthVolume" -}}
{{- if .Values.spark.authenticate.enabled }}
- name: spark-auth
  secret:
    secretName: {{ include "dwell.sparkAuthSecret" . }}
    defaultMode: 0440
    items:
      - key: {{ include "dwell.sparkAuthKey" . }}
        path: {{ include "dwell.sparkAuthKey" . }}
{{- end }}
{{- end -}}

{{/* A generated Secret's value, kept by every upgrade: what the release's Secret `existing`
     (from lookup) holds under `key`, else `new` (base64):
     dwell.keptValue (dict "existing" $existing "key" "k" "new" (randAlphaNum 32 | b64enc)) */}}
{{- define "dwell.keptValue" -}}
{{- if and .existing (index .existing.data .key) -}}
{{- index .existing.data .key -}}
{{- else -}}
{{- .new -}}
{{- end -}}
{{- end -}}
