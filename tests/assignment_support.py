"""Shared by the programming assignments' tests: the solution and skeleton cells of a lab, and
the functions they define, with a bug planted into them, as a submission would hand them over.
"""

from __future__ import annotations

import ast

import jax
import jax.numpy as jnp
import nbformat
import numpy as np

from clusterlab.device import models
from conftest import ROOT

KEYS = ROOT / "keys"


def code_after(notebook, marker: str) -> str:
    """The first code cell after the markdown cell holding ``marker``."""
    cells = notebook.cells
    start = next(i for i, c in enumerate(cells) if c.cell_type == "markdown" and marker in c.source)
    return next(c.source for c in cells[start:] if c.cell_type == "code")


def lab_sources(lab: str, labels: list[str]) -> list[str]:
    """Per exercise label, in order: its skeleton cell (the helpers given to the student), then
    its solution cell."""
    notebook = nbformat.read(next((ROOT / "labs").glob(f"{lab}-*.ipynb")), as_version=4)
    return [source for label in labels for source in (
        code_after(notebook, f":label: {label}"),
        code_after(notebook, "{solution-start} " + label))]


def solution_functions(sources: list[str], planted: tuple[str, str] | None = None, **helpers) -> dict:
    """The functions and constants the cells define (their checks and answer lines left out),
    with ``planted = (old, new)`` replaced in them first; ``helpers`` join the namespace."""
    code = "\n\n".join(sources)
    if planted is not None:
        old, new = planted
        assert code.count(old) == 1, f"the solution no longer holds {old!r}"
        code = code.replace(old, new)
    module = ast.parse(code)
    module.body = [node for node in module.body
                   if isinstance(node, (ast.FunctionDef, ast.Assign))]
    namespace = {"jax": jax, "jnp": jnp, "np": np, "models": models, **helpers}
    exec(compile(module, "<lab solution>", "exec"), namespace)
    return namespace


def assert_fails_by_name(verdict, failed: str) -> None:
    """A planted bug's verdict: refused, by the hidden test named ``failed``, with a hint."""
    assert not verdict.passed
    assert f": {failed}: " in verdict.line and "Hint:" in verdict.line, verdict.line


def judge_solution(key, exercise_id: str, sources: list[str], name: str,
                   planted: tuple[str, str] | None = None):
    """The key's verdict on the lab's own solution function ``name`` (a bug planted first)."""
    from clusterlab.course import grading

    return grading.judge(key, exercise_id, solution_functions(sources, planted)[name], {})


def assert_solution_passes(key, exercise_id: str, sources: list[str], name: str) -> None:
    """The key passes the lab's own solution ``name``; prints how long grading it took."""
    import time

    start = time.perf_counter()
    verdict = judge_solution(key, exercise_id, sources, name)
    print(f"{exercise_id} graded in {time.perf_counter() - start:.1f} s")
    assert verdict.passed, verdict.line


def key_module(lab: str):
    """``keys/<lab>.py`` loaded as a module, for tests that read its hidden cases."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{lab}_key", KEYS / f"{lab}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
