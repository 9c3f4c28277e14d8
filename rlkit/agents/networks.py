"""The agents' multilayer perceptron, and the same behind an observation encoder."""

from __future__ import annotations

import rlkit.core as rc
from rlkit.agents.observations import Identity, ObservationLayout


def mlp(sizes: tuple[int, ...], final_activation: bool) -> rc.nn.Sequential:
    """Linear layers between ``sizes``, ReLU between them, initialised as PyTorch initialises
    nn.Linear (the scale the RL Zoo settings were tuned with)."""
    pairs = list(zip(sizes[:-1], sizes[1:]))
    return rc.nn.Sequential(*[
        rc.nn.Linear(a, b, activation="relu" if final_activation or i < len(pairs) - 1 else None,
                     init="fan_in_uniform")
        for i, (a, b) in enumerate(pairs)])


def encoded_mlp(layout: ObservationLayout, hidden: tuple[int, ...], n_out: int, features_extractor_kwargs: dict | None = None) -> rc.nn.Module:
    """The observation encoder (a CNN for images, one-hot rows for indices) then an MLP through
    ``hidden`` to ``n_out``; for vector observations the MLP alone, its parameters named as they
    always were ("0.W", ...)."""
    encoder, features = layout.features_extractor(features_extractor_kwargs)
    head = mlp((features, *hidden, n_out), final_activation=False)
    return head if isinstance(encoder, Identity) else rc.nn.Sequential(encoder, head)
