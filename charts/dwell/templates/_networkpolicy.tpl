{{/* Pieces of the NetworkPolicies (networkpolicy-*.yaml), one per component. */}}

{{/* A peer: the pods of one component of this release: dwell.np.pods (dict "root" $ "component" "x") */}}
{{- define "dwell.np.pods" -}}
- podSelector:
    matchLabels:
      {{- include "dwell.selectorLabels" . | nindent 6 }}
{{- end -}}

{{/* The pods of a NetworkPolicy: its component's selector labels, plus the Spark role
     of the driver (the executors are the spark-executor component). */}}
{{- define "dwell.np.podSelector" -}}
podSelector:
  matchLabels:
    {{- include "dwell.selectorLabels" . | nindent 4 }}
    {{- if eq .component "spark" }}
    spark-role: driver
    {{- end }}
{{- end -}}

{{/* An ingress rule on `ports` from `peers`; no peers: from any source:
     dwell.np.from (dict "ports" (list (include "dwell.port" "kafka"))
       "peers" .Values.networkPolicy.clients) */}}
{{- define "dwell.np.from" -}}
- ports:
    {{- range .ports }}
    - port: {{ . }}
      protocol: TCP
    {{- end }}
  {{- with .peers }}
  from:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/* The ingress rule of an HTTP service's port, which serves both its clients and
     /metrics: from networkPolicy.clients and .metrics, or from any source when either
     list is empty: dwell.np.clients
     (dict "root" $ "port" (include "dwell.port" "policy" | int)) */}}
{{- define "dwell.np.clients" -}}
{{- $np := .root.Values.networkPolicy -}}
{{- $peers := list -}}
{{- if and $np.clients $np.metrics -}}
{{- $peers = concat $np.clients $np.metrics -}}
{{- end -}}
{{- include "dwell.np.from" (dict "ports" (list .port) "peers" $peers) -}}
{{- end -}}

{{/* Egress every dwell process needs: names (DNS), Redis and Kafka, in the chart
     (their pods) or external (their ports, to networkPolicy.externalTo or anywhere). */}}
{{- define "dwell.np.dataEgress" -}}
{{- $np := .Values.networkPolicy -}}
{{- include "dwell.np.dns" . }}
{{- if .Values.redis.enabled }}
- to:
    {{- include "dwell.np.pods" (dict "root" . "component" "redis") | nindent 4 }}
  ports:
    - port: {{ include "dwell.port" "redis" }}
      protocol: TCP
{{- else }}
- ports:
    - port: {{ int .Values.redis.external.port }}
      protocol: TCP
  {{- with $np.externalTo }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- if .Values.kafka.enabled }}
- to:
    {{- include "dwell.np.pods" (dict "root" . "component" "kafka") | nindent 4 }}
  ports:
    - port: {{ include "dwell.port" "kafka" }}
      protocol: TCP
{{- else }}
{{- $ports := list -}}
{{- range splitList "," .Values.kafka.external.bootstrap }}
{{- $ports = append $ports (int (last (splitList ":" (trim .)))) -}}
{{- end }}
- ports:
    {{- range uniq $ports }}
    - port: {{ . }}
      protocol: TCP
    {{- end }}
  {{- with $np.externalTo }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end -}}

{{- define "dwell.np.dns" -}}
- ports:
    - port: {{ include "dwell.port" "dns" }}
      protocol: UDP
    - port: {{ include "dwell.port" "dns" }}
      protocol: TCP
  {{- with .Values.networkPolicy.dns.to }}
  to:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/* The metadata and pod selector of a component's NetworkPolicy */}}
{{- define "dwell.np.head" -}}
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: {{ include "dwell.component" . }}
  labels:
    {{- include "dwell.labels" . | nindent 4 }}
spec:
  {{- include "dwell.np.podSelector" . | nindent 2 }}
  policyTypes: [Ingress, Egress]
{{- end -}}
