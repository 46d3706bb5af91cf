"""Answer key of lab 14, long sequences and context parallelism (instructor-only: student copies
leave keys/ out).

lab14.1: with a causal mask on p = 16 devices, how many times the work (scores computed) of the
busiest device under the contiguous placement is that of the busiest device under zig-zag:
p (S/p)^2 against (2p+1) (S/2p)^2, i.e. 4p / (2p+1) = 64/33.
lab14.2: bytes each GPU sends in one forward pass of one attention layer with ring attention, for
one sequence of 131,072 tokens on 16 GPUs with 8 key-value heads of 128 in bf16 (a Llama 3
405B-like layer, Dubey et al. 2024): (p-1) blocks of 2 B (S/p) H_kv Dh values, modelled.
lab14.3: the per-device memory (temporaries + arguments + outputs) of the lab's ring-attention
program on 8 devices, as a fraction of one device's: read from the compiled programs the lab
built (a recipe of the lab's namespace).
"""

from clusterlab.course import grading
from clusterlab.device.parallel import context


def _busiest_ratio(p: int = 16) -> float:
    seq = 2 * p * 64                       # any multiple of 2p; the ratio does not depend on it
    return (max(context.score_elements_per_device(seq, p, "contiguous"))
            / max(context.score_elements_per_device(seq, p, "zigzag")))


def _memory_fraction(ns):
    sizes = ns["memory_by_p"]
    return sizes[8] / sizes[1]


KEY = {
    "lab14.1": grading.close(_busiest_ratio(), name="contiguous over zig-zag, busiest device",
                             hint="Count score blocks per device for each placement "
                                  "(context.causal_blocks_per_device) and mind that a zig-zag "
                                  "block is a quarter of a contiguous one.", rtol=1e-6),
    "lab14.2": grading.close(context.ring_attention_traffic(
        1, 131072, 8, 128, 16, bytes_per_element=2).sent_bytes_per_device,
        name="ring bytes sent per GPU", hint="p-1 ring steps, each sending this GPU's keys and "
                                             "values (2 x tokens/p x KV heads x head size x 2 "
                                             "bytes).", rtol=1e-6),
    "lab14.3": grading.close(_memory_fraction, name="memory on 8 devices over one device's",
                             hint="Add temp_size_in_bytes, argument_size_in_bytes and "
                                  "output_size_in_bytes of each compiled program.", rtol=1e-6),
}
