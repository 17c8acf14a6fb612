{{/*
Names, labels, the image and the security settings every torchyard Pod shares.
*/}}

{{- define "torchyard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
"<release>-torchyard", or the release name when it already says torchyard. At most 47
characters, so that "<fullname>-registry-client" and every Service name (DNS labels)
stay within 63.
*/}}
{{- define "torchyard.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 47 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 47 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 47 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Kopf peering object's name (operator.peering). */}}
{{- define "torchyard.peeringName" -}}
{{- default (include "torchyard.fullname" .) .Values.operator.peeringName }}
{{- end }}

{{- define "torchyard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object; call with (dict "ctx" $ "component" "operator"). */}}
{{- define "torchyard.labels" -}}
helm.sh/chart: {{ include "torchyard.chart" .ctx }}
{{ include "torchyard.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: torchyard
{{- end }}

{{- define "torchyard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "torchyard.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end }}

{{- define "torchyard.image" -}}
{{- $repository := include "torchyard.fromRegistry" (dict "ctx" . "ref" .Values.image.repository) }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- /*
An image reference with its registry host replaced by .Values.imageRegistry when that is
set (a mirror or a private registry holding the same repositories). The host is the first
path part when it has a "." or ":" or is "localhost", as Docker reads references; a
reference without one gets the registry put in front.
*/}}
{{- define "torchyard.fromRegistry" -}}
{{- $registry := .ctx.Values.imageRegistry }}
{{- $parts := splitList "/" .ref }}
{{- $first := first $parts }}
{{- if or (not $registry) (not .ref) }}
{{- .ref }}
{{- else if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) }}
{{- printf "%s/%s" $registry (rest $parts | join "/") }}
{{- else }}
{{- printf "%s/%s" $registry .ref }}
{{- end }}
{{- end }}

{{- define "torchyard.operatorServiceAccount" -}}
{{- if .Values.serviceAccount.create }}
{{- default (printf "%s-operator" (include "torchyard.fullname" .)) .Values.serviceAccount.operator.name }}
{{- else }}
{{- required "serviceAccount.operator.name is required when serviceAccount.create is false" .Values.serviceAccount.operator.name }}
{{- end }}
{{- end }}

{{- define "torchyard.registryServiceAccount" -}}
{{- if .Values.serviceAccount.create }}
{{- default (printf "%s-registry" (include "torchyard.fullname" .)) .Values.serviceAccount.registry.name }}
{{- else }}
{{- required "serviceAccount.registry.name is required when serviceAccount.create is false" .Values.serviceAccount.registry.name }}
{{- end }}
{{- end }}

{{/* "https" when the registry serves TLS (registry.tls.enabled), else "http". */}}
{{- define "torchyard.registryScheme" -}}
{{- ternary "https" "http" (eq .Values.registry.tls.enabled true) }}
{{- end }}

{{/* The registry service's in-cluster URL (TORCHYARD_REGISTRY_URL of the operator). */}}
{{- define "torchyard.registryURL" -}}
{{- printf "%s://%s.%s.svc:%d" (include "torchyard.registryScheme" .) .Values.registry.service.name .Release.Namespace (int .Values.registry.service.port) }}
{{- end }}

{{/* The Secret with the registry's tls.crt, tls.key and ca.crt. */}}
{{- define "torchyard.registryTLSSecret" -}}
{{- default (printf "%s-registry-tls" (include "torchyard.fullname" .)) .Values.registry.tls.existingSecret }}
{{- end }}

{{/* The DNS names the registry's certificate is for: the Service's, and localhost for a
kubectl port-forward. */}}
{{- define "torchyard.registryDNSNames" -}}
{{- $svc := .Values.registry.service.name }}
{{- $ns := .Release.Namespace }}
{{- toJson (list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) "localhost") }}
{{- end }}

{{- define "torchyard.registryClaim" -}}
{{- default (printf "%s-registry" (include "torchyard.fullname" .)) .Values.registry.persistence.existingClaim }}
{{- end }}

{{/* Namespaces that get curated Environments. */}}
{{- define "torchyard.environmentNamespaces" -}}
{{- $ns := .Values.environments.namespaces | default .Values.watchNamespaces | default (list .Release.Namespace) }}
{{- toJson (uniq $ns) }}
{{- end }}

{{/* Namespaces whose default ServiceAccount may upload to the registry. */}}
{{- define "torchyard.trainerNamespaces" -}}
{{- toJson (uniq (concat .Values.watchNamespaces .Values.registry.trainerNamespaces)) }}
{{- end }}

{{/* Pod Security "restricted": the Pod part (call with the component's values). */}}
{{- define "torchyard.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .runAsUser }}
runAsGroup: {{ .runAsGroup }}
{{- if .fsGroup }}
fsGroup: {{ .fsGroup }}
fsGroupChangePolicy: OnRootMismatch
{{- end }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Pod Security "restricted": the container part. */}}
{{- define "torchyard.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
The operator's rules in one namespace (a Role per watched namespace, or part of the
ClusterRole when it watches them all). Each rule names the code that needs it.
*/}}
{{- define "torchyard.operatorNamespacedRules" -}}
# Kopf watches TrainingRuns, Sweeps and Environments; the reconcilers get them fresh and
# list the runs of an Environment and the trials of a Sweep (controller/handlers.py,
# controller/environments.py, controller/sweeps.py).
- apiGroups: ["torchyard.dev"]
  resources: ["trainingruns", "sweeps", "environments"]
  verbs: ["get", "list", "watch"]
# OnlineEndpoints: Kopf watches them, the reconciler gets them, an Environment's reconcile
# and the inputs cache's eviction list them (controller/endpoints.py, controller/inputs.py).
- apiGroups: ["torchyard.dev"]
  resources: ["onlineendpoints"]
  verbs: ["get", "list", "watch"]
# A Sweep's trials are TrainingRuns it makes, and stops by setting spec.suspend, both by
# server-side apply (controller/sweeps.py).
- apiGroups: ["torchyard.dev"]
  resources: ["trainingruns"]
  verbs: ["create", "patch"]
# Status is written by server-side apply of the status subresource (k8s.apply_status);
# a new ModelVersion gets its Available condition (controller/finalize.py).
- apiGroups: ["torchyard.dev"]
  resources: ["trainingruns/status", "sweeps/status", "environments/status", "modelversions/status", "onlineendpoints/status"]
  verbs: ["patch"]
# Node Pods and Services carry an owner reference to their run, trials and a Sweep's
# ConfigMap to their Sweep, with blockOwnerDeletion, which clusters with the
# OwnerReferencesPermissionEnforcement admission plugin check.
- apiGroups: ["torchyard.dev"]
  resources: ["trainingruns/finalizers", "sweeps/finalizers", "onlineendpoints/finalizers"]
  verbs: ["update"]
# A promoted model is recorded as a ModelVersion (server-side apply creates it); the
# registry also checks `create` on modelversions for the operator's token. A model://
# input that names no version starts from the model's latest one (controller/inputs.py).
- apiGroups: ["torchyard.dev"]
  resources: ["modelversions"]
  verbs: ["list", "create", "patch"]
# Run records: no object has this resource; the registry asks SubjectAccessReview whether
# the writer of a run's record may create it, and only the operator may
# (controller/recording.py, registry/records.py).
- apiGroups: ["torchyard.dev"]
  resources: ["runrecords"]
  verbs: ["create"]
# Node Pods: server-side applied, listed by run, watched by Kopf, deleted on failure/TTL.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# The running node Pods' launcher progress lines (controller/progress.py), read at most
# every 10 s per run: the Pods themselves have no rights on the API.
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
# The headless Service of each run (applied; deleted after ttlSecondsAfterFinished); an
# OnlineEndpoint's Service (read first: another owner's is not applied over; applied;
# listed and deleted when it moves to KServe).
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "create", "patch", "delete"]
# An OnlineEndpoint's serving Deployments (applied, watched by Kopf, a finished canary's
# deleted) and its HorizontalPodAutoscaler (controller/endpoints.py).
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["list", "create", "patch", "delete"]
# backend KServe: the endpoint's InferenceService (nothing is granted where KServe is not
# installed).
- apiGroups: ["serving.kserve.io"]
  resources: ["inferenceservices"]
  verbs: ["list", "create", "patch", "delete"]
# The key of an MPI run's launcher channel (controller/mpi_keys.py): created once, never
# read back (no get/list: the operator does not read the namespace's Secrets).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
# The checkpoint claim a run asks for (spec.checkpoints.size): applied, owned by the run;
# a named one (spec.checkpoints.claimName) is looked up before the run's Pods
# (controller/references.py); the namespace's inputs cache claim is applied before its
# first fetch Job (controller/inputs.py).
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "create", "patch"]
# The conda environment.yml / Dockerfile of an Environment build, the launcher's
# ConfigMap that node Pods mount (controller/admission.py ship) and a Sweep's ConfigMap of
# trials (controller/sweeps.py), all applied, the last read back; a run's source.configMap
# is looked up before its Pods (controller/references.py). The index of a namespace's
# inputs cache is one ConfigMap per entry: listed, applied, deleted when the entry is
# evicted (controller/inputs.py).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "create", "patch", "delete"]
# A run's scheduling.queueName: Kueue's LocalQueue is looked up before its Pods
# (controller/references.py); nothing is granted where Kueue is not installed.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["localqueues"]
  verbs: ["get"]
# ... and the run is a Kueue Workload: created (owned by the run), read, watched by Kopf,
# deactivated while the run is suspended; its status written as the job's controller
# (Finished, the admission cleared after an eviction); on a MultiKueue worker, the Workload
# MultiKueue made is adopted (an owner reference) (controller/workloads.py).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
# Events about runs (k8s.record_event) and Kopf's own handler events; a run's own Events
# are listed into its record when it ends (controller/recording.py).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "list"]
# Environment build Jobs and inputs fetch Jobs: applied, read back, watched by Kopf; a
# fetch Job that failed before a new run asked is deleted to try again (controller/inputs.py).
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- if .Values.operator.peering }}
# Kopf peering in a namespace (operator.peering with watchNamespaces): Kopf watches the
# peering objects and writes its presence into its own one only.
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  resourceNames: [{{ include "torchyard.peeringName" . | quote }}]
  verbs: ["patch"]
{{- end }}
{{- end }}

{{/* What the operator needs cluster-wide, whatever it watches. */}}
{{- define "torchyard.operatorClusterRules" -}}
# Kopf discovers and watches the resources it serves; a run with scheduling.queueName
# looks up Kueue's LocalQueue CRD (is Kueue installed, which version: references.py).
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
# A run's compute.priorityClassName is looked up before its Pods (references.py), and its
# value is its Kueue Workload's priority (workloads.py).
- apiGroups: ["scheduling.k8s.io"]
  resources: ["priorityclasses"]
  verbs: ["get"]
# Kueue's Topologies (the levels above a run's spec.placement) and ResourceFlavors (the
# node labels and tolerations of an admission), read and watched (controller/workloads.py).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["topologies", "resourceflavors"]
  verbs: ["get", "list", "watch"]
# Kopf observes namespaces (it matches --namespace against them).
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
# Gang admission weighs each pool's nodes; a run's reconcile asks for a node it never saw
# by name, to know whether it was deleted (controller/lost_nodes.py).
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list", "watch"]
# Gang admission counts every running Pod of the cluster against the nodes' capacity
# (controller/admission.py): list, never read or change them.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
{{- if and .Values.operator.peering (not .Values.watchNamespaces) }}
# Kopf peering of a cluster-wide operator (its own ClusterKopfPeering only is written).
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  resourceNames: [{{ include "torchyard.peeringName" . | quote }}]
  verbs: ["patch"]
{{- end }}
{{- end }}
