# fireledger — `make run` starts the service on the embedded default; `make test` sets up and
# passes the whole suite (installing PostgreSQL server binaries when missing).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: venv run test test-long lint typecheck bench bench-report falsify clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	@echo "fireledger: console on http://127.0.0.1:8080/console/ (http://127.0.0.1:8080/ leads there; sign in with a token)"
	@echo "fireledger: API on http://127.0.0.1:8080/v1 (schema: /openapi.json, metrics: /metrics)"
	@echo "fireledger: get a token with: $(BIN)/fireledger tenant create acme --json"
	@echo "fireledger: local demo mode: loopback/private targets allowed (FIRELEDGER_ALLOW_PRIVATE_TARGETS=1)"
	@echo "fireledger: state (key ring, key-encryption key, SQLite store) in $${FIRELEDGER_STATE_DIR:-./.fireledger}/"
	$(BIN)/fireledger init
	FIRELEDGER_ALLOW_PRIVATE_TARGETS=1 $(BIN)/fireledger serve $(ARGS)

test: $(STAMP)
	./scripts/ensure-postgres.sh >/dev/null
	./scripts/ensure-pg-auto-failover.sh >/dev/null
	./scripts/ensure-chromium.sh >/dev/null
	./scripts/ensure-faketime.sh >/dev/null
	$(BIN)/ruff check src tests bench falsify
	$(BIN)/lint-imports
	$(BIN)/mypy src/fireledger
	$(BIN)/python -m pytest --durations=25 $(ARGS)

# The long forms left out of `make test` (tests marked `long`, decision 0203): the [postgres] forms of
# the end-to-end tests whose store behaviour the contract suite shows on both engines.
test-long: $(STAMP)
	./scripts/ensure-postgres.sh >/dev/null
	FIRELEDGER_TEST_LONG=1 $(BIN)/python -m pytest -m long $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench falsify
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy src/fireledger

BENCH_STAMP := $(VENV)/.bench-installed
BENCH4 := .venv-bench4

# The bench recipes are silent (@, installs to stderr): stdout carries only the JSON lines.
$(BENCH_STAMP): $(STAMP) pyproject.toml
	@$(BIN)/python -m pip install -q -e '.[dev,bench]' >&2
	@touch $(BENCH_STAMP)

# APScheduler 4 cannot share a venv with 3.x (one distribution name): its peer runs from its own.
$(BENCH4)/.installed: bench/requirements-aps4.txt
	@test -x $(BENCH4)/bin/python || $(PY) -m venv $(BENCH4) >&2
	@$(BENCH4)/bin/python -m pip install -q -r bench/requirements-aps4.txt >&2
	@touch $(BENCH4)/.installed

# The JSON lines go to stdout and to bench/results/latest.jsonl (gitignored); `make bench-report`
# renders that file as docs/performance-results.md (tables, peers, ratios, the Targets table).
bench: $(BENCH_STAMP) $(BENCH4)/.installed
	@./scripts/ensure-postgres.sh >/dev/null || echo "bench: no PostgreSQL binaries; its commit line says skipped" >&2
	@$(BIN)/python bench/run.py --out bench/results/latest.jsonl $(ARGS)

bench-report:
	$(BIN)/python bench/report.py < bench/results/latest.jsonl > docs/performance-results.md

falsify: $(STAMP)
	./scripts/ensure-postgres.sh >/dev/null
	./scripts/ensure-pg-auto-failover.sh >/dev/null
	./scripts/ensure-faketime.sh >/dev/null
	$(BIN)/python falsify/run.py $(ARGS)

clean:
	rm -rf $(VENV) $(BENCH4) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .grimp_cache
