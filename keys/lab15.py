"""Answer key of lab 15, recomputation (instructor-only: student copies leave keys/ out).

``lab15.1`` asks what share of no recomputation's bytes selective recomputation keeps for one
GPT-3 layer (h = 12288, 96 heads, 16-bit, one sequence) at 8192 tokens, by the course's formula
(:func:`clusterlab.analytic.memory.transformer_layer_activation_bytes`): 34 / (34 + 5 a s / h)
= 34 / 354, about 0.096.
"""

from clusterlab.analytic import memory
from clusterlab.course import grading

_GPT3_AT_8192 = {r: memory.transformer_layer_activation_bytes(8192, 1, 12288, 96, recompute=r)
                 for r in ("none", "selective")}

KEY = {
    "lab15.1": grading.close(
        _GPT3_AT_8192["selective"] / _GPT3_AT_8192["none"], name="share of the bytes kept",
        hint="Call memory.transformer_layer_activation_bytes at s = 8192 for 'selective' and "
             "for 'none', with the lab's GPT-3 sizes, and divide the first by the second."),
}
