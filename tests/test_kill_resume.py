"""The kill test: SIGKILL a training job at random moments, resume it, get the same bits.

``clusterlab.device.killtest.kill_test`` runs ``python -m clusterlab.device.train_demo`` once
uninterrupted (the reference), then again, killing it with SIGKILL 12 times over a job of 40
steps: each kill aimed at a data read, a step or a checkpoint write (four of each, in a seeded
order), at a seeded random occurrence and a seeded random moment inside it, and restarting the
job after every kill. Checked here: every kill landed; each phase was hit at least twice; every
resume read the newest complete checkpoint, bit for bit what the uninterrupted run saved at
that step (0 corrupt reads); kills inside a write left a half-written checkpoint that the next
run skipped; the final parameters equal the uninterrupted run's bit for bit. The figures are
printed (run pytest with ``-s`` to see them).
"""

from __future__ import annotations

import pytest

from clusterlab.device import killtest

N_KILLS = 12
SEED = 20261201
STEPS = 40  # the job's length: twelve kills of up to six skipped steps each spread over it


def test_kill_and_resume_is_bit_identical(tmp_path):
    report = killtest.kill_test(tmp_path, kills=N_KILLS, seed=SEED, steps=STEPS)
    print(f"\nkill test: {report.summary()}")
    for kill in report.kills:
        print(f"  aimed at {kill.aimed_at:16s} landed in {kill.landed_in:16s} step "
              f"{kill.step:3d}, {kill.delay_s * 1e3:5.0f} ms in; resumed at {kill.resumed_at}")

    assert len(report.kills) == N_KILLS
    landed = report.landed()
    assert all(landed[phase] >= 2 for phase in killtest.PHASES), landed
    assert report.corrupt_reads == 0
    first_resumable = next(i for i, k in enumerate(report.kills) if k.newest_complete is not None)
    assert report.resumes == N_KILLS - first_resumable
    assert report.identical_resumes == report.resumes
    assert report.resumed_newest, [(k.newest_complete, k.resumed_at) for k in report.kills]
    assert report.half_written_skipped >= 1
    assert report.final_identical
    # The kills spread over the job, not only its first checkpoints.
    assert max(k.step for k in report.kills) > report.steps // 2


def test_a_run_that_fails_on_its_own_is_reported_with_its_output(tmp_path):
    with pytest.raises(killtest.KillTestError, match=r"(?s)uninterrupted run failed.*"
                                                        r"stderr.*read_bytes_per_s"):
        killtest.kill_test(tmp_path, kills=1, steps=4, n_samples=256, d_model=8, d_hidden=8,
                           batch_size=8, read_bytes_per_s=-1.0)
    assert (tmp_path / "logs" / "reference.err").read_text()  # kept on disk as well


def test_kill_test_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="kills must be a positive integer"):
        killtest.kill_test(tmp_path, kills=0)
    with pytest.raises(ValueError, match="delay_fraction"):
        killtest.kill_test(tmp_path, kills=1, delay_fraction=(0.5, 0.1))
