"""Seeded toy tasks for training small transformers on a CPU (chapter 12).

Each generator takes a ``torch.Generator`` so a seed fixes every batch, and
returns integer tensors:

- :func:`reversal_batch`, :func:`shift_batch`, :func:`sorting_batch`:
  sequence-to-sequence tasks in tagging form for a bidirectional model:
  position i of the output is the target for position i of the input. Reversal
  needs a content lookup at the mirrored position (an anti-diagonal attention
  map).
- :func:`repeated_segment_batch`: random tokens in which a random segment of
  random length is followed by its copy; from the second token of the copy on,
  the next token can be read off the first occurrence (what an induction head
  does). The copy offset varies per example, so position alone cannot solve it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .validation import check_int


def _random_digits(
    batch_size: int, length: int, num_digits: int, generator: torch.Generator
) -> Tensor:
    for name, value in (
        ("batch_size", batch_size),
        ("length", length),
        ("num_digits", num_digits),
    ):
        check_int(value, name)
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            "generator must be a torch.Generator, got "
            f"{type(generator).__name__}"
        )
    # (B, T)
    return torch.randint(
        0, num_digits, (batch_size, length), generator=generator
    )


def reversal_batch(
    batch_size: int,
    length: int,
    generator: torch.Generator,
    num_digits: int = 10,
) -> tuple[Tensor, Tensor]:
    """Digits (B, T) and their reversal (B, T): target[i] = digits[T - 1 -
    i]."""
    digits = _random_digits(batch_size, length, num_digits, generator)
    return digits, digits.flip(-1)


def shift_batch(
    batch_size: int,
    length: int,
    generator: torch.Generator,
    shift: int = 3,
    num_digits: int = 10,
) -> tuple[Tensor, Tensor]:
    """Digits (B, T) and their cyclic shift (B, T): target[i] = digits[(i +
    shift) % T]."""
    if isinstance(shift, bool) or not isinstance(shift, int):
        raise TypeError(f"shift must be an int, got {type(shift).__name__}")
    digits = _random_digits(batch_size, length, num_digits, generator)
    return digits, digits.roll(-shift, dims=-1)


def sorting_batch(
    batch_size: int,
    length: int,
    generator: torch.Generator,
    num_digits: int = 10,
) -> tuple[Tensor, Tensor]:
    """Digits (B, T) and the same digits sorted ascending (B, T)."""
    digits = _random_digits(batch_size, length, num_digits, generator)
    return digits, digits.sort(dim=-1).values


def repeated_segment_batch(
    batch_size: int,
    seq_len: int,
    vocab_size: int,
    generator: torch.Generator,
    min_segment: int = 4,
    max_segment: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Random tokens (B, T) with a segment copied once, and the mask (B, T) of
    the copy's predictable targets.

    Per example: a segment length L in [min_segment, max_segment] and a start s
    are drawn, and ids[s + L : s + 2L] = ids[s : s + L]. ``copy_target[b, t]``
    is True where the next token ids[t + 1] lies in the copy and its
    predecessor ids[t] does too (t in [s + L, s + 2L - 2]): an induction head
    can find ids[t] earlier and read the token that followed it. Default
    max_segment: seq_len // 2.
    """
    for name, value in (
        ("batch_size", batch_size),
        ("seq_len", seq_len),
        ("vocab_size", vocab_size),
        ("min_segment", min_segment),
    ):
        check_int(value, name)
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            "generator must be a torch.Generator, got "
            f"{type(generator).__name__}"
        )
    max_segment = seq_len // 2 if max_segment is None else max_segment
    if not 2 <= min_segment <= max_segment <= seq_len // 2:
        raise ValueError(
            "need 2 <= min_segment <= max_segment <= seq_len // 2, got "
            f"min_segment={min_segment}, "
            f"max_segment={max_segment}, seq_len={seq_len}"
        )
    # (B, T)
    ids = torch.randint(
        0, vocab_size, (batch_size, seq_len), generator=generator
    )
    # (B,)
    lengths = torch.randint(
        min_segment, max_segment + 1, (batch_size,), generator=generator
    )
    room = seq_len - 2 * lengths + 1  # number of valid starts
    # (B,) uniform in [0, room)
    starts = (torch.rand(batch_size, generator=generator) * room).long()
    t = torch.arange(seq_len)  # (T,)
    # (B, 1)
    copy_start, copy_end = (
        (starts + lengths)[:, None],
        (starts + 2 * lengths)[:, None],
    )
    in_copy = (t >= copy_start) & (t < copy_end)  # (B, T)
    # (B, T) where each copied token comes from
    source = (t - lengths[:, None]).clamp(min=0)
    ids = torch.where(in_copy, ids.gather(1, source), ids)
    # (B, T) predictor and next token both in the copy
    copy_target = (t >= copy_start) & (t < copy_end - 1)
    return ids, copy_target


def position_blind_accuracy(
    digits: Tensor, targets: Tensor, num_digits: int = 10
) -> float:
    """Best expected token accuracy on reversal of a model that cannot tell
    positions apart.

    A bidirectional model without positions is permutation-equivariant:
    position i knows its own digit and how many of each digit the sequence
    holds, not where anything is. Its best answer is the most common digit
    among the *others* (the target sits at another position). It can count, so
    it beats chance (1 / num_digits).
    """
    # (B, 1, num_digits)
    counts = nn.functional.one_hot(digits, num_digits).sum(dim=1, keepdim=True)
    # (B, T, num_digits): without the own digit
    others = counts - nn.functional.one_hot(digits, num_digits)
    guess = others.argmax(dim=-1)  # (B, T)
    return (targets == guess).float().mean().item()


def associative_recall_batch(
    batch_size: int,
    num_pairs: int,
    generator: torch.Generator,
    num_keys: int = 64,
    num_values: int = 16,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Associative recall (chapter 17): ``num_pairs`` (key, value) pairs, then
    every key asked once, shuffled.

    One position per pair: key id and value id; then one position per question:
    the key id and the blank value id ``num_values``. Keys are distinct within
    a sequence. Returns key ids (B, T), value ids (B, T), targets (B, T) (at a
    question: the value stored with its key) and the questions' mask (B, T), T
    = 2 * num_pairs.
    """
    for name, value in (
        ("batch_size", batch_size),
        ("num_pairs", num_pairs),
        ("num_keys", num_keys),
        ("num_values", num_values),
    ):
        check_int(value, name)
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            "generator must be a torch.Generator, got "
            f"{type(generator).__name__}"
        )
    if num_pairs > num_keys:
        raise ValueError(
            "num_pairs must be <= num_keys (distinct keys), got "
            f"num_pairs={num_pairs}, "
            f"num_keys={num_keys}"
        )
    # (B, N) distinct
    keys = torch.rand(batch_size, num_keys, generator=generator).argsort(-1)[
        :, :num_pairs
    ]
    # (B, N)
    values = torch.randint(
        0, num_values, (batch_size, num_pairs), generator=generator
    )
    # (B, N) questions' order
    order = torch.rand(batch_size, num_pairs, generator=generator).argsort(-1)
    key_ids = torch.cat([keys, keys.gather(1, order)], 1)
    value_ids = torch.cat([values, torch.full_like(values, num_values)], 1)
    targets = torch.cat([values, values.gather(1, order)], 1)
    asked = torch.arange(2 * num_pairs) >= num_pairs
    return key_ids, value_ids, targets, asked.expand(batch_size, -1)
