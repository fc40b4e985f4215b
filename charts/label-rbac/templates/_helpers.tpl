{{/*
Every name and namespace this chart writes comes from these two: the name prefix (value `name`,
"label-rbac" by default: the Deployment, the ClusterRoles, the webhook configuration, the
policies) and the namespace (value `namespace`, else the release's).
*/}}
{{- define "label-rbac.name" -}}
{{- .Values.name -}}
{{- end }}

{{- define "label-rbac.namespace" -}}
{{- default .Release.Namespace .Values.namespace -}}
{{- end }}

{{/* The compiler's identity, which the guard policies name. */}}
{{- define "label-rbac.compilerUser" -}}
system:serviceaccount:{{ include "label-rbac.namespace" . }}:{{ include "label-rbac.name" . }}-compiler
{{- end }}

{{/* The image: repository, then @digest or :tag (the digest wins). */}}
{{- define "label-rbac.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* The serving certificate's Secret. */}}
{{- define "label-rbac.tlsSecret" -}}
{{- if eq .Values.certificates.source "existingSecret" -}}
{{ required "certificates.existingSecret.name is required with certificates.source=existingSecret" .Values.certificates.existingSecret.name }}
{{- else -}}
{{ include "label-rbac.name" . }}-tls
{{- end -}}
{{- end }}

{{/*
The webhook's failure policy for the entries that fail closed (labels, rbac, nodes). "auto":
Ignore when the release is installed (the configuration exists before the pods answer and before
the CA bundle is injected), Fail on every upgrade (docs/install.md).
*/}}
{{- define "label-rbac.failurePolicy" -}}
{{- if eq .Values.webhook.failurePolicy "auto" -}}
{{ ternary "Fail" "Ignore" .Release.IsUpgrade }}
{{- else -}}
{{ .Values.webhook.failurePolicy }}
{{- end -}}
{{- end }}

{{/* The scheduling settings shared by the webhook's and the compiler's pods. */}}
{{- define "label-rbac.scheduling" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The policy flags the webhook and the compiler share: the parameters must say what the
webhook would. */}}
{{- define "label-rbac.policyArgs" -}}
{{- if ne .Values.mode "enforce" }}
- --mode={{ .Values.mode }}
{{- end }}
{{- range .Values.annotationKeys }}
- --annotation-key={{ . }}
{{- end }}
{{- with .Values.defaultLabelKey }}
- --default-label-key={{ . }}
{{- end }}
{{- if .Values.allowUnlabeled }}
- --allow-unlabeled
{{- end }}
{{- end }}

{{/* The PriorityClass of the pods ("" for none). */}}
{{- define "label-rbac.priorityClass" -}}
{{- if .Values.priorityClass.create -}}
{{ include "label-rbac.name" . }}
{{- else -}}
{{ .Values.priorityClass.name }}
{{- end -}}
{{- end }}

{{/* Topology spread of a Deployment's pods whose app.kubernetes.io/name is the argument's
"app": the value if set, else one per node (hard) and across zones (soft). */}}
{{- define "label-rbac.spread" -}}
{{- if .root.Values.topologySpreadConstraints }}
{{- toYaml .root.Values.topologySpreadConstraints }}
{{- else }}
- maxSkew: 1
  topologyKey: kubernetes.io/hostname
  whenUnsatisfiable: DoNotSchedule
  labelSelector:
    matchLabels:
      app.kubernetes.io/name: {{ .app }}
  matchLabelKeys: [pod-template-hash]
- maxSkew: 1
  topologyKey: topology.kubernetes.io/zone
  whenUnsatisfiable: ScheduleAnyway
  labelSelector:
    matchLabels:
      app.kubernetes.io/name: {{ .app }}
  matchLabelKeys: [pod-template-hash]
{{- end }}
{{- end }}

{{/* A container of the post-install hook: kubectl, locked down. */}}
{{- define "label-rbac.hookContainer" -}}
{{- $image := .Values.enforceHook.image -}}
image: {{ $image.repository }}{{ if $image.digest }}@{{ $image.digest }}{{ else }}:{{ $image.tag }}{{ end }}
resources:
  requests: {cpu: 10m, memory: 32Mi}
  limits: {memory: 128Mi}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: {drop: [ALL]}
{{- end }}

{{/* The JSON patch setting Fail on the entries that fail closed, each guarded by a test of
its name at its index (the order webhook.yaml renders them in), so a different registration is
refused rather than changed. */}}
{{- define "label-rbac.failClosedPatch" -}}
{{- $entries := list "labels.labelrbac.io" -}}
{{- if and .Values.compiled.enabled .Values.compiled.split -}}
{{- $entries = append $entries "labels-compiled.labelrbac.io" -}}
{{- end -}}
{{- $entries = append $entries "rbac.labelrbac.io" -}}
{{- if .Values.webhook.nodeEntries -}}
{{- $entries = append $entries "nodes.labelrbac.io" -}}
{{- end -}}
{{- $ops := list -}}
{{- range $i, $entry := $entries -}}
{{- $ops = append $ops (dict "op" "test" "path" (printf "/webhooks/%d/name" $i) "value" $entry) -}}
{{- $ops = append $ops (dict "op" "replace" "path" (printf "/webhooks/%d/failurePolicy" $i) "value" "Fail") -}}
{{- end -}}
{{- toJson $ops -}}
{{- end }}
