# The two commands a new user needs: `make demo` and `make test` (each creates .venv if needed).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-test
# pytest-xdist workers: the suite is sized for a 2-CPU machine (issue 26: `make test` < 12 min there).
# It waits more than it computes (real servers, proxies, clocks: ~430 s of CPU in a 1,000 s run on 2
# workers), so 4 workers on 2 CPUs overlap the waits. A test file is one unit of work, the files sharing
# the real LiteLLM proxy one unit, the longest handed out first (tests/conftest.py, xdist_unit_of).
WORKERS ?= 4
PYTEST_PAR := -n $(WORKERS) --dist loadfile

.PHONY: demo test test-fast lint bench chaos realserver reallitellm clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $@

demo: $(STAMP)
	$(PY) examples/demo.py

# The whole suite, including the tiers against a real llama.cpp llama-server (built once per
# machine into ~/.cache/gpuheal; set GPUHEAL_SKIP_REALSERVER=1 to leave that tier out) and the
# real LiteLLM proxy (installed once per machine, ~2 min, ~750 MB; GPUHEAL_SKIP_REALLITELLM=1).
test: $(STAMP) lint realserver reallitellm
	$(PY) -m pytest -q $(PYTEST_PAR) --durations=20

test-fast: $(STAMP) lint
	GPUHEAL_SKIP_REALSERVER=1 GPUHEAL_SKIP_REALLITELLM=1 $(PY) -m pytest -q $(PYTEST_PAR) -m "not realserver and not reallitellm"

realserver:
	@if [ "$${GPUHEAL_SKIP_REALSERVER:-0}" = "1" ]; then echo "skipping the real llama-server build (GPUHEAL_SKIP_REALSERVER=1)"; \
	else scripts/build-llama-server.sh >/dev/null; fi

reallitellm:
	@if [ "$${GPUHEAL_SKIP_REALLITELLM:-0}" = "1" ]; then echo "skipping the real LiteLLM install (GPUHEAL_SKIP_REALLITELLM=1)"; \
	else scripts/install-litellm.sh >/dev/null; fi

# Part of `make test` (and so of .ci/run): ruff is in the test extras; lines <= 120 in gpuheal/.
# mypy --strict on the pure core; what it checks is listed once, in pyproject.toml [tool.mypy].
lint: $(STAMP)
	$(VENV)/bin/ruff check gpuheal tests benchmarks
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) benchmarks/run.py

# A week of chaos on a simulated 100-GPU fleet (issue 29; benchmarks/README.md "Chaos"). Its 10-GPU,
# 1-day smoke runs in `make test` (tests/test_chaos_smoke.py).
chaos: $(STAMP)
	$(PY) benchmarks/chaos.py --json benchmarks/results/chaos-latest.json

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache demo-state
