"""The float64 reference of the model's arithmetic: a fixed tiny model, fixed inputs, and what gptcore computes
from them (logits, loss, gradient norms, five training steps). ``tests/data/reference_float64.json`` holds the
committed figures; ``tests/test_reference.py`` checks the code against them.

Regenerate (only when the model's math is meant to change, see test_reference.py):

    python -m tests.reference --write
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from gptcore.config import CHAR_VOCAB, GPTConfig, Recipe
from gptcore.training.model import GPT
from gptcore.training.trainer import Trainer

FIXTURE = Path(__file__).parent / "data" / "reference_float64.json"

#: 2 layers x 2 heads x 16 wide, T=8, batch 2, biases on (so that every parameter kind is pinned), no dropout.
CONFIG = GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=CHAR_VOCAB, batch_size=2, bias=True)
STEPS = 5


def set_parameters(model: GPT) -> None:
    """Every parameter from a closed form (no random generator, so nothing depends on torch's RNG streams):
    LayerNorm weights 1 + 0.1 sin(.), biases 0.02 sin(.), matrices and embeddings 0.1 sin(.)."""
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            k = torch.arange(p.numel(), dtype=torch.float64)
            wave = torch.sin(0.731 * k + 1.3 * (i + 1)).reshape(p.shape)
            if ".ln_" in name or name.startswith("transformer.ln_f"):
                value = 1.0 + 0.1 * wave if name.endswith("weight") else 0.02 * wave
            else:
                value = 0.02 * wave if name.endswith("bias") else 0.1 * wave
            p.copy_(value)


def tokens(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of ``step``: a fixed arithmetic pattern of token ids, targets shifted by one."""
    B, T, V = CONFIG.batch_size, CONFIG.block_size, CONFIG.vocab_size
    ids = (torch.arange(B * (T + 1)) * 7 + 3 + 11 * step) % V
    ids = ids.reshape(B, T + 1)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def compute(attention: str = "sdpa") -> dict:
    """The reference quantities, computed by gptcore in float64."""
    recipe = Recipe(attention=attention)
    model = GPT(CONFIG, recipe).to(torch.float64)
    set_parameters(model)
    x, y = tokens(0)
    logits, loss = model(x, y)
    loss.backward()
    grad_norms = {name: p.grad.norm().item() for name, p in model.named_parameters()}

    trainer = Trainer(CONFIG, recipe, "cpu", dtype=torch.float64)
    set_parameters(trainer.model)
    losses = [trainer.step(tokens(step)).item() for step in range(STEPS)]
    param_norm = math.sqrt(sum(p.detach().pow(2).sum().item() for p in trainer.model.parameters()))
    return {
        "logits": logits.detach().tolist(),
        "loss": loss.item(),
        "grad_norms": grad_norms,
        "train_losses": losses,
        "param_norm_after": param_norm,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description="Compute (and with --write, store) the float64 reference.")
    parser.add_argument("--write", action="store_true", help=f"overwrite {FIXTURE}")
    args = parser.parse_args()
    figures = compute()
    figures["generated_with"] = {"torch": torch.__version__}
    if args.write:
        FIXTURE.write_text(json.dumps(figures, indent=1) + "\n")
        print(f"wrote {FIXTURE}")
    else:
        print(json.dumps({k: v for k, v in figures.items() if k != "logits"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
