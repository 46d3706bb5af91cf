"""What a lab calls to check itself and its exercises: one name, ``check``, for both jobs.

A lab's exercise cell records the student's answer and carries no expected value::

    answer = ...  # bytes
    check.answer("lab01.1", answer)

:func:`answer` records the value under the exercise's id and, where the instructor's key
(``keys/labNN.py``, see :mod:`clusterlab.course.grading`) is found, judges it and prints one ✓/✗
line with the key's hint; in a student copy, which has no key, it prints one line saying the answer
was recorded and how it is graded. ``python -m clusterlab grade`` runs a submitted notebook and
judges every exercise of the key from the recorded answers, so a deleted ``check.answer`` call
scores zero for its exercise.

The two jobs live in their own modules, re-exported here so that labs, keys and chapters call
``check.<name>``:

* :mod:`clusterlab.course.answers`: exercise answers, recorded and compared (:func:`close` and
  :func:`equal` are the comparisons the keys use; chapters call them directly where the
  expected value is part of the text). Each prints one line and returns nothing, so a notebook
  cell shows that verdict line and nothing else.
* :mod:`clusterlab.course.verification`: a lab's verifications of its own run (:func:`verify`,
  :func:`verify_equal`, :func:`verify_close`, :func:`verify_catches`), which raise when a claim
  does not hold, and the float32 tolerances they compare at (:func:`fp32_rtol`,
  :func:`fp32_matmuls`).

Importing it imports no JAX (chapters use it).
"""

from __future__ import annotations

import sys

from clusterlab.course import answers, grading
from clusterlab.course.answers import (  # noqa: F401
    EXERCISE_ID, close, close_verdict, equal, equal_verdict, is_unanswered, public_tests,
    recorded_answers)
from clusterlab.course.verification import (  # noqa: F401
    FP32_RTOL, FP32_TRAINED_RTOL, VerificationFailed, fp32_matmuls, fp32_rtol, matmul_precision,
    verify, verify_catches, verify_close, verify_equal)


def answer(exercise_id: str, value) -> None:
    """Record a lab's or a chapter's exercise answer and, where the instructor's key is found,
    judge it.

    Args:
        exercise_id: ``"labNN.K"``, the K-th exercise of lab NN, or ``"chNN.K"``, the K-th
            exercise of chapter NN (``"ch04b.1"`` for chapter 04b), as the key names it
            (``keys/labNN.py``, ``keys/chNN.py``).
        value: the answer: a number, a tuple, an array, or for a code exercise the function
            the student wrote.

    Prints one line: the key's ✓/✗ verdict with its hint; without a key (a student copy),
    that the answer was recorded and is graded with ``python -m clusterlab grade``; for a blank
    (``...``), that there is no answer yet.

    Raises:
        ValueError: when ``exercise_id`` is neither ``labNN.K`` nor ``chNN.K``, or the key has no
            such exercise.
    """
    answers.record(exercise_id, value)
    key = grading.find_key(exercise_id)
    if key is None:
        print(f"✗ {exercise_id}: {answers._NO_ANSWER}" if is_unanswered(value) else
              f"• {exercise_id}: answer recorded; your instructor grades it with the course's "
              "key (python -m clusterlab grade).")
        return
    # expected values the key takes from the lab come from the calling notebook's namespace
    namespace = sys._getframe(1).f_globals
    print(grading.judge(key, exercise_id, value, namespace).line)
