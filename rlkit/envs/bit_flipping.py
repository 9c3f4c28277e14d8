"""The bit-flipping task of the HER paper (Andrychowicz et al., 2017, section 3.1): a goal
environment whose reward is almost never seen without hindsight.

A state of ``n_bits`` bits and a goal of as many; each action flips one bit. The reward is -1
on every step the state differs from the goal, 0 on the step that reaches it (which ends the
episode); episodes are cut after ``max_steps`` steps (``n_bits`` by default). Start and goal are
drawn uniformly, so a random policy almost never succeeds on 15 bits or more. Observations are
Gymnasium's goal-environment Dict ``{observation, achieved_goal, desired_goal}`` (the achieved
goal is the state), and ``compute_reward`` recomputes rewards for any goals, as HER needs.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class BitFlippingEnv(gym.Env):
    """Flip ``n_bits`` bits to the goal's (the module docstring). Bits are MultiBinary
    observations (int8, as Gymnasium's MultiBinary); ``continuous`` takes a Box action of
    ``n_bits`` values instead, flipping every bit whose value is above 0. ``info["is_success"]``
    says whether the step reached the goal."""

    metadata = {"render_modes": []}

    def __init__(self, n_bits: int = 10, continuous: bool = False, max_steps: int | None = None):
        super().__init__()
        if isinstance(n_bits, bool) or not isinstance(n_bits, int) or n_bits < 1:
            raise ValueError(f"BitFlippingEnv: n_bits must be a positive int, got {n_bits!r}")
        self.n_bits, self.continuous = n_bits, bool(continuous)
        self.max_steps = n_bits if max_steps is None else int(max_steps)
        bits = gym.spaces.MultiBinary(n_bits)
        self.observation_space = gym.spaces.Dict({"observation": bits, "achieved_goal": bits, "desired_goal": bits})
        self.action_space = (gym.spaces.Box(-1.0, 1.0, (n_bits,), np.float32) if self.continuous
                             else gym.spaces.Discrete(n_bits))

    def _obs(self) -> dict[str, np.ndarray]:
        return {"observation": self.state.copy(), "achieved_goal": self.state.copy(), "desired_goal": self.goal.copy()}

    def reset(self, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.state = self.np_random.integers(0, 2, self.n_bits).astype(np.int8)
        self.goal = self.np_random.integers(0, 2, self.n_bits).astype(np.int8)
        self.steps = 0
        return self._obs(), {}

    def step(self, action):
        if self.continuous:
            self.state[np.asarray(action).reshape(-1) > 0] ^= 1
        else:
            self.state[int(action)] ^= 1
        self.steps += 1
        reward = float(self.compute_reward(self.state, self.goal, None))
        success = reward == 0.0
        return self._obs(), reward, success, self.steps >= self.max_steps and not success, {"is_success": success}

    def compute_reward(self, achieved_goal, desired_goal, info) -> np.ndarray | float:
        """-1 where the goals differ in any bit, 0 where they are equal: for one pair of goals or
        a batch (the goals' last axis holds the bits), as HER relabelling calls it."""
        differ = np.any(np.asarray(achieved_goal) != np.asarray(desired_goal), axis=-1)
        return np.where(differ, np.float32(-1.0), np.float32(0.0))


BIT_FLIPPING_ID = "rlkit/BitFlipping-v0"
"""BitFlippingEnv's Gymnasium id (``gym.make(BIT_FLIPPING_ID, n_bits=15)``), for the command line."""


def register() -> None:
    """Registers BitFlippingEnv with Gymnasium as BIT_FLIPPING_ID (again only if missing)."""
    if BIT_FLIPPING_ID not in gym.registry:
        gym.register(id=BIT_FLIPPING_ID, entry_point=BitFlippingEnv)
