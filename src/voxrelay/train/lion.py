"""Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"): the sign of an interpolated
momentum as the update, one state (the momentum) per parameter, half AdamW's optimizer memory.

    c = beta1 * m + (1 - beta1) * g         update direction
    p = p * (1 - lr * weight_decay) - lr * sign(c)
    m = beta2 * m + (1 - beta2) * g         momentum

Its update has norm ~1 per element, so it wants a learning rate 3-10x smaller than AdamW's and a weight
decay 3-10x larger (the paper; betas (0.9, 0.99)). Pure torch ops: works on FSDP2's DTensors and on CPU.
"""

from __future__ import annotations

import torch


class Lion(torch.optim.Optimizer):
    """``state[p]["exp_avg"]``: the momentum, in the parameter's dtype (saved with the checkpoint)."""

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0):
        if not lr > 0 or not all(0.0 <= b < 1.0 for b in betas) or weight_decay < 0:
            raise ValueError(f"Lion: lr > 0, betas in [0, 1) and weight_decay >= 0, got {lr}, {betas}, {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), decay = group["lr"], group["betas"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                m = state["exp_avg"]
                direction = m.mul(beta1).add_(p.grad, alpha=1 - beta1).sign_()
                if decay:
                    p.mul_(1 - lr * decay)
                p.add_(direction, alpha=-lr)
                m.mul_(beta2).add_(p.grad, alpha=1 - beta2)
        return loss
