"""Polyak (soft) target updates on the device, and their deferral: k updates requested while
the source is unchanged applied as one."""

from __future__ import annotations

import rlkit.core as rc
from rlkit.core.tensor import Tensor


class Polyak:
    """target <- tau * source + (1 - tau) * target for paired parameters, in place on the
    device (the target's storage stays the same, so captured programs reading it see the
    update). Usable inside a captured update."""

    def __init__(self, target: dict[str, Tensor], source: dict[str, Tensor]):
        if list(target) != list(source):
            raise ValueError("polyak: the target and source networks have different parameters")
        self._targets, self._sources = list(target.values()), [source[name] for name in target]

    def __call__(self, tau: float) -> None:
        rc.polyak_update(self._targets, self._sources, tau)  # every pair in one pass


class DeferredPolyak:
    """Polyak updates requested at environment steps and applied together by ``apply``, which
    the owner calls before anything reads the target or writes the source. While the source
    does not change, k updates with coefficient tau are one with coefficient 1 - (1 - tau)^k
    (exactly a copy for tau = 1): one device dispatch per round of gradient steps instead of
    one every few environment steps."""

    def __init__(self, update: Polyak, tau: float):
        self.update, self.tau = update, float(tau)
        self.pending = 0  # updates requested since the last apply

    def request(self) -> None:
        """Asks for one update (applied by the next ``apply``)."""
        self.pending += 1

    def apply(self) -> None:
        """Applies the requested updates as one (nothing when none is pending)."""
        if self.pending:
            coefficient = 1.0 - (1.0 - self.tau) ** self.pending
            self.pending = 0
            self.update(coefficient)
