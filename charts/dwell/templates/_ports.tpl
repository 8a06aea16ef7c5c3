{{/* The ports dwell's processes, the in-chart Redis and Kafka, the Spark driver and DNS
     listen on: the one place the chart spells them. dwell's and Redis's and Kafka's are
     services/dwell/endpoints.py's defaults (and ARCHITECTURE.md's); tests/chart/test_chart.py
     keeps the two equal and fails on a port spelled anywhere else under templates/. */}}
{{- define "dwell.ports" -}}
policy: 8081
admission: 8082
tracker: 8083
spark: 8084
redis: 6379
kafka: 9092
kafkaController: 9093
sparkDriver: 7078
sparkBlockManager: 7079
dns: 53
{{- end -}}

{{/* One of them by name: include "dwell.port" "policy" */}}
{{- define "dwell.port" -}}
{{- $ports := include "dwell.ports" . | fromYaml -}}
{{- if not (hasKey $ports .) -}}
{{- fail (printf "dwell.port: no port named %q" .) -}}
{{- end -}}
{{- index $ports . | int -}}
{{- end -}}
