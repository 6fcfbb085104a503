"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023): guess k
tokens cheaply, check them in one pass.

Decoding one token costs one forward pass of the large *target* model, and that
pass is mostly reading weights:
checking k + 1 positions costs about the same as one. A cheap *draft* (a small
model, or a lookup in the prompt) proposes k tokens; the target runs once over
the last accepted token and the k proposals, through its KV cache: k + 1
queries that are the *last* k + 1 positions of the sequence, so the mask is
chapter 8's bottom-right causal mask (proposal i sees the cache and the
proposals before it, never the ones after). Row i of its logits is what the
target would have predicted after proposal i - 1.

* Greedy: accept proposals while each equals the target's argmax; at the first
  mismatch take the target's token instead (if all k match, row k gives one
  more token free). The tokens are exactly plain greedy decoding's; each pass
  yields between 1 and k + 1 of them. Rejected proposals are cropped from both
  caches.
* Sampling: accept proposal x (drawn from the draft's q) with probability
  min(1, p(x) / q(x)); on rejection, draw from the residual max(0, p - q),
  normalised. Then the token has exactly the target's distribution p
  (:func:`output_distribution` enumerates it).
* Prompt lookup: no draft model; propose the k tokens that followed the latest
  earlier occurrence of the sequence's last n-gram (code, quotes and summaries
  repeat their input).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from ..kv_cache import KVCache
from ..validation import check_int


@dataclass
class SpeculativeStats:
    """Counts of one speculative generation: target and draft forward passes,
    proposals made and accepted."""

    target_passes: int = 0
    draft_passes: int = 0
    proposed: int = 0
    accepted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


class ModelDraft:
    """Greedy proposals from a small model with its own KV cache, kept in step
    with the accepted tokens."""

    def __init__(self, model, max_len: int):
        self.model, self.cache = (
            model.eval(),
            KVCache(len(model.blocks), max_len=max_len),
        )

    def propose(
        self, tokens: list[int], k: int, stats: SpeculativeStats
    ) -> list[int]:
        """k greedy tokens after ``tokens``; the cache first catches up with
        the tokens it has not seen."""
        step_input, out = tokens[len(self.cache) :], []
        for _ in range(k):
            # (1, V)
            logits = self.model(torch.tensor([step_input]), cache=self.cache)[
                :, -1
            ]
            stats.draft_passes += 1
            out.append(int(logits.argmax()))
            step_input = out[-1:]
        return out

    def keep(self, length: int) -> None:
        """Forget cached positions from ``length`` on (rejected proposals)."""
        self.cache.crop(min(length, len(self.cache)))


def early_exit_draft(model, num_layers: int):
    """A draft that is the target's first ``num_layers`` blocks with its
    embeddings, final norm and head (a self-speculative draft: no second model
    to train, about num_layers / L of a target pass). A GPT is rebuilt from its
    config; any other model of the cache protocol (a Decoder) is the same
    object cut after its first blocks, sharing every weight with the target."""
    check_int(num_layers, "num_layers")
    if num_layers >= len(model.blocks):
        raise ValueError(
            f"num_layers={num_layers} must be < the target's "
            f"{len(model.blocks)} layers"
        )
    if not hasattr(model, "config"):
        # a shallow copy: the same modules, in a module table of its own
        draft = copy.copy(model)
        draft._modules = dict(model._modules)
        draft.blocks = nn.ModuleList(model.blocks[:num_layers])
        return draft.eval()
    draft = type(model)(replace(model.config, num_layers=num_layers)).to(
        model.tok_emb.weight
    )
    draft.load_state_dict(
        {
            k: v
            for k, v in model.state_dict().items()
            if k in draft.state_dict()
        }
    )
    return draft.eval()


class PromptLookupDraft:
    """Proposals copied from the sequence itself: what followed the latest
    earlier match of its last n-gram (n from ``max_ngram`` down to 1); none if
    nothing matches."""

    def __init__(self, max_ngram: int = 3):
        check_int(max_ngram, "max_ngram")
        self.max_ngram = max_ngram

    def propose(
        self, tokens: list[int], k: int, stats: SpeculativeStats
    ) -> list[int]:
        return prompt_lookup(tokens, k, self.max_ngram)

    def keep(self, length: int) -> None:
        pass  # nothing cached


def prompt_lookup(tokens: list[int], k: int, max_ngram: int = 3) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the last n
    tokens (longest n first)."""
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == tail:
                return tokens[start + n : start + n + k]
    return []


@torch.no_grad()
def speculative_generate(
    target,
    prompt: list[int],
    max_new_tokens: int,
    k: int,
    draft=None,
    eos_token_id: int | None = None,
) -> tuple[list[int], SpeculativeStats]:
    """Greedy speculative decoding: the same tokens as the target's plain
    greedy decoding, fewer target passes.

    ``draft``: a small :class:`~attention_course.gpt.GPT` (same vocabulary), or
    None for prompt lookup. Returns (new tokens, :class:`SpeculativeStats`).
    """
    check_int(k, "k")
    check_int(max_new_tokens, "max_new_tokens")
    if not prompt:
        raise ValueError("prompt must hold at least one token")
    if draft is not None and draft.vocab_size != target.vocab_size:
        raise ValueError(
            "draft and target must share a vocabulary, got "
            f"{draft.vocab_size} and {target.vocab_size}"
        )
    max_len = len(prompt) + max_new_tokens + k + 1
    proposer = (
        PromptLookupDraft() if draft is None else ModelDraft(draft, max_len)
    )
    cache, stats = (
        KVCache(target.num_layers, max_len=max_len),
        SpeculativeStats(),
    )
    tokens = list(prompt)
    target.eval()
    logits = target(torch.tensor([tokens]), cache=cache)  # prefill: (1, T0, V)
    stats.target_passes += 1
    tokens.append(int(logits[0, -1].argmax()))
    while (
        len(tokens) - len(prompt) < max_new_tokens
        and tokens[-1] != eos_token_id
    ):
        want = min(k, max_new_tokens - (len(tokens) - len(prompt)))
        proposal = proposer.propose(tokens, want, stats)
        # one pass over the last token and the proposals: k + 1 queries,
        # bottom-right causal over the cache (1, 1 + k, V)
        logits = target(torch.tensor([tokens[-1:] + proposal]), cache=cache)
        stats.target_passes += 1
        # best[i]: the target's choice after proposal i - 1
        best = logits[0].argmax(dim=-1).tolist()
        accepted = 0
        while (
            accepted < len(proposal) and proposal[accepted] == best[accepted]
        ):
            accepted += 1
        stats.proposed += len(proposal)
        stats.accepted += accepted
        tokens += proposal[:accepted] + [best[accepted]]
        if eos_token_id in tokens[len(tokens) - accepted - 1 :]:
            tokens = tokens[
                : tokens.index(eos_token_id, len(tokens) - accepted - 1) + 1
            ]
        # the newest token is not in the cache yet; rejected proposals go
        cache.crop(len(tokens) - 1)
        proposer.keep(len(tokens) - 1)
    return tokens[len(prompt) :][:max_new_tokens], stats


# ---------------------------------------------------------------- sampling:
# the rejection rule


def accept_probability(p: Tensor, q: Tensor) -> Tensor:
    """(V,) probability of accepting each draft token x: min(1, p(x) / q(x)) (1
    where q(x) = 0: never drawn)."""
    return torch.where(
        q > 0, torch.clamp(p / torch.where(q > 0, q, 1), max=1), 1
    )


def residual_distribution(p: Tensor, q: Tensor) -> Tensor:
    """(V,) where to draw after a rejection: max(0, p - q), normalised (p
    itself if p == q: no rejection then)."""
    r = torch.clamp(p - q, min=0)
    total = r.sum()
    return r / total if total > 0 else p


def check_distributions(p: Tensor, q: Tensor) -> None:
    for name, d in (("p", p), ("q", q)):
        if (
            not isinstance(d, Tensor)
            or d.dim() != 1
            or not d.is_floating_point()
        ):
            raise TypeError(f"{name} must be a 1-D floating-point tensor (V,)")
        if (d < 0).any() or abs(float(d.sum()) - 1) > 1e-6:
            raise ValueError(
                f"{name} must be a probability distribution (>= 0, sum 1), "
                f"got sum {float(d.sum())}"
            )
    if p.shape != q.shape:
        raise ValueError(
            f"p and q must have the same vocabulary, got {tuple(p.shape)} "
            f"and {tuple(q.shape)}"
        )


def speculative_sample(
    p: Tensor, q: Tensor, generator: torch.Generator
) -> int:
    """One token by the rejection rule: draw x from the draft's q; keep it with
    probability :func:`accept_probability`, else draw from
    :func:`residual_distribution`. Distributed exactly as p."""
    check_distributions(p, q)
    x = int(torch.multinomial(q, 1, generator=generator))
    if float(torch.rand((), generator=generator, dtype=p.dtype)) < float(
        accept_probability(p, q)[x]
    ):
        return x
    return int(
        torch.multinomial(residual_distribution(p, q), 1, generator=generator)
    )


def output_distribution(p: Tensor, q: Tensor) -> Tensor:
    """(V,) exact distribution of :func:`speculative_sample`'s token,
    enumerating the draft's choice x:
    P(y) = q(y) a(y) + (sum_x q(x) (1 - a(x))) r(y). Equals p (the proof of
    Leviathan et al., Appendix A.1)."""
    check_distributions(p, q)
    a = accept_probability(p, q)
    rejected = (q * (1 - a)).sum()
    return q * a + rejected * residual_distribution(p, q)


# ---------------------------------------------------------------- how many
# tokens a verify pass brings


def _check_alpha(alpha: float) -> None:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(
            f"alpha must be a float, got {type(alpha).__name__} {alpha!r}"
        )
    if not 0 <= alpha <= 1:
        raise ValueError(
            f"alpha must be a probability in [0, 1], got alpha={alpha}"
        )


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """Expected tokens one verify pass yields when each of its k proposals is
    accepted with probability alpha, independently (Leviathan et al. 2023, eq.
    1).

    The pass yields its (i + 1)-th token (i = 0..k) exactly when the first i
    proposals were all accepted, probability alpha^i: E = sum_i alpha^i = (1 -
    alpha^(k + 1)) / (1 - alpha), and k + 1 when alpha = 1.
    """
    _check_alpha(alpha)
    check_int(k, "k")
    # the sum, not the quotient: no 0 / 0 at alpha = 1
    return sum(alpha**i for i in range(k + 1))


def expected_speedup(alpha: float, k: int, draft_cost: float) -> float:
    """Tokens per unit of target-pass cost against plain decoding (one token
    per pass): E / (1 + k * draft_cost), with ``draft_cost`` the cost of one
    draft pass in target passes (Leviathan et al. 2023, Theorem 3.8)."""
    if (
        isinstance(draft_cost, bool)
        or not isinstance(draft_cost, (int, float))
        or draft_cost < 0
    ):
        raise ValueError(
            f"draft_cost must be a number >= 0, got draft_cost={draft_cost!r}"
        )
    return expected_tokens_per_pass(alpha, k) / (1 + k * draft_cost)


def fit_acceptance(ks, tokens_per_pass, resolution: float = 1e-4) -> float:
    """The least-squares alpha: the one whose :func:`expected_tokens_per_pass`
    is nearest the measured tokens per verify pass at each k (sum of squared
    differences), searched on a grid of step ``resolution`` over [0, 1]."""
    ks, measured = list(ks), [float(m) for m in tokens_per_pass]
    if not ks or len(ks) != len(measured):
        raise ValueError(
            "ks and tokens_per_pass must be non-empty and of one length, "
            f"got {len(ks)} and "
            f"{len(measured)}"
        )
    for k in ks:
        check_int(k, "k")
    if not 0 < resolution < 1:
        raise ValueError(
            f"resolution must be in (0, 1), got resolution={resolution}"
        )
    # (A,)
    alphas = torch.linspace(
        0, 1, round(1 / resolution) + 1, dtype=torch.float64
    )
    # (A, kmax + 1): alpha^i
    powers = alphas[:, None] ** torch.arange(max(ks) + 1, dtype=torch.float64)
    # (A, len(ks))
    expected = torch.stack([powers[:, : k + 1].sum(-1) for k in ks], dim=-1)
    # (A,)
    error = (
        (expected - torch.tensor(measured, dtype=torch.float64)).pow(2).sum(-1)
    )
    return float(alphas[error.argmin()])
