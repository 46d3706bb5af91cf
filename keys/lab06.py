"""Answer key of lab 06, sharded data parallelism (instructor-only: student copies leave keys/
out)."""

from clusterlab import collectives, costmodel, grading, memory


def _stage3_bytes_on_16(ns):
    # the lab's fp32 parameters and Adam moments, sharded 16 ways, plus Adam's 4-byte counter
    return memory.training_memory_per_device(ns["n_params"], 16, 3, bytes_param=4, bytes_grad=0,
                                             optimizer_bytes_per_param=8) + 4


def _all_gathers(ns):
    # counted in the compiled stage-3 step the student cell builds (5 blocks, 2 devices)
    sdp = ns["sdp_2"]
    ops = collectives.executed_collectives(sdp.step, ns["flat_2"], ns["state_2"],
                                           *sdp.place_batch(*ns["batches"][0]))
    return collectives.summarize(ops)["all-gather"].n_ops


KEY = {
    "lab06.1": grading.close(_stage3_bytes_on_16, name="bytes per device", rtol=1e-6,
                             hint="Which of parameters, gradients and Adam's moments does stage 3 "
                                  "shard, and over how many devices? The measured shards add "
                                  "Adam's counter."),
    "lab06.2": grading.close(
        costmodel.sharded_data_parallel_bytes_per_step(7e9, 2, 16, 3)
        - costmodel.sharded_data_parallel_bytes_per_step(7e9, 2, 16, 0),
        name="extra bytes",
        hint="Which collective does stage 3 add to plain data parallelism's, over which bytes, "
             "and what share of them does a ring of p GPUs send from each?"),
    "lab06.3": grading.equal(_all_gathers, name="all-gathers",
                             hint="Stage 3 gathers each block's parameters when it needs them: "
                                  "how often per step? The 3-block count above shows it."),
}
