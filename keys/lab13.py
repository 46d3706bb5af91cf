"""Answer key of lab 13, mixture of experts (instructor-only: student copies leave keys/ out).

``lab13.4`` is the dispatch all-to-all inside ``shard_map`` over ``"expert"``: each device's
buffer f32[E, C, D] in, its E/p experts' slots from every device f32[E/p, p*C, D] out. Hidden
tests on 2, 4 and 8 devices with sizes the lab never shows compare the arrangement exactly (an
all-to-all only copies) and require exactly one all-to-all of E x C x D x 4 bytes.

``lab13.5`` is the combine of one group, ``combine_from_experts(expert_out f32[E, C, D], expert
i32[T, k], weight f32[T, k]) -> f32[T, D]``, judged under ``jax.jit`` against the layer's
``experts.masks`` and ``DISPATCH_COMBINE.combine`` on three shapes the lab never shows, in three
named tests: slots first-come per expert, weighted by the router, assignments past capacity
dropped (the course's router on a hot expert).
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
    rng = np.random.default_rng(grading.hidden_seed(case.seed))
    return rng.standard_normal(shape).astype(np.float32)


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
# no references: the library's dispatch is two lines inside experts._local_moe (its all-to-all
# and the reshape after it), which returns the layer's output, never the dispatched buffer; the
# all-to-all itself is jax.lax.all_to_all, the collective the exercise asks for


# ---- lab13.5: the combine, from the experts' buffers back to the tokens ----------------------

class _Shape(NamedTuple):
    """One hidden shape: T tokens, E experts, k choices, capacity factor c, width D."""

    tokens: int
    n_experts: int
    top_k: int
    capacity_factor: float
    d_model: int

    @property
    def capacity(self) -> int:
        return moe.expert_capacity(self.tokens, n_experts=self.n_experts, top_k=self.top_k,
                                   capacity_factor=self.capacity_factor)

    @property
    def name(self) -> str:
        return (f"T = {self.tokens}, E = {self.n_experts}, k = {self.top_k}, "
                f"c = {self.capacity_factor} (C = {self.capacity}), D = {self.d_model}")


# the lab shows T = 32, E = 8, k = 2, C = 8 (and T = 44, k = 1 on the hot expert); none of these.
# c >= 1, so the balanced routing below fits every assignment.
_SHAPES = (_Shape(20, 4, 1, 1.25, 3), _Shape(18, 6, 2, 1.0, 5), _Shape(21, 5, 3, 1.0, 4))


def _first_come(expert: np.ndarray) -> np.ndarray:
    """i32[T, k]: each assignment's slot, counted per expert in token order, then rank order."""
    seen: dict[int, int] = {}
    position = np.zeros_like(expert)
    for t, j in np.ndindex(*expert.shape):
        position[t, j] = seen.get(int(expert[t, j]), 0)
        seen[int(expert[t, j])] = position[t, j] + 1
    return position


def _balanced(shape: _Shape, seed: int, weighted: bool):
    """A routing that fits: assignment i of the T*k goes to expert i mod E (k <= E, so a token's
    k experts differ), the tokens then shuffled; weights 1, or random and summing to one per
    token."""
    t, k = shape.tokens, shape.top_k
    rng = np.random.default_rng(grading.hidden_seed(seed))
    expert = rng.permutation(np.arange(t * k).reshape(t, k) % shape.n_experts).astype(np.int32)
    weight = rng.uniform(0.1, 1.0, (t, k)) if weighted else np.ones((t, k))
    weight = (weight / weight.sum(axis=1, keepdims=True) if weighted else weight)
    return expert, weight.astype(np.float32)


def _hot(shape: _Shape, seed: int):
    """The course's router on tokens whose top-1 choice is expert 0 for three in four of them:
    expert 0 overflows its C slots. Returns the layer's experts.Routing."""
    import jax

    t, e = shape.tokens, shape.n_experts
    rng = np.random.default_rng(grading.hidden_seed(seed))
    target = np.where(np.arange(t) < 3 * t // 4, 0, rng.integers(1, e, t))
    rng.shuffle(target)
    router, x = experts.steered_tokens(jax.random.key(grading.hidden_seed(seed)), target,
                                       d_model=e + 2, n_experts=e)
    return experts.route(router, x, top_k=shape.top_k, capacity=shape.capacity,
                         renormalize=shape.top_k > 1)


def _outputs(shape: _Shape, seed: int, labelled: bool) -> np.ndarray:
    """f32[E, C, D]: the experts' outputs, random or (labelled) slot (e, c) holding 100 e + c."""
    e, c, d = shape.n_experts, shape.capacity, shape.d_model
    if labelled:
        slot = 100.0 * np.arange(e)[:, None] + np.arange(c)[None, :]
        return np.repeat(slot[:, :, None], d, axis=2).astype(np.float32)
    rng = np.random.default_rng(grading.hidden_seed(seed))
    return rng.standard_normal((e, c, d)).astype(np.float32)


def _reference(out, expert, weight, position, capacity) -> np.ndarray:
    """The course's combine: experts.masks of the routing, then DISPATCH_COMBINE.combine."""
    routing = experts.Routing(None, expert, weight, position, position < capacity)
    m = experts.masks(routing, out.shape[0], capacity)
    return np.asarray(experts.DISPATCH_COMBINE.combine(out, m))


def _compare(program, test: str, shape: _Shape, out, expert, weight, position) -> None:
    got = np.asarray(program(out, np.asarray(expert, np.int32), np.asarray(weight, np.float32)))
    want = _reference(out, expert, weight, position, shape.capacity)
    if got.shape != want.shape:
        raise grading.Refused(f"{test}: on {shape.name} the result has shape {got.shape}, "
                              f"expected {want.shape} (f32[T, D])")
    bad = ~np.isclose(got, want, rtol=1e-5, atol=1e-5).all(axis=1)
    if bad.any():
        raise grading.Refused(f"{test}: on {shape.name}, {int(bad.sum())} of {shape.tokens} "
                              f"tokens differ (first: token {int(np.argmax(bad))})")


def _check_combine(programs) -> None:
    # 1. slots: every assignment fits, weights 1, slot (e, c) labelled: finds the slot read
    for i, (program, shape) in enumerate(zip(programs, _SHAPES)):
        expert, weight = _balanced(shape, 1350 + i, weighted=False)
        _compare(program, "slots first-come per expert", shape, _outputs(shape, 0, True),
                 expert, weight, _first_come(expert))
    # 2. weights: every assignment fits, the router's weights differ per token
    for i, (program, shape) in enumerate(zip(programs, _SHAPES)):
        expert, weight = _balanced(shape, 1360 + i, weighted=True)
        _compare(program, "weighted by the router", shape, _outputs(shape, 1370 + i, False),
                 expert, weight, _first_come(expert))
    # 3. capacity: the course's router on a hot expert; its overflow must add nothing
    for i, (program, shape) in enumerate(zip(programs, _SHAPES)):
        r = _hot(shape, 1380 + i)
        _compare(program, "assignments past capacity dropped", shape,
                 _outputs(shape, 1390 + i, False), np.asarray(r.expert), np.asarray(r.weight),
                 np.asarray(r.position))


KEY["lab13.5"] = grading.code(
    _check_combine, name="combine",
    hint="Count each expert's assignments in token order to find a token's slot; a slot number "
         "of C or more was never filled; the router's weight scales what comes back.",
    exports=[grading.Export(args=[((s.n_experts, s.capacity, s.d_model), "float32"),
                                  ((s.tokens, s.top_k), "int32"),
                                  ((s.tokens, s.top_k), "float32")], n_devices=1, wrap="jit")
             for s in _SHAPES],
    # the slots (route), the masks built from them and the layer's combine
    # (DISPATCH_COMBINE.combine is experts._combine)
    references=[f"clusterlab.device.parallel.experts.{name}" for name in ("route", "masks",
                                                                          "_combine")])
