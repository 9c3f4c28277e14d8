"""Episode statistics: the returns and lengths of the last finished episodes of every lane."""

from __future__ import annotations

from collections import deque

import numpy as np


class EpisodeStats:
    """Returns and lengths of the last 100 finished episodes of all lanes (rollout/ep_rew_mean,
    rollout/ep_len_mean)."""

    def __init__(self, n_envs: int = 1, window: int = 100):
        self.returns: deque = deque(maxlen=window)
        self.lengths: deque = deque(maxlen=window)
        self.current_return = np.zeros(n_envs)
        self.current_length = np.zeros(n_envs, np.int64)

    def step(self, reward, done) -> None:
        """Counts one step of every lane; ``done`` marks lanes whose episode ended."""
        self.current_return += np.asarray(reward, np.float64).reshape(-1)
        self.current_length += 1
        ended = np.asarray(done).reshape(-1)
        if not np.count_nonzero(ended):
            return  # most steps end no episode (and the count is cheaper than the search below)
        for lane in np.flatnonzero(ended):
            self.returns.append(float(self.current_return[lane]))
            self.lengths.append(int(self.current_length[lane]))
            self.current_return[lane], self.current_length[lane] = 0.0, 0

    def means(self) -> tuple[float, float] | None:
        """(mean return, mean length) of the window, or None before the first episode ends."""
        if not self.returns:
            return None
        return float(np.mean(self.returns)), float(np.mean(self.lengths))
