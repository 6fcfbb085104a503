"""Training loop of chapter 12: determinism, the loss, and the reversal task with and without positions."""

import pytest
import torch
import torch.nn.functional as F

from attention_course.gpt import GPT, GPTConfig
from attention_course.tasks import position_blind_accuracy, reversal_batch
from attention_course.training import History, summary_line, tagging_loss, train

LENGTH, STEPS, BLIND_STEPS = 12, 100, 40  # without positions it plateaus within a few dozen steps


def encoder(positions, seed=0, backend="eager"):
    torch.manual_seed(seed)
    return GPT(GPTConfig(10, 64, 4, 2, max_len=LENGTH, positions=positions, causal=False, backend=backend))


def reversal_loss(model, batch):
    digits, target = batch
    return tagging_loss(model(digits), target)


def token_accuracy(model, batch):
    with torch.no_grad():
        return (model(batch[0]).argmax(-1) == batch[1]).float().mean().item()


TEST = reversal_batch(1000, LENGTH, torch.Generator().manual_seed(123))


@pytest.fixture(scope="module")
def trained():
    """Both models of the chapter, trained once for the module with the same seed and budget (through PyTorch's
    fused attention: the same verdicts as the course's attention, 1.5 times faster)."""
    models, histories = {}, {}
    for positions, steps in (("learned", STEPS), (None, BLIND_STEPS)):
        models[positions] = encoder(positions, backend="sdpa")
        histories[positions] = train(
            models[positions], lambda g: reversal_batch(64, LENGTH, g), reversal_loss, steps,
            eval_fn=lambda m: {"accuracy": token_accuracy(m, TEST)}, eval_every=50,
        )
    return models, histories


def test_reversal_reaches_99_percent_within_the_budget(trained):
    models, histories = trained
    assert token_accuracy(models["learned"], TEST) >= 0.99
    steps, accuracy = histories["learned"].metric("accuracy")
    assert steps == [0, 50, 100] and accuracy[0] < 0.2  # it started at chance and learned
    assert len(histories["learned"].losses) == STEPS


def test_without_positions_it_only_counts(trained):
    """A bidirectional model without positions cannot tell positions apart: at best it answers the most
    common of the other digits (about 26 % for 12 digits), well above chance (10 %), far below 99 %."""
    models, _ = trained
    ceiling = position_blind_accuracy(*TEST)
    assert 0.2 < ceiling < 0.3
    accuracy = token_accuracy(models[None], TEST)
    assert 0.15 < accuracy <= ceiling + 0.01
    assert accuracy < 0.35


def test_without_positions_the_model_is_permutation_equivariant():
    """Permuting the input digits permutes the logits the same way: nothing tells the positions apart."""
    model = encoder(None).eval()
    digits = TEST[0][:4]
    permutation = torch.randperm(LENGTH, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(model(digits[:, permutation]), model(digits)[:, permutation], atol=1e-5, rtol=1e-5)
    with_positions = encoder("learned").eval()
    assert not torch.allclose(with_positions(digits[:, permutation]), with_positions(digits)[:, permutation],
                              atol=1e-5, rtol=1e-5)


def test_training_is_deterministic_and_seed_matters():
    def run(seed):
        model = encoder("learned")
        return train(model, lambda g: reversal_batch(16, LENGTH, g), reversal_loss, 5, seed=seed).losses

    assert run(0) == run(0)
    assert run(0) != run(1)


def test_tagging_loss_against_cross_entropy():
    logits, targets = torch.randn(3, 5, 7), torch.randint(0, 7, (3, 5))
    torch.testing.assert_close(tagging_loss(logits, targets), F.cross_entropy(logits.transpose(1, 2), targets))
    keep = torch.zeros(3, 5, dtype=torch.bool)
    keep[1, 2:] = True
    expected = F.cross_entropy(logits[1, 2:], targets[1, 2:])
    torch.testing.assert_close(tagging_loss(logits, targets, keep), expected)


def test_history_metric_and_errors():
    history = History(metrics={"accuracy": [(0, 0.1), (10, 0.9)]})
    assert history.metric("accuracy") == ([0, 10], [0.1, 0.9])
    model = encoder("learned")
    for kwargs, match in (({"steps": 0}, "steps"), ({"steps": 2, "lr": 0.0}, "lr"),
                          ({"steps": 2, "eval_every": 0}, "eval_every")):
        with pytest.raises(ValueError, match=match):
            train(model, lambda g: reversal_batch(4, LENGTH, g), reversal_loss, **kwargs)


def test_loss_below_prints_one_verdict_line_on_stdout_and_nothing_on_stderr(capsys):
    """The page shows stdout only: one line, a verdict rather than the loss, the same on every machine."""
    model = encoder("learned")
    history = train(model, lambda g: reversal_batch(4, LENGTH, g), reversal_loss, 3, loss_below=100.0)
    out, err = capsys.readouterr()
    assert out == "trained 3 steps; mean loss of the last 3 < 100: True\n"
    assert err == ""
    history.losses[-1] = 1e6  # one bad step among the last ten turns the verdict
    assert summary_line(history, 100.0).endswith("< 100: False")
    train(model, lambda g: reversal_batch(4, LENGTH, g), reversal_loss, 2)
    assert capsys.readouterr() == ("", "")  # silent unless asked
    with pytest.raises(ValueError, match="loss_below"):
        train(model, lambda g: reversal_batch(4, LENGTH, g), reversal_loss, 2, loss_below=0.0)


def test_progress_bar_runs(capsys):
    model = encoder("learned")
    history = train(model, lambda g: reversal_batch(4, LENGTH, g), reversal_loss, 3, progress=True)
    assert len(history.losses) == 3
    assert "3/3" in capsys.readouterr().err
