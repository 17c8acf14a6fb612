#!/usr/bin/env bash
# A local kind cluster with torchyard: create the cluster, build the operator image and the
# curated CPU image with Docker, load them into the kind node, and install the chart.
# Needs docker, kind, helm and kubectl. Run from anywhere: make kind, or hack/kind-up.sh.
#   KIND_CLUSTER   cluster name (default: torchyard)
#   NAMESPACE      the chart's namespace (default: torchyard-system)
#   WATCH          the namespace the operator watches and gets curated Environments in (default: default)
# The image tags are read from the sources the release uses: operator/torchyard/__init__.py
# (the operator image's tag is torchyard's version) and the chart's values.yaml (the
# curated CPU image). The CUDA image is not built: kind nodes have no GPUs.
set -euo pipefail

cluster="${KIND_CLUSTER:-torchyard}"
namespace="${NAMESPACE:-torchyard-system}"
watch="${WATCH:-default}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

for tool in docker kind helm kubectl; do
  if ! command -v "$tool" >/dev/null; then
    echo "error: $tool is not installed (this script needs docker, kind, helm and kubectl)" >&2
    exit 1
  fi
done

version="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' operator/torchyard/__init__.py)"
cpu_image="$(sed -n 's/^ *image: \(ghcr\.io\/torchyard\/pytorch:.*-cpu\)$/\1/p' charts/torchyard/values.yaml)"
operator_image="ghcr.io/torchyard/torchyard:${version}"
if [[ -z "$version" || -z "$cpu_image" ]]; then
  echo "error: could not read the version or the curated CPU image from the sources" >&2
  exit 1
fi

if kind get clusters | grep -qx "$cluster"; then
  echo "[kind] cluster $cluster exists: reusing it"
else
  kind create cluster --name "$cluster"
fi

echo "[kind] building $operator_image and $cpu_image"
docker build -f images/operator/Dockerfile -t "$operator_image" .
docker build -f images/pytorch-cpu/Dockerfile -t "$cpu_image" .
kind load docker-image --name "$cluster" "$operator_image" "$cpu_image"

# The loaded images exist only on the kind node: no registry to resolve tags to digests
# from, so the curated Environments keep their tags.
echo "[kind] installing the chart into $namespace (watching $watch)"
helm upgrade --install torchyard charts/torchyard \
  --kube-context "kind-$cluster" \
  --namespace "$namespace" --create-namespace \
  --set "watchNamespaces={$watch}" \
  --set operator.resolveCuratedImages=none \
  --wait --timeout 5m

kubectl --context "kind-$cluster" get pods -n "$namespace"
echo "[kind] ready: .venv/bin/torchyard submit examples/ddp/trainingrun.yaml --source examples/ddp --wait"
