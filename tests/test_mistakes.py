"""The mistakes catalogue: one entry per code, complete (every code a check reports, every bug_zoo example), and
guarded against malformed or duplicate entries."""

import inspect

import pytest

from attention_course import bug_zoo, checks, mistakes
from attention_course.checks import runner
from attention_course.mistakes import catalogue


@pytest.fixture
def scratch_catalogue():
    """Lets a test add entries; the catalogue is restored afterwards (in place: CODES is a view of it)."""
    saved = [(d, dict(d)) for d in (mistakes.MISTAKES, catalogue._DESCRIPTIONS, catalogue._EXAMPLES)]
    yield
    for live, copy in saved:
        live.clear()
        live.update(copy)


def test_codes_is_the_catalogue():
    assert list(checks.CODES) == list(mistakes.MISTAKES)
    assert all(checks.CODES[code] == entry.description for code, entry in mistakes.MISTAKES.items())
    with pytest.raises(TypeError):
        checks.CODES["new"] = "read-only: add entries with mistakes.mistake()"


def test_every_example_is_a_zoo_entry_diagnosed_by_an_existing_check():
    zoo = (bug_zoo.ZOO + bug_zoo.SINGLE_HEAD_ZOO + bug_zoo.WEIGHT_LAYOUT_ZOO + bug_zoo.KV_CACHE_ZOO + bug_zoo.SEED_ZOO
           + bug_zoo.MODERN_ZOO)
    in_zoo = {(b.code, b.impl.__name__, b.check) for b in zoo}
    listed = {(m.code, e.impl, e.check) for m in mistakes.MISTAKES.values() for e in m.examples}
    assert listed == in_zoo
    for code, name, check in listed:
        assert inspect.getdoc(getattr(bug_zoo, name)).startswith(f"[{code}] ")
        assert callable(getattr(checks, check))


def test_topics_and_chapters():
    topics = {m.topic for m in mistakes.MISTAKES.values()}
    assert topics <= {"runner", "questions", "core", "masks", "heads", "modules", "kv_cache", "positions",
                      "blocks", "interpret", "distributed", "field_guide", "capstone", "capstone_model", "porting",
                      "modern", "tiles", "flex", "kernels", "linear", "serving", "sparse"}
    assert [m.code for m in mistakes.in_chapter(8)] == ["kv-heads-tiled", "cache-keys-only", "cache-missing-factor"]
    assert [m.code for m in mistakes.in_chapter(10)] == [
        "rope-wrong-pairing", "rope-wrong-frequencies", "rope-position-not-offset", "rope-rotates-values",
        "rope-cache-rotated-twice", "rope-angle-layout", "alibi-query-offset", "alibi-bias-sign", "alibi-bias-scaled",
        "rope-padding-ignored", "rope-offset-one-row", "rope-permutation-inverted", "rope-permutation-not-per-head",
        "rope-permutation-on-columns"]
    assert [m.code for m in mistakes.in_chapter(11)] == [
        "residual-missing", "residual-twice", "norm-wrong-place", "norm-on-residual-stream", "ffn-activation-missing",
        "decoder-not-causal", "cross-attention-keys-from-decoder", "branch-dropout-off", "dropout-not-on-branch",
        "rmsnorm-mean-subtracted", "rmsnorm-eps-misplaced", "rmsnorm-not-mean", "rmsnorm-scale-missing",
        "norm-wrong-axis", "swiglu-gate-swapped", "swiglu-wrong-activation", "swiglu-not-gated", "residual-init-depth",
        "residual-init-wrong-layers", "init-norm-or-bias"]
    assert [m.code for m in mistakes.in_chapter(14)] == [
        "cap-on-probabilities", "cap-after-mask", "norm-after-rope", "sink-given-value", "sink-ignored",
        "absorption-transposed", "keys-formed", "norm-per-head", "values-formed", "heads-split-wrong",
        "cache-window-off-by-one"]
    assert [m.code for m in mistakes.in_chapter(15)] == [
        "mod-roles-swapped", "mod-window-off-by-one", "bias-sign-flipped", "doc-id-wrong-index",
        "doc-ids-assumed-sorted", "chunk-not-causal", "chunk-is-window", "chunk-boundary-off-by-one",
        "decode-offset-ignored", "decode-offset-off-by-one", "decode-reads-empty-slots", "masks-or-not-and",
        "mask-term-missing", "tiles-dense-count", "partial-tiles-skipped", "sink-in-numerator", "lse-wrong-base",
        "sinks-per-query", "sink-renormalised-twice", "sink-as-column", "lse-not-requested", "scores-outside-flex",
        "sinks-from-library", "mod-from-library", "mod-fails-in-flex"]
    assert [m.code for m in mistakes.in_chapter(17)] == [
        "state-carried-over", "read-before-write", "beta-missing", "beta-on-key", "no-erase", "decay-after-write",
        "keys-not-normalized", "chunk-mask-diagonal", "chunk-start-state-ignored", "not-token-by-token",
        "rule-from-library", "delta-key-normalized", "delta-divided-by-norm"]
    assert [m.code for m in mistakes.in_chapter(18)] == [
        "block-index-off-by-one", "slot-ignores-table", "slot-block-not-scaled", "shared-block-freed", "cow-no-copy",
        "cow-refs-not-moved", "verify-mask-top-left", "verify-mask-sees-future", "verify-mask-drops-cache",
        "rejection-not-residual", "rejection-ratio-inverted", "rejection-always-accepts", "finished-left-in-batch",
        "retired-too-early", "eos-zero-ignored", "decode-not-first", "prefill-not-chunked", "block-room-ignored",
        "preempt-frees-ignored", "preempt-wrong-victim", "accepts-after-rejection", "bonus-token-missing",
        "bonus-row-off-by-one", "spec-cost-ignored", "spec-acceptance-not-compounded", "spec-bonus-forgotten",
        "spec-target-pass-forgotten", "spec-from-library"]
    assert [m.code for m in mistakes.in_chapter(19)] == [
        "relu-after-weights", "index-no-relu", "index-scale-missing", "topk-not-causal", "topk-wrong-axis",
        "topk-off-by-one", "tie-anywhere", "ties-by-position"]
    assert [m.code for m in mistakes.in_chapter("capstone1")] == [
        "rope-not-applied", "cache-keys-unrotated", "final-norm-missing", "generate-wrong-position",
        "cache-not-passed-back", "cache-fed-whole-sequence", "targets-not-shifted", "induction-not-learned",
        "cache-kept-in-module", "accuracy-not-from-weights", "scores-from-library", "shard-not-split",
        "shard-not-seen"]
    assert [m.code for m in mistakes.in_chapter("capstone2")] == [
        "cache-position-off-by-one", "rope-base-default", "model-final-norm-missing", "logits-differ-from-hf",
        "decode-cache-dropped", "decode-recomputes-prefix", "lookup-draft-unverified", "lookup-keeps-mismatch",
        "lookup-cache-not-cropped", "lookup-too-many-passes", "serve-too-many-running", "serve-static-batching",
        "serve-blocks-reserved", "serve-blocks-shared", "serve-blocks-not-freed", "serve-tokens-differ"]
    assert all(m.chapter is None for m in mistakes.MISTAKES.values() if m.topic in ("runner", "questions"))


def test_hints_fill_in_the_detail():
    assert mistakes.hint("cache-missing-factor", "seq_len") == "Your cache size leaves out seq_len."
    with pytest.raises(ValueError, match=r"\[timeout\] has no default hint"):
        mistakes.hint("timeout")
    with pytest.raises(ValueError, match=r"unknown diagnosis code 'no-such-code'"):
        runner.fail("no-such-code")


def test_example_lookup():
    assert mistakes.example("sdpa_missing_scale") == ("missing-scale", "check_scaled_dot_product_attention")
    with pytest.raises(ValueError, match=r"bug_zoo\.sdpa_right is the example of no mistake"):
        mistakes.example("sdpa_right")


def test_a_chapter_adds_a_mistake(scratch_catalogue):
    entry = mistakes.mistake("rope-pairs-split", "rotation pairs (i, i + D/2) instead of (2i, 2i + 1)",
                             "Your pairs are {detail}.", chapter=99, topic="positions")
    assert mistakes.MISTAKES["rope-pairs-split"] is entry and "rope-pairs-split" in checks.CODES
    assert mistakes.in_chapter(99) == [entry]
    assert str(runner.fail("rope-pairs-split", detail="split")) == "[rope-pairs-split] Your pairs are split."


@pytest.mark.parametrize("args, kwargs, match", [
    (("Missing-Scale", "x"), {}, r"code must be lower-case words joined by '-'"),
    (("missing-scale", "x"), {}, r"code 'missing-scale' is already in the catalogue"),
    (("new-code", ""), {}, r"description of 'new-code' must be one non-empty line"),
    (("new-code", "two\nlines"), {}, r"description of 'new-code' must be one non-empty line"),
    (("new-code", "x"), {"examples": [("sdpa_missing_scale", "check_softmax")]},
     r"bug_zoo\.sdpa_missing_scale is already an example of \[missing-scale\]"),
])
def test_malformed_entries_are_refused(scratch_catalogue, args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        mistakes.mistake(*args, **kwargs)
    assert "new-code" not in checks.CODES
