# torchyard: two commands on a fresh machine.
#   make demo   set up, then train the birds example for real in local mode (2 nodes x 2 processes, CPU)
#   make test   set up, then lint, type-check, layer-check, build the docs and run every test tier
#   make check  the inner loop: lint, types, layers and the unit tests (minutes)
#
# Dependencies (pinned in requirements.lock; torch is large) go into a virtual environment
# OUTSIDE the clone, keyed by the lock file's hash, so a second clone or a CI run reuses it;
# the clone's own .venv is tiny: it links that environment and installs torchyard editable.
# The control-plane binaries (kube-apiserver, etcd, KWOK, ...) are built from Go modules once
# per version into the same cache folder (see tests/cluster/binaries.py).

SHELL := /bin/bash
PYTHON ?= python3
export TORCHYARD_CACHE ?= $(HOME)/.cache/torchyard
# Python keeps its compiled bytecode: an inherited PYTHONDONTWRITEBYTECODE would compile every
# module again in each of the suite's processes, and pytest rewrite every test module's asserts.
unexport PYTHONDONTWRITEBYTECODE
LOCK_HASH := $(shell sha256sum requirements.lock | cut -c1-12)
PYVER := $(shell $(PYTHON) -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
DEPS := $(TORCHYARD_CACHE)/venv-py$(PYVER)-$(LOCK_HASH)
# The documentation site's tools (MkDocs, Material), pinned in docs/requirements.lock, in a
# venv of their own keyed by that file's hash: the site never forces the torch venv anew.
DOCS_LOCK_HASH := $(shell sha256sum docs/requirements.lock | cut -c1-12)
DOCS_DEPS := $(TORCHYARD_CACHE)/docs-venv-py$(PYVER)-$(DOCS_LOCK_HASH)
# The browser tests' Playwright, pinned in tests/integration/web/requirements.lock, in a venv of
# its own (keyed by that file's hash) that .venv links; the browser is Debian's chromium.
BROWSER_LOCK := tests/integration/web/requirements.lock
BROWSER_LOCK_HASH := $(shell sha256sum $(BROWSER_LOCK) | cut -c1-12)
BROWSER_DEPS := $(TORCHYARD_CACHE)/browser-venv-py$(PYVER)-$(BROWSER_LOCK_HASH)
# The mutation tester (mutmut), pinned in tests/mutants.lock, in a venv keyed by that file's
# hash that also sees the main venv's packages (a .pth file, as .venv does).
MUTANTS_LOCK_HASH := $(shell sha256sum tests/mutants.lock | cut -c1-12)
MUTANTS_DEPS := $(TORCHYARD_CACHE)/mutants-venv-py$(PYVER)-$(MUTANTS_LOCK_HASH)-$(LOCK_HASH)
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# The tracking tests' MLflow server, pinned in tests/integration/tracking/requirements.lock, in a
# venv of its own (keyed by that file's hash); the tests start its 'mlflow server', the
# operator talks to it over its REST API (no mlflow package in the operator's image).
MLFLOW_LOCK := tests/integration/tracking/requirements.lock
MLFLOW_LOCK_HASH := $(shell sha256sum $(MLFLOW_LOCK) | cut -c1-12)
export TORCHYARD_MLFLOW_VENV ?= $(TORCHYARD_CACHE)/mlflow-venv-py$(PYVER)-$(MLFLOW_LOCK_HASH)
# The TensorBoard 'torchyard tensorboard' starts in the tests, pinned in
# tests/integration/tracking/tensorboard.lock, in a venv of its own (keyed by that file's hash).
TENSORBOARD_LOCK := tests/integration/tracking/tensorboard.lock
TENSORBOARD_LOCK_HASH := $(shell sha256sum $(TENSORBOARD_LOCK) | cut -c1-12)
export TORCHYARD_TENSORBOARD_VENV ?= $(TORCHYARD_CACHE)/tensorboard-venv-py$(PYVER)-$(TENSORBOARD_LOCK_HASH)

.PHONY: all venv docs-venv browser browser-link mutants mlflow tensorboard tools setup peers crds docs site lint typecheck layers check unit integration e2e node test demo bench images chart kind clean help

help:
	@echo "make demo   - set up and run the birds example (real training, local mode)"
	@echo "make test   - set up and run lint, types, layers, unit, integration, e2e and node tests"
	@echo "              TIER=integration: one tier's run (and what it needs); K=expr: pytest -k"
	@echo "make check  - lint, types, layers and the unit tests: the inner loop"
	@echo "make tools  - build (once per version) the test control plane's Go binaries"
	@echo "make setup  - make (once, cached) everything the tests need: Go tools, the real node, images"
	@echo "make crds   - regenerate crds/ from the API models"
	@echo "make docs   - regenerate the reference and benchmarks pages, then build the site (build/site)"
	@echo "make site   - build the documentation site with mkdocs --strict (no regeneration)"
	@echo "make mutants - mutation testing of the guards: the score per module (MUTANTS='checkpoint rank': only these)"
	@echo "make bench  - run every benchmark (BENCH_ARGS=--smoke: each at its smallest size)"
	@echo "make peers  - build (once per version) Kubeflow's operators the benchmarks compare with, and Kueue"
	@echo "make images - build the release images with buildah, their SBOMs and provenance (build/release)"
	@echo "              CUDA=1: the CUDA image too; IMAGES='torchyard': only these; PUSH=host: push them"
	@echo "make chart  - package the Helm chart (build/release); PUSH=host: push it to oci://host/torchyard/charts"
	@echo "make kind   - create a kind cluster, load the images and install the chart (needs Docker)"

all: test

$(DEPS)/.complete:
	@echo "[setup] dependencies -> $(DEPS)"
	@rm -rf "$(DEPS)"
	@$(PYTHON) -m venv "$(DEPS)"
	@"$(DEPS)/bin/pip" install --quiet --disable-pip-version-check --no-deps -r requirements.lock
	@touch "$@"

$(VENV)/.ok: $(DEPS)/.complete pyproject.toml
	@echo "[setup] $(VENV) (links $(DEPS))"
	@rm -rf $(VENV)
	@$(PYTHON) -m venv $(VENV)
	@site=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  deps=$$("$(DEPS)/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  echo "import site; site.addsitedir('$$deps')" > "$$site/torchyard-deps.pth"
	@$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@# the browser tests' Playwright, when 'make browser' installed it (linked again here)
	@[ ! -e "$(BROWSER_DEPS)/.complete" ] || $(MAKE) --no-print-directory browser-link
	@# the dependencies' commands (torchrun, pytest, ...) beside python, as in a single venv
	@for f in "$(DEPS)"/bin/*; do n=$$(basename "$$f"); case "$$n" in python*|pip*|activate*|Activate*) ;; *) [ -e "$(VENV)/bin/$$n" ] || ln -s "$$f" "$(VENV)/bin/$$n";; esac; done
	@touch $@

venv: $(VENV)/.ok

$(DOCS_DEPS)/.complete:
	@echo "[setup] documentation tools -> $(DOCS_DEPS)"
	@rm -rf "$(DOCS_DEPS)"
	@$(PYTHON) -m venv "$(DOCS_DEPS)"
	@"$(DOCS_DEPS)/bin/pip" install --quiet --disable-pip-version-check --no-deps -r docs/requirements.lock
	@touch "$@"

docs-venv: $(DOCS_DEPS)/.complete

# The web view's browser tests (tests/integration/web): Debian's chromium (apt, once) and
# Playwright (cached venv, linked into .venv by a .pth file): a second run does nothing.
# A venv of its own at $(1), from the pinned lock $(2) ($(3): what it is for).
define locked_venv
	@echo "[setup] $(3) -> $(1)"
	@rm -rf "$(1)"
	@$(PYTHON) -m venv "$(1)"
	@"$(1)/bin/pip" install --quiet --disable-pip-version-check --no-deps -r $(2)
	@touch "$(1)/.complete"
endef

# apt-get one at a time on this machine (the lock tests/cluster/debian.py takes too: make
# test installs the node's packages beside this), waiting for anyone else's dpkg lock.
APT = $$( [ "$$(id -u)" = 0 ] || echo sudo ) flock /tmp/torchyard-apt.lock apt-get -o DPkg::Lock::Timeout=600

$(BROWSER_DEPS)/.complete:
	$(call locked_venv,$(BROWSER_DEPS),$(BROWSER_LOCK),browser tests' Playwright)

browser: venv $(BROWSER_DEPS)/.complete
	@command -v chromium >/dev/null || { echo "[setup] chromium (Debian)"; \
	  $(APT) install -y -q chromium >/dev/null || \
	  { $(APT) update -q >/dev/null && $(APT) install -y -q chromium >/dev/null; }; }
	@$(MAKE) --no-print-directory browser-link

$(TORCHYARD_MLFLOW_VENV)/.complete:
	$(call locked_venv,$(TORCHYARD_MLFLOW_VENV),$(MLFLOW_LOCK),tracking tests' MLflow server)

mlflow: $(TORCHYARD_MLFLOW_VENV)/.complete

$(TORCHYARD_TENSORBOARD_VENV)/.complete:
	$(call locked_venv,$(TORCHYARD_TENSORBOARD_VENV),$(TENSORBOARD_LOCK),TensorBoard of the tracking tests)

tensorboard: $(TORCHYARD_TENSORBOARD_VENV)/.complete

browser-link:
	@site=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  deps=$$("$(BROWSER_DEPS)/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  echo "import site; site.addsitedir('$$deps')" > "$$site/torchyard-browser.pth"
$(MUTANTS_DEPS)/.complete: $(DEPS)/.complete
	@echo "[setup] mutation tester -> $(MUTANTS_DEPS)"
	@rm -rf "$(MUTANTS_DEPS)"
	@$(PYTHON) -m venv "$(MUTANTS_DEPS)"
	@"$(MUTANTS_DEPS)/bin/pip" install --quiet --disable-pip-version-check --no-deps -r tests/mutants.lock
	@site=$$("$(MUTANTS_DEPS)/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  deps=$$("$(DEPS)/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  echo "import site; site.addsitedir('$$deps')" > "$$site/torchyard-deps.pth"
	@touch "$@"

# Mutation testing of the guards (tests/mutants.py): each listed module's mutants against its
# own unit tests, the score per module; MUTANTS='checkpoint rank': only these, MUTANTS_WORKERS=2.
MUTANTS ?=
MUTANTS_WORKERS ?= 1
mutants: venv $(MUTANTS_DEPS)/.complete
	@"$(MUTANTS_DEPS)/bin/python" -m tests.mutants --workers $(MUTANTS_WORKERS) \
	  --results build/mutants/scores.json $(MUTANTS)

tools: venv
	@$(PY) tests/cluster/binaries.py

# Everything the tests need built (tests/cluster/needs.py): what make test's first steps make.
setup: venv browser mlflow tensorboard
	@$(PY) -m tests.cluster.needs

# Kubeflow Trainer, JobSet and Training Operator for benchmarks/peers.py and `pytest --peers`,
# and Kueue (its plain-Pod integration) for tests/integration/test_kueue.py (which make test
# runs, building Kueue first when it is not cached)
peers: venv
	@$(PY) tests/cluster/peers.py
	@$(PY) tests/cluster/kueue.py

crds: venv
	@$(PY) -m torchyard.api.crds crds/
	@# the chart and the GitOps example carry copies (tests keep them identical)
	@cp crds/*.torchyard.dev.yaml charts/torchyard/crds/
	@cp crds/*.torchyard.dev.yaml examples/gitops/crds/

# The reference pages (CRDs, CLI, Helm values, metrics, failure classes) and the benchmarks
# page are generated (docs/gen/); tests/unit/test_docs.py fails when one is stale.
docs: venv docs-venv
	@echo "[docs] generate"
	@$(PY) -m docs.gen
	@$(MAKE) --no-print-directory site

# Built outside the tracked tree (build/ is git-ignored); --strict: a broken link fails.
site: docs-venv
	@echo "[docs] mkdocs build --strict"
	@NO_MKDOCS_2_WARNING=1 "$(DOCS_DEPS)/bin/mkdocs" build --strict --site-dir build/site

lint: venv
	@echo "[lint] ruff"
	@"$(DEPS)/bin/ruff" check operator tests docs/gen $(wildcard benchmarks examples)
	@"$(DEPS)/bin/ruff" format --check operator tests docs/gen $(wildcard benchmarks examples)
	@echo "[lint] shellcheck"
	@command -v shellcheck >/dev/null || $(PY) -c 'from tests.cluster import debian; debian.ensure_packages({"shellcheck": "/usr/bin/shellcheck"})'
	@shellcheck hack/*.sh

# mypy's cache lives outside the clone, keyed by the lock (mypy's version): a fresh clone
# checks only what differs from the last check on this machine (SQLite: clones may share it).
typecheck: venv
	@echo "[types] mypy --strict operator/"
	@$(PY) -m mypy --sqlite-cache --cache-dir "$(TORCHYARD_CACHE)/mypy-$(LOCK_HASH)"

layers: venv
	@echo "[layers] import-linter"
	@PYTHONPATH=operator $(PY) -c 'import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports())'

# The inner loop: what a change is checked with before make test (about 2 minutes warm).
check: lint typecheck layers
	@echo "[unit] pytest tests/unit -n 2"
	@$(PY) -m pytest tests/unit -n 2 -q $(PYTEST_ARGS)

# One tier's pytest run, after what it needs is made: make test TIER=<tier> (K=expr: -k).
unit integration e2e node: venv
	@$(PY) -m tests.tiers --tier $@ $(if $(K),-k "$(K)") $(PYTEST_ARGS)

# Its steps side by side as each one's needs are done (tests/tiers.py): the builds, venvs and
# checks, then the unit, integration, node and e2e runs; TIER=name: that run only (and what it
# needs), K=expr: pytest -k; TORCHYARD_TEST_SERIAL=1: one plain pytest run after the setup.
TIER ?=
K ?=
test: venv
	@$(PY) -m tests.tiers $(foreach t,$(TIER),--tier $(t)) $(if $(K),-k "$(K)") $(PYTEST_ARGS)

# The benchmarks print each figure beside its baseline from the same run and write them to
# benchmarks/results/<name>.json (`make docs` makes docs/benchmarks.md of them); `make test` runs
# them at their smallest size (tests/integration/test_benchmarks_smoke.py; real_launch, which
# needs the real node and root, in tests/node/test_benchmarks_smoke.py).
BENCH_ARGS ?=
bench: venv tools peers browser tensorboard
	@for b in launch_overhead fanout env_cache registry_throughput scale real_launch serving peers progress_overhead sweeps ui tensorboard_live inputs_cache placement; do \
	  extra=$$( [ $$b = scale ] && echo --peers ); \
	  echo "[bench] $$b $(BENCH_ARGS) $$extra"; $(PY) benchmarks/$$b.py $(BENCH_ARGS) $$extra || exit 1; done

# The release (tests/cluster/release.py; .github/workflows/release.yml runs these on a tag).
# One version: operator/torchyard/__init__.py; the chart's version and appVersion equal it.
#   make images [CUDA=1] [IMAGES="torchyard pytorch-cpu"] [PUSH=ghcr.io [PLAIN_HTTP=1] [AUTH=config.json]]
#   make chart [PUSH=ghcr.io [PLAIN_HTTP=1]]
RELEASE_PUSH = $(if $(PUSH),--push $(PUSH)) $(if $(PLAIN_HTTP),--plain-http)
images: venv
	@$(PY) -m tests.cluster.release images $(if $(CUDA),--cuda) $(foreach i,$(IMAGES),--only $(i)) $(RELEASE_PUSH) $(if $(AUTH),--auth $(AUTH))

chart: venv
	@$(PY) -m tests.cluster.release chart $(RELEASE_PUSH)

# a local kind cluster with the images and the chart (needs Docker and kind; not run here)
kind:
	@hack/kind-up.sh

demo: venv
	@$(VENV)/bin/torchyard run examples/birds/trainingrun.yaml --local

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build/site
