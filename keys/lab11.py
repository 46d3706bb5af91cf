"""Answer key of lab 11, serving (instructor-only: student copies leave keys/ out)."""

from clusterlab import grading, hardware, memory, serving

_LLAMA = serving.LLAMA_3_70B


def _measured_bandwidth_gb_per_s(ns):
    # from this run's own measurement: the step's bytes by the formula over its median time
    step_bytes = serving.decode_step_bytes(ns["weight_bytes"], memory.kv_cache_bytes(
        ns["N_LAYERS"], ns["N_HEADS"], ns["HEAD_DIM"], ns["SWEEP_LEN"], 1,
        bytes_per_value=ns["BYTES_PER_VALUE"]))
    return step_bytes / ns["step_s"][1] / 1e9


KEY = {
    "lab11.1": grading.close(
        memory.kv_cache_bytes(_LLAMA.n_layers, _LLAMA.n_kv_heads, _LLAMA.head_dim, 8192, 16,
                              bytes_per_value=2) / 1e9,
        name="KV cache (GB)",
        hint="Keys and values, in every layer, for each key-value head (not each query head), "
             "position and sequence, 2 bytes each; then divide by 1e9."),
    "lab11.2": grading.close(
        8 * hardware.gpu("H200").hbm_bytes_per_s
        / serving.decode_step_bytes(_LLAMA.param_bytes(2), _LLAMA.kv_cache_bytes(4096, 1, 2)),
        name="tokens per second",
        hint="One step reads all the weights and the whole cache once; 8 GPUs read their "
             "eighths at the same time; one step makes one token."),
    "lab11.3": grading.close(
        _measured_bandwidth_gb_per_s, name="achieved bandwidth (GB/s)",
        hint="Bytes of one step at batch 1 (the weights plus one sequence's cache of SWEEP_LEN "
             "positions, float32) over step_s[1]; then divide by 1e9."),
}
