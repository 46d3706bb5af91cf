"""Lab 05's GPipe backward (lab05.4) must be a backward schedule written by hand: ``jax.grad``
through the forward ticks computes the right gradients with the right number of sends, and the
key refuses it by name, from the exported program (the review's M3). The rule is the last test of
each hidden case, so failing by its name shows the gradients and the sends passed before it. The
solution and the other planted bugs are in tests/test_assignments_lab05_06.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from assignment_support import KEYS, assert_fails_by_name, lab_sources, solution_functions
from clusterlab.course import grading

_LAB05 = lab_sources("05", ["lab05-gpipe-forward", "lab05-gpipe-grads"])
_KEY05 = grading.load_key(KEYS / "lab05.py")
_FIRST05 = "2 stages of 2 block(s), 3 micro-batches of 4"   # the first hidden case
_FORWARD_TICKS = solution_functions(_LAB05)["forward_ticks"]


def _last_stage_loss(weights, x, y, axis_name):
    """The batch's mean squared error, counted on the last stage only (the others hold no
    outputs), through the lab's own forward ticks."""
    p, stage = jax.lax.axis_size(axis_name), jax.lax.axis_index(axis_name)
    outputs, _ = _FORWARD_TICKS(weights, x[0], axis_name)
    return jnp.where(stage == p - 1, jnp.mean((outputs - y[0]) ** 2), 0.0)


def _grads_by_grad(w1, b1, w2, b2, x, y, axis_name):
    """jax.grad of the loss through the forward ticks: autodiff transposes each send."""
    grads = jax.grad(lambda *weights: _last_stage_loss(weights, x, y, axis_name),
                     argnums=(0, 1, 2, 3))(w1[0], b1[0], w2[0], b2[0])
    return tuple(g[None] for g in grads)


def _grads_by_vjp(w1, b1, w2, b2, x, y, axis_name):
    """jax.vjp of the whole forward schedule, seeded with 1: the same shortcut spelled as vjp."""
    loss, vjp = jax.vjp(lambda *weights: _last_stage_loss(weights, x, y, axis_name),
                        w1[0], b1[0], w2[0], b2[0])
    return tuple(g[None] for g in vjp(jnp.ones_like(loss)))


@pytest.mark.parametrize("submission", [_grads_by_grad, _grads_by_vjp],
                         ids=["jax.grad through the forward ticks",
                              "jax.vjp of the whole forward schedule"])
def test_lab05_backward_by_autodiff_fails_by_name(submission):
    verdict = grading.judge(_KEY05, "lab05.4", submission, {})
    assert_fails_by_name(verdict, f"gradients on {_FIRST05}: the backward schedule")
