"""Answer key of lab 11, serving (instructor-only: student copies leave keys/ out)."""

from clusterlab.analytic import memory, serving
from clusterlab.catalog import hardware
from clusterlab.course import grading

_LLAMA = serving.LLAMA_3_70B


def _predicted_long_cache_step_s(ns):
    # from this run's own measurement: the batch-1 step's bytes by the formula over its median
    # time is the bandwidth; the batch-SEQ_BATCH step over LENGTHS[-1] positions at that bandwidth
    def step_bytes(batch, cache_len):
        return serving.decode_step_bytes(ns["weight_bytes"], memory.kv_cache_bytes(
            ns["N_LAYERS"], ns["N_HEADS"], ns["HEAD_DIM"], cache_len, batch,
            bytes_per_element=ns["BYTES_PER_VALUE"]))
    bandwidth = step_bytes(1, ns["SWEEP_LEN"]) / ns["step_s"][1]
    return step_bytes(ns["SEQ_BATCH"], ns["LENGTHS"][-1]) / bandwidth


KEY = {
    "lab11.1": grading.close(
        memory.kv_cache_bytes(_LLAMA.n_layers, _LLAMA.n_kv_heads, _LLAMA.head_dim, 8192, 16,
                              bytes_per_element=2) / 1e9,
        name="KV cache (GB)",
        hint="Keys and values, in every layer, for each key-value head (not each query head), "
             "position and sequence, 2 bytes each; then divide by 1e9."),
    "lab11.2": grading.close(
        8 * hardware.gpu("H200").hbm_bytes_per_s
        / serving.decode_step_bytes(_LLAMA.streamed_param_bytes(2),
                                    _LLAMA.kv_cache_bytes(4096, 1, 2)),
        name="tokens per second",
        hint="One step reads the weights it multiplies (all but the input embedding, which is "
             "only indexed) and the whole cache once; 8 GPUs read their eighths at the same "
             "time; one step makes one token."),
    "lab11.3": grading.close(
        _predicted_long_cache_step_s, name="predicted step time (s)",
        hint="The bandwidth is one batch-1 step's bytes (the weights plus one sequence's cache "
             "of SWEEP_LEN positions, float32) over step_s[1]; the prediction is the bytes of a "
             "step of SEQ_BATCH sequences over LENGTHS[-1] positions over that bandwidth, in "
             "seconds."),
}
