"""A dataset on disk and a prefetching loader with throughput counters and a read-bandwidth cap.

A dataset here is a directory of NumPy ``.npy`` shards, one file per field per shard
(``shard-00000.x.npy``, ``shard-00000.y.npy``, ...), described by ``manifest.json``. Every
sample has the same shape per field, so sample ``i`` lives at a known row of a known shard and
can be read on its own: the random access a shuffling loader needs.

:class:`ShardedSource` reads samples (it is a ``grain`` random-access data source) and can
throttle itself to a read bandwidth, like a slow disk or a shared file system: the cap is a
pipe of ``read_bytes_per_s`` that all reading threads share. :class:`Loader` builds a ``grain``
pipeline over it (global shuffle with a seed, batching, ``workers`` reading threads,
``prefetch`` batches read ahead) and counts what it delivers (samples/s, MB/s) and how long
the consumer waited. Its position is the number of batches delivered, so a checkpoint that
stores it resumes the exact same data order.

Units: bytes, seconds, bytes per second (1 MB/s = 1e6 bytes/s).

References:
    grain, the JAX ecosystem's data loader. https://google-grain.readthedocs.io
    Mohan et al., "Analyzing and Mitigating Data Stalls in DNN Training", VLDB 2021.
    https://arxiv.org/abs/2007.06775
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np

from clusterlab._checks import count as _check_count, positive as _check_positive

__all__ = [
    "MANIFEST", "DatasetInfo", "write_shards", "write_synthetic_tokens", "read_info",
    "ReadLimiter", "ShardedSource", "LoaderStats", "Loader",
]

MANIFEST = "manifest.json"
_FORMAT = "clusterlab-npy-shards-v1"


@dataclass(frozen=True)
class DatasetInfo:
    """What ``manifest.json`` says about a dataset on disk."""

    n_samples: int                                   # samples in the whole dataset
    fields: dict[str, tuple[tuple[int, ...], str]]   # name -> (shape of one sample, dtype)
    shard_sizes: tuple[int, ...]                     # samples per shard, in order

    @property
    def bytes_per_sample(self) -> int:
        """Bytes of one sample, all fields together."""
        return int(sum(np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64))
                       for shape, dtype in self.fields.values()))

    @property
    def total_bytes(self) -> int:
        """Bytes of the whole dataset's samples (the ``.npy`` headers not counted)."""
        return self.n_samples * self.bytes_per_sample


def _shard_file(directory: Path, shard: int, field: str) -> Path:
    return directory / f"shard-{shard:05d}.{field}.npy"


def write_shards(directory: str | os.PathLike, arrays: Mapping[str, np.ndarray], *,
                 samples_per_shard: int) -> DatasetInfo:
    """Write arrays as a sharded dataset: row ``i`` of every array is sample ``i``.

    Each shard file is written under a temporary name and renamed when complete, and the
    manifest is written last, so a killed writer never leaves a dataset that looks whole.

    Args:
        directory: where to write (created if missing; must not already hold a dataset).
        arrays: field name -> array whose first dimension is the sample index, e.g.
            ``{"x": f32[N, D], "y": f32[N, D]}``; every array has the same ``N >= 1``.
        samples_per_shard: samples per shard file (the last shard may hold fewer).

    Returns:
        The :class:`DatasetInfo` written to ``manifest.json``.

    Raises:
        ValueError: on no fields, an empty dataset, arrays of different lengths, a field name
            that is not a plain identifier, or a directory that already holds a dataset.
    """
    _check_count("samples_per_shard", samples_per_shard)
    if not arrays:
        raise ValueError("write_shards needs at least one field, e.g. {'x': x, 'y': y}.")
    arrays = {name: np.asarray(a) for name, a in arrays.items()}
    for name, a in arrays.items():
        if not name.isidentifier():
            raise ValueError(f"Field names must be identifiers (they become file names), got "
                             f"{name!r}.")
        if a.ndim == 0:
            raise ValueError(f"Field {name!r} is a scalar; give an array with one row per "
                             "sample.")
    lengths = {name: a.shape[0] for name, a in arrays.items()}
    n = next(iter(lengths.values()))
    if len(set(lengths.values())) != 1:
        raise ValueError(f"Every field needs the same number of samples, got {lengths}.")
    if n == 0:
        raise ValueError("Cannot write an empty dataset: the arrays have 0 samples. A loader "
                         "needs at least one batch of samples.")
    directory = Path(directory)
    if (directory / MANIFEST).exists():
        raise ValueError("That directory already holds a dataset (it has a manifest.json); "
                         "write to a new directory, or delete the old dataset yourself first.")
    directory.mkdir(parents=True, exist_ok=True)
    shard_sizes = []
    for shard, start in enumerate(range(0, n, samples_per_shard)):
        stop = min(n, start + samples_per_shard)
        for name, a in arrays.items():
            final = _shard_file(directory, shard, name)
            tmp = final.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                np.save(f, np.ascontiguousarray(a[start:stop]))
            os.replace(tmp, final)
        shard_sizes.append(stop - start)
    info = DatasetInfo(n_samples=n,
                       fields={name: (tuple(a.shape[1:]), str(a.dtype))
                               for name, a in arrays.items()},
                       shard_sizes=tuple(shard_sizes))
    manifest = {"format": _FORMAT, "n_samples": n, "shard_sizes": list(shard_sizes),
                "fields": {name: {"shape": list(shape), "dtype": dtype}
                           for name, (shape, dtype) in info.fields.items()}}
    tmp = directory / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, directory / MANIFEST)
    return info


def write_synthetic_tokens(directory: str | os.PathLike, *, n_samples: int, seq_len: int,
                           vocab_size: int = 50_257, samples_per_shard: int = 1024,
                           seed: int = 0) -> DatasetInfo:
    """Write random token sequences (``uint16`` ids when they fit, else ``uint32``).

    Args:
        directory: where to write.
        n_samples: number of sequences.
        seq_len: tokens per sequence.
        vocab_size: ids are drawn uniformly from ``[0, vocab_size)``.
        samples_per_shard: sequences per shard file.
        seed: seed of NumPy's generator.

    Returns:
        The dataset's :class:`DatasetInfo`; one field ``"tokens"`` of shape ``[seq_len]``.
    """
    _check_count("n_samples", n_samples)
    _check_count("seq_len", seq_len)
    _check_count("vocab_size", vocab_size)
    dtype = np.uint16 if vocab_size <= 2**16 else np.uint32
    tokens = np.random.default_rng(seed).integers(0, vocab_size, size=(n_samples, seq_len),
                                                  dtype=dtype)  # u16[N, S]
    return write_shards(directory, {"tokens": tokens}, samples_per_shard=samples_per_shard)


def read_info(directory: str | os.PathLike) -> DatasetInfo:
    """Read and check a dataset's ``manifest.json``.

    Raises:
        FileNotFoundError: when the directory or its manifest is missing, or a shard file is.
        ValueError: when the manifest is unreadable or describes an empty dataset.
    """
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.exists():
        raise FileNotFoundError(
            f"No dataset in {directory.name!r}: it has no {MANIFEST}. Write one with "
            "clusterlab.device.dataloader.write_shards (a killed writer leaves no manifest, on purpose).")
    try:
        manifest = json.loads(path.read_text())
        if manifest.get("format") != _FORMAT:
            raise ValueError(f"unknown format {manifest.get('format')!r}")
        info = DatasetInfo(
            n_samples=int(manifest["n_samples"]),
            fields={name: (tuple(int(s) for s in spec["shape"]), str(np.dtype(spec["dtype"])))
                    for name, spec in manifest["fields"].items()},
            shard_sizes=tuple(int(s) for s in manifest["shard_sizes"]))
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"The dataset manifest {MANIFEST} cannot be read ({err}); rewrite the "
                         "dataset with clusterlab.device.dataloader.write_shards.") from None
    if info.n_samples == 0 or not info.fields:
        raise ValueError("The dataset is empty (0 samples or no fields): there is nothing to "
                         "load. Write at least one batch of samples.")
    if sum(info.shard_sizes) != info.n_samples:
        raise ValueError(f"The manifest's shard sizes add up to {sum(info.shard_sizes)}, not "
                         f"{info.n_samples} samples; rewrite the dataset.")
    for shard in range(len(info.shard_sizes)):
        for name in info.fields:
            if not _shard_file(directory, shard, name).exists():
                raise FileNotFoundError(f"Shard file {_shard_file(directory, shard, name).name}"
                                        " is missing; rewrite the dataset.")
    return info


class ReadLimiter:
    """A pipe of fixed bandwidth that every reading thread shares.

    A read of ``n`` bytes occupies the pipe for ``n / read_bytes_per_s`` seconds after the
    previous read ends (or now, if the pipe is idle); the caller sleeps until its bytes are
    through. Several threads therefore share the cap, as readers of one disk or one storage
    link do, and sleeping costs no CPU, so computation overlaps it.

    Args:
        read_bytes_per_s: the bandwidth, > 0. (No cap at all: do not make a limiter.)
    """

    def __init__(self, read_bytes_per_s: float):
        if read_bytes_per_s is None or read_bytes_per_s == 0:
            raise ValueError(
                f"A read cap must be a positive number of bytes per second, got "
                f"{read_bytes_per_s!r}: a cap of 0 would never deliver a byte. Use "
                "read_bytes_per_s=None for no cap.")
        self.read_bytes_per_s = _check_positive("read_bytes_per_s", read_bytes_per_s)
        self._lock = threading.Lock()
        self._free_at_s = 0.0  # time.perf_counter() when the pipe is next idle

    def acquire(self, nbytes: int) -> None:
        """Block until ``nbytes`` have gone through the pipe."""
        with self._lock:
            now_s = time.perf_counter()
            start_s = max(now_s, self._free_at_s)
            self._free_at_s = start_s + nbytes / self.read_bytes_per_s
            done_s = self._free_at_s
        delay_s = done_s - time.perf_counter()
        if delay_s > 0:
            time.sleep(delay_s)


class ShardedSource:
    """Random access to the samples of a sharded dataset (a ``grain`` data source).

    ``source[i]`` reads sample ``i`` from its shard (memory-mapped, then copied: a real read of
    the file's bytes) and returns ``{field: array}``. It counts samples and bytes read, also
    from several threads at once.

    Args:
        directory: a dataset written by :func:`write_shards`.
        read_bytes_per_s: cap on the read bandwidth (shared by all threads), or None for none.

    Raises:
        FileNotFoundError, ValueError: as :func:`read_info`; ValueError for a cap of 0 or less.
    """

    def __init__(self, directory: str | os.PathLike, *, read_bytes_per_s: float | None = None):
        self.directory = Path(directory)
        self.info = read_info(self.directory)
        self._limiter = None if read_bytes_per_s is None else ReadLimiter(read_bytes_per_s)
        self._starts = np.cumsum((0,) + self.info.shard_sizes)  # first sample of each shard
        self._maps: dict[tuple[int, str], np.ndarray] = {}
        self._lock = threading.Lock()
        self.samples_read = 0
        self.bytes_read = 0

    @property
    def read_bytes_per_s(self) -> float | None:
        """The read cap in bytes per second, or None."""
        return None if self._limiter is None else self._limiter.read_bytes_per_s

    def __len__(self) -> int:
        return self.info.n_samples

    def _map(self, shard: int, field: str) -> np.ndarray:
        key = (shard, field)
        if key not in self._maps:
            with self._lock:
                if key not in self._maps:
                    self._maps[key] = np.load(_shard_file(self.directory, shard, field),
                                              mmap_mode="r")
        return self._maps[key]

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        index = int(index)
        if not 0 <= index < self.info.n_samples:
            raise IndexError(f"Sample {index} is outside the dataset's {self.info.n_samples} "
                             "samples.")
        shard = int(np.searchsorted(self._starts, index, side="right")) - 1
        row = index - int(self._starts[shard])
        nbytes = self.info.bytes_per_sample
        if self._limiter is not None:
            self._limiter.acquire(nbytes)
        sample = {field: np.array(self._map(shard, field)[row]) for field in self.info.fields}
        with self._lock:
            self.samples_read += 1
            self.bytes_read += nbytes
        return sample

    def __repr__(self) -> str:  # no machine paths in lab outputs
        cap = "none" if self._limiter is None else f"{self.read_bytes_per_s / 1e6:g} MB/s"
        return (f"ShardedSource({self.info.n_samples} samples in {len(self.info.shard_sizes)} "
                f"shards, {self.info.bytes_per_sample} bytes each, read cap {cap})")


class _EpochView:
    """Sample ``k`` of an endless stream: epoch ``k // n``, in that epoch's permutation."""

    _EPOCHS = 2**20  # "endless": a million epochs

    def __init__(self, source: ShardedSource, *, seed: int, shuffle: bool):
        self._source = source
        self._n = len(source)
        self._seed = int(seed)
        self._shuffle = shuffle
        self._orders: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._n * self._EPOCHS

    def _order(self, epoch: int) -> np.ndarray:
        with self._lock:
            if epoch not in self._orders:
                if len(self._orders) > 2:  # keep a few epochs: threads may straddle a boundary
                    del self._orders[min(self._orders)]
                rng = np.random.default_rng((self._seed, epoch))
                self._orders[epoch] = rng.permutation(self._n)
            return self._orders[epoch]

    def __getitem__(self, k: int) -> dict[str, np.ndarray]:
        epoch, j = divmod(int(k), self._n)
        return self._source[int(self._order(epoch)[j]) if self._shuffle else j]


@dataclass(frozen=True)
class LoaderStats:
    """What a loader delivered, measured by its consumer."""

    samples: int       # samples delivered
    bytes: int         # bytes of those samples
    elapsed_s: float   # wall time from the first request to the last delivery
    wait_s: float      # time the consumer spent blocked waiting for batches

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.elapsed_s if self.elapsed_s > 0 else float("inf")

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.elapsed_s if self.elapsed_s > 0 else float("inf")

    def __str__(self) -> str:
        return (f"{self.samples} samples in {self.elapsed_s:.3f} s: "
                f"{self.samples_per_s:,.0f} samples/s, {self.bytes_per_s / 1e6:.2f} MB/s, "
                f"waited {self.wait_s:.3f} s")


class Loader:
    """Batches from a :class:`ShardedSource`, shuffled, read ahead by worker threads (grain).

    Batch ``k`` is always the same samples for the same ``seed`` (each epoch a new global
    permutation), so a loader made with ``start_step=k`` continues exactly where one that
    delivered ``k`` batches stopped: store :attr:`position` in the checkpoint.

    Args:
        source: the data source.
        batch_size: samples per batch (at most the dataset size).
        seed: seed of the shuffle.
        shuffle: shuffle globally (a new order every epoch); False reads in order.
        start_step: index of the first batch to deliver (the position to resume from).
        prefetch: batches read ahead of the consumer; 0 reads each batch when asked for it.
        workers: threads reading batches in parallel (>= 1; ignored when ``prefetch`` is 0).

    Yields:
        ``{field: array[batch_size, *sample_shape]}`` (NumPy arrays), without end.

    References:
        grain's ``MapDataset`` and ``ReadOptions``. https://google-grain.readthedocs.io
    """

    def __init__(self, source: ShardedSource, *, batch_size: int, seed: int = 0,
                 shuffle: bool = True, start_step: int = 0, prefetch: int = 2,
                 workers: int = 1):
        import grain  # imported here: it is slow to import and only loaders need it

        _check_count("batch_size", batch_size)
        _check_count("start_step", start_step, minimum=0)
        _check_count("prefetch", prefetch, minimum=0)
        _check_count("workers", workers)
        if batch_size > len(source):
            raise ValueError(f"batch_size {batch_size} is larger than the dataset "
                             f"({len(source)} samples); use a smaller batch or more data.")
        self.source = source
        self.batch_size = batch_size
        self.prefetch = prefetch
        self.workers = workers
        # grain's own MapDataset.shuffle costs ~0.1 ms per sample in Python; a NumPy
        # permutation per epoch does the same job for a fraction of that.
        ds = grain.MapDataset.source(_EpochView(source, seed=seed, shuffle=shuffle))
        ds = ds.batch(batch_size, drop_remainder=True)[start_step:]
        if prefetch == 0:
            options = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
        else:
            options = grain.ReadOptions(num_threads=workers, prefetch_buffer_size=prefetch)
        self._iterator = iter(ds.to_iter_dataset(options))
        self.position = start_step
        self._delivered = 0
        self._wait_s = 0.0
        self._first_s: float | None = None
        self._last_s: float | None = None

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        start_s = time.perf_counter()
        if self._first_s is None:
            self._first_s = start_s
        batch = next(self._iterator)
        self._last_s = time.perf_counter()
        self._wait_s += self._last_s - start_s
        self._delivered += 1
        self.position += 1
        return batch

    def stats(self) -> LoaderStats:
        """Samples, bytes and time delivered so far (counting from the first batch asked for)."""
        elapsed_s = 0.0 if self._first_s is None else self._last_s - self._first_s
        samples = self._delivered * self.batch_size
        return LoaderStats(samples=samples, bytes=samples * self.source.info.bytes_per_sample,
                           elapsed_s=elapsed_s, wait_s=self._wait_s)
