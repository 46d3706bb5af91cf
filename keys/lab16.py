"""Answer key of lab 16, profiles, stragglers and overlap (instructor-only: student copies leave
keys/ out).

``lab16.1`` asks what share of a data-parallel step the devices that finish first spend waiting
for a straggler at the all-reduce's rendezvous.
"""

from clusterlab.course import grading

_COMPUTE_MS, _STRAGGLER_MS, _ALL_REDUCE_MS = 100.0, 130.0, 20.0  # the exercise's numbers

KEY = {
    "lab16.1": grading.close(
        (_STRAGGLER_MS - _COMPUTE_MS) / (_STRAGGLER_MS + _ALL_REDUCE_MS),
        name="share of the step spent waiting",
        hint="The all-reduce cannot finish before the last device joins it. How long is the "
             "step, and how much of it do the early devices spend neither computing nor in the "
             "all-reduce? Answer as a fraction."),
}
