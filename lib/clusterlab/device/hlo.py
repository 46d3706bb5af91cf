"""Program inspection: the collectives XLA compiled, read from the HLO text of a program.

What runs is what the compiled program says, not what the Python code suggests: ``jit`` over
sharded inputs inserts the all-reduces a sum needs, XLA's combiner merges independent
all-reduces, and a loop body runs once per trip. These functions parse ``compiled.as_text()``
(instructions, shapes and their bytes, loop trip counts); they call nothing of JAX but a jitted
function's ``.lower(...).compile()``.
"""

from __future__ import annotations

import json

import re
from typing import Callable, NamedTuple

# XLA's collective opcodes. Asynchronous versions (``all-reduce-start``/``all-reduce-done``, as
# on GPUs) are counted once, at ``-done``, whose shape is the result.
COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute",
                    "all-to-all", "collective-broadcast", "ragged-all-to-all")

# Compiler options that keep independent all-reduces apart. XLA's all-reduce combiner merges
# them into one (a tuple all-reduce), which is bucketing done by the compiler; turn it off to see
# the all-reduces the program asks for. Pass as ``jax.jit(f, compiler_options=...)``. The CPU and
# GPU pipelines name the pass differently; unknown names are ignored.
SEPARATE_ALL_REDUCES = {"xla_disable_hlo_passes": "all-reduce-combiner,cpu-all-reduce-combiner"}

_BITS_PER_ELEMENT = {
    "pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16,
    "f16": 16, "bf16": 16, "s32": 32, "u32": 32, "f32": 32, "s64": 64, "u64": 64, "f64": 64,
    "c64": 64, "c128": 128, "token": 0,
}
_ARRAY_SHAPE = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\]")
_OPCODE_AFTER_SHAPE = re.compile(r"\s*([a-z][a-z0-9-]*)\(")


class HloInstruction(NamedTuple):
    """One instruction of an HLO module's text: ``name = shape opcode(...)``."""

    name: str
    shape: str  # e.g. "f32[8,128]{1,0}" or a tuple "(f32[8]{0}, f32[4]{0})"
    opcode: str


class CollectiveOp(NamedTuple):
    """One collective in a compiled program.

    Attributes:
        kind: the XLA opcode without ``-start``/``-done``, e.g. ``"all-reduce"``.
        bytes: bytes of its result per device, from the HLO shape (tuples summed), e.g.
            ``f32[1024]`` is 4096 bytes; for an all-reduce that is the buffer reduced.
        shape: the HLO result shape as printed.
    """

    kind: str
    bytes: int
    shape: str


class CollectiveSummary(NamedTuple):
    """How many collectives of one kind a program holds, and their bytes added up."""

    n_ops: int
    total_bytes: int


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape string: ``"f32[8,128]{1,0}"`` is 4096; tuples are summed.

    Raises:
        ValueError: for an element type this table does not know.
    """
    total_bits = 0
    for dtype, dims in _ARRAY_SHAPE.findall(shape):
        if dtype.startswith("f8") or dtype.startswith("f4") or dtype.startswith("f6"):
            bits = int(re.sub(r"\D.*", "", dtype[1:]) or 8)  # f8e4m3fn -> 8, f4e2m1fn -> 4
        elif dtype in _BITS_PER_ELEMENT:
            bits = _BITS_PER_ELEMENT[dtype]
        else:
            raise ValueError(f"Unknown HLO element type {dtype!r} in shape {shape!r}.")
        n = 1
        for dim in filter(None, dims.split(",")):
            n *= int(dim.strip().lstrip("<="))  # "<=8": a dynamic dimension's bound
        total_bits += n * bits
    return (total_bits + 7) // 8


def _split_shape(right: str) -> tuple[str, str]:
    """Split ``"shape opcode(...)"`` into the shape and the rest; tuple shapes nest parens."""
    if not right.startswith("("):
        shape, _, rest = right.partition(" ")
        return shape, rest
    depth = 0
    for i, char in enumerate(right):
        depth += char == "("
        depth -= char == ")"
        if depth == 0:
            return right[:i + 1], right[i + 1:]
    return right, ""


def hlo_instructions(text: str) -> list[HloInstruction]:
    """Parse the instructions out of an HLO module's text (``compiled.as_text()``).

    Args:
        text: HLO text; every computation in it is read, so an instruction inside a fusion or a
            loop body counts once however often it runs.

    Returns:
        The instructions in the order printed.
    """
    out = []
    for line in text.splitlines():
        left, equals, right = line.strip().partition(" = ")
        name = left.removeprefix("ROOT ").strip()
        if not equals or not name or " " in name:  # headers, metadata, attributes
            continue
        shape, rest = _split_shape(right.strip())
        match = _OPCODE_AFTER_SHAPE.match(rest)
        if match:
            out.append(HloInstruction(name, shape, match.group(1)))
    return out


def compiled_text(jitted: Callable[..., object], *args) -> str:
    """The HLO text XLA compiled for ``jitted(*args)`` (after SPMD partitioning, per device).

    Args:
        jitted: a ``jax.jit``- or ``jax.pmap``-wrapped function.
        *args: example arguments (arrays with their shardings) to compile it for.
    """
    if not hasattr(jitted, "lower"):
        raise TypeError("Inspecting a compiled program needs a jax.jit-wrapped function (it "
                        "calls .lower); wrap yours with jax.jit first.")
    return jitted.lower(*args).compile().as_text()


def compiled_collectives(jitted: Callable[..., object], *args) -> list[CollectiveOp]:
    """The collectives XLA compiled into the program of ``jitted(*args)``, with their bytes.

    What runs is what the compiled program says, not what the Python code suggests: ``jit`` over
    sharded inputs inserts the all-reduces a sum needs, and XLA's combiner merges independent
    all-reduces into one. Bytes are per device, of each collective's result: for an all-reduce
    the buffer reduced (nccl-tests' ``size``), which a ring sends ``2(p-1)/p`` times over the wire
    (:func:`clusterlab.analytic.costmodel.collective_steps_and_bytes`).

    Args:
        jitted: a ``jax.jit``- or ``jax.pmap``-wrapped function.
        *args: example arguments to compile it for.

    Returns:
        One :class:`CollectiveOp` per collective instruction, in program order; asynchronous
        start/done pairs count once.
    """
    return collectives_in_text(compiled_text(jitted, *args))


def collectives_in_text(text: str) -> list[CollectiveOp]:
    """The collectives in HLO text, as :func:`compiled_collectives` reads them.

    Args:
        text: an HLO module's text, e.g. ``jax.jit(f).lower(x).compile().as_text()``.

    Returns:
        One :class:`CollectiveOp` per collective instruction; ``-start`` halves of asynchronous
        pairs are skipped and the ``-done`` halves counted.
    """
    return [op for op in map(_as_collective, hlo_instructions(text)) if op is not None]


def _as_collective(ins: HloInstruction) -> CollectiveOp | None:
    """The collective ``ins`` is (its ``-done`` half for an asynchronous pair), else ``None``."""
    kind = ins.opcode.removesuffix("-done")
    if kind not in COLLECTIVE_KINDS:
        return None
    return CollectiveOp(kind, shape_bytes(ins.shape), ins.shape)


def summarize(ops: list[CollectiveOp]) -> dict[str, CollectiveSummary]:
    """Count and total bytes per collective kind, e.g. ``{"all-reduce": (1, 4096)}``.

    Args:
        ops: from :func:`compiled_collectives`.

    Returns:
        A dict from kind to :class:`CollectiveSummary`, kinds in order of first appearance.
    """
    summary: dict[str, CollectiveSummary] = {}
    for op in ops:
        n_ops, total = summary.get(op.kind, (0, 0))
        summary[op.kind] = CollectiveSummary(n_ops + 1, total + op.bytes)
    return summary


def hlo_op_count(jitted: Callable[..., object], *args, op: str = "collective-permute") -> int:
    """How many ``op`` instructions XLA compiled into the program of ``jitted(*args)``.

    Counting the collectives in the compiled program shows what runs, not what the Python code
    suggests: a ring all-reduce over p devices compiles to 2(p-1) ``collective-permute``
    instructions, and ``jit`` over sharded inputs inserts the ``all-reduce`` a sum needs.
    Asynchronous pairs (``op-start``/``op-done``, as on GPUs) count once.

    Args:
        jitted: a ``jax.jit``-wrapped function.
        *args: example arguments (arrays with their shardings) to compile it for.
        op: an XLA opcode, e.g. ``"collective-permute"``, ``"all-reduce"``, ``"all-gather"``.

    Returns:
        The number of instructions with that opcode, across all computations of the program.
    """
    if not hasattr(jitted, "lower"):
        raise TypeError("hlo_op_count needs a jax.jit-wrapped function (it calls .lower); "
                        "wrap yours with jax.jit first.")
    return sum(ins.opcode in (op, f"{op}-start")
               for ins in hlo_instructions(compiled_text(jitted, *args)))


_WHILE_BODY = re.compile(r"\bbody=%?([\w.\-]+)")
_CALLEE = re.compile(r"\bto_apply=%?([\w.\-]+)")
_BRANCHES = re.compile(r"\b(?:branch_computations=\{([^}]*)\}|(?:true|false)_computation=%?([\w.\-]+))")
# Deeper nesting than this is taken for a cycle in the program text rather than followed.
_MAX_DEPTH = 64


def executed_collectives(jitted: Callable[..., object], *args) -> list[CollectiveOp]:
    """Like :func:`compiled_collectives`, but a collective inside a loop counts once per trip.

    A model whose layers run in a ``jax.lax.scan`` compiles to a ``while`` loop whose body holds
    one layer's collectives; :func:`compiled_collectives` lists that body once.
    This function follows the program from its entry computation into ``while`` bodies (times
    the ``known_trip_count`` XLA records, 1 when it is unknown) and ``call`` targets, and repeats
    each collective as often as it runs. A ``conditional``'s branches all count, as if each ran:
    a collective cannot hide in a branch (``lax.cond``). Trip counts come from the loop's
    ``backend_config`` read as JSON, never from attributes a program can set
    (``frontend_attributes`` hold strings a user chooses).

    Args:
        jitted: a ``jax.jit``-wrapped function.
        *args: example arguments to compile it for.

    Returns:
        One :class:`CollectiveOp` per collective *executed*, in program order.

    Raises:
        ValueError: the program text has no ENTRY computation, or nests deeper than 64 levels.
    """
    entry, computations = _computations(compiled_text(jitted, *args))
    return _executed_in(entry, computations, depth=0)


def _computations(text: str) -> tuple[str, dict[str, list[str]]]:
    """The entry computation's name, and every computation's instruction lines by name."""
    computations: dict[str, list[str]] = {}
    entry, current = None, None
    for line in text.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            header = line.split()
            is_entry = header[0] == "ENTRY"
            current = (header[1] if is_entry else header[0]).lstrip("%")
            computations[current] = []
            entry = current if is_entry else entry
        elif current is not None and line.strip() and line.strip() != "}":
            computations[current].append(line)
    if entry is None:
        raise ValueError("No ENTRY computation found in the compiled program text.")
    return entry, computations


def backend_config(line: str) -> dict:
    """An instruction's ``backend_config={...}`` as JSON (``{}`` when it has none).

    XLA prints the backend configuration last on the line, after ``frontend_attributes`` (whose
    values a program sets, e.g. with ``set_xla_metadata``, and which may print unquoted): so the
    last ``backend_config=`` outside a double-quoted string is XLA's, whatever a program wrote
    before it.
    """
    index, quoted, found = 0, False, -1
    while index < len(line):
        char = line[index]
        if quoted:
            if char == "\\":
                index += 1
            elif char == '"':
                quoted = False
        elif char == '"':
            quoted = True
        elif line.startswith("backend_config={", index):
            found = index
        index += 1
    if found < 0:
        return {}
    try:
        config, _ = json.JSONDecoder().raw_decode(line, found + len("backend_config="))
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}


def _trip_count(line: str) -> int:
    """A ``while`` loop's ``known_trip_count`` from its backend configuration, 1 if unknown."""
    trips = backend_config(line).get("known_trip_count", {}).get("n")
    return int(trips) if isinstance(trips, str) and trips.isdigit() else 1


def _executed_in(name: str, computations: dict[str, list[str]], *,
                 depth: int) -> list[CollectiveOp]:
    """The collectives computation ``name`` executes, loop bodies repeated per trip and every
    branch of a conditional counted."""
    if depth > _MAX_DEPTH:
        raise ValueError("Computations nest too deeply to follow.")
    ops: list[CollectiveOp] = []
    for line in computations.get(name, []):
        parsed = hlo_instructions(line)
        if not parsed:
            continue
        ins = parsed[0]
        collective = _as_collective(ins)
        if collective is not None:
            ops.append(collective)
        elif ins.opcode == "while":
            body = _WHILE_BODY.search(line)
            if body:
                ops.extend(_executed_in(body.group(1), computations, depth=depth + 1)
                           * _trip_count(line))
        elif ins.opcode == "call":
            callee = _CALLEE.search(line)
            if callee:
                ops.extend(_executed_in(callee.group(1), computations, depth=depth + 1))
        elif ins.opcode == "conditional":
            for listed, single in _BRANCHES.findall(line):
                for branch in (listed.split(",") if listed else [single]):
                    ops.extend(_executed_in(branch.strip().lstrip("%"), computations,
                                            depth=depth + 1))
    return ops


class CompiledFootprint(NamedTuple):
    """What XLA's analyses of one compiled program report, per device.

    Attributes:
        temp_bytes: temporaries (``memory_analysis().temp_size_in_bytes``): intermediates,
            and in a gradient step the activations kept for the backward pass.
        argument_bytes: the inputs (parameters, batch).
        output_bytes: the outputs (e.g. the gradients).
        flops: ``cost_analysis()["flops"]``; XLA counts a loop body once, whatever its trip
            count.
    """

    temp_bytes: int
    argument_bytes: int
    output_bytes: int
    flops: float


def compiled_footprint(jitted: Callable[..., object], *args) -> CompiledFootprint:
    """Memory and FLOPs of ``jitted(*args)`` from the compiled program's own analyses.

    Args:
        jitted: a ``jax.jit``-wrapped function, e.g. ``jax.jit(jax.grad(loss))``.
        *args: example arguments to compile it for.

    Returns:
        A :class:`CompiledFootprint`.

    Raises:
        TypeError: when ``jitted`` is not jitted.
        ValueError: when the backend reports no memory or FLOP analysis.
    """
    if not hasattr(jitted, "lower"):
        raise TypeError("compiled_footprint needs a jax.jit-wrapped function (it calls "
                        ".lower); wrap yours with jax.jit first.")
    return footprint(jitted.lower(*args).compile())


def footprint(compiled) -> CompiledFootprint:
    """:func:`compiled_footprint` of a program compiled already (``jitted.lower(...).compile()``),
    which can then also be called without compiling it again.

    Raises:
        ValueError: when the backend reports no memory or FLOP analysis.
    """
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older JAX: one dict per program
        cost = cost[0] if cost else {}
    if memory is None or not cost or "flops" not in cost:
        raise ValueError("XLA reported no memory or cost analysis for this program on this "
                         "backend.")
    return CompiledFootprint(int(memory.temp_size_in_bytes), int(memory.argument_size_in_bytes),
                             int(memory.output_size_in_bytes), float(cost["flops"]))


class PermuteSlot(NamedTuple):
    """Where one collective-permute sits in a compiled schedule, beside the matmul it can hide.

    The all-gather form of a collective matmul sends on the block it holds while it multiplies
    it: the permute and that matmul read the same buffer. The reduce-scatter form sends a running
    sum while it multiplies the next share, which is added to what arrives: the permute's result
    and that matmul's meet in one add. Either matmul is independent of the transfer. Positions
    count instructions of the entry computation in the order XLA scheduled them
    (``compiled.as_text()`` prints a scheduled module in that order).

    Attributes:
        permute: the HLO name of the ``collective-permute`` (its ``-start`` when asynchronous).
        sent: the HLO name of the buffer it sends.
        matmul: the matmul (a ``dot`` or a fusion calling one) that reads the buffer sent or,
            failing that, whose result is combined with the buffer received; ``""`` if none.
        issued_at: the permute's (or its ``-start``'s) position.
        matmul_at: the matmul's position (-1 when there is none).
        done_at: the position of its ``-done`` when asynchronous; ``issued_at`` when not.
        asynchronous: a ``-start``/``-done`` pair (XLA:GPU's default) rather than one
            instruction that returns once the data has arrived.
    """

    permute: str
    sent: str
    matmul: str
    issued_at: int
    matmul_at: int
    done_at: int
    asynchronous: bool

    @property
    def issued_before_matmul(self) -> bool:
        """The permute is issued before the matmul of the block it sends (the schedule allows it
        to run while that matmul does)."""
        return self.matmul_at >= 0 and self.issued_at < self.matmul_at

    @property
    def in_flight_during_matmul(self) -> bool:
        """Issued before the matmul and completed after it: an asynchronous permute whose
        transfer the schedule overlaps with the matmul."""
        return self.asynchronous and self.issued_before_matmul and self.done_at > self.matmul_at


_OPERANDS = re.compile(r"%([\w.\-]+)")
_CALLS = re.compile(r"\bcalls=%?([\w.\-]+)")


def permute_schedule(text: str) -> list[PermuteSlot]:
    """Each collective-permute of a compiled program's entry, beside the matmul of its block.

    Reads the scheduled entry computation of ``compiled.as_text()``: for every
    ``collective-permute`` (or ``collective-permute-start``), the buffer it sends, the matmul
    independent of it that it can overlap (see :class:`PermuteSlot`; a matmul is a ``dot`` or a
    fusion whose computation holds one), and their positions in the schedule.

    Args:
        text: a compiled (scheduled) HLO module's text, e.g. from
            :func:`clusterlab.device.hlo.compiled_text`.

    Returns:
        One :class:`PermuteSlot` per permute, in schedule order.

    Raises:
        ValueError: when the text has no ENTRY computation.
    """
    entry, computations = _computations(text)
    holds_dot = {name for name, lines in computations.items()
                 if any(ins.opcode == "dot" for line in lines for ins in hlo_instructions(line))}
    rows = []  # (position, name, opcode, operands)
    for line in computations[entry]:
        parsed = hlo_instructions(line)
        if not parsed:
            continue
        ins = parsed[0]
        call = line.split(f" {ins.opcode}(", 1)
        operands = _OPERANDS.findall(call[1].split(")", 1)[0]) if len(call) == 2 else []
        callee = _CALLS.search(line)
        is_matmul = ins.opcode == "dot" or bool(callee and callee.group(1) in holds_dot)
        rows.append((len(rows), ins.name.lstrip("%"), ins.opcode, operands, is_matmul))
    matmul_of = {}  # a buffer -> the first matmul that reads it
    is_matmul_at = {name: position for position, name, _, _, is_matmul in rows if is_matmul}
    for position, name, _, operands, is_matmul in rows:
        for operand in operands if is_matmul else ():
            matmul_of.setdefault(operand, (name, position))
    joined_with = {}  # a buffer -> the matmul whose result its first consumer combines it with
    for _, _, _, operands, _ in rows:
        products = [o for o in operands if o in is_matmul_at]
        for operand in operands:
            others = [o for o in products if o != operand]
            if others:
                joined_with.setdefault(operand, (others[0], is_matmul_at[others[0]]))
    done_of = {operands[0]: position for position, _, opcode, operands, _ in rows
               if opcode == "collective-permute-done" and operands}
    slots = []
    for position, name, opcode, operands, _ in rows:
        if opcode not in ("collective-permute", "collective-permute-start") or not operands:
            continue
        asynchronous = opcode.endswith("-start")
        received = next((r[1] for r in rows if r[2] == "collective-permute-done"
                         and r[3][:1] == [name]), name) if asynchronous else name
        matmul, matmul_at = matmul_of.get(operands[0]) or joined_with.get(received, ("", -1))
        slots.append(PermuteSlot(name, operands[0], matmul, position, matmul_at,
                                 done_of.get(name, position) if asynchronous else position,
                                 asynchronous))
    return slots
