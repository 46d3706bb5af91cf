"""clusterlab.device.profile: traces captured here on simulated devices, and constructed traces.

The captured traces come from a child process (XLA reads ``--xla_cpu_enable_xprof_traceme=true``
only when JAX creates its backends, which this test process has already done in conftest): a
tiny jitted ``shard_map`` gradient step on 4 simulated CPU devices, traced for a few steps,
balanced and with one device given extra work (jax/jaxlib 0.10.2). The GPU tests read a trace
*constructed* in the format the JAX/XProf trace viewer writes for GPUs (processes named
``/device:GPU:<n>``, one thread per CUDA stream, derived ``XLA Ops`` lines, NCCL kernel names):
**no real GPU trace has been read** (no GPU here); the numbers put in are the numbers asserted.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest

from clusterlab.course import plotting
from clusterlab.device import profile

ROOT = Path(__file__).resolve().parents[1]
STEPS = 3
N_DEVICES = 4

# Run in a child process: enable per-op events, then set up devices, then capture.
_CAPTURE = r"""
import json, sys, time
from clusterlab.device import profile
profile.enable_cpu_op_events()
from clusterlab.device import devices, hlo, models
DEVICES = devices.setup({n})
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = devices.mesh(({n},), ("data",), DEVICES)
params = models.init_mlp(jax.random.key(0), d_model=128, d_hidden=256, n_blocks=1)
x, y = models.synthetic_regression(jax.random.key(1), n_samples=64, d_model=128)
def make(extra_on, name):
    def local(params, xb, yb):  # xb, yb: f32[64/n, 128]
        loss, grads = jax.value_and_grad(models.mse_loss)(params, xb, yb)
        # every device runs eighty 256^3 matmuls, so a step's work dwarfs the host's thread
        # scheduling; the straggler's device runs three times as many more
        w = jnp.ones((256, 256)) / 256
        heavy = lambda n: jax.lax.fori_loop(0, n, lambda i, a: jnp.tanh(a @ w), w).sum()
        loss = loss + 0 * heavy(80)
        if extra_on is not None:
            loss = loss + 0 * jax.lax.cond(jax.lax.axis_index("data") == extra_on,
                                           lambda: heavy(240), lambda: 0.0)
        return jax.lax.pmean((loss, grads), "data")
    local.__name__ = name  # the compiled module is jit_<name>
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data"), P("data")),
                                 out_specs=P()))
args = (jax.device_put(params, NamedSharding(mesh, P())),
        jax.device_put(x, NamedSharding(mesh, P("data"))),
        jax.device_put(y, NamedSharding(mesh, P("data"))))
steps = {{name: make(extra_on, name) for name, extra_on in (("balanced", None),
                                                           ("straggler", {n} - 1))}}
for step in steps.values():
    jax.block_until_ready(step(*args))
start = time.perf_counter()
path = profile.capture_programs({{name: (step, args) for name, step in steps.items()}},
                                steps={steps}, log_dir=sys.argv[1])
out = {{"path": str(path), "host_s": time.perf_counter() - start}}
for name, step in steps.items():
    out[name] = {{"hlo": hlo.compiled_text(step, *args),
                 "n_collectives": len(hlo.compiled_collectives(step, *args))}}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> dict:
    """The two captured traces, their compiled HLO and collective counts."""
    where = tmp_path_factory.mktemp("traces")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib"), "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    done = subprocess.run([sys.executable, "-c", _CAPTURE.format(n=N_DEVICES, steps=STEPS),
                           str(where)], capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _read(captured: dict, name: str) -> profile.Profile:
    return profile.read_trace(captured["path"], hlo_texts=[captured[name]["hlo"]],
                              module=f"jit_{name}")


def test_captured_collectives_equal_the_compiled_program(captured):
    for name in ("balanced", "straggler"):
        read = _read(captured, name)
        assert read.source == "xla-cpu" and read.n_steps == STEPS
        assert [d.device for d in read.devices] == [f"cpu:{i}" for i in range(N_DEVICES)]
        expected = STEPS * captured[name]["n_collectives"]
        assert captured[name]["n_collectives"] >= 1
        assert [d.n_collectives for d in read.devices] == [expected] * N_DEVICES, name
    print(f"collective events per device = {STEPS} steps x the compiled program's "
          f"{captured['balanced']['n_collectives']} collectives: holds")


def test_captured_parts_add_up_to_the_wall_time(captured):
    read = _read(captured, "balanced")
    for d in read.devices:
        parts = d.compute_s + d.collective_s + d.waiting_s + d.idle_s
        assert parts == pytest.approx(d.wall_s, rel=1e-9), d  # exact by construction
        assert d.compute_s > 0 and d.collective_s + d.waiting_s > 0, d
        assert min(d.compute_s, d.collective_s, d.waiting_s, d.idle_s, d.overlap_s) >= 0, d
        assert sum(d.fractions().values()) == pytest.approx(1, rel=1e-9)
    steps = read.steps()
    assert len(steps) == STEPS
    assert sum(step.wall_s for step in steps) == pytest.approx(read.wall_s, rel=1e-9)
    assert sum(step.device("cpu:0").compute_s for step in steps) == \
        pytest.approx(read.device("cpu:0").compute_s, rel=1e-9)
    # The device windows of both programs lie inside the host's timing of the traced session.
    both_s = read.wall_s + _read(captured, "straggler").wall_s
    assert 0 < both_s <= captured["host_s"]
    print(f"parts sum to the wall ({read.wall_s * 1e3:.1f} ms over {STEPS} steps; both programs "
          f"{both_s * 1e3:.1f} ms, within the host's {captured['host_s'] * 1e3:.1f} ms): holds")


def test_captured_waits_lie_inside_a_collective_of_their_device(captured):
    read = _read(captured, "balanced")
    assert read.waits, "an all-reduce of 4 devices always has some device waiting for others"
    for device, start, end in read.waits:
        assert any(op.device == device and op.kind != "compute" and op.start_us <= start
                   and end <= op.end_us for op in read.ops)
    assert sum(d.waiting_s for d in read.devices) > 0


def test_a_straggler_shows_as_waiting_on_every_other_device(captured):
    read = _read(captured, "straggler")
    last = f"cpu:{N_DEVICES - 1}"
    assert profile.straggler(read) == last, read.table()
    slow = read.device(last)
    for d in read.devices:
        if d.device != last:
            assert d.waiting_s >= 5 * slow.waiting_s
    for step in read.steps():  # the least waiting device in every step
        assert min(step.devices, key=lambda d: d.waiting_s).device == last
    # Negative control: the balanced step has no straggler.
    assert profile.straggler(_read(captured, "balanced")) is None
    print(f"straggler found: {last}; none on the balanced trace: holds")


# --------------------------------------------------------------------- constructed traces

def _write(tmp_path: Path, events: list[dict], name: str = "t.trace.json.gz") -> Path:
    path = tmp_path / name
    with gzip.open(path, "wt") as f:
        json.dump({"displayTimeUnit": "ns", "traceEvents": events}, f)
    return path


def _meta(pid: int, name: str, tid: int | None = None) -> dict:
    if tid is None:
        return {"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}}
    return {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}}


def _x(pid: int, tid: int, name: str, ts: float, dur: float, **args) -> dict:
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": ts, "dur": dur, "args": args}


def gpu_trace() -> list[dict]:
    """Two GPUs, compute and NCCL streams; GPU 1 computes longer, GPU 0 waits in its NCCL kernel.

    GPU 0: compute 0-100 and 330-350 us; AllReduce kernel 80-330 on the NCCL stream (20 us of it
    under compute, 230 exposed). GPU 1: compute 0-310 and 330-350; AllReduce 310-330. Window
    0-350.
    """
    nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    return [
        _meta(1, "/host:CPU"), _meta(1, "python", 10),
        _meta(2, "/device:GPU:0"), _meta(2, "Stream #14(Compute)", 14),
        _meta(2, "Stream #20(Nccl)", 20), _meta(2, "XLA Ops", 99),
        _meta(3, "/device:GPU:1"), _meta(3, "Stream #14(Compute)", 14),
        _meta(3, "Stream #20(Nccl)", 20), _meta(3, "XLA Ops", 99),
        _x(1, 10, "PjitFunction(step)", -50, 500),  # host: ignored
        _x(2, 14, "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32", 0, 100),
        _x(2, 20, nccl, 80, 250),
        _x(2, 14, "loop_add_fusion", 330, 20),
        _x(2, 99, "fusion.3", 0, 350),  # a derived line: ignored
        _x(3, 14, "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32", 0, 310),
        _x(3, 20, nccl, 310, 20),
        _x(3, 14, "loop_add_fusion", 330, 20),
        _x(3, 99, "all-reduce-start.1", 0, 350),  # derived: ignored
    ]


def test_a_constructed_gpu_trace_reads_to_the_numbers_put_in(tmp_path):
    read = profile.read_trace(_write(tmp_path, gpu_trace()))
    assert read.source == "gpu" and read.n_steps == 1
    assert read.wall_s == pytest.approx(350e-6)
    gpu0, gpu1 = read.device("gpu:0"), read.device("gpu:1")
    assert (gpu0.compute_s, gpu0.collective_s, gpu0.waiting_s, gpu0.idle_s, gpu0.overlap_s) == \
        pytest.approx((120e-6, 230e-6, 0, 0, 20e-6), abs=1e-12)
    assert (gpu1.compute_s, gpu1.collective_s, gpu1.waiting_s, gpu1.idle_s, gpu1.overlap_s) == \
        pytest.approx((330e-6, 20e-6, 0, 0, 0), abs=1e-12)
    assert [d.n_collectives for d in read.devices] == [1, 1]
    assert [op.name for op in profile.overlapped_collectives(read)] == \
        [e["name"] for e in gpu_trace() if e.get("name", "").startswith("nccl")][:1]
    assert profile.straggler(read) == "gpu:1"


def test_a_constructed_cpu_trace_with_a_rendezvous_and_a_conditional(tmp_path):
    """XLA:CPU's shape (as in the captured traces): ops by device_ordinal on any thread, a wait
    inside the all-reduce on its thread, a conditional's event around its branch's ops."""
    op = lambda tid, name, ts, dur, dev: _x(7, tid, name, ts, dur, device_ordinal=str(dev),
                                           hlo_op=name, hlo_module="jit_step", run_id="5")
    events = [
        _meta(7, "/host:CPU"),
        op(1, "conditional", 0, 60, 0), op(1, "dot.1", 0, 25, 0), op(1, "dot.2", 30, 30, 0),
        op(2, "dot.1", 0, 10, 1),
        op(1, "all-reduce.1", 60, 40, 0), _x(7, 1, "Rendezvous", 61, 30),
        _x(7, 1, "Wait: pending_threads=1/2", 62, 4),  # device 1 is there already: a short one
        op(3, "all-reduce.1", 10, 90, 1), _x(7, 3, "Rendezvous", 11, 80),
        _x(7, 3, "Wait: pending_threads=1/2", 12, 50),
    ]
    read = profile.read_trace(_write(tmp_path, events))
    cpu0, cpu1 = read.device("cpu:0"), read.device("cpu:1")
    assert read.source == "xla-cpu" and read.wall_s == pytest.approx(100e-6)
    assert "conditional" not in {o.name for o in read.ops}  # a container, its branch counted
    assert (cpu0.compute_s, cpu0.collective_s, cpu0.waiting_s, cpu0.idle_s) == \
        pytest.approx((55e-6, 36e-6, 4e-6, 5e-6), abs=1e-12)
    assert (cpu1.compute_s, cpu1.collective_s, cpu1.waiting_s, cpu1.idle_s) == \
        pytest.approx((10e-6, 40e-6, 50e-6, 0), abs=1e-12)


def test_names_of_collectives():
    names = {
        "all-reduce.3": "all-reduce", "psum_invariant.7": "all-reduce",
        "all-gather-start.1": "all-gather", "reduce-scatter": "reduce-scatter",
        "psum_scatter.2": "reduce-scatter", "all-to-all.4": "all-to-all",
        "collective-permute-done": "collective-permute", "ppermute.1": "collective-permute",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL": "all-reduce",
        "ncclKernel_AllGather_RING_LL_Sum_int8_t": "all-gather",
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_SIMPLE": "reduce-scatter",
        "ncclDevKernel_SendRecv": "collective-permute",
        "ncclDevKernel_Broadcast_RING_LL": "collective-broadcast",
        "dot.1": None, "loop_add_fusion": None, "ynn_fusion.3": None,
        "sm90_xmma_gemm_f32f32": None,
    }
    assert {n: profile.collective_kind(n) for n in names} == names


def test_missing_and_empty_traces_say_what_to_do(tmp_path):
    with pytest.raises(profile.TraceError, match="capture"):
        profile.find_trace(tmp_path / "nowhere")
    with pytest.raises(profile.TraceError, match="no trace file"):
        profile.find_trace(tmp_path)
    with pytest.raises(profile.TraceError, match="No trace file"):
        profile.read_trace(tmp_path / "missing.trace.json.gz")
    with pytest.raises(profile.TraceError, match="empty trace"):
        profile.read_trace(_write(tmp_path, [_meta(1, "/host:CPU")], "empty.trace.json.gz"))
    host_only = [_meta(1, "/host:CPU"), _x(1, 1, "PjitFunction(step)", 0, 10)]
    with pytest.raises(profile.TraceError, match="enable_cpu_op_events"):
        profile.read_trace(_write(tmp_path, host_only, "host.trace.json.gz"))
    (tmp_path / "bad.trace.json").write_text("not json")
    with pytest.raises(profile.TraceError, match="not a JSON trace"):
        profile.read_trace(tmp_path / "bad.trace.json")


def test_a_module_the_trace_does_not_hold_is_named(captured):
    with pytest.raises(profile.TraceError, match="jit_balanced"):
        profile.read_trace(captured["path"], module="jit_nothing")
    # The two programs of one session are told apart: all of each's ops are its module's.
    balanced, straggling = _read(captured, "balanced"), _read(captured, "straggler")
    assert not {op.step for op in balanced.ops} & {op.step for op in straggling.ops}


def test_the_flag_cannot_be_set_once_jax_has_started(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "")  # conftest has set up JAX's backends already
    with pytest.raises(RuntimeError, match="restart the kernel"):
        profile.enable_cpu_op_events()
    monkeypatch.setenv("XLA_FLAGS", profile.CPU_OP_EVENTS_FLAG)
    profile.enable_cpu_op_events()  # already there: harmless


def test_the_timeline_draws_one_row_per_device(tmp_path):
    read = profile.read_trace(_write(tmp_path, gpu_trace()))
    ax = plotting.profile_timeline(read)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["gpu:0", "gpu:1"]
    assert len(ax.collections) == 2 * 3  # compute, collective and waiting bars per device
    with pytest.raises(ValueError, match="numbered from 0"):
        plotting.profile_timeline(read, step=1)
    plt.close("all")
