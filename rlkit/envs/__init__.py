"""Environments and wrappers on top of Gymnasium: the partially observed classic-control tasks
(``partial_observation``: HideVelocity, registered as ``rlkit/CartPoleNoVel-v1`` and
``rlkit/PendulumNoVel-v1`` on import) and Atari with the standard preprocessing (``atari``:
``make_atari``; needs the ``atari`` extra, ale-py, only when called) and the bit-flipping
goal task of the HER paper (``BitFlippingEnv``, registered as ``rlkit/BitFlipping-v0``)."""

from rlkit.envs import bit_flipping, partial_observation
from rlkit.envs.partial_observation import HIDDEN_VELOCITY_IDS, POSITIONS_KEPT, HideVelocity
from rlkit.envs.atari import ATARI_DQN_DEFAULTS, EpisodicLife, FireReset, is_atari_id, make_atari, needs_fire_reset
from rlkit.envs.bit_flipping import BIT_FLIPPING_ID, BitFlippingEnv


def register() -> None:
    """Registers rlkit's environments with Gymnasium (each again only if missing): the
    partially observed tasks and the bit-flipping task."""
    partial_observation.register()
    bit_flipping.register()


register()

__all__ = ["HideVelocity", "HIDDEN_VELOCITY_IDS", "POSITIONS_KEPT", "register", "make_atari", "is_atari_id",
           "EpisodicLife", "FireReset", "needs_fire_reset", "ATARI_DQN_DEFAULTS", "BitFlippingEnv",
           "BIT_FLIPPING_ID"]
