# The two commands a new user needs: `make demo` and `make test` (each creates .venv if needed).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-test

.PHONY: demo test test-fast lint bench realserver clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $@

demo: $(STAMP)
	$(PY) examples/demo.py

# The whole suite, including the tier against a real llama.cpp llama-server (built once per
# machine into ~/.cache/gpuheal; set GPUHEAL_SKIP_REALSERVER=1 to leave that tier out).
test: $(STAMP) realserver
	$(PY) -m pytest -q

test-fast: $(STAMP)
	GPUHEAL_SKIP_REALSERVER=1 $(PY) -m pytest -q -m "not realserver"

realserver:
	@if [ "$${GPUHEAL_SKIP_REALSERVER:-0}" = "1" ]; then echo "skipping the real llama-server build (GPUHEAL_SKIP_REALSERVER=1)"; \
	else scripts/build-llama-server.sh >/dev/null; fi

lint: $(STAMP)
	$(VENV)/bin/ruff check gpuheal tests

bench: $(STAMP)
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache demo-state
