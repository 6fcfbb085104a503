"""Checks of chapter 12: the prefix-matching (induction) score, the key-path
(K-composition) ablation, a predicted pattern, a predicted query-path
ablation."""

from __future__ import annotations

import numpy as np
import torch

from ..gpt import GPT, GPTConfig
from ..interpret import (
    ablation_mask,
    induction_targets,
    path_ablated_forward,
    prefix_matching_score,
)
from .questions import choice_question
from .runner import (
    DEFAULT_TIMEOUT,
    as_array,
    call,
    close,
    display_name,
    fail,
    run_check,
    shape_text,
)

choice_question(
    "12.shift-pattern",
    answer="C",
    why="output i needs input (i + 3) mod 12: some head attends from "
    "each query to the key 3 places to its right, "
    "and the last 3 queries wrap around to keys 0, 1, 2.",
    wrong={
        "A": (
            "predicted-reversal-pattern",
            (
                "the anti-diagonal serves reversal, where output i needs "
                "input "
                "11 - i; here output i needs input i + 3."
            ),
        ),
        "B": (
            "predicted-identity-pattern",
            (
                "the main diagonal would copy each digit to its own place; "
                "the "
                "target at i is the digit 3 places further on."
            ),
        ),
        "D": (
            "predicted-uniform-pattern",
            (
                "uniform attention averages all digits, which cannot name "
                "one of "
                "them; with positions, the model can and does look up "
                "exactly one key."
            ),
        ),
    },
)

choice_question(
    "12.query-path",
    answer="B",
    why="the query of an induction head at token A only has to say 'I "
    "am A', and the token itself is in the residual "
    "stream from the embedding on: nothing the previous-token heads write "
    "is needed there. They act through the "
    "KEYS (the key at j must say 'the token before me was A'), so removing "
    "them from the queries alone leaves "
    "the copying intact.",
    wrong={
        "A": (
            "query-path-needs-previous-token",
            "that is what removing them from the KEYS does. The query at the "
            "later A matches on its own token, which the embedding already "
            "holds; the previous token matters at "
            "the key it looks for.",
        ),
        "C": (
            "query-path-shares-work",
            "the two halves of the circuit do not share one job between "
            "queries and "
            "keys: the previous-token information is needed in the keys "
            "only, so the query path carries none of "
            "it.",
        ),
    },
)


def _cases():
    """(weights (L, B, H, T, T), ids (B, T), query_mask (B, T) or None,
    description); small vocabularies so that tokens occur more than twice
    (several targets per query) and some queries have none."""
    out = []
    for i, (layers, batch, heads, t, vocab, use_mask) in enumerate(
        [
            (2, 3, 4, 10, 4, False),
            (1, 2, 2, 12, 3, True),
            (3, 4, 3, 9, 5, True),
            (2, 2, 1, 16, 6, False),
        ]
    ):
        gen = torch.Generator().manual_seed(100 + i)
        ids = torch.randint(0, vocab, (batch, t), generator=gen)
        scores = 3 * torch.randn(
            layers, batch, heads, t, t, generator=gen, dtype=torch.float64
        )
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        mask = None
        if use_mask:
            mask = torch.rand(batch, t, generator=gen) < 0.7
            mask[0, -1] = True
        text = f"L={layers}, B={batch}, H={heads}, T={t}, vocab {vocab}" + (
            ", with query_mask" if use_mask else ""
        )
        out.append((weights, ids, mask, text))
    return out


def _score(weights, targets, queries, reduce="sum"):
    """Mean over the chosen queries of the weight on the targets (summed, or
    averaged over the targets)."""
    on_target = (weights * targets[None, :, None]).sum(-1)  # (L, B, H, T)
    if reduce == "mean":
        on_target = on_target / targets.sum(-1).clamp(min=1)[None, :, None]
    return on_target.transpose(2, 3)[:, queries].mean(1).numpy()


def _variants(weights, ids, mask):
    """(code, detail, score) of each known-wrong way to compute the score."""
    targets = induction_targets(ids)  # (B, T, T)
    has = targets.any(-1)
    queries = has if mask is None else has & mask
    earlier = torch.zeros_like(targets)
    # the earlier occurrence itself, one key before each target
    earlier[..., :-1] = targets[..., 1:]
    t = ids.size(1)
    including_self = targets | (
        torch.eye(t, dtype=torch.bool)
        & (
            ids[:, :, None]
            == torch.cat([torch.full_like(ids[:, :1], -1), ids[:, :-1]], 1)[
                :, None, :
            ]
        )
    )
    every_query = torch.ones_like(has) if mask is None else mask
    out = [
        (
            "induction-off-by-one",
            "",
            _score(weights, earlier, queries & earlier.any(-1)),
        ),
        ("induction-all-queries", "", _score(weights, targets, every_query)),
        (
            "induction-mean-over-targets",
            "",
            _score(weights, targets, queries, reduce="mean"),
        ),
        (
            "induction-includes-self",
            "",
            _score(
                weights,
                including_self,
                queries
                | (
                    including_self.any(-1)
                    & (torch.ones_like(has) if mask is None else mask)
                ),
            ),
        ),
    ]
    if mask is not None:
        out.append(
            ("induction-ignores-query-mask", "", _score(weights, targets, has))
        )
    return out


def check_prefix_matching_score(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(weights, ids, query_mask=None)`` -> (L, H): for every query
    whose token occurred earlier, the attention summed over the keys right
    after those earlier occurrences, averaged over such queries (and over
    ``query_mask`` True only, when given). Compared with
    :func:`attention_course.interpret.prefix_matching_score` on random causal
    maps and token ids from small vocabularies. Diagnoses
    ``[induction-off-by-one]`` (the earlier occurrence itself scored),
    ``[induction-all-queries]``, ``[induction-mean-over-targets]``,
    ``[induction-includes-self]`` and ``[induction-ignores-query-mask]``."""
    label = "prefix_matching_score"

    def body():
        cases = _cases()
        for i, (weights, ids, mask, text) in enumerate(cases, 1):
            case = f"case {i} of {len(cases)}: {text}"
            args = {"weights": weights.clone(), "ids": ids.clone()}
            if mask is not None:
                args["query_mask"] = mask.clone()
            got = call(fn, args, label, positional=2)
            got = as_array(got, "result", case)
            expected = prefix_matching_score(weights, ids, mask).numpy()
            if got.shape != expected.shape:
                raise fail(
                    "wrong-shape",
                    f"Your score has shape {shape_text(got.shape)}; "
                    "expected (L, H) = "
                    f"{shape_text(expected.shape)}: one number per layer "
                    "and head.",
                    case=case,
                )
            if close(got, expected, 1e-6, 1e-5):
                continue
            for code, detail, wrong in _variants(weights, ids, mask):
                if close(got, wrong, 1e-6, 1e-5):
                    raise fail(code, detail=detail, case=case)
            raise fail(
                "wrong-output",
                "Your scores differ from the reference and match none of "
                "the known "
                "mistakes (largest difference "
                f"{np.abs(got - expected).max():.2g}).",
                case=case,
            )
        return (
            f"✓ {display_name(fn, label)}: {len(cases)} random cases "
            "(several layers, heads and lengths, "
            "repeated tokens, with and without query_mask) match the reference"
        )

    run_check(body, timeout)


def _path_models():
    """(model, its GPTConfig arguments, ids, heads, description): 2-layer
    attention-only GPTs with sharp, loud heads (so that every path matters),
    several head counts and vocabularies, and the layer-1 heads to remove."""
    out = []
    for i, (vocab, heads_per_layer, t, removed) in enumerate(
        [
            (20, 4, 11, [(0, 1), (0, 2)]),
            (16, 2, 9, [(0, 0)]),
            (24, 8, 12, [(0, 3), (0, 5), (0, 6)]),
        ]
    ):
        sizes = {
            "vocab_size": vocab,
            "d_model": 32,
            "num_heads": heads_per_layer,
            "num_layers": 2,
            "max_len": 16,
            "attention_only": True,
            "tie_embeddings": False,
        }
        model = GPT(GPTConfig(**sizes, embedding_std=1.0), seed=200 + i).eval()
        with torch.no_grad():
            # std 0.02 at init: attention would be almost uniform
            for name, p in model.named_parameters():
                p.mul_(
                    {"w_q": 25.0, "w_k": 25.0, "w_v": 10.0, "w_o": 100.0}.get(
                        name.split(".")[-2], 1.0
                    )
                )
        ids = torch.randint(
            0, vocab, (3, t), generator=torch.Generator().manual_seed(300 + i)
        )
        text = (
            f"GPT with 2 layers of {heads_per_layer} heads, vocab "
            f"{vocab}, ids (3, {t}), heads {removed}"
        )
        out.append((model, sizes, ids, removed, text))
    return out


@torch.no_grad()
def _key_path_variants(model, ids, heads):
    """(code, logits) of each known-wrong way to remove ``heads`` from layer
    2's keys."""
    mask = ablation_mask(model.num_layers, model.num_heads, *heads)
    block = model.blocks[1]
    stream = {}
    hook = block.register_forward_pre_hook(
        lambda module, args: stream.update(x=args[0])
    )
    model(ids, head_mask=mask)
    hook.remove()
    # without norm1
    raw = block.attn.w_k.register_forward_pre_hook(
        lambda module, args: (stream["x"],)
    )
    skipped = model(ids)
    raw.remove()
    return [
        ("ablation-every-path", model(ids, head_mask=mask)),
        (
            "ablation-query-path",
            path_ablated_forward(model, ids, heads, "q")[0],
        ),
        (
            "ablation-value-path",
            path_ablated_forward(model, ids, heads, "v")[0],
        ),
        ("key-path-skips-layernorm", skipped),
        ("ablation-not-applied", model(ids)),
    ]


def check_key_path_ablation(fn, *, timeout: float = DEFAULT_TIMEOUT):
    """Check ``fn(state, config, ids, heads)`` -> logits (B, T, V) of the
    2-layer GPT ``GPT(GPTConfig(**config))`` with weights ``state`` (its
    ``state_dict()``; a model does not travel into the grader's sandbox, its
    weights do), whose layer-2 KEYS are computed from the residual stream
    without the layer-1 ``heads`` (the stream the model has with them switched
    off), while its queries, values and the rest of the model read the whole
    stream. Compared with
    :func:`attention_course.interpret.path_ablated_forward` (``path="k"``) on
    random models with several head counts. Diagnoses
    ``[ablation-every-path]``, ``[ablation-query-path]``,
    ``[ablation-value-path]``, ``[key-path-skips-layernorm]`` and
    ``[ablation-not-applied]``."""
    label = "key_path_logits"

    def body():
        cases = _path_models()
        for i, (model, config, ids, heads, text) in enumerate(cases, 1):
            case = f"case {i} of {len(cases)}: {text}"
            args = {
                "state": model.state_dict(),
                "config": dict(config),
                "ids": ids.clone(),
                "heads": list(heads),
            }
            got = call(fn, args, label, positional=4)
            got = as_array(
                got.detach() if isinstance(got, torch.Tensor) else got,
                "result",
                case,
            )
            expected = path_ablated_forward(model, ids, heads, "k")[0].numpy()
            if got.shape != expected.shape:
                raise fail(
                    "wrong-shape",
                    f"Your logits have shape {shape_text(got.shape)}; "
                    "expected (B, T, V) = "
                    f"{shape_text(expected.shape)}: the model's logits at "
                    "every position.",
                    case=case,
                )
            if close(got, expected, 1e-4, 1e-4):
                continue
            for code, wrong in _key_path_variants(model, ids, heads):
                if close(got, wrong.numpy(), 1e-4, 1e-4):
                    raise fail(code, case=case)
            raise fail(
                "wrong-output",
                "Your logits differ from the reference and match none of "
                "the known mistakes "
                f"(largest difference {np.abs(got - expected).max():.2g}).",
                case=case,
            )
        return (
            f"✓ {display_name(fn, label)}: {len(cases)} models (2, 4 and 8 "
            "heads; one to three heads removed) "
            "match the reference: only layer 2's keys lose the removed heads"
        )

    run_check(body, timeout)
