"""Answer key of lab 13, mixture of experts (instructor-only: student copies leave keys/ out).

``lab13.4`` is the dispatch all-to-all inside ``shard_map`` over ``"expert"``: each device's
buffer f32[E, C, D] in, its E/p experts' slots from every device f32[E/p, p*C, D] out. Hidden
tests on 2, 4 and 8 devices with sizes the lab never shows compare the arrangement exactly (an
all-to-all only copies) and require exactly one all-to-all of E x C x D x 4 bytes.
"""

from typing import NamedTuple

import numpy as np

from clusterlab.analytic import costmodel, moe
from clusterlab.course import grading
from clusterlab.device.parallel import experts


def _dropped_at_1_5(ns):
    # the lab's hot-expert assignments (i32[8, 44, 1]) against C = ceil(1.5 * 44 / 8) = 9
    capacity = moe.expert_capacity(ns["T_DEV"], n_experts=ns["E"], top_k=1,
                                       capacity_factor=1.5)
    return moe.predicted_dropped(ns["hot_expert"], capacity, ns["E"])


# DeepSeek-V3 (DeepSeek-AI 2024): 8 of 256 routed experts, hidden width 7168, EP64; the lab's
# assumptions: 4096 tokens per device, capacity factor 1.0, BF16
_DEEPSEEK_BUFFER = moe.all_to_all_bytes(4096, d_model=7168, n_experts=256, top_k=8,
                                            capacity_factor=1.0, bytes_per_element=2)


def _straggler_on_8(ns):
    return experts.straggler_factor(ns["lab12_load"], 8)


KEY = {
    "lab13.1": grading.equal(_dropped_at_1_5, name="tokens dropped",
                             hint="Compute C for 44 tokens per device at c = 1.5, then count "
                                  "each device's overflow per expert (max(0, n_e - C))."),
    "lab13.2": grading.close(
        costmodel.collective_steps_and_bytes("all_to_all", _DEEPSEEK_BUFFER, 64)[1],
        name="bytes sent off the device",
        hint="The buffer is E experts x C slots x D values x 2 bytes, C from the capacity "
             "formula; a device keeps its own 1/64 of it."),
    "lab13.3": grading.close(_straggler_on_8, name="slow-down factor",
                             hint="Add up the shares of the 4 experts on each device; the step "
                                  "waits for the busiest device, against the mean device."),
}


# ---- lab13.4: the dispatch all-to-all, written with one jax.lax collective ----------------

_AXIS = "expert"


class _Case(NamedTuple):
    """One hidden case: p devices, E experts, C slots per expert, width D."""

    devices: int
    n_experts: int
    capacity: int
    d_model: int
    seed: int

    @property
    def name(self) -> str:
        return (f"{self.devices} devices, E = {self.n_experts}, C = {self.capacity}, "
                f"D = {self.d_model}")


# the lab shows 8 devices, E = 8, C = 4, D = 16; none of these
_CASES = (_Case(2, 4, 3, 5, 1301), _Case(4, 8, 2, 3, 1302), _Case(8, 16, 1, 4, 1303))


def _buffers(case: _Case) -> np.ndarray:
    """Every device's dispatch buffer stacked: f32[p * E, C, D] (device i's rows i*E ...)."""
    shape = (case.devices * case.n_experts, case.capacity, case.d_model)
    return np.random.default_rng(case.seed).standard_normal(shape).astype(np.float32)


def _arranged(buffers: np.ndarray, case: _Case) -> np.ndarray:
    """What the devices hold after the dispatch, stacked: f32[E, p * C, D]; expert e's row holds
    device 0's C slots for e, then device 1's, ... (device j holds experts j*E/p ...)."""
    p, e, c, d = case.devices, case.n_experts, case.capacity, case.d_model
    return buffers.reshape(p, e, c, d).transpose(1, 0, 2, 3).reshape(e, p * c, d)


def _check_dispatch(programs) -> None:
    for program, case in zip(programs, _CASES):
        buffers = _buffers(case)
        out = np.asarray(program(buffers))
        expected = _arranged(buffers, case)
        if out.shape != expected.shape or not np.array_equal(out, expected):
            raise grading.Refused(
                f"experts' slots on {case.name}: got shape {out.shape}, expected "
                f"{expected.shape} ({'values differ' if out.shape == expected.shape else ''}); "
                "local expert l's row holds device 0's C slots, then device 1's, ...")
        nbytes = case.n_experts * case.capacity * case.d_model * 4
        found = [(op.kind, op.bytes) for op in program.collective_ops(buffers)]
        if found != [("all-to-all", nbytes)]:
            raise grading.Refused(f"{case.name}: its program runs {found}; the dispatch is one "
                                  f"all-to-all of the E x C x D buffer ({nbytes} B) and nothing "
                                  "else.")


KEY["lab13.4"] = grading.code(
    _check_dispatch, name="dispatch all-to-all",
    hint="Each device keeps E/p experts and receives p devices' slots for them: which axis of "
         "the buffer is cut into p chunks, and along which do the arrivals stack?",
    exports=[grading.Export(args=[((c.devices * c.n_experts, c.capacity, c.d_model),
                                   "float32")], n_devices=c.devices, wrap="shard_map",
                            axis=_AXIS) for c in _CASES])
