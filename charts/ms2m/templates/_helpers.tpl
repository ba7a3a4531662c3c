{{/*
Names. The fullname is the release name when it already contains the
chart's name ("ms2m"), else "<release>-ms2m"; every object's name starts
with it, so that two releases in one cluster do not collide on the
cluster-scoped objects.
*/}}
{{- define "ms2m.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ms2m.webhookName" -}}{{ include "ms2m.fullname" . }}-webhook{{- end -}}
{{- define "ms2m.migratorName" -}}{{ include "ms2m.fullname" . }}-migrator{{- end -}}
{{- define "ms2m.agentName" -}}{{ include "ms2m.fullname" . }}-agent{{- end -}}
{{- define "ms2m.controllerName" -}}{{ include "ms2m.fullname" . }}-controller{{- end -}}
{{- define "ms2m.webhookTLSSecret" -}}{{ include "ms2m.webhookName" . }}-tls{{- end -}}
{{- define "ms2m.agentTLSSecret" -}}
{{- .Values.agent.tls.existingSecret | default (printf "%s-tls" (include "ms2m.agentName" .)) -}}
{{- end -}}
{{/* The one name on the agents' certificate, which the migrator checks. */}}
{{- define "ms2m.agentServerName" -}}{{ include "ms2m.agentName" . }}.{{ .Release.Namespace }}{{- end -}}
{{- define "ms2m.agentTokenSecret" -}}
{{- .Values.agent.token.existingSecret | default (printf "%s-token" (include "ms2m.agentName" .)) -}}
{{- end -}}

{{/* Labels on every object; component is added per object. */}}
{{- define "ms2m.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ms2m
{{- end -}}

{{/* Selector labels of one component: (list $ "webhook"). */}}
{{- define "ms2m.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ $.Chart.Name }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "ms2m.componentLabels" -}}
{{- $ := index . 0 -}}
{{ include "ms2m.labels" $ }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* An image reference: (list $ .Values.webhook.image.repository). */}}
{{- define "ms2m.image" -}}
{{- $ := index . 0 -}}
{{- $repo := index . 1 -}}
{{- $tag := $.Values.image.tag | default $.Chart.AppVersion -}}
{{- if $.Values.image.registry -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $.Values.image.registry) $repo $tag -}}
{{- else -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}
{{- end -}}

{{/*
Where checkpoint images go: migrator.checkpointRepository, else
<image.registry>/ms2m/checkpoints, else empty.
*/}}
{{- define "ms2m.checkpointRepository" -}}
{{- if .Values.migrator.checkpointRepository -}}
{{- .Values.migrator.checkpointRepository -}}
{{- else if .Values.image.registry -}}
{{- printf "%s/ms2m/checkpoints" (trimSuffix "/" .Values.image.registry) -}}
{{- end -}}
{{- end -}}

{{/*
The webhook's replicas: 2 with cert-manager, 1 with the self-signed
bootstrap, which cannot run more than one (each replica makes its own CA).
*/}}
{{- define "ms2m.webhookReplicas" -}}
{{- $r := .Values.webhook.replicas -}}
{{- if .Values.certManager.enabled -}}
{{- if kindIs "invalid" $r -}}2{{- else -}}{{ int $r }}{{- end -}}
{{- else -}}
{{- if and (not (kindIs "invalid" $r)) (gt (int $r) 1) -}}
{{- fail (printf "webhook.replicas: %d replicas need certManager.enabled=true; the self-signed bootstrap runs one replica, because each replica would make its own CA and overwrite the others' caBundle" (int $r)) -}}
{{- end -}}
1
{{- end -}}
{{- end -}}

{{/*
Checks that need the release namespace, which the schema cannot see. Every
template that depends on them includes this.
*/}}
{{- define "ms2m.validate" -}}
{{- range .Values.workloadNamespaces -}}
{{- if or (eq . "kube-system") (eq . $.Release.Namespace) -}}
{{- fail (printf "workloadNamespaces: %q cannot hold workloads: the webhook never runs for kube-system nor for the release namespace %s, where its own pods run" . $.Release.Namespace) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.secrets.create (not .Values.workloadNamespaces) -}}
{{- fail "secrets.create: list the namespaces to create the Secrets in as workloadNamespaces" -}}
{{- end -}}
{{- $bu := .Values.brokerUsers -}}
{{- if and $bu.enabled .Values.secrets.streamURI.value -}}
{{- fail "secrets.streamURI.value: with brokerUsers.enabled (the default) each namespace's sidecars use a broker user of their own, and one stream URI for every namespace would reach every namespace's replay logs; remove secrets.streamURI.value, or set brokerUsers.enabled=false where namespaces are not tenants of each other" -}}
{{- end -}}
{{- if and .Values.secrets.create (not $bu.enabled) (not .Values.secrets.streamURI.value) -}}
{{- fail "secrets.streamURI.value: secrets.create needs the broker's stream URI, rabbitmq-stream://user:password@host:5552/vhost" -}}
{{- end -}}
{{- if and $bu.enabled (eq $bu.provision "controller") -}}
{{- if not .Values.migrator.controller.enabled -}}
{{- fail "brokerUsers.provision=controller: the controller makes the broker users, and migrator.controller.enabled is false; set brokerUsers.provision=manual and run `migrator broker-users ensure <namespace>`" -}}
{{- end -}}
{{- if or (not $bu.managementURL) (not $bu.adminSecret.name) (not $bu.streamAddress) -}}
{{- fail "brokerUsers: the controller makes each namespace's broker user (brokerUsers.provision=controller, the default) and needs brokerUsers.managementURL (http(s)://host:15672), brokerUsers.adminSecret.name (a Secret in the release namespace with an administrator's username and password) and brokerUsers.streamAddress (rabbitmq-stream://host:5552/vhost, without credentials); or set brokerUsers.provision=manual and run `migrator broker-users ensure <namespace>` (docs/install.md)" -}}
{{- end -}}
{{- end -}}
{{- if eq (int .Values.webhook.sidecar.listenPort) (int .Values.webhook.sidecar.controlPort) -}}
{{- fail (printf "webhook.sidecar.listenPort and webhook.sidecar.controlPort are both %d: the sidecar needs two ports" (int .Values.webhook.sidecar.listenPort)) -}}
{{- end -}}
{{- end -}}

{{/*
The host folder the agent mounts for a node folder of its values: the folder
itself, or, where the path names $(NODE_NAME) (nodes that share one host
filesystem, each with folders of its own), the folder above the first
segment that names it. Kubernetes expands $(NODE_NAME) in the agent's
environment, not in a mount, so the agent mounts what holds every node's
folder and opens its own node's.
*/}}
{{- define "ms2m.agentHostDir" -}}
{{- if contains "$(NODE_NAME)" . -}}
{{- dir (index (splitList "$(NODE_NAME)" .) 0) -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}

{{/*
Whether the controller provisions the broker users.
*/}}
{{- define "ms2m.provisionBrokerUsers" -}}
{{- if and .Values.brokerUsers.enabled (eq .Values.brokerUsers.provision "controller") .Values.migrator.controller.enabled -}}
true
{{- end -}}
{{- end -}}
