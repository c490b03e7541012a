{{/*
Labels Helm adds to every object, beside the app.kubernetes.io/name,
component and part-of labels the kustomize base (deploy/) has too.
*/}}
{{- define "resclass.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/*
The labels of a component's objects: include "resclass.labels" (list $ "scheduler")
*/}}
{{- define "resclass.labels" -}}
{{- $root := index . 0 -}}
{{- $component := index . 1 -}}
app.kubernetes.io/name: resclass-{{ $component }}
app.kubernetes.io/component: {{ $component }}
app.kubernetes.io/part-of: resclass
{{ include "resclass.helmLabels" $root }}
{{- end }}

{{/*
The labels of a component's pods (the kustomize base's: no Helm labels, so
that an upgrade from one chart version to the next changes no pod template
for nothing).
*/}}
{{- define "resclass.podLabels" -}}
app.kubernetes.io/name: resclass-{{ . }}
app.kubernetes.io/component: {{ . }}
app.kubernetes.io/part-of: resclass
{{- end }}

{{/*
A component's image: include "resclass.image" (list $ .Values.scheduler.image).
Its registry and tag default to image.registry and image.tag, the tag then to
the chart's appVersion.
*/}}
{{- define "resclass.image" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{- $registry := $image.registry | default $root.Values.image.registry -}}
{{- $tag := $image.tag | default $root.Values.image.tag | default $root.Chart.AppVersion -}}
{{- printf "%s/%s:%s" $registry $image.repository $tag -}}
{{- end }}

{{/*
The ServiceAccount username of a component, as the apiserver spells it.
*/}}
{{- define "resclass.serviceAccountUser" -}}
{{- printf "system:serviceaccount:%s:resclass-%s" (index . 0).Release.Namespace (index . 1) -}}
{{- end }}

{{/*
The node agent's namespace: nodeAgent.namespace, or the release namespace
when that is empty (docs/install.md, "Pod Security").
*/}}
{{- define "resclass.nodeAgentNamespace" -}}
{{- .Values.nodeAgent.namespace | default .Release.Namespace -}}
{{- end }}

{{/*
The namespaces the pod and workload webhooks never see: the release's own
(the webhook must be able to start to answer), the node agent's (its
DaemonSet must roll out on new nodes while the webhook is down) and
webhook.excludedNamespaces.
*/}}
{{- define "resclass.webhookExcludedNamespaces" -}}
{{- concat (list .Release.Namespace (include "resclass.nodeAgentNamespace" .)) .Values.webhook.excludedNamespaces | uniq | toJson -}}
{{- end }}

{{/*
The ResourceDistribution controller acts for the author its distributions
record. The admission policy resclass-spec-author binds that record to the
requester in the apiserver and is always rendered; the webhook records it
(mutating) and checks, at admission, that the requester may make the writes
a create, an update or a delete causes (the garbage collector deletes the
copies of a deleted distribution under its own identity). Without the
webhook the controller would act on distributions nobody checked, so the
chart refuses that combination rather than render it.
*/}}
{{- define "resclass.distributionNeedsAuthorGuard" -}}
{{- if and .Values.distribution.enabled (not .Values.webhook.enabled) -}}
{{- fail "distribution.enabled=true needs webhook.enabled=true: the webhook records each ResourceDistribution's author and checks that whoever creates, changes or deletes one may write or delete its copies; the controller must not act without it (docs/distribution.md, \"Installing the controller\")" -}}
{{- end -}}
{{- end }}

{{/*
resclass.podPolicies.on: "true" when any pod policy (webhook.policies) is on,
else "". With none on, the pods and workloads webhooks are not rendered.
*/}}
{{- define "resclass.podPolicies.on" -}}
{{- $p := .Values.webhook.policies -}}
{{- if or $p.emptyNamespaceSelector $p.crossNamespaceAffinityQuota $p.priorityClassQuota $p.resourceQuota }}true{{ end -}}
{{- end }}

{{/*
resclass.podPolicies.quotaOn: "true" when a covering-quota policy is on (the
webhook gets --quota-config and its ConfigMap), else "".
*/}}
{{- define "resclass.podPolicies.quotaOn" -}}
{{- $p := .Values.webhook.policies -}}
{{- if or $p.crossNamespaceAffinityQuota $p.priorityClassQuota $p.resourceQuota }}true{{ end -}}
{{- end }}

{{/*
resclass.podPolicies.cover: the --match-conditions-cover value: what the
rendered matchConditions send to the webhook, so that it can say loudly when
a rule reloaded from its ConfigMap concerns pods they leave out.
*/}}
{{- define "resclass.podPolicies.cover" -}}
{{- $p := .Values.webhook.policies -}}
{{- $c := list -}}
{{- if $p.emptyNamespaceSelector }}{{ $c = append $c "EmptyNamespaceSelector" }}{{ end -}}
{{- if $p.crossNamespaceAffinityQuota }}{{ $c = append $c "CrossNamespacePodAffinity" }}{{ end -}}
{{- if has "*" $p.priorityClassQuota }}{{ $c = append $c "PriorityClass" }}
{{- else }}{{ range $p.priorityClassQuota }}{{ $c = append $c (printf "PriorityClass=%s" .) }}{{ end }}{{ end -}}
{{- range $p.resourceQuota }}{{ $c = append $c (printf "Contains=%s" .) }}{{ end -}}
{{- if $c }}{{ join "," $c }}{{ else }}None{{ end -}}
{{- end }}

{{/*
resclass.podPolicies.quotaConfig: the covering-quota rule of the policies,
in the apiserver's ResourceQuotaConfiguration schema.
*/}}
{{- define "resclass.podPolicies.quotaConfig" -}}
{{- $p := .Values.webhook.policies -}}
apiVersion: apiserver.config.k8s.io/v1
kind: ResourceQuotaConfiguration
limitedResources:
- resource: pods
  {{- if or $p.crossNamespaceAffinityQuota $p.priorityClassQuota }}
  matchScopes:
  {{- if $p.crossNamespaceAffinityQuota }}
  - scopeName: CrossNamespacePodAffinity
    operator: Exists
  {{- end }}
  {{- if has "*" $p.priorityClassQuota }}
  - scopeName: PriorityClass
    operator: Exists
  {{- else if $p.priorityClassQuota }}
  - scopeName: PriorityClass
    operator: In
    values: {{ toJson $p.priorityClassQuota }}
  {{- end }}
  {{- end }}
  {{- with $p.resourceQuota }}
  matchContains: {{ toJson . }}
  {{- end }}
{{- end }}

{{/*
resclass.podPolicies.condition: the pods webhook's matchCondition, one CEL
expression, true for exactly the pods the policies concern (matchConditions
are ANDed, so the policies' cases are one expression ORed): a priority class
the rule limits, an affinity term reaching other namespaces (or only the
empty selector {}, when that is the one affinity policy on), a consumed
resource whose quota name contains a limited substring (requests.<name> or
limits.<name>; a pod's overhead counts in both).
*/}}
{{- define "resclass.podPolicies.condition" -}}
{{- $p := .Values.webhook.policies -}}
{{- $terms := list -}}
{{- $pred := "" -}}
{{- if $p.crossNamespaceAffinityQuota -}}
{{- $pred = "has(TERM.namespaceSelector) || (has(TERM.namespaces) && size(TERM.namespaces) > 0)" -}}
{{- else if $p.emptyNamespaceSelector -}}
{{- $pred = "has(TERM.namespaceSelector) && (!has(TERM.namespaceSelector.matchLabels) || size(TERM.namespaceSelector.matchLabels) == 0) && (!has(TERM.namespaceSelector.matchExpressions) || size(TERM.namespaceSelector.matchExpressions) == 0)" -}}
{{- end -}}
{{- if $pred -}}
{{- $kinds := list -}}
{{- range list "podAffinity" "podAntiAffinity" -}}
{{- $a := printf "object.spec.affinity.%s" . -}}
{{- $kinds = append $kinds (printf "(has(%s) && (\n    (has(%s.requiredDuringSchedulingIgnoredDuringExecution) &&\n      %s.requiredDuringSchedulingIgnoredDuringExecution.exists(t,\n        %s)) ||\n    (has(%s.preferredDuringSchedulingIgnoredDuringExecution) &&\n      %s.preferredDuringSchedulingIgnoredDuringExecution.exists(w,\n        %s))))" $a $a $a (replace "TERM" "t" $pred) $a $a (replace "TERM" "w.podAffinityTerm" $pred)) -}}
{{- end -}}
{{- $terms = append $terms (printf "(has(object.spec.affinity) && (\n  %s))" (join " ||\n  " $kinds)) -}}
{{- end -}}
{{- if has "*" $p.priorityClassQuota -}}
{{- $terms = append $terms "(has(object.spec.priorityClassName) && object.spec.priorityClassName != '')" -}}
{{- else if $p.priorityClassQuota -}}
{{- $names := list -}}
{{- range $p.priorityClassQuota }}{{ $names = append $names (printf "'%s'" .) }}{{ end -}}
{{- $terms = append $terms (printf "(has(object.spec.priorityClassName) && object.spec.priorityClassName in [%s])" (join ", " $names)) -}}
{{- end -}}
{{- if $p.resourceQuota -}}
{{- $req := list -}}
{{- $lim := list -}}
{{- range $p.resourceQuota -}}
{{- if contains . "count/pods" -}}
{{- fail (printf "webhook.policies.resourceQuota: %q is part of pods or count/pods, which every pod consumes: no matchCondition can narrow it" .) -}}
{{- end -}}
{{- $req = append $req (printf "('requests.' + r).contains('%s')" .) -}}
{{- $lim = append $lim (printf "('limits.' + r).contains('%s')" .) -}}
{{- end -}}
{{- $c := printf "has(c.resources) && (\n    (has(c.resources.requests) && c.resources.requests.exists(r, %s)) ||\n    (has(c.resources.limits) && c.resources.limits.exists(r, %s)))" (join " || " $req) (join " || " $lim) -}}
{{- $terms = append $terms (printf "object.spec.containers.exists(c, %s)" $c) -}}
{{- $terms = append $terms (printf "(has(object.spec.initContainers) && object.spec.initContainers.exists(c, %s))" $c) -}}
{{- $terms = append $terms (printf "(has(object.spec.overhead) && object.spec.overhead.exists(r, %s || %s))" (join " || " $req) (join " || " $lim)) -}}
{{- end -}}
{{- join " ||\n" $terms -}}
{{- end }}

{{/*
A container's Go collector settings, from a component's gc value ({gogc,
memoryLimit}; "" leaves the Go default): include "resclass.goEnv" $v.gc
(docs/install.md, "Sizing").
*/}}
{{- define "resclass.goEnv" -}}
{{- with .gogc }}
- name: GOGC
  value: {{ . | quote }}
{{- end }}
{{- with .memoryLimit }}
- name: GOMEMLIMIT
  value: {{ . }}
{{- end }}
{{- end }}
