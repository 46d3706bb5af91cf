"""Key of the test fixture "lab 98" (tests/test_grading.py): a value, an exact answer taken from
the notebook's namespace, and a code exercise."""

from clusterlab.course import grading


def _check_double(programs):
    value = int(programs[0](21))
    if value != 42:
        raise grading.Refused(f"it returns {value!r} for 21.")


KEY = {
    "lab98.1": grading.close(2.5, name="time (s)", hint="Divide the bytes by the bandwidth."),
    "lab98.2": grading.equal(lambda ns: ns["pair"], name="pair", hint="Swap nothing."),
    "lab98.3": grading.code(_check_double, name="double", hint="Return twice the input.",
                            exports=[grading.Export(args=[((), "int32")], n_devices=1)]),
}
