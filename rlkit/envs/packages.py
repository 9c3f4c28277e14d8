"""The packages that register environments with Gymnasium, imported when one of their ids is
asked for: ``gym.make("ALE/Pong-v5")`` fails with "Namespace ALE not found" until ale_py has been
imported, MinAtar's and MiniGrid's ids likewise. ``register_for(env_id)`` imports the one an id
needs (a fixed table: nothing named by a file or a user string is imported)."""

from __future__ import annotations

import importlib

import gymnasium as gym

NAMESPACE_PACKAGES = {"ALE": ("ale_py", "atari"), "MinAtar": ("minatar", "minatar"), "MiniGrid": ("minigrid", None)}
"""Namespace of an id -> (the module that registers it, the rlkit extra that installs it)."""


def _register(module: str) -> None:
    package = importlib.import_module(module)
    if module == "ale_py":
        gym.register_envs(package)
    elif module == "minatar":
        from minatar.gym import register_envs

        if "MinAtar/Breakout-v1" not in gym.registry:
            register_envs()
    # minigrid registers its environments when imported

def register_for(env_id) -> None:
    """Imports the package that registers ``env_id``'s namespace, where it is one of
    NAMESPACE_PACKAGES' and not registered yet; the older Atari ids (``PongNoFrameskip-v4``)
    count as ALE's. An id already registered, or of another namespace, is left alone."""
    if not isinstance(env_id, str) or env_id in gym.registry:
        return
    namespace = env_id.split("/", 1)[0] if "/" in env_id else ("ALE" if "NoFrameskip" in env_id else None)
    if namespace not in NAMESPACE_PACKAGES:
        return
    module, extra = NAMESPACE_PACKAGES[namespace]
    try:
        _register(module)
    except ImportError as error:
        how = f"pip install 'rlkit[{extra}]'" if extra else f"pip install {module}"
        raise ImportError(f"the environment {env_id!r} is registered by the {module} package, which is not "
                          f"installed: {how}") from error
