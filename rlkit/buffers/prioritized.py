"""Prioritized experience replay (Schaul et al., 2016) over the ReplayBuffer's columns.

Each column (transition) has a priority p; it is sampled with probability p^alpha / sum p^alpha
(stratified over the batch) and weighted by (N P)^-beta / max (the importance correction).
New transitions get the largest priority seen so far. The sum tree lives on the host; its
updates are batched (no Python loop over the batch).
"""

from __future__ import annotations

import math

import numpy as np

import rlkit.core as rc
from rlkit.buffers.device_buffer import DeviceBuffer
from rlkit.buffers.replay import ReplayBuffer, ReplaySamples
from rlkit.core.checks import check_index_values, number_in_range, positive_int
from rlkit.core.tensor import Tensor


class SumTree:
    """Leaf values and the sums of every subtree, in one array (the root at 1)."""

    def __init__(self, capacity: int):
        self.capacity = positive_int(capacity, "SumTree: capacity")
        self.size = 1 << max(0, (self.capacity - 1).bit_length())
        self.tree = np.zeros(2 * self.size, np.float64)

    def update(self, index: np.ndarray, value: np.ndarray) -> None:
        """Sets leaves (the last value wins for a repeated index) and their ancestors' sums.
        ``index`` holds integers in [0, capacity) (IndexError), ``value`` (one per index, or one
        for all) finite numbers >= 0 (ValueError); nothing changes when either is refused."""
        index = np.asarray(index).reshape(-1)
        if index.size == 0:
            return
        if index.dtype.kind not in "iu":
            raise TypeError(f"SumTree.update: index must be an integer array, got {index.dtype}")
        check_index_values(index, "SumTree.update", self.capacity, "leaves")
        value = np.broadcast_to(np.asarray(value, np.float64).reshape(-1), index.shape)
        if not np.all(np.isfinite(value) & (value >= 0)):
            j = int(np.flatnonzero(~(np.isfinite(value) & (value >= 0)))[0])
            raise ValueError(f"SumTree.update: values must be finite and >= 0, got {float(value[j])!r} at position {j}")
        nodes = index.astype(np.int64) + self.size
        self.tree[nodes] = value
        nodes = np.unique(nodes // 2)
        while nodes[0] >= 1:
            self.tree[nodes] = self.tree[2 * nodes] + self.tree[2 * nodes + 1]
            if nodes[0] == 1:
                break
            nodes = np.unique(nodes // 2)

    def total(self) -> float:
        return float(self.tree[1])

    def leaves(self, index: np.ndarray) -> np.ndarray:
        return self.tree[np.asarray(index, np.int64) + self.size]

    def find(self, prefix: np.ndarray) -> np.ndarray:
        """The leaf whose cumulative range holds each prefix sum."""
        node = np.ones(prefix.shape, np.int64)
        prefix = prefix.astype(np.float64).copy()
        while node[0] < self.size:
            left = self.tree[2 * node]
            right = prefix >= left
            prefix -= np.where(right, left, 0.0)
            node = 2 * node + right
        return node - self.size


# the hyperparameters' ranges (alpha's and beta's as DQNConfig checks its prioritized_alpha and _beta)
ALPHA_RANGE, BETA_RANGE, EPS_RANGE = (0.0, 10.0), (0.0, 1.0), (0.0, math.inf)


class PrioritizedReplayBuffer(ReplayBuffer):
    """A ReplayBuffer sampled by priority. ``alpha`` shapes the priorities, ``beta`` the
    importance weights (anneal it towards 1 by setting ``buffer.beta``), ``eps`` keeps every
    priority positive. ``update_priorities(samples.index, td_errors)`` after each update."""

    def __init__(self, capacity: int, obs_shape, action_shape, alpha: float = 0.6, beta: float = 0.4,
                 eps: float = 1e-6, **kwargs):
        super().__init__(capacity, obs_shape, action_shape, **kwargs)
        if self.optimize_memory:
            raise ValueError("PrioritizedReplayBuffer: optimize_memory is not supported with priorities")
        self.alpha = number_in_range(alpha, "PrioritizedReplayBuffer: alpha", *ALPHA_RANGE)
        self.beta = number_in_range(beta, "PrioritizedReplayBuffer: beta", *BETA_RANGE)
        self.eps = number_in_range(eps, "PrioritizedReplayBuffer: eps", *EPS_RANGE)
        self._tree = SumTree(self.capacity)
        self._max_priority = 1.0

    def _settings(self) -> dict:
        return {**super()._settings(), "alpha": self.alpha, "beta": self.beta, "eps": self.eps}

    def _extra_host_arrays(self) -> dict[str, np.ndarray]:
        return {"priorities": self._tree.leaves(np.arange(self.capacity)),
                "max_priority": np.array(self._max_priority)}

    def _restore_extra_host_arrays(self, host) -> None:
        self._tree.update(np.arange(self.capacity), host["priorities"])
        self._max_priority = float(host["max_priority"])

    def add(self, obs, action, reward, next_obs, terminated, truncated) -> None:
        column = self.pos * self.n_envs
        super().add(obs, action, reward, next_obs, terminated, truncated)
        self._tree.update(np.arange(column, column + self.n_envs), self._max_priority**self.alpha)

    def _stopped_sampling(self, columns: np.ndarray) -> None:
        self._tree.update(columns, 0.0)  # frame stacks whose start frames are gone: never drawn again

    def sample(self, batch_size: int) -> ReplaySamples:
        """A batch drawn in proportion to priority^alpha, with importance weights [1, B]."""
        positive_int(batch_size, "PrioritizedReplayBuffer.sample: batch_size")
        total = self._tree.total()
        if len(self) == 0 or total <= 0:
            raise ValueError("PrioritizedReplayBuffer.sample: the buffer holds no transition that can be sampled yet")
        segment = total / batch_size
        prefix = (np.arange(batch_size) + self._rng.random(batch_size)) * segment
        column = np.minimum(self._tree.find(np.minimum(prefix, np.nextafter(total, 0))), self.capacity - 1)
        probability = self._tree.leaves(column) / total
        weights = (len(self) * probability) ** (-self.beta)
        weights = (weights / weights.max()).astype(np.float32)
        t, e = np.divmod(column, self.n_envs)
        samples = self._gather(t, e)
        return samples._replace(weights=rc.tensor(weights[None, :], device=self.device))

    def anneal_beta(self, progress: float, beta_start: float | None = None, beta_end: float = 1.0) -> float:
        """Sets beta linearly from ``beta_start`` (the constructor's beta) to ``beta_end`` as
        ``progress`` goes from 0 to 1 (CleanRL's convention: progress = step / total steps);
        returns the new beta."""
        if not hasattr(self, "_beta_start"):
            self._beta_start = self.beta
        start = self._beta_start if beta_start is None else float(beta_start)
        fraction = min(1.0, max(0.0, float(progress)))
        self.beta = start + (beta_end - start) * fraction
        return self.beta

    def update_priorities(self, index, priorities) -> None:
        """New priorities (for example |TD error|) of the sampled columns ``index``."""
        if isinstance(priorities, Tensor):
            priorities = priorities.numpy()
        index = np.asarray(index).reshape(-1)
        priorities = np.abs(np.asarray(priorities, np.float64).reshape(-1))
        if index.size != priorities.size:
            raise ValueError(f"update_priorities: {index.size} indices but {priorities.size} priorities")
        if index.size and index.dtype.kind in "iu":
            check_index_values(index, "update_priorities", self.capacity, "columns")
        if not np.all(np.isfinite(priorities)):
            raise ValueError("update_priorities: priorities must be finite")
        priorities = priorities + self.eps
        leaves = priorities**self.alpha
        if index.size and index.dtype.kind in "iu":  # a column no longer sampled keeps priority 0
            leaves = np.where(self._sampleable(index), leaves, 0.0)
        self._tree.update(index, leaves)  # (refuses non-integer indices before any change)
        self._max_priority = max(self._max_priority, float(priorities.max(initial=0.0)))


class DevicePrioritizedReplayBuffer(ReplayBuffer):
    """Prioritized replay entirely on the device: priorities^alpha in a device row, sampling by
    prefix sums and a search (``sample_on_device``), importance weights, and priority updates
    from TD errors (``update_priorities_on_device``), so a captured update samples and
    re-prioritizes without crossing to the host. n-step returns as ReplayBuffer.sample_on_device
    gives them; not with next-observation sharing. New transitions get the largest priority so far;
    so does a column whose TD error is not finite (counted in ``nonfinite_priorities``)."""

    def __init__(self, capacity: int, obs_shape, action_shape, alpha: float = 0.6, eps: float = 1e-6, **kwargs):
        super().__init__(capacity, obs_shape, action_shape, **kwargs)
        if self.optimize_memory:
            raise ValueError("DevicePrioritizedReplayBuffer: not with optimize_memory")
        self.alpha = number_in_range(alpha, "DevicePrioritizedReplayBuffer: alpha", *ALPHA_RANGE)
        self.eps = number_in_range(eps, "DevicePrioritizedReplayBuffer: eps", *EPS_RANGE)
        device = kwargs.get("device")  # None: follow the default device, as the base's tables do
        self._priority = DeviceBuffer(1, self.capacity, "f32", device)  # priority^alpha per column
        self._priority.before_read = self.flush  # new steps get their priority when they are sent
        self._max = DeviceBuffer(1, 1, "f32", device)  # the largest priority^alpha so far
        self._max.write(np.ones((1, 1), np.float32))
        self._nonfinite = DeviceBuffer(1, 1, "f32", device)  # replaced priorities (nonfinite_priorities)
        self._nonfinite.write(np.zeros((1, 1), np.float32))

    def _device_fields(self) -> dict:
        return {**super()._device_fields(), "priority": self._priority, "max_priority": self._max}

    def _all_tables(self) -> list[DeviceBuffer]:
        return [*super()._all_tables(), self._priority, self._max, self._nonfinite]

    @classmethod
    def estimate_nbytes(cls, capacity: int, obs_shape, action_shape, n_envs: int = 1, **kwargs) -> int:
        """ReplayBuffer.estimate_nbytes and the priority row, the largest priority and the count."""
        columns = capacity // n_envs * n_envs
        return super().estimate_nbytes(capacity, obs_shape, action_shape, n_envs, **kwargs) + columns * 4 + 2 * 4

    def _stopped_sampling(self, columns: np.ndarray) -> None:
        """Frame stacks whose start frames are gone get priority 0: never drawn again."""
        index = rc.tensor(columns.astype(np.int32)[None, :], device=self.device)  # [1, k]
        rc.put_cols(self._priority, index, rc.full(index.shape, 0.0, dtype="f32", device=self.device))

    def _settings(self) -> dict:
        return {**super()._settings(), "alpha": self.alpha, "eps": self.eps}

    def flush(self) -> None:
        """Sends the staged steps (ReplayBuffer.flush) and gives them the largest priority so far,
        in one write for all of them. The largest priority cannot have changed since they were
        added: an update of the priorities reads the priority row, which flushes first."""
        n, first = self._n_staged, self._first_staged
        super().flush()
        if n == 0:
            return
        steps = self._ring_steps(first, n)
        new = (steps[:, None] * self.n_envs + np.arange(self.n_envs)).astype(np.int32).reshape(1, -1)  # [1, n * n_envs]
        top = rc.expand(self._max.__rlkit_buffer__(), new.shape)  # [1, n * n_envs], on the device
        rc.put_cols(self._priority, rc.tensor(new, device=self.device), top)

    def sample_on_device(self, batch_size: int, stored=None, beta=0.4) -> ReplaySamples:
        """A batch drawn in proportion to priority^alpha with importance weights
        (N P)^-beta / max, all on the device. ``stored`` and ``beta`` may be [1, 1] tensors
        (inputs of a captured function, so that they change between replays) or numbers."""
        positive_int(batch_size, "sample_on_device: batch_size")
        device = self.device
        stored = self._stored_for_device_sampling(stored, "sample_on_device")
        priority = self._priority.__rlkit_buffer__()  # [1, C]
        cdf = rc.cumsum(rc.reshape(priority, (self.capacity, 1)))  # [C, 1]
        total = rc.slice_rows(cdf, self.capacity - 1, 1)  # [1, 1]
        query = rc.mul(rc.rand((1, batch_size), dtype="f32", device=device), total)  # [1, B]
        index = rc.searchsorted(cdf, query)  # [1, B] i32: columns in proportion to priority
        probability = rc.div(rc.get_rows(priority, index), total)
        # (N P)^-beta, as exp(-beta log(N P)) so that beta can be a tensor
        weights = rc.exp(rc.mul(rc.neg(rc.as_tensor(beta, like=probability)), rc.log(rc.mul(probability, stored))))
        weights = rc.div(weights, rc.max(rc.reshape(weights, (batch_size, 1))))
        return self._transitions_on_device(index, weights)

    @property
    def nonfinite_priorities(self) -> int:
        """How many priorities ``update_priorities_on_device`` found not finite (a NaN or
        infinite TD error, or an overflow of priority^alpha) and replaced by the largest so far:
        counted on the device, read here (exact up to 2^24)."""
        return int(self._nonfinite.read()[0, 0])

    def update_priorities_on_device(self, index: Tensor, td_error: Tensor) -> None:
        """Priorities (|td_error| + eps)^alpha for the columns ``index`` (both [1, B] device
        tensors, as sample_on_device and a TD computation give them). A priority that is not
        finite becomes the largest finite one so far, the one new steps get, and is counted in
        ``nonfinite_priorities``: a NaN in the priority row would make every later draw land on
        the last, perhaps never written, column (the prefix sums are NaN from it on)."""
        priority = rc.add(rc.abs(rc.stop_gradient(td_error)), self.eps)  # [1, B]
        values = rc.pow(priority, self.alpha)
        top = self._max.__rlkit_buffer__()  # [1, 1], finite: only finite values reach it
        # 1 where both are finite, else 0 (gt is 0 for NaN); both, since pow(NaN, 0) is 1
        finite = rc.mul(rc.gt(math.inf, priority), rc.gt(math.inf, values))
        replaced = rc.sub(1.0, finite)
        values = rc.where(finite, values, top)  # a select: finite * values would keep the NaN
        rc.put_cols(self._priority, index, values)
        batch_max = rc.max(rc.reshape(values, (values.numel, 1)))  # [1, 1]
        zero = rc.full((1, 1), 0, dtype="i32", device=values.device)
        rc.put_cols(self._max, zero, rc.maximum(top, batch_max))
        counted = rc.add(self._nonfinite.__rlkit_buffer__(), rc.sum(replaced))
        rc.put_cols(self._nonfinite, zero, counted)
