"""The package installs from its own metadata: ``pip install .`` with no extras, into a new
virtual environment, gives a working catalog and analytical layer and the ``plan`` and ``expect``
commands, without JAX (the outside review's B2: the declared dependencies once missed scipy,
IPython and optax, so the base install was broken)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)


@pytest.fixture(scope="module")
def base_install(tmp_path_factory) -> Path:
    """A virtual environment with ``pip install .`` of a copy of the package, no extras."""
    tmp = tmp_path_factory.mktemp("install")
    source = tmp / "source"  # a copy: the build writes its egg-info beside the sources
    source.mkdir()
    shutil.copy(ROOT / "pyproject.toml", source)
    shutil.copy(ROOT / "README.md", source)
    shutil.copytree(ROOT / "lib", source / "lib",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    env_dir = tmp / "venv"
    # No pip of its own: the test's pip installs into it (pip --python), which skips ensurepip;
    # --no-compile skips writing .pyc files for scipy and matplotlib. What lands in the new
    # environment is still only what the package's metadata asks for (80 s -> 7 s).
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    result = _run(sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                  "--no-compile", str(source))
    assert result.returncode == 0, result.stdout + result.stderr
    return python


def test_the_base_install_has_no_jax_and_imports_the_analytical_layer(base_install):
    result = _run(str(base_install), "-c", "import jax")
    assert result.returncode != 0 and "No module named 'jax'" in result.stderr
    result = _run(str(base_install), "-c",
                  "import clusterlab.catalog.hardware, clusterlab.analytic.plan, "
                  "clusterlab.analytic.costmodel, clusterlab.analytic.fabric, "
                  "clusterlab.analytic.serving, clusterlab.course.expect; print('imported')")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "imported"


def test_the_base_install_runs_plan_and_expect(base_install):
    plan = _run(str(base_install), "-m", "clusterlab", "plan", "--params", "7e9", "--tokens",
                "1e11", "--gpu", "H100", "--gpus", "64")
    assert plan.returncode == 0, plan.stderr
    assert "fastest layouts that fit" in plan.stdout
    expect = _run(str(base_install), "-m", "clusterlab", "expect", "all_reduce", "--gpu", "H100",
                  "--nodes", "2")
    assert expect.returncode == 0, expect.stderr
    assert "busbw" in expect.stdout.lower()
    # the device layer needs its extra, and says so by failing to import JAX
    bench = _run(str(base_install), "-m", "clusterlab", "bench", "all_reduce", "--devices", "2")
    assert bench.returncode != 0 and "jax" in bench.stderr


def test_the_console_script_is_installed(base_install):
    script = base_install.parent / "clusterlab"
    result = _run(str(script), "--help")
    assert result.returncode == 0, result.stderr
    assert "plan" in result.stdout and "expect" in result.stdout
