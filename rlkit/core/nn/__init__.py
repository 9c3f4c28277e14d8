"""Modules: layers with named parameters, train/eval modes and state dicts.

Inputs are column-major ``[features, batch]``. A module registers the parameters, buffers
(non-trained state such as running statistics) and sub-modules assigned to its attributes, in
assignment order; ``parameters()`` returns them as an ordered ``{dotted name: param}`` and
each parameter's ``name`` is that dotted name, so ``grads["0.W"]`` finds it.

The layers live in ``layers.py``, the image layers and encoders (Conv2d, MaxPool2d, NatureCNN,
ImpalaCNN) in ``conv.py``, the recurrent blocks (Mamba, RWKV-7) in ``recurrent.py``;
this module is where they are used from (``rc.nn.Linear``, ``rc.nn.MambaBlock``).
"""

from rlkit.core.nn.layers import (
    ACTIVATIONS, INITIALISERS, BatchNorm, Dropout, Embedding, LayerNorm, Linear, Module, MultiheadAttention, Sequential,
)
from rlkit.core.nn.conv import (
    Conv2d, Flatten, ImpalaCNN, MaxPool2d, NatureCNN, ResidualBlock, ScaleImages, conv_output_size,
)
from rlkit.core.nn.recurrent import MambaBlock, MambaState, RWKVBlock, RWKVState

__all__ = [
    "Module", "Linear", "Sequential", "BatchNorm", "LayerNorm", "Dropout", "Embedding", "MultiheadAttention",
    "Conv2d", "MaxPool2d", "Flatten", "ScaleImages", "NatureCNN", "ImpalaCNN", "ResidualBlock", "conv_output_size",
    "MambaBlock", "MambaState", "RWKVBlock", "RWKVState", "ACTIVATIONS", "INITIALISERS",
]
