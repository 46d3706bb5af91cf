"""Unit tests of clusterlab.device.checkpoint: round trips, keep-k, atomic writes, resharding, errors."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from clusterlab.device import checkpoint, devices, models, train_demo

from conftest import DEVICES, run_python


def _state(step: int = 0, *, d_hidden: int = 16, seed: int = 0) -> checkpoint.TrainState:
    params = models.init_mlp(jax.random.key(seed), d_model=8, d_hidden=d_hidden, n_blocks=2)
    optimizer = models.make_optimizer()
    return checkpoint.TrainState(step=step, params=params, opt_state=optimizer.init(params),
                                 loader_position=3 * step, rng=jax.random.key(seed + 7))


def _leaves(state: checkpoint.TrainState) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves((state.params, state.opt_state,
                                                    jax.random.key_data(state.rng)))]


def _files(directory) -> dict[str, int]:
    return {str(p.relative_to(directory)): p.stat().st_size
            for p in sorted(directory.rglob("*")) if p.is_file()}


def test_round_trip_is_bit_exact(tmp_path):
    state = _state(5)
    with checkpoint.Checkpoints(tmp_path / "c") as ckpts:
        ckpts.save(state)
        assert ckpts.steps() == [5] and ckpts.latest_step() == 5
        assert ckpts.step_bytes(5) > models.param_bytes(state.params)
        restored = ckpts.restore(_state(0))
    assert restored.step == 5 and restored.loader_position == 15
    assert jax.tree.structure(restored.opt_state) == jax.tree.structure(state.opt_state)
    assert jnp.issubdtype(restored.rng.dtype, jax.dtypes.prng_key)
    assert train_demo.bitwise_equal(_leaves(restored), _leaves(state))
    # A target of shapes only (jax.eval_shape) restores just as well.
    shapes = checkpoint.TrainState(0, *jax.eval_shape(lambda: (state.params, state.opt_state)),
                                   0, state.rng)
    with checkpoint.Checkpoints(tmp_path / "c", create=False) as ckpts:
        assert train_demo.bitwise_equal(_leaves(ckpts.restore(shapes)), _leaves(state))
        assert "/" not in repr(ckpts)


def test_keeps_the_last_k_and_refuses_to_rewrite_history(tmp_path):
    with checkpoint.Checkpoints(tmp_path / "c", max_to_keep=2) as ckpts:
        for step in (1, 2, 3, 4):
            ckpts.save(_state(step))
        assert ckpts.steps() == [3, 4]
        assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["3", "4"]
        with pytest.raises(ValueError, match="already exists"):
            ckpts.save(_state(4))
        assert ckpts.restore(_state(), step=3).loader_position == 9
        with pytest.raises(checkpoint.CheckpointError, match=r"complete ones are \[3, 4\]"):
            ckpts.restore(_state(), step=1)


def test_a_write_interrupted_before_its_rename_is_ignored(tmp_path, monkeypatch):
    """orbax writes into <step>.orbax-checkpoint-tmp and renames: stop it just before."""
    from orbax.checkpoint._src.path import async_path

    directory = tmp_path / "c"
    with checkpoint.Checkpoints(directory) as ckpts:
        ckpts.save(_state(1))

    async def no_rename(*args, **kwargs):
        raise KeyboardInterrupt("killed just before the rename")

    monkeypatch.setattr(async_path, "rename", no_rename)
    ckpts = checkpoint.Checkpoints(directory)
    with pytest.raises(BaseException, match="killed just before the rename"):
        ckpts.save(_state(2, seed=1))
    monkeypatch.undo()
    names = sorted(p.name for p in directory.iterdir())
    assert names[0] == "1" and len(names) == 2 and "orbax-checkpoint-tmp" in names[1]
    tmp_files = _files(directory / names[1])
    assert any(name.endswith("commit_success.txt") for name in tmp_files)  # fully written
    with checkpoint.Checkpoints(directory) as fresh:
        assert fresh.steps() == [1]  # the unrenamed step 2 does not count
        restored = fresh.restore(_state())
    assert restored.step == 1
    assert train_demo.bitwise_equal(_leaves(restored), _leaves(_state(1)))


def test_a_half_written_temporary_directory_is_never_read(tmp_path):
    directory = tmp_path / "c"
    with checkpoint.Checkpoints(directory) as ckpts:
        ckpts.save(_state(1))
    partial = directory / "9.orbax-checkpoint-tmp"
    partial.mkdir()
    (partial / "_CHECKPOINT_METADATA").write_text("{trunc")
    with checkpoint.Checkpoints(directory) as ckpts:
        assert ckpts.steps() == [1]
        assert ckpts.restore(_state()).step == 1
        ckpts.save(_state(2))  # later steps are written as usual
        assert ckpts.steps() == [1, 2]


def test_missing_directory_and_no_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="No checkpoint directory"):
        checkpoint.Checkpoints(tmp_path / "nowhere", create=False)
    assert not (tmp_path / "nowhere").exists()
    (tmp_path / "empty").mkdir()
    with checkpoint.Checkpoints(tmp_path / "empty", create=False) as ckpts:
        assert ckpts.latest_step() is None
        with pytest.raises(checkpoint.CheckpointError, match="no complete checkpoint"):
            ckpts.restore(_state())


def test_a_checkpoint_of_another_model_shape_is_refused_and_kept(tmp_path):
    directory = tmp_path / "c"
    with checkpoint.Checkpoints(directory) as ckpts:
        ckpts.save(_state(1, d_hidden=16))
    before = _files(directory)
    with checkpoint.Checkpoints(directory) as ckpts:
        with pytest.raises(checkpoint.CheckpointError,
                           match=r"does not fit this model .*w1.*float32\[8, 16\].*\[8, 32\]"):
            ckpts.restore(_state(d_hidden=32))
    assert _files(directory) == before


@pytest.mark.parametrize("damage", ["array data", "metadata", "json"])
def test_a_corrupted_checkpoint_gets_a_clear_error_and_nothing_is_deleted(tmp_path, damage):
    directory = tmp_path / "c"
    with checkpoint.Checkpoints(directory) as ckpts:
        ckpts.save(_state(1))
        ckpts.save(_state(2, seed=1))
    if damage == "array data":
        targets = [p for p in (directory / "2" / "state").rglob("*")
                   if p.is_file() and p.parent.name == "d"]
    elif damage == "metadata":
        targets = [directory / "2" / "state" / "_METADATA"]
    else:
        targets = [directory / "2" / "meta" / "metadata"]
    assert targets
    for path in targets:
        path.write_bytes(b"\x00garbage" * 3)
    before = _files(directory)
    with checkpoint.Checkpoints(directory) as ckpts:
        with pytest.raises(checkpoint.CheckpointError,
                           match=r"step 2 cannot be read.*left on disk.*\[1\]"):
            ckpts.restore(_state())
        assert _files(directory) == before  # nothing deleted or rewritten
        older = ckpts.restore(_state(), step=1)  # the older one still restores
    assert train_demo.bitwise_equal(_leaves(older), _leaves(_state(1)))
    assert _files(directory) == before


def _sharded_state(mesh) -> checkpoint.TrainState:
    w = jnp.arange(16 * 6, dtype=jnp.float32).reshape(16, 6) / 7.0  # w: f32[16, 6]
    params = {"w": devices.shard(w, mesh, P("data")), "b": jnp.ones(6) / 3.0}
    opt_state = models.make_optimizer().init(params)
    return checkpoint.TrainState(step=4, params=params, opt_state=opt_state,
                                 loader_position=8, rng=jax.random.key(3))


_RESTORE_SCRIPT = """
import sys
from clusterlab.device import devices
n = int(sys.argv[2])
devices.setup(n)
import jax
from jax.sharding import NamedSharding, PartitionSpec as P
from clusterlab.device import checkpoint, models, train_demo
import jax.numpy as jnp
mesh = devices.mesh((n,), ("data",))
params = {"w": jnp.zeros((16, 6)), "b": jnp.zeros(6)}
opt_state = models.make_optimizer().init(params)
shardings = jax.tree.map(lambda x: NamedSharding(mesh, P("data") if x.ndim == 2 else P()),
                         (params, opt_state))
target = checkpoint.TrainState(0, *checkpoint.abstract((params, opt_state), shardings), 0,
                               jax.random.key(0))
with checkpoint.Checkpoints(sys.argv[1], create=False) as ckpts:
    state = ckpts.restore(target)
w = state.params["w"]
print("devices", len(w.sharding.device_set), "shard", w.addressable_shards[0].data.shape)
print("digest", train_demo.digest((state.params, state.opt_state, jax.random.key_data(state.rng))))
"""


def test_save_on_8_devices_restore_on_4_2_and_1(tmp_path):
    mesh8 = devices.mesh((8,), ("data",), DEVICES)
    state = _sharded_state(mesh8)
    assert len(state.params["w"].sharding.device_set) == 8
    with checkpoint.Checkpoints(tmp_path / "c") as ckpts:
        ckpts.save(state)
    expected = train_demo.digest((state.params, state.opt_state, jax.random.key_data(state.rng)))
    # In this process: onto 2 of the 8 devices.
    mesh2 = devices.mesh((2,), ("data",), DEVICES[:2])
    target = checkpoint.TrainState(0, *checkpoint.abstract(
        (state.params, state.opt_state), NamedSharding(mesh2, P())), 0, state.rng)
    with checkpoint.Checkpoints(tmp_path / "c", create=False) as ckpts:
        on2 = ckpts.restore(target)
    assert on2.params["w"].sharding.device_set == set(DEVICES[:2])
    assert train_demo.digest((on2.params, on2.opt_state,
                              jax.random.key_data(on2.rng))) == expected
    # In fresh processes (the device count is fixed per process): 4 devices, then 1.
    script = tmp_path / "restore.py"
    script.write_text(_RESTORE_SCRIPT)
    for n, shard_rows in ((4, 4), (1, 16)):
        result = run_python(str(script), str(tmp_path / "c"), str(n),
                            extra_env={"JAX_PLATFORMS": "cpu"})
        assert result.returncode == 0, result.stderr[-2000:]
        assert f"devices {n} shard ({shard_rows}, 6)" in result.stdout
        assert f"digest {expected}" in result.stdout


def test_abstract_keeps_or_replaces_shardings():
    mesh = devices.mesh((2,), ("data",), DEVICES[:2])
    x = devices.shard(jnp.ones((4, 2)), mesh, P("data"))
    kept = checkpoint.abstract({"x": x})
    assert kept["x"].shape == (4, 2) and kept["x"].sharding == x.sharding
    replaced = checkpoint.abstract({"x": x}, NamedSharding(mesh, P()))
    assert replaced["x"].sharding.spec == P()
