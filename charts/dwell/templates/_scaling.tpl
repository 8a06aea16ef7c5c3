{{- /* The scaling of a dwell process, from .Values.<component>: "dwell.hpa" a
       HorizontalPodAutoscaler on CPU for its workload of kind .kind (when
       autoscaling.enabled), "dwell.pdb" a PodDisruptionBudget for its pods (when
       podDisruptionBudget.enabled). Called with (dict "root" $ "component" <name>
       "kind" <Deployment|StatefulSet>). */}}
{{- define "dwell.hpa" -}}
{{- $v := index .root.Values .component }}
{{- if $v.autoscaling.enabled }}
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ include "dwell.component" . }}
  labels:
    {{- include "dwell.labels" . | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: {{ .kind }}
    name: {{ include "dwell.component" . }}
  minReplicas: {{ $v.autoscaling.minReplicas }}
  maxReplicas: {{ $v.autoscaling.maxReplicas }}
  metrics:
    - type: Resource
      resource:
        name: cpu
        target:
          type: Utilization
          averageUtilization: {{ $v.autoscaling.targetCPUUtilizationPercentage }}
{{- end }}
{{- end }}

{{- define "dwell.pdb" -}}
{{- $v := index .root.Values .component }}
{{- if $v.podDisruptionBudget.enabled }}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "dwell.component" . }}
  labels:
    {{- include "dwell.labels" . | nindent 4 }}
spec:
  maxUnavailable: {{ $v.podDisruptionBudget.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "dwell.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end }}
