# fireledger — `make run` starts the service on the embedded default; `make test` sets up and
# passes the whole suite (installing PostgreSQL server binaries when missing).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: venv run test lint typecheck bench falsify clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	@echo "fireledger: API on http://127.0.0.1:8080/v1 (schema: /openapi.json, metrics: /metrics)"
	@echo "fireledger: get a token with: $(BIN)/fireledger tenant create acme --json"
	@echo "fireledger: local demo mode: loopback/private targets allowed (FIRELEDGER_ALLOW_PRIVATE_TARGETS=1)"
	FIRELEDGER_ALLOW_PRIVATE_TARGETS=1 $(BIN)/fireledger serve $(ARGS)

test: $(STAMP)
	./scripts/ensure-postgres.sh >/dev/null
	./scripts/ensure-chromium.sh >/dev/null
	./scripts/ensure-faketime.sh >/dev/null
	$(BIN)/ruff check src tests bench falsify
	$(BIN)/mypy src/fireledger/recurrence src/fireledger/domain
	$(BIN)/python -m pytest $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench falsify

typecheck: $(STAMP)
	$(BIN)/mypy src/fireledger/recurrence src/fireledger/domain

bench: $(STAMP)
	$(BIN)/python bench/run.py $(ARGS)

falsify: $(STAMP)
	./scripts/ensure-postgres.sh >/dev/null
	./scripts/ensure-faketime.sh >/dev/null
	$(BIN)/python falsify/run.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
