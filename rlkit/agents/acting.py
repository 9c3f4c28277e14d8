"""Acting on an agent's device: the device made current for a block, observation batches as a
captured policy's inputs, and ``agent.policy`` (SB3's ``model.policy``)."""

from __future__ import annotations

import numpy as np

import rlkit.core as rc
from rlkit.core.tensor import Tensor


class default_device:
    """Makes ``device`` the default device for the block (ops without inputs, captures). A
    class rather than a generator function: entered at every host-acting step, where a
    generator-based context manager's overhead is a microsecond. Reusable and reentrant."""

    def __init__(self, device: str):
        self.device = device
        self._previous: list[str] = []  # the device each open block replaced, innermost last

    def __enter__(self) -> None:
        self._previous.append(rc.device(self.device))

    def __exit__(self, *exc_info) -> None:
        rc.device(self._previous.pop())

def policy_inputs(batch: np.ndarray | dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A batch of observations (rows [n, ...], or a dict of them) as the named inputs of a
    captured policy: ``obs`` [..., n], or for a dict an input per key (named ``obs.<key>``)."""
    if isinstance(batch, dict):
        return {f"obs.{key}": values.T for key, values in batch.items()}
    return {"obs": batch.T}


def policy_input(inputs: dict) -> Tensor | dict[str, Tensor]:
    """The observations ``policy_inputs`` named, as a captured policy's function receives them:
    the tensor, or the dict of each key's."""
    if "obs" in inputs:
        return inputs["obs"]
    return {name[len("obs."):]: tensor for name, tensor in inputs.items()}


class AgentPolicy:
    """``agent.policy``, as SB3's ``model.policy``: what acts. Its ``predict`` is the agent's
    policy alone (SB3's ``model.policy.predict``: no DQN epsilon); ``name`` is the policy name
    the agent was made with ("MlpPolicy" unless another of SB3's names was given)."""

    def __init__(self, agent):  # the OffPolicyAgent (base.py, which imports this file)
        self._agent = agent

    @property
    def name(self) -> str:
        return self._agent.policy_name

    @property
    def observation_space(self):
        return self._agent.observation_space

    @property
    def action_space(self):
        return self._agent.action_space

    def predict(self, observation, state: tuple[np.ndarray, ...] | None = None,
                episode_start: np.ndarray | None = None,
                deterministic: bool = False) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        """``(actions, state)`` as the agent's predict, without its exploration."""
        return self._agent._predict(observation, state, episode_start, deterministic)

    def __repr__(self) -> str:
        return f"AgentPolicy({self.name} of {self._agent.algo})"
