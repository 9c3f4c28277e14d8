"""The agents' multilayer perceptron."""

from __future__ import annotations

import rlkit.core as rc


def mlp(sizes: tuple[int, ...], final_activation: bool) -> rc.nn.Sequential:
    """Linear layers between ``sizes``, ReLU between them, initialised as PyTorch initialises
    nn.Linear (the scale the RL Zoo settings were tuned with)."""
    pairs = list(zip(sizes[:-1], sizes[1:]))
    return rc.nn.Sequential(*[
        rc.nn.Linear(a, b, activation="relu" if final_activation or i < len(pairs) - 1 else None,
                     init="fan_in_uniform")
        for i, (a, b) in enumerate(pairs)])
