# The two commands a newcomer needs:
#   make demo   run the example project's story on SQLite (Ctrl-C stops it)
#   make test   lint, build the docs, run the test suite (Python 3.11 + Django 5.2, then the
#               newest Django on Python 3.12+: SQLite, PostgreSQL, and the tasks suite on MariaDB)
# Both create their virtualenvs and install what they need (the demo only the demo extra).

# A Python 3.11 for the oldest supported pair, and 3.12+ for the newest Django.
find_python = $(shell for c in $(1); do $$c -c 'import sys; sys.exit(not ($(2)))' 2>/dev/null \
	&& { echo $$c; break; }; done)
PYTHON ?= $(call find_python,python3.11 $$HOME/.pyenv/versions/3.11*/bin/python python3,\
	sys.version_info >= (3, 11))
PYTHON_LATEST ?= $(call find_python,python3.13 python3.12 $$HOME/.pyenv/versions/3.13*/bin/python \
	$$HOME/.pyenv/versions/3.12*/bin/python,sys.version_info >= (3, 12))
VENV := .venv
VENV_LATEST := .venv-latest

.PHONY: demo demo-leases serve docs test test-main test-latest lint typecheck bench bench-throughput \
	bench-chaos bench-webhooks bench-recovery bench-quick clean

$(VENV)/.installed: pyproject.toml
	@test -n "$(PYTHON)" || { echo "No Python 3.11+ found: install one or set PYTHON=/path/to/python3.11"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -U pip
	$(VENV)/bin/pip install -q -e ".[dev]"
	touch $@

$(VENV_LATEST)/.installed: pyproject.toml
	@test -n "$(PYTHON_LATEST)" || { echo "No Python 3.12+ found: install one (pyenv install 3.12) or set PYTHON_LATEST=/path/to/python3.12"; exit 1; }
	$(PYTHON_LATEST) -m venv $(VENV_LATEST)
	$(VENV_LATEST)/bin/pip install -q -U pip
	$(VENV_LATEST)/bin/pip install -q -e ".[dev]"
	$(VENV_LATEST)/bin/pip install -q -U --upgrade-strategy only-if-needed Django
	touch $@

# The demo's own install: the demo extra only (Django and cryptography; SQLite needs no
# driver), so nothing compiles. `make test` later adds the dev extra to the same .venv.
$(VENV)/.demo-installed: pyproject.toml
	@test -n "$(PYTHON)" || { echo "No Python 3.11+ found: install one or set PYTHON=/path/to/python3.11"; exit 1; }
	@test -x $(VENV)/bin/python || { echo "Creating the virtualenv $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	@echo "Installing pikku-django with the demo extra into $(VENV) (Django, cryptography)"
	$(VENV)/bin/pip install -q --disable-pip-version-check -e ".[demo]"
	@touch $@

demo: $(VENV)/.demo-installed
	@echo "Starting the story in example_project/ (manage.py story); Ctrl-C stops it"
	cd example_project && ../$(VENV)/bin/python manage.py story

demo-leases: $(VENV)/.demo-installed
	cd example_project && ../$(VENV)/bin/python manage.py migrate --no-input -v 0
	cd example_project && ../$(VENV)/bin/python manage.py lease_demo
	cd example_project && ../$(VENV)/bin/python manage.py place_order 42 1999
	cd example_project && ../$(VENV)/bin/python manage.py pikku_worker --until-idle
	cd example_project && ../$(VENV)/bin/python manage.py order_status

serve: $(VENV)/.demo-installed
	cd example_project && ../$(VENV)/bin/python manage.py migrate --no-input -v 0
	cd example_project && ../$(VENV)/bin/python manage.py runserver

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy (strict, with django-stubs) on pikku_django; its configuration is in pyproject.toml.
typecheck: $(VENV)/.installed
	$(VENV)/bin/mypy

# The suites run in PYTEST_WORKERS pytest-xdist processes: the tests mostly wait on the
# databases and on worker processes, so even two cores keep five busy. Each process has
# its own test databases, and runs whole test files (--dist loadfile), so a module's
# fixtures are built once. Files marked `long` go first, then the rest by their number
# of tests (tests/conftest.py orders them; --no-loadscope-reorder keeps that order), so
# that no file of a few minute-long tests starts last and ends the run alone.
# PYTEST_WORKERS=0 runs a suite in one process.
PYTEST_WORKERS ?= 5
PYTEST_XDIST := -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

test-main: $(VENV)/.installed
	$(VENV)/bin/python -c "import django, sys; print('Python', sys.version.split()[0], 'Django', django.__version__)"
	$(VENV)/bin/pytest $(PYTEST_XDIST)

# The newest Django: the whole suite on SQLite (the ORM store, the admin, the checks, the
# commands, the django.tasks backend: the code built on Django's APIs), then the cases on
# PostgreSQL and MariaDB of the files that go through Django's own backend for them
# (connections, prepared statements, migrations, the admin, the status stream, the
# django.tasks contract). Only those cases run (-k): the files' backend-free tests ran in
# the first invocation. The rest of the PostgreSQL and MariaDB cases exercise pikku_django's
# own SQL and the drivers, which Django's version does not change: the main job runs them.
LATEST_POSTGRES := tests/test_tasks*.py tests/test_prepared.py tests/test_conn_max_age.py \
	tests/test_read_database.py tests/test_migrations.py tests/test_admin_workflows.py \
	tests/test_run_stream.py tests/test_workflow_store.py
test-latest: $(VENV_LATEST)/.installed
	$(VENV_LATEST)/bin/python -c "import django, sys; print('Python', sys.version.split()[0], 'Django', django.__version__)"
	PIKKU_TEST_BACKENDS=sqlite $(VENV_LATEST)/bin/pytest $(PYTEST_XDIST) -m "not once"
	PIKKU_TEST_BACKENDS=postgres $(VENV_LATEST)/bin/pytest $(PYTEST_XDIST) -m "not once" \
		-k "postgres" $(LATEST_POSTGRES)
	PIKKU_TEST_BACKENDS=mariadb $(VENV_LATEST)/bin/pytest $(PYTEST_XDIST) -m "not once" \
		-k "mariadb or mysql" tests/test_tasks*.py

# The docs' own install: the docs extra only (MkDocs and its plugins), so `make docs`
# compiles no database driver. `make test` builds the docs in the same .venv.
$(VENV)/.docs-installed: pyproject.toml
	@test -n "$(PYTHON)" || { echo "No Python 3.11+ found: install one or set PYTHON=/path/to/python3.11"; exit 1; }
	@test -x $(VENV)/bin/python || { echo "Creating the virtualenv $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV); }
	@echo "Installing pikku-django with the docs extra into $(VENV) (MkDocs and its plugins)"
	$(VENV)/bin/pip install -q --disable-pip-version-check -e ".[docs]"
	@touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

test: lint typecheck docs test-main test-latest

# The benchmarks (see docs/benchmarks.md) need the bench extra: the peers
# and baselines they measure pikku_django against. Full figures need a quiet machine;
# bench-quick runs each benchmark's --quick mode (a minute or so each) to check they run.
$(VENV)/.bench-installed: $(VENV)/.installed
	$(VENV)/bin/pip install -q -e ".[dev,bench]"
	touch $@

bench: $(VENV)/.bench-installed
	$(VENV)/bin/python benchmarks/leases.py

bench-throughput: $(VENV)/.bench-installed
	$(VENV)/bin/python benchmarks/throughput.py

bench-chaos: $(VENV)/.installed
	$(VENV)/bin/python benchmarks/chaos.py --database postgres
	$(VENV)/bin/python benchmarks/chaos.py --database mariadb

bench-webhooks: $(VENV)/.bench-installed
	$(VENV)/bin/python benchmarks/webhooks.py

bench-recovery: $(VENV)/.installed
	$(VENV)/bin/python benchmarks/recovery.py --trials 5 --lease-ms 5000

bench-quick: $(VENV)/.bench-installed
	$(VENV)/bin/python benchmarks/leases.py --quick
	$(VENV)/bin/python benchmarks/webhooks.py --quick
	$(VENV)/bin/python benchmarks/throughput.py --quick
	$(VENV)/bin/python benchmarks/fanout.py --quick
	$(VENV)/bin/python benchmarks/cron.py --quick

clean:
	rm -rf $(VENV) $(VENV_LATEST) .pytest_cache .ruff_cache .hypothesis site
