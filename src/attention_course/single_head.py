"""One attention head with learned query, key and value projections (no output
projection)."""

from __future__ import annotations

from torch import Tensor, nn

from .functional import scaled_dot_product_attention
from .validation import check_dropout, check_int, check_module_inputs


class SingleHeadAttention(nn.Module):
    """Project inputs (B, T, d_in) to queries, keys and values of width d_out,
    then attend.

    Args:
        d_in: feature size of the inputs.
        d_out: width of queries, keys, values and of the output.
        bias: whether the projections ``w_q``, ``w_k``, ``w_v`` (d_in -> d_out)
            have biases.
        dropout: probability of dropping attention weights, in ``.train()``
            mode only.
    """

    def __init__(
        self, d_in: int, d_out: int, bias: bool = True, dropout: float = 0.0
    ):
        super().__init__()
        check_int(d_in, "d_in")
        check_int(d_out, "d_out")
        check_dropout(dropout)
        self.d_in, self.d_out, self.dropout = d_in, d_out, dropout
        self.w_q = nn.Linear(d_in, d_out, bias=bias)
        self.w_k = nn.Linear(d_in, d_out, bias=bias)
        self.w_v = nn.Linear(d_in, d_out, bias=bias)

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: Tensor | None = None,
        return_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """query (B, Tq, d_in), key and value (B, Tk, d_in) -> out (B, Tq,
        d_out) [, weights (B, Tq, Tk)].

        key defaults to query (self-attention) and value to key; ``mask``
        broadcasts to (B, Tq, Tk), True = may attend.
        """
        key = query if key is None else key
        value = key if value is None else value
        check_module_inputs(
            query,
            key,
            value,
            (self.d_in, self.d_in, self.d_in),
            self.w_q.weight.dtype,
        )
        q = self.w_q(query)  # (B, Tq, d_out)
        k = self.w_k(key)  # (B, Tk, d_out)
        v = self.w_v(value)  # (B, Tk, d_out)
        # dropout regularises training only
        dropout_p = self.dropout if self.training else 0.0
        # (B, Tq, d_out), (B, Tq, Tk)
        out, weights = scaled_dot_product_attention(q, k, v, mask, dropout_p)
        return (out, weights) if return_weights else out
