{{/* The in-chart Kafka locked down (kafka.auth.enabled): SASL on its listeners, KRaft's
     StandardAuthorizer, the ACLs of files/kafka-acls.txt (written by
     dwell_dev.kafka_acls, their one owner), one SCRAM-SHA-512 principal per dwell
     component, passwords in a Secret. */}}

{{- define "dwell.kafkaLocked" -}}
{{- if and .Values.kafka.enabled .Values.kafka.auth.enabled -}}true{{- end -}}
{{- end -}}

{{- define "dwell.kafkaUsersSecret" -}}
{{- default (printf "%s-users" (include "dwell.component" (dict "root" . "component" "kafka"))) .Values.kafka.auth.existingSecret -}}
{{- end -}}

{{/* The broker's own login (its only super-user) and every principal the ACL file names,
     as a JSON list: the keys of the users' Secret. */}}
{{- define "dwell.kafkaUsers" -}}
{{- $users := list "broker" -}}
{{- range .Files.Lines "files/kafka-acls.txt" -}}
{{- $first := first (splitList " " (trim .)) -}}
{{- if and $first (not (hasPrefix "#" $first)) -}}
{{- $users = append $users (trimPrefix "User:" $first) -}}
{{- end -}}
{{- end -}}
{{- $users | uniq | sortAlpha | toJson -}}
{{- end -}}

{{/* How every dwell client of the locked Kafka connects: SASL without TLS (the broker
     has no certificate), SCRAM-SHA-512 as on devstack's secured stack. */}}
{{- define "dwell.kafkaLockedProtocolEnv" -}}
- name: DWELL_KAFKA_SECURITY_PROTOCOL
  value: SASL_PLAINTEXT
- name: DWELL_KAFKA_SASL_MECHANISM
  value: SCRAM-SHA-512
{{- end -}}

{{/* One process's own principal on the locked Kafka (nothing otherwise):
     dwell.kafkaLoginEnv (dict "root" $ "principal" "dwell-policy") */}}
{{- define "dwell.kafkaLoginEnv" -}}
{{- if include "dwell.kafkaLocked" .root }}
- name: DWELL_KAFKA_SASL_USERNAME
  value: {{ .principal | quote }}
- name: DWELL_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "dwell.kafkaUsersSecret" .root }}
      key: {{ .principal }}
{{- end }}
{{- end -}}
