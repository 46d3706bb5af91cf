"""clusterlab.device.devices: set-up of real or simulated devices, meshes, sharding checks."""

from __future__ import annotations

import os
import re

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from clusterlab.device import devices
from conftest import DEVICES, run_python


def test_conftest_gave_eight_devices():
    assert len(DEVICES) == 8
    assert len({d.id for d in DEVICES}) == 8


def test_setup_again_with_the_same_count_is_harmless(capsys):
    again = devices.setup(8)
    assert list(again) == list(DEVICES)
    assert "8" in capsys.readouterr().out


def test_setup_with_another_count_after_jax_started_says_restart():
    with pytest.raises(devices.DeviceSetupError,
                       match=r"already initialised with 8 CPU device\(s\).*4 were asked for.*"
                             r"restart the kernel.*setup\(4\)"):
        devices.setup(4)


def test_setup_with_another_count_in_a_fresh_process_says_restart():
    code = ("from clusterlab.device import devices\n"
            "devices.setup(8)\n"
            "devices.setup(4)\n")
    # Simulated devices even on a GPU host, where setup(4) after setup(8) is fine.
    result = run_python("-c", code, extra_env={devices.PLATFORM_ENV: "cpu"})
    assert result.returncode == 1
    assert "using 8 simulated CPU devices in this process" in result.stdout
    assert "DeviceSetupError" in result.stderr
    assert re.search(r"already initialised with 8 CPU device\(s\).*restart the kernel",
                     result.stderr)


@pytest.mark.parametrize("n", [0, -1, 2.5, True, "8"])
def test_setup_rejects_counts_that_are_not_positive_integers(n):
    with pytest.raises(ValueError, match=r"setup\(n_devices\) needs a positive whole number of devices"):
        devices.setup(n)


def test_setup_rejects_absurd_counts():
    with pytest.raises(ValueError, match=r"setup\(1000000\) asks for more simulated devices "
                                         r"than is sensible"):
        devices.setup(10**6)


def test_describe(capsys):
    text = devices.describe(DEVICES)
    assert capsys.readouterr().out.strip() == text
    assert f"jax {jax.__version__}" in text
    if DEVICES[0].platform == "cpu":
        assert ("devices: 8 simulated CPU devices in this process, sharing the host's "
                f"{os.cpu_count()} core") in text
        assert "devices: 1 of 8 simulated CPU devices" in devices.describe(DEVICES[:1])
    else:
        assert f"devices: 8 accelerators ({DEVICES[0].platform.upper()}" in text
    assert "1 process\n" in text and "processs" not in text


def test_one_cpu_device_is_the_host_not_a_simulation():
    code = ("from clusterlab.device import devices\n"
            "devices.describe(devices.setup(1))\n")
    result = run_python("-c", code, extra_env={devices.PLATFORM_ENV: "cpu"})
    assert result.returncode == 0, result.stderr
    assert "using the host CPU as 1 device" in result.stdout
    assert "devices: the host CPU as 1 device" in result.stdout
    assert "simulated CPU devices" not in result.stdout


def test_mesh_shape_names_and_auto_axes():
    mesh = devices.mesh((2, 4), ("data", "model"), DEVICES)
    assert dict(mesh.shape) == {"data": 2, "model": 4}
    assert mesh.axis_names == ("data", "model")
    assert tuple(mesh.axis_types) == (AxisType.Auto, AxisType.Auto)
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in DEVICES)


def test_mesh_defaults_to_all_devices():
    n = len(jax.devices())
    assert devices.mesh((n,), ("x",)).devices.size == n


def test_sub_mesh_over_first_devices():
    mesh = devices.mesh((3,), ("x",), DEVICES[:3])
    assert [d.id for d in mesh.devices.flat] == [d.id for d in DEVICES[:3]]


@pytest.mark.parametrize("shape", [(3,), (2, 2), (4, 4)])
def test_mesh_with_wrong_product(shape):
    product = int(np.prod(shape))
    names = ("a", "b")[:len(shape)]
    with pytest.raises(ValueError, match=rf"A mesh of shape {re.escape(str(shape))} needs "
                                         rf"{product} devices, but 8 are available"):
        devices.mesh(shape, names, DEVICES)


def test_mesh_needs_one_name_per_axis():
    with pytest.raises(ValueError, match="one name per axis"):
        devices.mesh((2, 4), ("data",), DEVICES)


def test_mesh_axes_need_a_device():
    with pytest.raises(ValueError, match="at least one device"):
        devices.mesh((0, 8), ("a", "b"), DEVICES)


def test_shard_places_blocks():
    mesh = devices.mesh((2, 4), ("data", "model"), DEVICES)
    x = np.arange(4 * 8, dtype=np.float32).reshape(4, 8)
    y = devices.shard(x, mesh, P("data", "model"))
    assert y.sharding == NamedSharding(mesh, P("data", "model"))
    assert {s.data.shape for s in y.addressable_shards} == {(2, 2)}
    np.testing.assert_array_equal(np.asarray(y), x)


def test_shard_over_two_axes_at_once():
    mesh = devices.mesh((2, 4), ("data", "model"), DEVICES)
    y = devices.shard(np.arange(16), mesh, P(("data", "model")))
    assert {s.data.shape for s in y.addressable_shards} == {(2,)}


def test_shard_rejects_sizes_that_do_not_divide():
    mesh = devices.mesh((8,), ("x",), DEVICES)
    with pytest.raises(ValueError, match=r"Dimension 0 of an array of shape \(10,\) has size 10, "
                                         r"which does not divide into 8 shards.*e\.g\. 16"):
        devices.shard(np.arange(10), mesh, P("x"))
    mesh2 = devices.mesh((2, 4), ("data", "model"), DEVICES)
    with pytest.raises(ValueError, match=r"Dimension 1 .* has size 6, which does not divide "
                                         r"into 4 shards"):
        devices.shard(np.zeros((4, 6)), mesh2, P("data", "model"))
    with pytest.raises(ValueError, match=r"size 12, which does not divide into 8 shards over "
                                         r"mesh axes \('data', 'model'\)"):
        devices.shard(np.zeros(12), mesh2, P(("data", "model")))


def test_shard_rejects_unknown_axes_and_long_specs():
    mesh = devices.mesh((8,), ("x",), DEVICES)
    with pytest.raises(ValueError, match=r"Mesh axis 'y' is not in the mesh"):
        devices.shard(np.zeros(8), mesh, P("y"))
    with pytest.raises(ValueError, match=r"has 2 entries but the array has only 1 dimension"):
        devices.shard(np.zeros(8), mesh, P("x", None))


def test_check_divides_accepts_what_divides():
    mesh = devices.mesh((2, 4), ("data", "model"), DEVICES)
    assert devices.check_divides((6, 8), mesh, P("data", "model")) is None
    assert devices.check_divides((5, 7), mesh, P()) is None
