"""Attention split across processes with ``torch.distributed`` (chapter 13).

* :mod:`.launch`: run a function on P processes (the gloo backend, on CPU; the
  backend is a parameter, but only gloo is tested here), with timeouts so that
  a hung rank fails fast, and the results returned to the caller.
* :mod:`.tensor_parallel`: Megatron-style tensor parallelism of the heads (each
  rank holds H / P heads).
* :mod:`.ring_attention`: context parallelism with ring attention (each rank
  holds T / P positions of the attention's input; key/value blocks travel
  around the ring and are merged with chapter 9's online softmax).
  Megatron-LM's "sequence parallelism" (Korthikanti et al. 2022) is another
  thing: it splits along the sequence only the layers outside attention
  (LayerNorm, dropout), while tensor parallelism splits attention by heads.
"""
