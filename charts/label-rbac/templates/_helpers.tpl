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
{{- range .Values.placementKeys }}
- --placement-key={{ . }}
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

{{/*
Every key of the chart's defaults (_defaults.tpl) a values file lacks, filled in .Values before a
template reads it: `helm upgrade --reuse-values` renders this chart with the values of the
release it upgrades, which lack every key added since. Each template calls it first (it is
idempotent). A map is filled key by key, but for the sections a user sets as a whole (where a key
nulled with `--set key=null` must stay absent): those are filled only when absent.
*/}}
{{- define "label-rbac.fill" -}}
{{- include "label-rbac.fillMap" (list .Values.AsMap (include "label-rbac.defaults" . | fromJson) "") -}}
{{- end }}

{{- define "label-rbac.fillMap" -}}
{{- $dst := index . 0 -}}
{{- $src := index . 1 -}}
{{- $prefix := index . 2 -}}
{{- $whole := list "networkPolicy.apiServer" "networkPolicy.prometheus" "webhook.resources" "compiled.resources" "reports.resources" "reports.readRules" "certificates.certManager.issuerRef" "securityContext" "podSecurityContext" -}}
{{- range $key, $default := $src -}}
{{- $path := printf "%s%s" $prefix $key -}}
{{- if not (hasKey $dst $key) -}}
{{- $_ := set $dst $key (deepCopy $default) -}}
{{- else if and (kindIs "map" $default) (kindIs "map" (index $dst $key)) (not (has $path $whole)) -}}
{{- include "label-rbac.fillMap" (list (index $dst $key) $default (printf "%s." $path)) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
The labels of every object: app.kubernetes.io/name (the argument's "name", default the name
prefix: the selectors use it, so it stays what earlier releases set) and the rest, which no
selector reads ("label-rbac.commonLabels": instance, version, component, part-of, managed-by,
helm.sh/chart). Argument: (dict "root" $ "component" "webhook" ["name" "..."]).
*/}}
{{- define "label-rbac.labels" -}}
app.kubernetes.io/name: {{ .name | default (include "label-rbac.name" .root) }}
{{ include "label-rbac.commonLabels" . }}
{{- end }}

{{- define "label-rbac.commonLabels" -}}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: label-rbac
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end }}

{{/* A pod template's labels: "label-rbac.labels" and podLabels (which cannot replace them). */}}
{{- define "label-rbac.podLabels" -}}
{{- $labels := include "label-rbac.labels" . | fromYaml -}}
{{- toYaml (merge $labels (.root.Values.podLabels | default dict)) -}}
{{- end }}

{{/* An object read from files/ (YAML) with the chart's labels added to its own (which win, its
name label included). Argument:
(dict "root" $ "component" "..." "text" "<the object's YAML>"). */}}
{{- define "label-rbac.labeled" -}}
{{- $object := .text | fromYaml -}}
{{- $labels := include "label-rbac.labels" . | fromYaml -}}
{{- $_ := set $object.metadata "labels" (merge ($object.metadata.labels | default dict) $labels) -}}
{{- toYaml $object -}}
{{- end }}

{{/*
Where the webhook's certificate comes from: certificates.source, with "auto" resolved to
certManager where the cluster serves cert-manager's API, else generated. certManager asked for
where that API is not served fails here, with what to do, rather than at Helm's "no matches
for kind".
*/}}
{{- define "label-rbac.certSource" -}}
{{- $source := .Values.certificates.source -}}
{{- $served := .Capabilities.APIVersions.Has "cert-manager.io/v1" -}}
{{- if eq $source "auto" -}}
{{ ternary "certManager" "generated" $served }}
{{- else -}}
{{- if and (eq $source "certManager") (not $served) -}}
{{- fail "certificates.source=certManager, but this cluster serves no cert-manager.io/v1: install cert-manager (https://cert-manager.io/docs/installation/), or set certificates.source to auto or generated (the chart's own CA), or existingSecret" -}}
{{- end -}}
{{ $source }}
{{- end -}}
{{- end }}

{{/*
With certificates.source generated: the CA and the serving certificate, as a dict (caCert,
caKey, caNotAfter, cert, key, notAfter, bundle; PEM, notAfter in Unix seconds), those of the
Secrets "<name>-ca" and "<name>-tls" when they exist and expire later than renewBeforeDays from
now, else new ones. A new CA is issued with a new serving certificate, and the bundle keeps the
previous CA beside it, so the pods still serving the previous certificate (until the kubelet
refreshes their Secret volume) stay verifiable. Outside a cluster (helm template) every render
issues new ones.
*/}}
{{- define "label-rbac.generatedTLS" -}}
{{- $name := include "label-rbac.name" . -}}
{{- $namespace := include "label-rbac.namespace" . -}}
{{- $settings := .Values.certificates.generated -}}
{{- $now := now | unixEpoch | int64 -}}
{{- $horizon := add $now (mul (int $settings.renewBeforeDays) 86400) -}}
{{- $caSecret := lookup "v1" "Secret" $namespace (printf "%s-ca" $name) -}}
{{- $tlsSecret := lookup "v1" "Secret" $namespace (printf "%s-tls" $name) -}}
{{- $found := dict -}}
{{- $caKept := false -}}
{{- with $caSecret -}}
{{- $until := index (.metadata.annotations | default dict) "labelrbac.io/not-after" | default "0" | int64 -}}
{{- if and .data (gt $until $horizon) -}}
{{- $ca := buildCustomCert (index .data "tls.crt") (index .data "tls.key") -}}
{{- $found = dict "caCert" $ca.Cert "caKey" $ca.Key "caNotAfter" $until -}}
{{- $caKept = true -}}
{{- end -}}
{{- end -}}
{{- $previousCA := "" -}}
{{- if not $caKept -}}
{{- with $caSecret }}{{ with .data }}{{ $previousCA = index . "tls.crt" | b64dec }}{{ end }}{{ end -}}
{{- $ca := genCA (printf "%s-ca" $name) (int $settings.caDays) -}}
{{- $found = dict "caCert" $ca.Cert "caKey" $ca.Key "caNotAfter" (add $now (mul (int $settings.caDays) 86400)) -}}
{{- end -}}
{{- $certKept := false -}}
{{- if $caKept -}}
{{- with $tlsSecret -}}
{{- $until := index (.metadata.annotations | default dict) "labelrbac.io/not-after" | default "0" | int64 -}}
{{- if and .data (gt $until $horizon) -}}
{{- $_ := merge $found (dict "cert" (index .data "tls.crt" | b64dec) "key" (index .data "tls.key" | b64dec) "notAfter" $until "bundle" (index .data "ca.crt" | b64dec)) -}}
{{- $certKept = true -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if not $certKept -}}
{{- $ca := buildCustomCert ($found.caCert | b64enc) ($found.caKey | b64enc) -}}
{{- $dns := list (printf "%s.%s.svc" $name $namespace) (printf "%s.%s.svc.cluster.local" $name $namespace) -}}
{{- $cert := genSignedCert (first $dns) nil $dns (int $settings.days) $ca -}}
{{- $_ := merge $found (dict "cert" $cert.Cert "key" $cert.Key "notAfter" (add $now (mul (int $settings.days) 86400)) "bundle" (printf "%s%s" $found.caCert $previousCA)) -}}
{{- end -}}
{{- toYaml $found -}}
{{- end }}
