"""Unit tests of clusterlab.device.dataloader: shards on disk, the source, the loader, the read cap."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from clusterlab.device import dataloader


def _arrays(n: int = 100, d: int = 8) -> dict[str, np.ndarray]:
    x = np.arange(n * d, dtype=np.float32).reshape(n, d)  # x: f32[N, D], row i starts at i*D
    return {"x": x, "y": np.arange(n, dtype=np.int32)}


@pytest.fixture()
def dataset(tmp_path):
    directory = tmp_path / "ds"
    dataloader.write_shards(directory, _arrays(), samples_per_shard=30)
    return directory


def test_write_and_read_back(dataset):
    info = dataloader.read_info(dataset)
    assert info.n_samples == 100
    assert info.shard_sizes == (30, 30, 30, 10)
    assert info.fields == {"x": ((8,), "float32"), "y": ((), "int32")}
    assert info.bytes_per_sample == 8 * 4 + 4
    assert info.total_bytes == 100 * 36
    source = dataloader.ShardedSource(dataset)
    assert len(source) == 100
    for i in (0, 29, 30, 99):
        sample = source[i]
        np.testing.assert_array_equal(sample["x"], _arrays()["x"][i])
        assert int(sample["y"]) == i
    assert source.samples_read == 4 and source.bytes_read == 4 * 36
    with pytest.raises(IndexError):
        source[100]
    assert "/" not in repr(source)  # no machine paths in lab outputs


def test_synthetic_tokens_use_the_smallest_integer_type(tmp_path):
    info = dataloader.write_synthetic_tokens(tmp_path / "t", n_samples=10, seq_len=16,
                                       vocab_size=1000, samples_per_shard=4)
    assert info.fields == {"tokens": ((16,), "uint16")}
    tokens = np.stack([dataloader.ShardedSource(tmp_path / "t")[i]["tokens"] for i in range(10)])
    assert tokens.max() < 1000
    info = dataloader.write_synthetic_tokens(tmp_path / "u", n_samples=2, seq_len=4,
                                       vocab_size=100_000)
    assert info.fields["tokens"][1] == "uint32"


def _take(loader, n):
    return [next(loader) for _ in range(n)]


def test_loader_order_is_seeded_and_each_epoch_a_permutation(dataset):
    source = dataloader.ShardedSource(dataset)
    a = _take(dataloader.Loader(source, batch_size=10, seed=3), 20)  # two epochs
    b = _take(dataloader.Loader(source, batch_size=10, seed=3), 20)
    c = _take(dataloader.Loader(source, batch_size=10, seed=4), 10)
    assert all(np.array_equal(p["y"], q["y"]) for p, q in zip(a, b))
    assert not all(np.array_equal(p["y"], q["y"]) for p, q in zip(a, c))
    epoch0 = np.concatenate([batch["y"] for batch in a[:10]])
    epoch1 = np.concatenate([batch["y"] for batch in a[10:]])
    assert sorted(epoch0) == sorted(epoch1) == list(range(100))
    assert not np.array_equal(epoch0, epoch1)  # a new order every epoch
    assert a[0]["x"].shape == (10, 8) and a[0]["y"].shape == (10,)
    np.testing.assert_array_equal(a[0]["x"][:, 0], a[0]["y"] * 8.0)  # fields stay together


def test_loader_resumes_at_its_position_whatever_the_prefetching(dataset):
    source = dataloader.ShardedSource(dataset)
    loader = dataloader.Loader(source, batch_size=16, seed=1, prefetch=4, workers=3)
    first = _take(loader, 9)
    assert loader.position == 9
    resumed = dataloader.Loader(source, batch_size=16, seed=1, start_step=5, prefetch=0)
    for batch in first[5:]:
        np.testing.assert_array_equal(next(resumed)["y"], batch["y"])
    assert resumed.position == 9
    in_order = _take(dataloader.Loader(source, batch_size=25, shuffle=False), 5)
    np.testing.assert_array_equal(in_order[4]["y"], np.arange(25))  # epoch 2 starts again


def test_loader_counts_what_it_delivers(dataset):
    loader = dataloader.Loader(dataloader.ShardedSource(dataset), batch_size=10)
    _take(loader, 7)
    stats = loader.stats()
    assert stats.samples == 70 and stats.bytes == 70 * 36
    assert stats.elapsed_s > 0 and stats.wait_s <= stats.elapsed_s + 1e-9
    assert stats.samples_per_s == pytest.approx(70 / stats.elapsed_s)
    assert stats.bytes_per_s == pytest.approx(70 * 36 / stats.elapsed_s)
    assert "samples/s" in str(stats) and "MB/s" in str(stats)


def test_read_cap_bounds_throughput_even_with_many_workers(tmp_path):
    sample_bytes = 1024
    dataloader.write_shards(tmp_path / "big", {"x": np.zeros((64, sample_bytes), np.uint8)},
                      samples_per_shard=16)
    cap_bytes_per_s = 200e3
    source = dataloader.ShardedSource(tmp_path / "big", read_bytes_per_s=cap_bytes_per_s)
    assert source.read_bytes_per_s == cap_bytes_per_s
    loader = dataloader.Loader(source, batch_size=8, prefetch=4, workers=4)
    start_s = time.perf_counter()
    _take(loader, 6)  # 48 samples = 49,152 bytes
    elapsed_s = time.perf_counter() - start_s
    # The pipe is shared: 48 KiB at 200 kB/s take at least 0.246 s, whatever the threads.
    assert elapsed_s >= 48 * sample_bytes / cap_bytes_per_s * 0.99
    assert loader.stats().bytes_per_s <= cap_bytes_per_s * 1.01


@pytest.mark.parametrize("cap", [0, 0.0, -5.0, float("inf")])
def test_a_read_cap_must_be_positive(dataset, cap):
    with pytest.raises(ValueError, match="read"):
        dataloader.ShardedSource(dataset, read_bytes_per_s=cap)
    assert dataloader.read_info(dataset).n_samples == 100  # the dataset is untouched


def test_empty_and_missing_datasets_get_clear_errors(tmp_path, dataset):
    with pytest.raises(ValueError, match="empty dataset"):
        dataloader.write_shards(tmp_path / "empty", {"x": np.zeros((0, 4))}, samples_per_shard=8)
    assert not (tmp_path / "empty" / dataloader.MANIFEST).exists()
    with pytest.raises(ValueError, match="at least one field"):
        dataloader.write_shards(tmp_path / "none", {}, samples_per_shard=8)
    with pytest.raises(FileNotFoundError, match="manifest"):
        dataloader.ShardedSource(tmp_path / "nowhere")
    # A manifest that describes no samples (hand-made or from another tool).
    (tmp_path / "zero").mkdir()
    (tmp_path / "zero" / dataloader.MANIFEST).write_text(json.dumps(
        {"format": "clusterlab-npy-shards-v1", "n_samples": 0, "shard_sizes": [],
         "fields": {"x": {"shape": [4], "dtype": "float32"}}}))
    with pytest.raises(ValueError, match="empty"):
        dataloader.ShardedSource(tmp_path / "zero")
    with pytest.raises(ValueError, match="batch_size"):
        dataloader.Loader(dataloader.ShardedSource(dataset), batch_size=101)


def test_an_existing_dataset_is_never_overwritten(dataset):
    before = {p.name: p.read_bytes() for p in dataset.iterdir()}
    with pytest.raises(ValueError, match="already holds a dataset"):
        dataloader.write_shards(dataset, {"x": np.ones((5, 2))}, samples_per_shard=5)
    assert {p.name: p.read_bytes() for p in dataset.iterdir()} == before


def test_a_half_written_dataset_is_not_a_dataset(dataset):
    (dataset / "shard-00002.x.npy").unlink()  # as if the writer had died
    with pytest.raises(FileNotFoundError, match="shard-00002.x.npy"):
        dataloader.ShardedSource(dataset)
    (dataset / dataloader.MANIFEST).write_text("{not json")
    with pytest.raises(ValueError, match="cannot be read"):
        dataloader.read_info(dataset)
