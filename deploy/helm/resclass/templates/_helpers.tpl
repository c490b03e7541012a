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
