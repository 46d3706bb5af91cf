"""The dead-peer assignment of lab 09 (lab09.3): the instructor's detector, taken from the lab's
solution cell, passes the key's hidden tests, and each bug planted into it fails the hidden test
that names it.

Programs are exported and rebuilt in this process as a submission's kernel and the grader do
(:func:`clusterlab.course.grading.judge`).
"""

from __future__ import annotations

import numpy as np
import pytest

from assignment_support import (KEYS, assert_fails_by_name, assert_solution_passes, judge_solution,
                                key_module, lab_sources, solution_functions)
from clusterlab.course import grading

_LAB09 = lab_sources("09", ["lab09-dead-peer"])
_KEY09 = grading.load_key(KEYS / "lab09.py")


def test_solution_passes_every_hidden_log():
    assert_solution_passes(_KEY09, "lab09.3", _LAB09, "declared_dead_at")


def test_hidden_logs_declare_what_their_names_say():
    """The reference declares the silent ranks, at the right moments, and nobody else."""
    key = key_module("lab09")
    declared = {log.name: key._reference_dead_at(log.beats, log.now, log.timeout_s)
                for log in key._logs(5, 40, 901)}
    dead = {name: np.flatnonzero(np.isfinite(times)).tolist() for name, times in declared.items()}
    assert list(dead.values()) == [[], [3], [0], [2], [], [1, 4]], dead
    assert declared["5 ranks, rank 0 never beat"][0] == 1.0
    assert np.isclose(declared["5 ranks, rank 2 silent from 0.4 to 1.9 s and from 2.5 s"][2],
                      1.4, atol=0.1)


@pytest.mark.parametrize("planted, failed", [
    (("(silence_to > deadline)", "(silence_to > deadline) & jnp.isfinite(silence_to)"),
     "5 ranks, rank 3 silent since its last beat"),
    (("deadline = silence_from + timeout_s",
      "deadline = silence_from + 2 * jnp.median(jnp.diff(beats[:, :4], axis=1))"),
     "5 ranks, rank 1 slow (a beat every 0.9 s)"),
    (("return jnp.min(jnp.where(declared, deadline, jnp.inf), axis=1)",
      "return jnp.sort(jnp.min(jnp.where(declared, deadline, jnp.inf), axis=1))"),
     "5 ranks, rank 3 silent since its last beat"),
    (("return jnp.min(jnp.where(declared, deadline, jnp.inf), axis=1)",
      "return jnp.max(jnp.where(declared, deadline, -jnp.inf), axis=1)"),
     "5 ranks, rank 2 silent from 0.4 to 1.9 s and from 2.5 s"),
], ids=["waits for a next beat that never comes (the job hangs)",
        "slow treated as dead (a timeout from the beat interval)",
        "the wrong rank (declared times sorted)", "the latest silence, not the first"])
def test_planted_bug_fails_its_hidden_test_by_name(planted, failed):
    verdict = judge_solution(_KEY09, "lab09.3", _LAB09, "declared_dead_at", planted)
    assert_fails_by_name(verdict, failed)


def test_skeleton_is_refused_with_its_error():
    verdict = grading.judge(_KEY09, "lab09.3",
                            solution_functions(_LAB09[:1])["declared_dead_at"], {})
    assert not verdict.passed and "raised NotImplementedError" in verdict.line
