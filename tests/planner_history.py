"""Shared by the planner's tests that compare a new layout dimension with the planner before it:
run a script against the planner as it was at a past commit, on the rest of the library as it is
now, so that only the planner differs. The planner was ``lib/clusterlab/plan`` before the library
became four packages (it is ``lib/clusterlab/analytic/plan`` now); its imports are moved to
today's paths as it is copied.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT


OLD_PLANNER = "lib/clusterlab/plan/"
#: where each module the old planners import lives now
LAYER_OF = {"hardware": "catalog", "published": "catalog", "costmodel": "analytic",
            "plan": "analytic", "flops": "analytic", "gemm": "analytic", "memory": "analytic",
            "storage": "analytic", "moe": "analytic", "topology": "analytic",
            "fabric": "analytic", "tables": "analytic", "schedule": "analytic",
            "serving": "analytic", "reliability": "analytic"}
_FROM_ROOT = re.compile(r"^([ \t]*)from clusterlab import ([\w, ]+)$", re.M)
_DOTTED = re.compile(r"\bclusterlab\.(" + "|".join(LAYER_OF) + r")\b")


def at_todays_paths(source: str) -> str:
    """An old planner module's source with its imports moved to the layered packages:
    ``from clusterlab import costmodel, hardware`` becomes one import per package, and
    ``clusterlab.plan.step`` becomes ``clusterlab.analytic.plan.step``; an estimate marked
    ``validated=False`` is marked ``validation="untested"``."""
    def split(match: re.Match) -> str:
        indent, names = match.group(1), [n.strip() for n in match.group(2).split(",")]
        by_layer: dict[str, list[str]] = {}
        for name in names:
            by_layer.setdefault(LAYER_OF[name], []).append(name)
        return "\n".join(f"{indent}from clusterlab.{layer} import {', '.join(group)}"
                         for layer, group in by_layer.items())
    source = _FROM_ROOT.sub(split, source)
    # An estimate's flag became its level (costmodel.VALIDATION_LEVELS); prices are untouched.
    source = source.replace("validated=False", 'validation="untested"')
    return _DOTTED.sub(lambda m: f"clusterlab.{LAYER_OF[m.group(1)]}.{m.group(1)}", source)


def run_old_planner(commit: str, tmp_path: Path, script: str, *args: object) -> object:
    """The JSON that ``script`` prints when run with the planner of ``commit``'s parent.

    Args:
        commit: the commit that changed the planner; its parent's planner runs.
        tmp_path: where the mixed library is written.
        script: Python source; it gets ``args`` as JSON strings in ``sys.argv[1:]``.
        *args: JSON-serialisable arguments.

    Skips where the checkout has no git history (a tarball): there is nothing to rebuild from.
    """
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        # A checkout without history (an unpacked tarball, `git archive`) holds no earlier
        # planner to compare with; every clone, CI's included, has it, so there this runs.
        pytest.skip("this checkout has no git history, so the planner before the change cannot "
                    "be rebuilt for the comparison; run it in a git clone")
    lib = tmp_path / "lib"
    shutil.copytree(ROOT / "lib" / "clusterlab", lib / "clusterlab")
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{commit}^", OLD_PLANNER],
                           cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    assert OLD_PLANNER + "prediction.py" in names
    for name in names:
        old = subprocess.run(["git", "show", f"{commit}^:{name}"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
        (lib / "clusterlab" / "analytic" / "plan" / Path(name).name).write_text(
            at_todays_paths(old))
    run = subprocess.run([sys.executable, "-c", script, *(json.dumps(a) for a in args)],
                         env=dict(os.environ, PYTHONPATH=str(lib)), cwd=tmp_path,
                         capture_output=True, text=True)
    assert run.returncode == 0, f"the script failed on the old planner:\n{run.stderr[-3000:]}"
    return json.loads(run.stdout)


#: what the planner's data-parallel seconds became, with the overlap off, for a ZeRO stage and m
#: micro-batches since it prices ZeRO-2 and 3 per micro-batch (the old planners: once a step):
#: ZeRO-2 a reduce-scatter (half an all-reduce) more per earlier micro-batch, ZeRO-3 its
#: gathers and scatter in every micro-batch
ZERO_FACTOR = {0: lambda m: 1, 1: lambda m: 1, 2: lambda m: 1 + (m - 1) / 2, 3: lambda m: m}
#: the fields that follow the data-parallel seconds
DP_FIELDS = ("dp_comm_s", "step_s", "mfu")


def assert_priced_as_before(now, before: dict[str, float], fields: tuple[str, ...]) -> None:
    """``now`` (a Plan with the overlap off) against the old planner's ``before``: every field
    bit for bit, except that ZeRO-2 and ZeRO-3 with several micro-batches have their
    data-parallel seconds scaled by :data:`ZERO_FACTOR`, the step longer by the difference and
    the MFU lower in proportion (to rounding)."""
    layout = now.layout
    microbatches = now.workload.global_batch // (layout.dp * layout.micro_batch)
    factor = ZERO_FACTOR[layout.zero_stage](microbatches)
    for f in fields:
        if factor == 1 or f not in DP_FIELDS:
            assert getattr(now, f) == before[f], (layout, f, getattr(now, f), before[f])
    if factor == 1:
        return
    step_s = before["step_s"] + (factor - 1) * before["dp_comm_s"]
    assert now.dp_comm_s == pytest.approx(factor * before["dp_comm_s"], rel=1e-12)
    assert now.step_s == pytest.approx(step_s, rel=1e-12)
    if "mfu" in fields:
        assert now.mfu == pytest.approx(before["mfu"] * before["step_s"] / step_s, rel=1e-12)
