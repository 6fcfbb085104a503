"""Automatic checks for the course's exercises: run the student's code, compare
with the reference, explain.

Students write ``from attention_course import checks`` and call
``checks.check_softmax(softmax)``. Every ``check_*`` function runs the
student's function (or module class) on many random cases with fixed seeds
(several shapes, Tq != Tk, with and without masks), compares the results with
the float64 reference in :mod:`attention_course.numpy_ref`, and then either

* prints ONE line saying what was verified, named after the student's function
  or class (its ``__name__``; the contract's name for a lambda or a partial),
  e.g. ``✓ attention: 24 random cases (...) match the reference``, or
* raises :class:`CheckFailed` (a subclass of ``AssertionError``) whose message
  starts with a stable diagnosis code in brackets, then a plain-language hint,
  e.g. ``[missing-scale] Your scores are not divided by sqrt(d_k): ...``.
  :data:`CODES` lists every code; the catalogue with descriptions, hints and
  examples is :mod:`attention_course.mistakes`.

How the diagnosis works (:mod:`.diagnosis`): on the first failing case the
checker computes what each *known mistake* would produce (no scaling, softmax
over the wrong axis, inverted mask, heads split without a transpose, ...) and
reports the mistake whose output the student's output matches. If none matches,
the code is ``[wrong-output]`` (or ``[wrong-shape]`` / ``[nan-output]``).

Robustness (:mod:`.runner`): a student function that raises, returns None, the
wrong type or NaN, modifies its inputs in place, or never returns, gets a clear
one-paragraph message, never a traceback from inside the checker.

The package: :mod:`.runner` (calling student code safely), :mod:`.diagnosis`
(naming mistakes), :mod:`.cases` (input cases), one module per topic
(:mod:`.core`, :mod:`.masks`, :mod:`.heads`, :mod:`.modules`, :mod:`.kv_cache`,
:mod:`.tiles`, :mod:`.field_guide`, :mod:`.positions`, :mod:`.blocks`,
:mod:`.interpret`, :mod:`.distributed`, :mod:`.porting`, :mod:`.modern`,
:mod:`.flex`, :mod:`.kernels`, :mod:`.linear`, :mod:`.serving`, :mod:`.sparse`,
:mod:`.capstone`), :mod:`.questions` (checked letter and number questions),
:mod:`.hidden` (the grader's hidden cases) and :mod:`.observe` (what the
student's code computes and calls).
"""

import importlib

from ..lazy_exports import lazy_exports
from ..mistakes import CODES

# The checkers import torch (and some, TensorFlow or transformers) when first
# used, not when this package is imported:
# the grader's processes import it for its hidden cases and mistake codes
# alone, once per graded notebook.
_LAZY = {
    "check_decoder_block": "blocks",
    "check_feed_forward": "blocks",
    "check_post_ln_block": "blocks",
    "check_pre_ln_block": "blocks",
    "check_residual_init": "blocks",
    "check_rms_norm": "blocks",
    "check_swiglu": "blocks",
    "check_capstone_block": "capstone",
    "check_capstone_generation": "capstone",
    "check_capstone_induction_scores": "capstone",
    "check_capstone_sharding": "capstone",
    "check_capstone_training": "capstone",
    "check_rope_cached_attention": "capstone",
    "check_llama_attention": "capstone_model",
    "check_smollm2_logits": "capstone_model",
    "check_greedy_decoding": "capstone_model",
    "check_prompt_lookup": "capstone_model",
    "check_serving": "capstone_model",
    "check_attention_one_query": "core",
    "check_float_mask_attention": "core",
    "check_numpy_attention": "core",
    "check_scaled_dot_product_attention": "core",
    "check_softmax": "core",
    "check_streaming_attention": "core",
    "check_copy_and_sum": "distributed",
    "check_row_parallel_output": "distributed",
    "check_zigzag_layout": "distributed",
    "check_additive_mask": "field_guide",
    "check_layers_created_once": "field_guide",
    "check_alibi_score_mod": "flex",
    "check_chunked_mask": "flex",
    "check_decode_mask": "flex",
    "check_doc_window_mask": "flex",
    "check_sinks_from_lse": "flex",
    "check_document_mask": "flex",
    "check_prefix_lm_mask": "flex",
    "check_merge_heads": "heads",
    "check_split_heads": "heads",
    "check_key_path_ablation": "interpret",
    "check_prefix_matching_score": "interpret",
    "check_causal_tiles": "kernels",
    "check_dk": "kernels",
    "check_flash_forward": "kernels",
    "check_lse": "kernels",
    "check_tile_loop": "kernels",
    "check_grouped_query_attention": "kv_cache",
    "check_kv_cache_bytes": "kv_cache",
    "check_repeat_kv": "kv_cache",
    "check_delta_chunk": "linear",
    "check_delta_update": "linear",
    "check_gated_delta_rule": "linear",
    "check_linear_recurrent": "linear",
    "check_causal_mask": "masks",
    "check_padding_mask": "masks",
    "check_absorbed_output": "modern",
    "check_absorbed_scores": "modern",
    "check_olmo2_qk_norm": "modern",
    "check_qk_norm_rope": "modern",
    "check_sink_attention": "modern",
    "check_softcap_attention": "modern",
    "check_einsum_attention": "modules",
    "check_keras_attention": "modules",
    "check_multi_head_attention": "modules",
    "check_parameter_count": "modules",
    "check_single_head_attention": "modules",
    "check_keras_weights_from_torch": "porting",
    "check_alibi_attention": "positions",
    "check_rope_halves": "positions",
    "check_rope_left_padded": "positions",
    "check_rope_to_interleaved": "positions",
    "check_choice": "questions",
    "check_number": "questions",
    "CheckFailed": "runner",
    "DEFAULT_TIMEOUT": "runner",
    "check_block_slot": "serving",
    "check_copy_on_write": "serving",
    "check_rejection_rule": "serving",
    "check_retire": "serving",
    "check_verify_mask": "serving",
    "check_schedule": "serving",
    "check_verify_sampled": "serving",
    "check_best_k": "serving",
    "check_index_scores": "sparse",
    "check_tied_rows": "sparse",
    "check_top_k_mask": "sparse",
    "check_sliding_window_attention": "tiles",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY)


def load_all() -> None:
    """Import every topic's checks module, so that every question they register
    is known."""
    for module in sorted(set(_LAZY.values())):
        importlib.import_module(f".{module}", __name__)


__all__ = ["CODES", *_LAZY]
