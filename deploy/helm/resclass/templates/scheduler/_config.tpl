{{/*
The scheduler's KubeSchedulerConfiguration (deploy/scheduler/config.yaml).
The checksum of it rolls the scheduler's pods: kube-scheduler reads it once.
*/}}
{{- define "resclass.schedulerConfig" -}}
{{- $v := .Values.scheduler -}}
{{- if not (has $v.strategy (list "FirstFit" "BinPack" "Spread" "NUMAAligned" "Topology")) -}}
{{- fail (printf "scheduler.strategy %q: want FirstFit, BinPack, Spread, NUMAAligned or Topology" $v.strategy) -}}
{{- end -}}
{{- if not (has $v.assignmentWrite (list "Binding" "PreBind")) -}}
{{- fail (printf "scheduler.assignmentWrite %q: want Binding or PreBind" $v.assignmentWrite) -}}
{{- end -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: true
  resourceNamespace: {{ .Release.Namespace }}
  resourceName: resclass-scheduler
profiles:
  - schedulerName: resclass-scheduler
    plugins:
      multiPoint:
        enabled:
          - name: ResourceClasses
          # NodeResourcesFit, shown each pod without its class requests.
          - name: NodeResourcesFitWithoutClasses
        disabled:
          - name: NodeResourcesFit
      bind:
        # The first binder that does not skip binds: ResourceClasses for the
        # pods it placed devices for, DefaultBinder for all others.
        disabled:
          - name: "*"
        enabled:
          - name: ResourceClasses
          - name: DefaultBinder
    pluginConfig:
      - name: ResourceClasses
        args:
          strategy: {{ $v.strategy }}
          assignmentWrite: {{ $v.assignmentWrite }}
          statusUpdateInterval: {{ $v.statusUpdateInterval }}
          statusLeaseNamespace: {{ .Release.Namespace }}
      - name: NodeResourcesFitWithoutClasses
        args:
          scoringStrategy:
            type: LeastAllocated
            resources:
              - {name: cpu, weight: 1}
              - {name: memory, weight: 1}
{{- end }}

{{/*
The stock profile resclass-dra (deploy/scheduler/dra/config.yaml): upstream's
default plugins, NodeAffinity confined to DRA-mode nodes. The checksum of it
rolls the pods.
*/}}
{{- define "resclass.draSchedulerConfig" -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: true
  resourceNamespace: {{ .Release.Namespace }}
  resourceName: resclass-dra-scheduler
profiles:
- schedulerName: resclass-dra
  pluginConfig:
  - name: NodeAffinity
    args:
      addedAffinity:
        requiredDuringSchedulingIgnoredDuringExecution:
          nodeSelectorTerms:
          - matchExpressions:
            - key: node.resclass.io/device-mode
              operator: In
              values: [dra]
{{- end }}
