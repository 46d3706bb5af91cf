"""Shared set-up for the unit tests of clusterlab.

``clusterlab.device.devices.setup(8)`` runs here, at import, before any test touches JAX: the number of
simulated CPU devices is fixed once JAX has created its backends, so every test in this process
shares the same eight devices. Tests build sub-meshes over the first ``n`` of them.
"""

from __future__ import annotations

import functools

import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterlab.device import devices

ROOT = Path(__file__).resolve().parents[1]

# The eight devices every test shares: simulated CPUs here (a GPU host with fewer than eight
# accelerators gives CPUs too, which is why tests use this list rather than jax.devices()).
DEVICES = devices.setup(8)


def _worker_group(item: pytest.Item) -> str:
    """The pytest-xdist group of a test (``make test`` runs ``--dist loadgroup``).

    A group runs on one worker, in collection order. The tests that read the built book share one
    group, so the book is built once; every other file keeps its tests together, so a notebook's
    cells run in order in one kernel and a module's fixtures are set up once.
    """
    return "book" if "book" in getattr(item, "fixturenames", ()) else item.nodeid.split("::")[0]


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_worker_group(item)))
    # The book's group first (a stable sort): its build, browser crawl and PDF are the longest job,
    # and started last it would leave the other worker idle at the end.
    items.sort(key=lambda item: _worker_group(item) != "book")


def sub_mesh(n: int, axis_name: str = "x"):
    """A 1-D mesh over the first ``n`` of the shared devices."""
    return devices.mesh((n,), (axis_name,), DEVICES[:n])


def reference_run(*, d_model: int, d_hidden: int, n_blocks: int, batch: int, steps: int,
                  n_samples: int, learning_rate: float | None = None):
    """An MLP, its batches, the optimizer and the single-device run a strategy must equal.

    Returns:
        ``(params, batches, optimizer, reference_params, reference_losses)``, the reference on
        the host.
    """
    import jax
    import numpy as np

    from clusterlab.device import models

    params = models.init_mlp(jax.random.key(0), d_model=d_model, d_hidden=d_hidden,
                             n_blocks=n_blocks)
    x, y = models.synthetic_regression(jax.random.key(1), n_samples=n_samples, d_model=d_model)
    batches = models.make_batches(x, y, batch_size=batch, n_steps=steps)
    optimizer = models.make_optimizer(*(() if learning_rate is None else (learning_rate,)))
    reference, losses = models.reference_train(params, batches, optimizer=optimizer)
    return params, batches, optimizer, jax.device_get(reference), np.asarray(losses)


# The small MLP run that the sharded and 2-D tests share (fp32, several Adam steps).
SMALL_RUN = dict(d_model=32, d_hidden=64, n_blocks=2, batch=32, steps=4, n_samples=128,
                 learning_rate=1e-2)


@functools.lru_cache(maxsize=None)
def small_reference_run():
    """:func:`reference_run` of ``SMALL_RUN``, computed once per test process."""
    return reference_run(**SMALL_RUN)


def check_mean_and_catch_sum(label: str, grads_for, reference, p: int, bug: str) -> None:
    """``grads_for("mean")`` equals ``reference``, and the same check catches ``grads_for("sum")``
    (gradients summed over ``p`` devices, not averaged: a relative difference of ``p - 1``)."""
    from clusterlab.course import check

    check.verify_close(label, grads_for("mean"), reference, rtol=1e-5)
    caught = check.verify_catches(bug, functools.partial(check.verify_close, label,
                                                         grads_for("sum"), reference, rtol=1e-5))
    assert f"relative difference {p - 1:.1e}" in str(caught)


def fixture_submission(folder: Path, cells: list[str], name: str = "98-fixture.ipynb") -> Path:
    """A submitted copy of the fixture lab 98 in ``folder``: one exercise heading, then ``cells``."""
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell("```{exercise-start}\n:label: lab98-x\n```")]
    notebook.cells += [nbformat.v4.new_code_cell(source) for source in cells]
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, folder / name)
    return folder / name


def run_python(*args: str, timeout: float = 120,
               extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` in a fresh process (fresh JAX) from the repository root."""
    return subprocess.run([sys.executable, *args], cwd=ROOT,
                          env={**os.environ, **(extra_env or {})}, capture_output=True,
                          text=True, timeout=timeout)


class BuiltBook:
    """The book built once per test run into a temporary directory (see the ``book`` fixture).

    Attributes:
        html: the ``_build/html`` directory of the build.
        returncode: ``jupyter-book build``'s exit status.
        log: its stdout and stderr together.
    """

    def __init__(self, html: Path, returncode: int, log: str):
        self.html = html
        self.returncode = returncode
        self.log = log


@pytest.fixture(scope="session")
def book(tmp_path_factory) -> BuiltBook:
    """Build the book ONCE per test run (``jupyter-book build -W -n --keep-going``).

    The build goes to a temporary directory, never to the repository's ``_build``. The fixture
    does not judge the build: ``test_book.py`` asserts on warnings, ``test_browser.py`` opens the
    pages it produced.
    """
    out = tmp_path_factory.mktemp("book")
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    result = subprocess.run(
        [str(jupyter_book), "build", str(ROOT), "-W", "-n", "--keep-going",
         "--path-output", str(out)],
        capture_output=True, text=True, timeout=1800)
    return BuiltBook(out / "_build" / "html", result.returncode, result.stdout + result.stderr)
