"""The programming assignments of lab 03 (the data-parallel gradient, lab03.4; bucketed data
parallelism with gradient accumulation, lab03.5): the instructor's solutions, taken from the
lab's solution cells, pass the key's hidden tests on 2, 4 and 8 devices, and each bug planted
into them fails the hidden test that names it.

Programs are exported and rebuilt in this process as a submission's kernel and the grader do
(:func:`clusterlab.course.grading.judge`: :func:`clusterlab.course.submission.export_answer` for each
``grading.Export`` of the key, then :func:`clusterlab.course.grading.rehydrate`).
"""

from __future__ import annotations

import pytest

from assignment_support import (KEYS, assert_fails_by_name, judge_solution, lab_sources,
                                solution_functions)
from clusterlab.course import grading

_LAB03 = lab_sources("03", ["lab03-data-parallel-grads"])
_KEY03 = grading.load_key(KEYS / "lab03.py")
_FIRST03 = "2 devices, 2 block(s) of D = 8, H = 12, batch 12"   # the first hidden case
_PMEAN = "jax.lax.pmean(local, axis_name)"


def test_lab03_solution_passes_on_2_4_and_8_devices():
    assert sorted(e.n_devices for e in _KEY03["lab03.4"].exports) == [2, 4, 8]
    verdict = grading.judge(_KEY03, "lab03.4", solution_functions(_LAB03)["data_parallel_grads"],
                            {})
    assert verdict.passed, verdict.line


@pytest.mark.parametrize("planted, failed", [
    ((_PMEAN, "jax.lax.psum(local, axis_name)"), f"gradients on {_FIRST03}"),
    ((_PMEAN, "local"), f"gradients on {_FIRST03}"),
    ((_PMEAN, f"jax.tree.map(lambda g: g / jax.lax.axis_size(axis_name), {_PMEAN})"),
     f"gradients on {_FIRST03}"),
    (("grads = " + _PMEAN,
      "x, y = (jax.lax.all_gather(a, axis_name, tiled=True) for a in (x, y))\n"
      "    grads = jax.grad(local_loss, argnums=(0, 1, 2, 3))(w1[0], b1[0], w2[0], b2[0])"),
     f"{_FIRST03}: its collectives"),
], ids=["psum of the devices' means (sum for mean)", "no all-reduce (each device's own slice)",
        "divided by p twice", "the batch all-gathered, the whole batch on every device"])
def test_lab03_planted_bug_fails_its_hidden_test_by_name(planted, failed):
    grads = solution_functions(_LAB03, planted)["data_parallel_grads"]
    verdict = grading.judge(_KEY03, "lab03.4", grads, {})
    assert_fails_by_name(verdict, failed)


def test_lab03_skeleton_is_refused_with_its_error():
    skeleton = solution_functions(_LAB03[:1])["data_parallel_grads"]
    verdict = grading.judge(_KEY03, "lab03.4", skeleton, {})
    assert not verdict.passed and "raised NotImplementedError" in verdict.line


# --- lab03.5: bucketed data parallelism with gradient accumulation -----------------------------

_LAB03_BUCKETS = lab_sources("03", ["lab03-data-parallel-grads", "lab03-bucketed-accumulation"])
_FIRST_BUCKETS = "2 devices, 3 block(s) of D = 16, H = 24, 3 micro-batches of 4"
_BUCKET_PMEAN = "jax.lax.pmean(flat[i:i + size], axis_name)"
_BUCKET_BLOCK = ("buckets = [" + _BUCKET_PMEAN + " for i in range(0, flat.size, size)]\n"
                 "    flat = jnp.concatenate(buckets)")           # the buckets, reduced
_SCAN = ("total, _ = jax.lax.scan(add_micro_batch, tuple(jnp.zeros_like(w) for w in weights), "
         "(x, y))")


def test_lab03_bucketed_solution_passes_on_2_4_and_8_devices():
    assert sorted(e.n_devices for e in _KEY03["lab03.5"].exports) == [2, 4, 8]
    verdict = judge_solution(_KEY03, "lab03.5", _LAB03_BUCKETS, "bucketed_accumulated_grads")
    assert verdict.passed, verdict.line


@pytest.mark.parametrize("planted, failed", [
    ((_BUCKET_BLOCK, "flat = jax.lax.pmean(flat, axis_name)"), f"{_FIRST_BUCKETS}: its buckets"),
    (("flat = jnp.concatenate(buckets)",
      "flat = jax.lax.pmean(jnp.concatenate(buckets), axis_name)"),
     f"{_FIRST_BUCKETS}: its buckets"),
    ((_BUCKET_PMEAN, "jax.lax.psum(flat[i:i + size], axis_name)"),
     f"gradients on {_FIRST_BUCKETS}"),
    ((_SCAN, "total = jax.grad(lambda *w: models.mse_loss(blocks_of(*w), x[-1], y[-1]), "
             "argnums=(0, 1, 2, 3))(*weights)"),
     f"gradients on {_FIRST_BUCKETS}"),
    (("/ x.shape[0]", ""), f"gradients on {_FIRST_BUCKETS}"),
    (("BUCKET_BYTES // flat.dtype.itemsize", "BUCKET_BYTES"), f"{_FIRST_BUCKETS}: its buckets"),
    (("return tuple(t + g for t, g in zip(total, grads)), None",
      "return tuple(t + jax.lax.pmean(g, axis_name) for t, g in zip(total, grads)), None"),
     f"{_FIRST_BUCKETS}: its buckets"),
], ids=["one fused all-reduce of the whole gradient",
        "buckets reduced, then the whole gradient again",
        "psum of the devices' means (sum for mean)", "accumulation dropped (the last micro-batch)",
        "accumulated sum not divided by A", "buckets of BUCKET_BYTES values, not bytes",
        "reduced every micro-batch, not once per step"])
def test_lab03_bucketed_planted_bug_fails_its_hidden_test_by_name(planted, failed):
    verdict = judge_solution(_KEY03, "lab03.5", _LAB03_BUCKETS, "bucketed_accumulated_grads",
                             planted)
    assert_fails_by_name(verdict, failed)


def test_lab03_bucketed_by_the_library_fails_by_name():
    # the library's bucketing (clusterlab.device.collectives) gives the right buckets; the
    # exercise asks for them written by hand, and the exported program's locations show it
    from clusterlab.device import collectives

    planted = (_BUCKET_BLOCK, "flat = collectives.all_reduce_gradients(flat, axis_name, "
               "bucket_bytes=BUCKET_BYTES)")
    function = solution_functions(_LAB03_BUCKETS, planted, collectives=collectives)
    verdict = grading.judge(_KEY03, "lab03.5", function["bucketed_accumulated_grads"], {})
    assert_fails_by_name(verdict, f"{_FIRST_BUCKETS}: written by hand")


def test_lab03_bucketed_skeleton_is_refused_with_its_error():
    skeleton = solution_functions(_LAB03_BUCKETS[2:3])["bucketed_accumulated_grads"]
    verdict = grading.judge(_KEY03, "lab03.5", skeleton, {})
    assert not verdict.passed and "raised NotImplementedError" in verdict.line
