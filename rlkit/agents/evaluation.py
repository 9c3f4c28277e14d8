"""``evaluate``: an agent's mean return over deterministic episodes."""

from __future__ import annotations

import numpy as np

from rlkit.agents.lanes import make_env


def evaluate(agent, env, n_episodes: int = 10, seed: int | None = None,
             lengths: list | None = None) -> tuple[float, float]:
    """Mean and standard deviation of the returns of ``n_episodes`` deterministic episodes
    (episode ``i`` reset with ``seed + i``); their lengths are appended to ``lengths`` if given."""
    if isinstance(n_episodes, bool) or not isinstance(n_episodes, int) or n_episodes < 1:
        raise ValueError(f"evaluate: n_episodes must be a positive int, got {n_episodes!r}")
    env = make_env(env, seed, training=False)  # an Atari id: whole games, the game's own rewards
    recurrent = getattr(agent, "recurrent", False)
    returns = []
    for episode in range(n_episodes):
        obs, _ = env.reset(seed=None if seed is None else seed + episode)
        total, steps, done, state = 0.0, 0, False, None
        while not done:
            if recurrent:  # the state carried through the episode, from zeros
                action, state = agent.predict(obs, state, deterministic=True)
            else:
                action = agent.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            steps += 1
            done = terminated or truncated
        returns.append(total)
        if lengths is not None:
            lengths.append(steps)
    return float(np.mean(returns)), float(np.std(returns))
