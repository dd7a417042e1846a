# The two commands a newcomer needs:
#   make demo   run the example project's story on SQLite (Ctrl-C stops it)
#   make test   run the test suite (Python 3.11 + Django 5.2, then the newest Django on Python 3.12+)
# Both create their virtualenvs and install what they need.

# A Python 3.11 for the oldest supported pair, and 3.12+ for the newest Django.
find_python = $(shell for c in $(1); do $$c -c 'import sys; sys.exit(not ($(2)))' 2>/dev/null \
	&& { echo $$c; break; }; done)
PYTHON ?= $(call find_python,python3.11 $$HOME/.pyenv/versions/3.11*/bin/python python3,\
	sys.version_info >= (3, 11))
PYTHON_LATEST ?= $(call find_python,python3.13 python3.12 $$HOME/.pyenv/versions/3.13*/bin/python \
	$$HOME/.pyenv/versions/3.12*/bin/python,sys.version_info >= (3, 12))
VENV := .venv
VENV_LATEST := .venv-latest

.PHONY: demo demo-leases serve test test-main test-latest lint bench bench-throughput \
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

demo: $(VENV)/.installed
	cd example_project && ../$(VENV)/bin/python manage.py story

demo-leases: $(VENV)/.installed
	cd example_project && ../$(VENV)/bin/python manage.py migrate --no-input -v 0
	cd example_project && ../$(VENV)/bin/python manage.py lease_demo
	cd example_project && ../$(VENV)/bin/python manage.py place_order 42 1999
	cd example_project && ../$(VENV)/bin/python manage.py pikku_worker --until-idle
	cd example_project && ../$(VENV)/bin/python manage.py order_status

serve: $(VENV)/.installed
	cd example_project && ../$(VENV)/bin/python manage.py migrate --no-input -v 0
	cd example_project && ../$(VENV)/bin/python manage.py runserver

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test-main: $(VENV)/.installed
	$(VENV)/bin/python -c "import django, sys; print('Python', sys.version.split()[0], 'Django', django.__version__)"
	$(VENV)/bin/pytest

test-latest: $(VENV_LATEST)/.installed
	$(VENV_LATEST)/bin/python -c "import django, sys; print('Python', sys.version.split()[0], 'Django', django.__version__)"
	PIKKU_TEST_BACKENDS=sqlite,postgres $(VENV_LATEST)/bin/pytest

test: lint test-main test-latest

# The benchmarks (see the README's Benchmarks section) need the bench extra: the peers
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
	$(VENV)/bin/python benchmarks/chaos.py

bench-webhooks: $(VENV)/.bench-installed
	$(VENV)/bin/python benchmarks/webhooks.py

bench-recovery: $(VENV)/.installed
	$(VENV)/bin/python benchmarks/recovery.py --trials 5 --lease-ms 5000

bench-quick: $(VENV)/.bench-installed
	$(VENV)/bin/python benchmarks/leases.py --quick
	$(VENV)/bin/python benchmarks/webhooks.py --quick
	$(VENV)/bin/python benchmarks/throughput.py --quick

clean:
	rm -rf $(VENV) $(VENV_LATEST) .pytest_cache .ruff_cache .hypothesis
