"""The prefetching assignment of lab 07 (lab07.4): the instructor's solution, taken from the
lab's solution cell, passes the key's hidden tests, and each bug planted into it fails the hidden
test that names it.

Programs are exported and rebuilt in this process as a submission's kernel and the grader do
(:func:`clusterlab.course.grading.judge`).
"""

from __future__ import annotations

import numpy as np
import pytest

from assignment_support import (KEYS, assert_fails_by_name, assert_solution_passes, judge_solution,
                                key_module, lab_sources, solution_functions)
from clusterlab.course import grading

_LAB07 = lab_sources("07", ["lab07-prefetch-depth"])
_KEY07 = grading.load_key(KEYS / "lab07.py")


def test_solution_passes_every_hidden_timeline():
    assert_solution_passes(_KEY07, "lab07.4", _LAB07, "prefetch_timeline")


def test_hidden_slow_file_needs_more_than_depth_1():
    """The slow-file tests separate depths: a queue of 1 shows the slow file, one of 4 hides it
    (otherwise an implementation that ignores the depth would pass them)."""
    key = key_module("lab07")
    tests = {t.depth: t for t in key._timelines(23, 702) if "slow file" in t.name}
    ends = {d: key._reference_timeline(t.load_s, t.compute_s, d) for d, t in tests.items()}
    assert ends[1][-1] > ends[4][-1] * 1.05
    assert np.isclose(ends[4][-1], key._reference_timeline(
        tests[4].load_s, tests[4].compute_s, 1000)[-1])


@pytest.mark.parametrize("planted, failed", [
    (("jnp.maximum(loaded[i], buffer_free)", "loaded[i]"),
     "no prefetching (depth 0) on 12 random batches: when each step ends"),
    (("done[jnp.maximum(i - depth, 0)]", "done[jnp.maximum(i - depth + 1, 0)]"),
     "no prefetching (depth 0) on 12 random batches: when each step ends"),
    (("start = jnp.maximum(done[i], loaded[i + 1])", "start = done[i] + load_s[i]"),
     "depth 1, steady loads slower than the step, 12 batches: when each step ends"),
    (("done[jnp.maximum(i - depth, 0)]", "done[jnp.maximum(i - depth - 1, 0)]"),
     "no prefetching (depth 0) on 12 random batches: when each step ends"),
], ids=["the depth ignored (an unbounded queue)", "a buffer freed a step too early",
        "loading never overlapped with computing", "a buffer held a step too long"])
def test_planted_bug_fails_its_hidden_test_by_name(planted, failed):
    verdict = judge_solution(_KEY07, "lab07.4", _LAB07, "prefetch_timeline", planted)
    assert_fails_by_name(verdict, failed)


def test_skeleton_is_refused_with_its_error():
    verdict = grading.judge(_KEY07, "lab07.4",
                            solution_functions(_LAB07[:1])["prefetch_timeline"], {})
    assert not verdict.passed and "raised NotImplementedError" in verdict.line
