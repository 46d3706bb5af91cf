"""The data path: the read throughput training needs, data starvation, and checkpoint writes.

Training reads samples (images, token sequences) and, every so often, writes a checkpoint. The
GPUs consume ``samples_per_s_per_gpu`` samples each, so the storage system behind ``n_gpus`` GPUs
must deliver ``n_gpus * samples_per_s_per_gpu * bytes_per_sample`` bytes per second; the demand
grows with the cluster. When it cannot, every step waits for its data: with a prefetching loader
(loading batch ``k+1`` while computing batch ``k``) a step takes ``max(compute, load)``, without
one it takes ``compute + load``.

Units: bytes, seconds, bytes per second (1 GB/s = 1e9 bytes/s).

References:
    Mohan, Phanishayee, Raniwala & Chidambaram, "Analyzing and Mitigating Data Stalls in DNN
    Training", VLDB 2021. https://arxiv.org/abs/2007.06775
"""

from __future__ import annotations

import math
from clusterlab._checks import count as _check_count, positive as _check_positive


def token_sample_bytes(seq_len: int, *, bytes_per_token: int = 4) -> float:
    """Bytes of one pre-tokenized training sequence.

    Args:
        seq_len: tokens per sequence.
        bytes_per_token: bytes per stored token id: 2 (uint16) for vocabularies under 65,536
            tokens, 4 (uint32) above that.

    Returns:
        ``seq_len * bytes_per_token`` bytes.
    """
    _check_count("seq_len", seq_len)
    if bytes_per_token not in (1, 2, 4, 8):
        raise ValueError(f"bytes_per_token must be 1, 2, 4 or 8 (an integer dtype), "
                         f"got {bytes_per_token!r}.")
    return float(seq_len * bytes_per_token)


def tokens_per_s_per_gpu(flops_per_token: float, peak_flops_per_device: float,
                         mfu: float) -> float:
    """Tokens one GPU consumes per second when it runs at a given model FLOPs utilization.

    Args:
        flops_per_token: training FLOPs per token, e.g. ``6 * n_params`` from
            :func:`clusterlab.analytic.flops.training_flops` with one token.
        peak_flops_per_device: peak FLOP/s of one GPU in the dtype used.
        mfu: model FLOPs utilization as a fraction, ``0 < mfu <= 1``.

    Returns:
        ``peak_flops_per_device * mfu / flops_per_token`` tokens per second.

    References:
        Chowdhery et al. 2022 (PaLM), section 4.1 (MFU). https://arxiv.org/abs/2204.02311
    """
    _check_positive("flops_per_token", flops_per_token)
    _check_positive("peak_flops_per_device", peak_flops_per_device)
    _check_positive("mfu", mfu)
    if mfu > 1:
        raise ValueError(f"mfu must lie in (0, 1] (a fraction of the peak), got {mfu!r}.")
    return float(peak_flops_per_device * mfu / flops_per_token)


def required_read_bytes_per_s(n_gpus: int, samples_per_s_per_gpu: float,
                              bytes_per_sample: float) -> float:
    """The read throughput storage must sustain so that no GPU waits for data.

    Args:
        n_gpus: number of GPUs reading (each reads its own samples, as in data parallelism).
        samples_per_s_per_gpu: samples one GPU consumes per second when it never waits.
        bytes_per_sample: bytes read per sample (as stored: compressed JPEG, token ids, ...).

    Returns:
        ``n_gpus * samples_per_s_per_gpu * bytes_per_sample`` in bytes/s: linear in the GPU
        count, so doubling the cluster doubles what storage must deliver.

    References:
        Mohan et al., "Analyzing and Mitigating Data Stalls in DNN Training", VLDB 2021.
        https://arxiv.org/abs/2007.06775
    """
    _check_count("n_gpus", n_gpus)
    _check_positive("samples_per_s_per_gpu", samples_per_s_per_gpu)
    _check_positive("bytes_per_sample", bytes_per_sample)
    return float(n_gpus * samples_per_s_per_gpu * bytes_per_sample)


def max_gpus_fed(read_bytes_per_s: float, samples_per_s_per_gpu: float,
                 bytes_per_sample: float) -> int:
    """The largest number of GPUs a storage system can keep fed (0 if not even one).

    Args:
        read_bytes_per_s: sustained read throughput of the storage system.
        samples_per_s_per_gpu: samples one GPU consumes per second when it never waits.
        bytes_per_sample: bytes read per sample.

    Returns:
        ``floor(read_bytes_per_s / (samples_per_s_per_gpu * bytes_per_sample))``.
    """
    _check_positive("read_bytes_per_s", read_bytes_per_s)
    _check_positive("samples_per_s_per_gpu", samples_per_s_per_gpu)
    _check_positive("bytes_per_sample", bytes_per_sample)
    # A tiny relative slack so that an exact fit (3.0000000000000004 GPUs) is not rounded down.
    return int(math.floor(read_bytes_per_s / (samples_per_s_per_gpu * bytes_per_sample)
                          * (1 + 1e-12)))


def load_time_s(step_bytes: float, read_bytes_per_s: float) -> float:
    """Seconds to read one step's data at a given throughput.

    Args:
        step_bytes: bytes the step reads (across the whole cluster when ``read_bytes_per_s`` is
            the shared storage system's throughput; per GPU when it is one GPU's share).
        read_bytes_per_s: sustained read throughput.

    Returns:
        ``step_bytes / read_bytes_per_s``.
    """
    _check_positive("step_bytes", step_bytes, allow_zero=True)
    _check_positive("read_bytes_per_s", read_bytes_per_s)
    return float(step_bytes / read_bytes_per_s)


def starved_step_time_s(compute_s: float, load_s: float, *, prefetch: bool = True) -> float:
    """Time of one training step when its data takes ``load_s`` to arrive.

    Args:
        compute_s: seconds the GPUs compute per step (forward, backward, communication).
        load_s: seconds to read and decode the step's data.
        prefetch: True when the loader reads the next batch while the GPUs compute this one
            (overlap: ``max(compute_s, load_s)``); False when each step first waits for its data
            (``compute_s + load_s``).

    Returns:
        Seconds per step.

    References:
        Mohan et al., VLDB 2021, section 2 (prefetching pipelines and data stalls).
        https://arxiv.org/abs/2007.06775
    """
    _check_positive("compute_s", compute_s)
    _check_positive("load_s", load_s, allow_zero=True)
    return float(max(compute_s, load_s) if prefetch else compute_s + load_s)


def data_utilization(compute_s: float, load_s: float, *, prefetch: bool = True) -> float:
    """Fraction of the step the GPUs spend computing rather than waiting for data.

    Args:
        compute_s: seconds the GPUs compute per step.
        load_s: seconds to load the step's data.
        prefetch: whether loading overlaps computing (see :func:`starved_step_time_s`).

    Returns:
        ``compute_s / starved_step_time_s(compute_s, load_s, prefetch=prefetch)``, in (0, 1]. With
        prefetching it is 1 until ``load_s`` exceeds ``compute_s``, then ``compute_s / load_s``:
        the knee.
    """
    return compute_s / starved_step_time_s(compute_s, load_s, prefetch=prefetch)


def checkpoint_write_s(checkpoint_bytes: float, write_bytes_per_s: float) -> float:
    """Seconds to write a checkpoint at a sustained write throughput.

    Args:
        checkpoint_bytes: bytes of the checkpoint (see
        :func:`clusterlab.analytic.memory.checkpoint_bytes`). write_bytes_per_s: sustained aggregate
        write throughput of the storage system.

    Returns:
        ``checkpoint_bytes / write_bytes_per_s``.
    """
    _check_positive("checkpoint_bytes", checkpoint_bytes)
    _check_positive("write_bytes_per_s", write_bytes_per_s)
    return float(checkpoint_bytes / write_bytes_per_s)


def required_write_bytes_per_s(checkpoint_bytes: float, write_s: float) -> float:
    """Write throughput needed to save a checkpoint within ``write_s`` seconds.

    Args:
        checkpoint_bytes: bytes of the checkpoint.
        write_s: the time allowed for the write.

    Returns:
        ``checkpoint_bytes / write_s`` in bytes/s.
    """
    _check_positive("checkpoint_bytes", checkpoint_bytes)
    _check_positive("write_s", write_s)
    return float(checkpoint_bytes / write_s)


def host_memory_bytes_per_s(io_bytes_per_s: float, *, gpudirect_storage: bool) -> float:
    """Bytes per second that storage traffic to or from GPUs puts through the host's CPU memory.

    Without GPUDirect Storage, data read from a file lands in a bounce buffer in CPU memory (the
    NIC's or NVMe drive's DMA writes it there) and is copied from there into GPU memory (a read
    of the same bytes), and writes take the same two hops the other way: host memory carries
    every byte twice. With GPUDirect Storage the NIC or drive moves the bytes straight to or from
    GPU memory (DMA through the PCIe switch), and host memory carries none of them.

    Args:
        io_bytes_per_s: storage throughput of the node's GPUs, read plus write (>= 0).
        gpudirect_storage: whether the transfers use GPUDirect Storage (cuFile) or the bounce
            buffer.

    Returns:
        ``2 * io_bytes_per_s`` without GPUDirect Storage, 0 with it.

    Raises:
        ValueError: if the throughput is negative or not finite.

    References:
        NVIDIA, GPUDirect Storage Design Guide ("avoiding a bounce buffer through the CPU").
        https://docs.nvidia.com/gpudirect-storage/design-guide/index.html
    """
    rate = _check_positive("io_bytes_per_s", io_bytes_per_s, allow_zero=True)
    return 0.0 if gpudirect_storage else 2.0 * rate


def sharded_checkpoint_write_s(checkpoint_bytes: float, n_nodes: int, *,
                               node_write_bytes_per_s: float,
                               storage_write_bytes_per_s: float) -> float:
    """Seconds to write a checkpoint sharded over ``n_nodes`` nodes that all write at once.

    Each node writes its ``1 / n_nodes`` share through its own storage ports, and the storage
    system absorbs all of them together, so the slower of the two sets the time:
    ``max(checkpoint / n_nodes / node rate, checkpoint / storage rate)``. Few nodes are limited
    by their ports, many nodes by the storage system; the crossover lies at
    ``n_nodes = storage rate / node rate``.

    Args:
        checkpoint_bytes: bytes of the whole checkpoint (> 0), e.g. from
            :func:`clusterlab.analytic.memory.checkpoint_bytes`.
        n_nodes: nodes writing their shares in parallel (integer >= 1).
        node_write_bytes_per_s: write throughput of one node's storage ports (> 0).
        storage_write_bytes_per_s: aggregate write throughput of the storage system (> 0).

    Returns:
        The write time in seconds.

    Raises:
        ValueError: on a non-positive size or rate, or a bad node count.

    References:
        Dubey et al. 2024 (Llama 3), Sec. 3.3.4: each GPU saves its own shard of the state
        (1 MB to 4 GB), to storage sustaining 2 TB/s. https://arxiv.org/abs/2407.21783
    """
    total = _check_positive("checkpoint_bytes", checkpoint_bytes)
    nodes = _check_count("n_nodes", n_nodes)
    per_node_s = total / nodes / _check_positive("node_write_bytes_per_s", node_write_bytes_per_s)
    system_s = total / _check_positive("storage_write_bytes_per_s", storage_write_bytes_per_s)
    return float(max(per_node_s, system_s))
