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

    def extend(self, rewards, dones) -> None:
        """Counts k steps of every lane at once (``rewards`` and ``dones`` [k, n_lanes]): what k
        ``step`` calls count, each return summed in the same order, so to the same bits."""
        k, n = len(dones), len(self.current_return)
        dones = np.asarray(dones, bool).reshape(k, n)
        # row 0: each lane's running return; rows 1..k: the steps' rewards
        table = np.vstack([self.current_return[None, :], np.asarray(rewards, np.float64).reshape(k, n)])  # [k + 1, n]
        first_row = np.zeros(n, np.int64)  # where each lane's running episode starts in table
        length_before = self.current_length.copy()  # its steps before these
        for step, lane in zip(*np.nonzero(dones)):  # by step, lanes ascending in one: step's order
            # cumsum, not sum: sequential as step's +=, where sum is pairwise
            self.returns.append(float(np.cumsum(table[first_row[lane]:step + 2, lane])[-1]))
            self.lengths.append(int(length_before[lane] + step + 1 - max(first_row[lane] - 1, 0)))
            first_row[lane], length_before[lane] = step + 2, 0
        running = np.cumsum(table, axis=0)[-1]  # [n], the lanes whose episode ran on through all k steps
        for lane in np.flatnonzero(first_row):
            running[lane] = np.cumsum(table[first_row[lane]:, lane])[-1] if first_row[lane] <= k else 0.0
        self.current_return = running
        self.current_length = length_before + k - np.maximum(first_row - 1, 0)

    def means(self) -> tuple[float, float] | None:
        """(mean return, mean length) of the window, or None before the first episode ends."""
        if not self.returns:
            return None
        return float(np.mean(self.returns)), float(np.mean(self.lengths))
