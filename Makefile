# Dead Letter Office — the two commands: `make run` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck pytest quick venv demo clean

$(STAMP): requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --require-hashes -r requirements.lock
	touch $(STAMP)

venv: $(STAMP)

## make run: the dashboard on http://127.0.0.1:$(PORT) (default 8000; `make run PORT=8001`) with
## embedded defaults (SQLite, in-memory
## channel layer, in-process scheduler). The first run creates the schema and an admin login,
## and, unless DLO_AUDIT_SIGNING_KEY / DLO_AUDIT_MAC_KEY / DLO_AUDIT_CHECKPOINT_DIR are set, a
## local audit checkpoint signing key, event MAC key and checkpoint directory under .audit/.
AUDIT_ENV := DLO_AUDIT_SIGNING_KEY=$${DLO_AUDIT_SIGNING_KEY:-.audit/signing.key} \
	DLO_AUDIT_MAC_KEY=$${DLO_AUDIT_MAC_KEY:-.audit/mac.key} \
	DLO_AUDIT_CHECKPOINT_DIR=$${DLO_AUDIT_CHECKPOINT_DIR:-.audit/checkpoints}
PORT ?= 8000
run: $(STAMP)
	$(BIN)/python manage.py migrate --noinput
	$(AUDIT_ENV) $(BIN)/python manage.py firstrun --port $(PORT)
	$(AUDIT_ENV) DLO_INPROCESS_SCHEDULER=1 $(BIN)/python manage.py runserver 127.0.0.1:$(PORT)

## make test: lint, format check, type check, then the whole suite.
test: lint typecheck pytest

## make lint: ruff, the format check, and the import contract (pyproject.toml [tool.importlinter]:
## layers point one way, no cycle; tests/test_layers.py checks the same from the source).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-logo

typecheck: $(STAMP)
	$(BIN)/mypy config dashboard channels_registry brokers dlq audit alerts

pytest: $(STAMP)
	$(BIN)/pytest $(PYTEST_ARGS)

## make quick: the quick loop (not slow, not browser) in parallel with pytest-xdist, one worker
## per core, each on its own test database (pytest-django appends the worker: test_<db>_gw0 …)
## and with its own broker-side names (tests/conftest.py unique_name). `--dist load` keeps
## pytest-django's order on every worker (database tests before transactional ones, whose flush
## empties the rows the data migrations made); `--dist loadfile` broke three tests that way.
## `make quick QUICK_N=4` for another worker count.
QUICK_N ?= auto
quick: $(STAMP)
	$(BIN)/pytest -m 'not slow and not browser' -n $(QUICK_N) --dist load $(PYTEST_ARGS)

demo: $(STAMP)
	$(BIN)/python manage.py demo

clean:
	rm -rf $(VENV) db.sqlite3
