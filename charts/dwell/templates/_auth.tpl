{{/* Token authentication of the three HTTP services (dwell.auth): the settings, and the
     key mounted as a file from auth.existingSecret or the Secret auth.generateKeys makes
     (Pulsar's tokenSecretKey / tokenPublicKey as file: paths), so that no key appears in
     a manifest. With auth.enabled and no Secret, rendering fails rather than run the
     services open. */}}

{{- define "dwell.authKeyDir" -}}/etc/dwell/auth{{- end -}}

{{/* The Secret holding the token keys: auth.existingSecret, else the one the chart makes
     with auth.generateKeys (token-keys-secret.yaml); empty: neither. */}}
{{- define "dwell.tokenKeysSecret" -}}
{{- if .Values.auth.existingSecret -}}
{{- .Values.auth.existingSecret -}}
{{- else if .Values.auth.generateKeys -}}
{{- include "dwell.component" (dict "root" . "component" "token-keys") -}}
{{- end -}}
{{- end -}}

{{/* "true" when the chart makes the token keys (auth on, auth.generateKeys, no Secret named). */}}
{{- define "dwell.keysGenerated" -}}
{{- if and .Values.auth.enabled .Values.auth.generateKeys (not .Values.auth.existingSecret) -}}true{{- end -}}
{{- end -}}

{{/* The generated Secret's keys: an HS256 secret key and the Kafka token key. */}}
{{- define "dwell.generatedSecretKey" -}}secret.key{{- end -}}
{{- define "dwell.generatedKafkaTokenKey" -}}kafka-token.key{{- end -}}

{{- define "dwell.authEnv" -}}
{{- $auth := .Values.auth -}}
- name: DWELL_AUTHENTICATION_ENABLED
  value: {{ $auth.enabled | toString | quote }}
- name: DWELL_AUTHORIZATION_ENABLED
  value: {{ $auth.enabled | toString | quote }}
{{- if $auth.enabled }}
{{- if not (include "dwell.tokenKeysSecret" .) }}
{{- fail "auth.enabled is true (the default) but auth.existingSecret is empty: create a Secret holding the token key (e.g. kubectl create secret generic dwell-token-keys --from-file=public.key=my-public.key, the key from dwell-admin tokens create-key-pair) and set auth.existingSecret, set auth.generateKeys=true to have the chart make an HS256 key (evaluation), or set auth.enabled=false to run without authentication" }}
{{- end }}
- name: DWELL_SUPER_USER_ROLES
  value: {{ join "," $auth.superUserRoles | quote }}
{{- if include "dwell.keysGenerated" . }}
- name: DWELL_TOKEN_SECRET_KEY
  value: {{ printf "file://%s/%s" (include "dwell.authKeyDir" .) (include "dwell.generatedSecretKey" .) | quote }}
- name: DWELL_KAFKA_TOKEN_SECRET_KEY
  value: {{ printf "file://%s/%s" (include "dwell.authKeyDir" .) (include "dwell.generatedKafkaTokenKey" .) | quote }}
{{- else }}
{{- if $auth.secretKeyKey }}
- name: DWELL_TOKEN_SECRET_KEY
  value: {{ printf "file://%s/%s" (include "dwell.authKeyDir" .) $auth.secretKeyKey | quote }}
{{- else }}
- name: DWELL_TOKEN_PUBLIC_KEY
  value: {{ printf "file://%s/%s" (include "dwell.authKeyDir" .) (required "auth.publicKeyKey or auth.secretKeyKey is required when auth.enabled is true" $auth.publicKeyKey) | quote }}
{{- end }}
{{- if $auth.kafkaTokenSecretKeyKey }}
- name: DWELL_KAFKA_TOKEN_SECRET_KEY
  value: {{ printf "file://%s/%s" (include "dwell.authKeyDir" .) $auth.kafkaTokenSecretKeyKey | quote }}
{{- else if not $auth.secretKeyKey }}
{{- fail "auth.kafkaTokenSecretKeyKey is required with auth.publicKeyKey: the key of an HMAC secret in auth.existingSecret that dwell signs its short-lived Kafka tokens with (dwell-admin tokens create-secret-key)" }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "dwell.authVolumeMount" -}}
{{- if .Values.auth.enabled }}
- name: token-keys
  mountPath: {{ include "dwell.authKeyDir" . }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "dwell.authVolume" -}}
{{- if .Values.auth.enabled }}
- name: token-keys
  secret:
    secretName: {{ include "dwell.tokenKeysSecret" . }}
    defaultMode: 0440
{{- end }}
{{- end -}}
