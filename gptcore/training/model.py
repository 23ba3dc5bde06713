"""GPT in the nanoGPT architecture: pre-LayerNorm blocks, GELU MLP, learned positions, optional weight tying.

The recipe chooses what the studies vary inside the model: the attention kernel, vocabulary padding, weight tying
and activation checkpointing per block.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from gptcore.config import GPTConfig, Recipe
from gptcore.training.kernels import below_capability, fused_linear_cross_entropy

#: The kernels a recipe may pin sdpa to (the attention study); "sdpa" leaves the choice to sdpa's own dispatch,
#: which picks FlashAttention-2 on an A100 and cuDNN's attention on Hopper.
_SDPA_BACKEND = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}
#: The pinned kernels that exist only on a CUDA GPU, and the compute capability each needs.
_CUDA_KERNELS = {"flash": (8, 0), "efficient": (5, 0), "cudnn": (8, 0)}


def attention_capability(attention: str) -> tuple[int, int] | None:
    """The CUDA compute capability that ``attention`` needs, or None when it runs anywhere (manual, sdpa, math)."""
    return _CUDA_KERNELS.get(attention)


def attention_unsupported(attention: str, device: torch.device | str) -> str | None:
    """Why ``attention`` cannot run on ``device``, or None when it can."""
    device = torch.device(device)
    capability = attention_capability(attention)
    if capability is None:
        return None
    need = "{}.{}".format(*capability)
    if device.type != "cuda":
        return f"{attention} attention needs a CUDA GPU (compute capability >= {need}); this run is on {device.type}"
    short = below_capability(device, capability)
    return f"{attention} attention needs compute capability >= {need}; {short}" if short else None


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig, attention: str) -> None:
        super().__init__()
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # q, k, v for all heads at once
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.attn_dropout = nn.Dropout(cfg.dropout)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.n_head, self.dropout, self.attention = cfg.n_head, cfg.dropout, attention
        if attention == "manual":  # lower-triangular mask, not saved in checkpoints
            mask = torch.tril(torch.ones(cfg.block_size, cfg.block_size, dtype=torch.bool))
            self.register_buffer("mask", mask.view(1, 1, cfg.block_size, cfg.block_size), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        if self.attention == "manual":
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, T, T)
            att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
            att = self.attn_dropout(F.softmax(att, dim=-1))
            y = att @ v  # (B, nh, T, hs)
        else:
            p = self.dropout if self.training else 0.0
            backend = _SDPA_BACKEND.get(self.attention)
            with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble the heads side by side
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class LMHead(nn.Linear):
    """The lm_head, ``vocab_rows`` wide. Padded (``vocab_rows > vocab_size``), it adds a constant bias of 0 on the
    real columns and -inf on the padding ones: the matmul's epilogue adds it (no copy of the B x T x vocab logits),
    the softmax gives the padding columns probability 0, so the loss is the loss over the real vocabulary, and their
    gradient is 0 (no padding row of the weight is trained). The bias is a buffer, not a parameter."""

    def __init__(self, n_embd: int, vocab_rows: int, vocab_size: int) -> None:
        super().__init__(n_embd, vocab_rows, bias=False)
        mask = None
        if vocab_rows > vocab_size:
            mask = torch.zeros(vocab_rows)
            mask[vocab_size:] = float("-inf")
        self.register_buffer("padding_mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.padding_mask)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, attention: str) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg, attention)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's GPT; ``forward(idx, targets)`` returns (logits over the real vocabulary, mean loss or None); with
    the fused linear cross-entropy (Recipe.kernels.loss) and targets, (None, mean loss). Compiled, with targets, the
    logits come back detached (the loss is what a step differentiates; see forward)."""

    def __init__(self, cfg: GPTConfig, recipe: Recipe | None = None) -> None:
        super().__init__()
        recipe = recipe or Recipe()
        self.cfg = cfg
        self.checkpoint_blocks = recipe.checkpoint
        self.tied = recipe.tie_weights
        self.fused_loss = recipe.kernels.loss == "liger"
        self.vocab_rows = recipe.vocab_rows(cfg)
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(self.vocab_rows, cfg.n_embd),
                wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
                drop=nn.Dropout(cfg.dropout),
                h=nn.ModuleList([Block(cfg, recipe.attention) for _ in range(cfg.n_layer)]),
                ln_f=nn.LayerNorm(cfg.n_embd, bias=cfg.bias),
            )
        )
        self.lm_head = LMHead(cfg.n_embd, self.vocab_rows, cfg.vocab_size)
        if self.tied:
            self.transformer.wte.weight = self.lm_head.weight  # one storage for both
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        B, T = idx.size()
        if T > self.cfg.block_size:
            raise ValueError(f"block_size: sequence of {T} tokens exceeds the model's {self.cfg.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))  # (B, T, C)
        for block in self.transformer.h:
            if self.checkpoint_blocks and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        if self.fused_loss and targets is not None:  # the head and the loss in one: the logits are never made
            head = self.lm_head
            return None, fused_linear_cross_entropy(self.transformer.ln_f(x), head.weight, head.padding_mask, targets)
        # no local holds ln_f's output: it dies at the matmul (under autocast its bf16 cast is what is saved)
        logits = self.lm_head(self.transformer.ln_f(x))  # (B, T, vocab_rows), padding columns -inf
        loss = None
        if targets is not None:  # over all vocab_rows columns: the padding ones add exp(-inf) = 0
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        if loss is not None and torch.compiler.is_compiling():
            # a compiled graph's every output that requires grad gets a gradient in backward, zero-filled when the
            # caller drops it (a B x T x vocab memset, read back by the loss's backward); eager autograd passes none.
            # With a loss, the loss is what is differentiated: the logits come back detached
            logits = logits.detach()
        if self.vocab_rows != self.cfg.vocab_size:
            logits = logits[..., : self.cfg.vocab_size]  # a view: the caller sees the real vocabulary
        return logits, loss

    def num_params(self) -> int:
        """Distinct parameters (a tied embedding counts once), padding rows included."""
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self) -> int:
        """Training FLOPs per token (forward + backward = 3 x forward) counted over matmuls, as in PaLM's MFU:
        6 x (weights used in matmuls: every Linear, lm_head included) + 12 x n_layer x n_embd x T for the
        attention scores and their product with V (the full T x T, as ``gptcore.measure.flops`` counts every attention
        kernel)."""
        matmul_weights = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        cfg = self.cfg
        return 6 * matmul_weights + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size
