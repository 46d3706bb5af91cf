# The course's commands. Each one creates .venv when it is missing: a student's commands (student,
# lab) install requirements-student.txt; the maintainers' (book, test, pdf, grade) all of
# requirements.txt.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
READY := $(VENV)/.installed
STUDENT_READY := $(VENV)/.installed-student

.PHONY: book serve lab test system-deps student grade clean pdf

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STUDENT_READY): requirements-student.txt pyproject.toml | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -r requirements-student.txt -e ".[device]"
	touch $@

$(READY): requirements.txt requirements-student.txt pyproject.toml | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -r requirements.txt
	touch $@ $(STUDENT_READY)

## book: build the HTML book (chapters executed with a cache, labs from their stored outputs)
book: $(READY)
	$(BIN)/jupyter-book build . -W -n --keep-going
	@echo "The book is at $(CURDIR)/_build/html/index.html (make serve to view it)"

## pdf: the whole book as one A4 PDF, _build/latex/gpu-clusters-hands-on.pdf (XeLaTeX; the TeX set
## comes from tests/system_deps.sh), then the HTML book, whose landing page links a copy of it
pdf: $(READY)
	tests/system_deps.sh
	$(BIN)/jupyter-book build . --builder pdflatex -W -n --keep-going
	$(BIN)/jupyter-book build . -W -n --keep-going
	@echo "The PDF is at $(CURDIR)/_build/latex/gpu-clusters-hands-on.pdf (and linked from the book)"

## serve: serve the built book on http://127.0.0.1:8000
serve: book
	$(BIN)/python -m http.server --directory _build/html --bind 127.0.0.1 8000

## student: student copies of the labs in student/ (solutions and outputs removed; the keys in
## keys/ are not copied, and no check in a copy carries its expected value), and one
## chapter-NN-exercises.ipynb per chapter, whose cells answer its exercises with check.answer.
## A copy already there is your work and is kept (python -m clusterlab.course.student --replace
## overwrites).
student: $(STUDENT_READY)
	$(BIN)/python -m clusterlab.course.student --labs labs --chapters chapters --out student

## lab: Jupyter Lab on the student copies (made first if missing); as root it passes
## --allow-root, which Jupyter otherwise refuses
lab: student
	$(BIN)/jupyter lab student $(if $(filter 0,$(shell id -u)),--allow-root,)

## grade: run submitted notebooks, each in a bubblewrap sandbox, and grade every exercise from keys/
## outside it: one line per exercise per submission, and GRADES (grades.csv): student,exercise,points
## (make grade SUBMISSIONS="submitted/*.ipynb" GRADES=grades.csv)
GRADES ?= grades.csv
grade: system-deps $(READY)
	@test -n "$(SUBMISSIONS)" || { echo 'usage: make grade SUBMISSIONS="submitted/*.ipynb"'; exit 2; }
	$(BIN)/python -c 'import sys; from clusterlab.course import grading; sys.exit(grading.cli(sys.argv[1:]))' \
		$(SUBMISSIONS) --key keys --csv $(GRADES)

## test: the whole suite: library unit tests, the labs against their stored outputs, the book;
## on TEST_WORKERS processes (pytest-xdist; a file's tests, and the book's, stay on one of them).
## JAX's persistent compilation cache (JAX_CACHE, empty in a fresh clone) lets a program compiled
## by one test, lab kernel or launched process be loaded by the next that compiles the same one.
TEST_WORKERS ?= 2
JAX_CACHE ?= $(CURDIR)/.jax-cache
test: system-deps $(READY)
	JAX_COMPILATION_CACHE_DIR=$(JAX_CACHE) JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0.2 \
	$(BIN)/python -m pytest tests labs -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder \
		--nbval --nbval-current-env \
		--nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=600

## system-deps: what the tests need from the system (tests/system_deps.sh): installed with apt-get
## as root, else one line names the command; it runs before .venv is created, so it stops at once
system-deps:
	@tests/system_deps.sh

clean:
	rm -rf _build .pytest_cache .jax-cache
