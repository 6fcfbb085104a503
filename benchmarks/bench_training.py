"""Training throughput, CPU fp32: the course's GPT vs an equal-size model built on nn.TransformerEncoder.

Candidates (the same weights; one training step = forward, cross-entropy, backward, AdamW step):
  GPT           attention_course.gpt.GPT: pre-LN GELU blocks, learned positions, tied head; its attention
                    forms the weights explicitly (it returns them for chapter 12's attention maps)
  nn.Transformer    token embedding + the same learned positions + nn.TransformerEncoder of
                    nn.TransformerEncoderLayer(norm_first=True, activation="gelu", dropout=0), with the same causal
                    mask (boolean, its convention True = NOT allowed, plus is_causal=True), final LayerNorm, tied head

Both are checked to compute the same logits and gradients before timing. Reported: tokens per second (B*T per
step / fastest step time), and the ratio GPT / nn.Transformer. Target: GPT >= 0.9 of its throughput.

Usage: python benchmarks/bench_training.py [--repeats N]
"""

from __future__ import annotations

import argparse

import common  # sets OMP_WAIT_POLICY before torch is imported
import torch
import torch.nn.functional as F
from torch import nn

from attention_course.gpt import GPT, GPTConfig
from attention_course.params import load_torch_mha

VOCAB, D, H, L, B, T = 64, 128, 4, 2, 16, 128
MIN_RATIO = 0.9


class TorchGPT(nn.Module):
    """The same model as GPT, its blocks from nn.TransformerEncoder (pre-LN, GELU, causal mask)."""

    def __init__(self, vocab: int, d: int, h: int, layers: int, max_len: int):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d)
        self.pos_emb = nn.Embedding(max_len, d)
        layer = nn.TransformerEncoderLayer(d, h, 4 * d, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.size(1)
        x = self.tok_emb(ids) + self.pos_emb(torch.arange(t))  # (B, T, D)
        not_allowed = ~torch.ones(t, t, dtype=torch.bool).tril()  # torch: True = NOT allowed
        x = self.encoder(x, mask=not_allowed, is_causal=True)
        return self.norm(x) @ self.tok_emb.weight.T  # (B, T, V), tied head


@torch.no_grad()
def copy_weights(ours: GPT, theirs: TorchGPT) -> None:
    """Give the GPT the torch model's weights (the attention's through params.load_torch_mha)."""
    ours.tok_emb.weight.copy_(theirs.tok_emb.weight)
    next(ours.pos_emb.parameters()).copy_(theirs.pos_emb.weight)
    ours.norm.load_state_dict(theirs.norm.state_dict())
    for block, layer in zip(ours.blocks, theirs.encoder.layers, strict=True):
        attn = block.attn
        load_torch_mha({"q": attn.w_q, "k": attn.w_k, "v": attn.w_v, "o": attn.w_o}, layer.self_attn)
        block.norm1.load_state_dict(layer.norm1.state_dict())
        block.norm2.load_state_dict(layer.norm2.state_dict())
        block.mlp.linear1.load_state_dict(layer.linear1.state_dict())
        block.mlp.linear2.load_state_dict(layer.linear2.state_dict())


def build() -> tuple[GPT, TorchGPT]:
    torch.manual_seed(0)
    theirs = TorchGPT(VOCAB, D, H, L, T)
    ours = GPT(GPTConfig(VOCAB, D, H, L, max_len=T, positions="learned"))
    copy_weights(ours, theirs)
    return ours.train(), theirs.train()


def loss_of(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids[:, :-1])  # (B, T - 1, V)
    return F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())


def check(ours: GPT, theirs: TorchGPT, ids: torch.Tensor) -> None:
    """Same loss and same gradient of the token embedding: the two models compute the same function."""
    losses, grads = [], []
    for model in (ours, theirs):
        model.zero_grad()
        loss = loss_of(model, ids)
        loss.backward()
        losses.append(loss.detach())
        grads.append(model.tok_emb.weight.grad.clone())
        model.zero_grad()
    common.check("loss, GPT vs nn.TransformerEncoder", common.max_abs_diff(*losses), 1e-5)
    common.check("embedding gradient, GPT vs nn.TransformerEncoder", common.max_abs_diff(*grads), 1e-5)


def step_fn(model: nn.Module, ids: torch.Tensor):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_of(model, ids).backward()
        optimizer.step()

    return step


def main(repeats: int = 15) -> dict:
    config = common.setup("bench_training", {"vocab": VOCAB, "D": D, "H": H, "layers": L, "B": B, "T": T,
                                             "dtype": "float32"})
    ours, theirs = build()
    ids = torch.randint(0, VOCAB, (B, T + 1), generator=torch.Generator().manual_seed(0))
    check(ours, theirs, ids[:2, :17])
    params = sum(p.numel() for p in ours.parameters()), sum(p.numel() for p in theirs.parameters())
    print(f"parameters: GPT {params[0]:,}, nn.Transformer {params[1]:,}")
    candidates = {"GPT": step_fn(ours, ids), "nn.TransformerEncoder": step_fn(theirs, ids)}
    times = common.interleaved(candidates, repeats=repeats, warmup=2, inference=False)
    tokens = B * T
    rows, results = [], {}
    for name, ts in times.items():
        best, med = common.fastest(ts), common.median(ts)
        results[name] = {"fastest_s": best, "median_s": med, "tokens_per_s": tokens / best}
        rows.append([name, f"{best * 1e3:.0f}", f"{med * 1e3:.0f}", f"{tokens / best:,.0f}"])
    ratio = results["GPT"]["tokens_per_s"] / results["nn.TransformerEncoder"]["tokens_per_s"]
    median_ratio = results["nn.TransformerEncoder"]["median_s"] / results["GPT"]["median_s"]
    headers = ["model", "fastest step ms", "median step ms", "tokens/s (fastest)"]
    print(common.markdown_table(headers, rows))
    targets = [[f"GPT tokens/s >= {MIN_RATIO} x nn.TransformerEncoder", f"{ratio:.2f} (median {median_ratio:.2f})",
                common.verdict(ratio >= MIN_RATIO)]]
    print()
    print(common.markdown_table(["target", "measured", "result"], targets))
    common.save("bench_training", config, table={"headers": headers, "rows": rows}, targets=targets,
                results=results, ratio=ratio, parameters=params)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    main(parser.parse_args().repeats)
