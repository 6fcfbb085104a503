"""Attention split across processes with ``torch.distributed`` (chapter 13).

* :mod:`.launch`: run a function on P processes (gloo backend on CPU; the same code runs with NCCL on GPUs), with
  timeouts so that a hung rank fails fast, and the results returned to the caller.
* :mod:`.tensor_parallel`: Megatron-style tensor parallelism of the heads (each rank holds H / P heads).
* :mod:`.ring_attention`: sequence parallelism with ring attention (each rank holds T / P positions; key/value
  blocks travel around the ring and are merged with chapter 9's online softmax).
"""
