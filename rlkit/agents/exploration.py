"""Epsilon-greedy exploration, with epsilon falling linearly over training (the DQN family)."""

from __future__ import annotations

import numpy as np


class EpsilonGreedy:
    """Exploration of the DQN family (a mixin before OffPolicyAgent): each lane takes a uniform
    action with probability epsilon, else the greedy one; epsilon falls linearly from
    ``exploration_initial_eps`` to ``exploration_final_eps`` over ``exploration_fraction`` of
    training, and is logged as rollout/exploration_rate."""

    def _explore(self, obs: np.ndarray | dict[str, np.ndarray]) -> np.ndarray:
        n = self.lanes.n  # the rows of obs (each key's, for a Dict space): one per lane
        if n == 1:
            return self._explore_one(obs)
        explore = self._rng.random(n) < self._epsilon()
        n_explore = int(np.count_nonzero(explore))
        if n_explore == n and not self.recurrent:  # as SB3: no forward for random actions only
            return self._rng.integers(0, self.n_actions, (n, 1)).astype(np.int32)
        actions = self._policy(obs, deterministic=True)  # the greedy actions of every lane
        if n_explore:  # skipped when no lane explores: drawing no numbers leaves the generator as it is
            actions[explore, 0] = self._rng.integers(0, self.n_actions, n_explore)
        return actions

    def _explore_one(self, obs: np.ndarray | dict[str, np.ndarray]) -> np.ndarray:
        """_explore for one lane, the loop's common case, with Python scalars where it makes arrays
        of one (a few microseconds a step): the generator gives the same numbers either way."""
        if self._rng.random() >= self._epsilon():
            return self._policy(obs, deterministic=True)
        if not self.recurrent:
            return np.array([[self._rng.integers(0, self.n_actions)]], np.int32)
        actions = self._policy(obs, deterministic=True)  # the lane's state advances all the same
        actions[0, 0] = self._rng.integers(0, self.n_actions)
        return actions

    def predict(self, observation, state=None, episode_start=None, deterministic: bool = False):
        """As SB3's DQN.predict: ``deterministic=False`` replaces each observation's greedy action
        by a uniform one with probability ``exploration_rate`` (0 before the first learn call,
        so greedy; drawn from the action space's generator, seeded with the agent). SB3 draws once
        for a whole batch; here each observation draws, with the same chance each."""
        actions, state = super().predict(observation, state, episode_start, deterministic)
        rate = self.exploration_rate
        if deterministic or rate == 0.0:
            return actions, state
        rng = self.action_space.np_random
        flat = np.array(actions).reshape(-1)
        explore = rng.random(flat.size) < rate
        flat[explore] = rng.integers(0, self.n_actions, int(np.count_nonzero(explore)))
        if self.recurrent and self.config.previous_action:  # the state carries the action taken
            state = (*state[:-1], self._host_action_features(flat))
        return flat.reshape(np.shape(actions)), state

    @property
    def exploration_rate(self) -> float:
        """SB3's: epsilon at this point of training, 0 before the first learn call."""
        return self._epsilon() if self._learn_total else 0.0

    def _epsilon(self) -> float:
        """Epsilon at the current point of the learn call."""
        cfg = self.config
        progress = min(1.0, self._progress() / cfg.exploration_fraction)
        return cfg.exploration_initial_eps + progress * (cfg.exploration_final_eps - cfg.exploration_initial_eps)

    def _extra_scalars(self) -> dict[str, float]:
        return {"rollout/exploration_rate": self._epsilon()}
