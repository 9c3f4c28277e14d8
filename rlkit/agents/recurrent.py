"""What the recurrent agents share: a state-space (Mamba) or RWKV encoder over observation
sequences, and acting step by step with a state carried per environment lane.

Training runs the encoder over whole windows sampled from the replay buffer
(``sample_sequences_on_device``: R2D2's burn-in, from a zero state); acting runs the same encoder
one token at a time through ``step``, so the two see the same function of the history. A lane's
state is zeroed when its episode ends. ``predict`` follows SB3-Contrib's recurrent policies:
``predict(obs, state, episode_start) -> (actions, state)``.
"""

from __future__ import annotations

import numpy as np

import rlkit.core as rc
from rlkit.agents.common import OffPolicyAgent
from rlkit.core.tensor import Tensor

ENCODERS = ("mamba", "rwkv")
"""The sequence layers a recurrent agent's encoder can use."""


def check_encoder_fields(config) -> None:
    """The checks the recurrent configs share: the encoder kind and sizes, the window."""
    prefix = type(config).__name__
    if config.encoder not in ENCODERS:
        raise ValueError(f"{prefix}: encoder must be one of {ENCODERS}, got {config.encoder!r}")
    for name in ("d_model", "d_state", "sequence_length"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{prefix}: {name} must be an int >= 1, got {value!r}")
    if isinstance(config.burn_in, bool) or not isinstance(config.burn_in, int) or config.burn_in < 0:
        raise ValueError(f"{prefix}: burn_in must be an int >= 0, got {config.burn_in!r}")
    if config.burn_in + config.sequence_length > config.buffer_size // config.n_envs:
        raise ValueError(f"{prefix}: a window of burn_in + sequence_length = {config.burn_in + config.sequence_length} "
                         f"steps does not fit in the {config.buffer_size // config.n_envs} steps each lane of the "
                         f"buffer holds")


class SequenceEncoder(rc.nn.Module):
    """Observations [n_obs, T, B] to features [d_model, T, B]: a linear embedding, then a Mamba
    (or RWKV-7) block with a residual connection around it. ``step`` runs one token per lane."""

    def __init__(self, n_obs: int, d_model: int, d_state: int, kind: str = "mamba"):
        super().__init__()
        self.embed = rc.nn.Linear(n_obs, d_model, init="fan_in_uniform")
        if kind == "mamba":
            # dt starts in [0.1, 1] (decays per step of exp(-dt) .. exp(-16 dt), memories of at
            # most ~10 steps), not Mamba's language-model range [0.001, 0.1]: training sees
            # windows of a few dozen steps from a zero state, acting carries the state through
            # whole episodes, and a short memory makes the two agree after the burn-in
            self.block = rc.nn.MambaBlock(d_model, d_state, head_dim=min(16, 2 * d_model), dt_min=0.1, dt_max=1.0)
        else:
            self.block = rc.nn.RWKVBlock(d_model, head_size=min(16, d_model))

    @property
    def state_type(self) -> type:
        """The NamedTuple of the block's state."""
        return self.block.state_type

    def initial_state(self, batch_size: int = 1):
        """Zeros: the state before an episode's first step."""
        return self.block.initial_state(batch_size)

    def forward(self, obs: Tensor, state=None):
        """(features [d_model, T, B], final state) of observations [n_obs, T, B]."""
        x = self.embed(obs)  # [d_model, T, B]
        y, state = self.block(x, state)  # [d_model, T, B]
        return rc.add(x, y), state

    def step(self, obs: Tensor, state):
        """(features [d_model, n], new state) of one observation per lane [n_obs, n]."""
        x = self.embed(obs)  # [d_model, n]
        y, state = self.block.step(x, state)  # [d_model, n]
        return rc.add(x, y), state


def flat_steps(x: Tensor) -> Tensor:
    """[rows, T, B] as [rows, T * B] (time fastest), for per-step heads and losses."""
    return rc.reshape(x, (x.shape[0], x.shape[1] * x.shape[2]))


def learning_weights(samples, burn_in_weights: Tensor) -> tuple[Tensor, Tensor]:
    """The per-step loss weights [1, T * B] of sampled sequences (1 on steps of the sampled
    episode after the burn-in, else 0) and their count, at least 1 (a [1, 1] divisor)."""
    weights = flat_steps(rc.mul(samples.mask, burn_in_weights))  # [1, T * B]
    return weights, rc.maximum(rc.sum(weights), 1.0)


def burn_in_weights(burn_in: int, sequence_length: int, device: str) -> Tensor:
    """[1, T, 1]: 0 on the burn-in steps (they only warm the state up), 1 after."""
    steps = np.concatenate([np.zeros(burn_in), np.ones(sequence_length)]).astype(np.float32)
    return rc.tensor(steps.reshape(1, -1, 1), device=device)


class RecurrentAgent(OffPolicyAgent):
    """An off-policy agent whose policy carries a recurrent state: the training lanes' states
    live on the host between steps (one upload and download per step with the observations),
    zeroed where an episode ends. Subclasses supply ``_policy_encoder`` and ``_act_step``."""

    recurrent = True

    def _policy_encoder(self) -> SequenceEncoder:
        """The encoder acting runs."""
        raise NotImplementedError

    def _act_step(self, obs: Tensor, state, deterministic: bool):
        """(actions [action_rows, n] in the buffer's space, new state) for one step of every lane."""
        raise NotImplementedError

    def _act(self, obs, deterministic: bool):
        raise TypeError(f"{self.algo} acts with a carried state: use predict(obs, state, episode_start)")

    def initial_state(self, n: int = 1) -> tuple[np.ndarray, ...]:
        """Zero states for ``n`` lanes (host arrays, lanes in the last dimension)."""
        with self.on_device():
            return tuple(t.numpy() for t in self._policy_encoder().initial_state(n))

    def _stepper(self, deterministic: bool):
        """The captured acting step: observations and the state in, actions and the new state out."""
        act = self._acting.get(deterministic)
        if act is None:
            state_type = self._policy_encoder().state_type

            def step(obs, **state):
                actions, new_state = self._act_step(obs, state_type(**state), deterministic)
                return (actions, *new_state)

            act = self._acting[deterministic] = rc.capture(step, self._policy_parameters())
        return act

    def _policy_with_state(self, obs: np.ndarray, state: tuple[np.ndarray, ...], deterministic: bool):
        """(actions [n, action_rows], new state) for observations [n, n_obs]."""
        fields = self._policy_encoder().state_type._fields
        outputs = self._stepper(deterministic)(obs=obs.T, **dict(zip(fields, state)))
        return outputs[0].T, tuple(outputs[1:])

    def _policy(self, obs: np.ndarray, deterministic: bool) -> np.ndarray:
        """Actions for the training lanes, advancing their states."""
        if getattr(self, "_lane_state", None) is None:
            self._lane_state = self.initial_state(len(obs))
        actions, self._lane_state = self._policy_with_state(obs, self._lane_state, deterministic)
        return actions

    def _episodes_ended(self, done: np.ndarray) -> None:
        """Zeroes the states of the lanes whose episode ended (their next step starts anew)."""
        if getattr(self, "_lane_state", None) is not None:
            for part in self._lane_state:
                part[..., np.asarray(done, bool).reshape(-1)] = 0.0

    def predict(self, obs, state=None, episode_start=None, deterministic: bool = True):
        """``(actions, state)`` for one observation or a batch [n, *obs_shape], as SB3-Contrib's
        recurrent policies: ``state`` None (or a lane with ``episode_start`` true) starts from
        zeros; pass the returned state back with the next observations."""
        batch, single = self._obs_batch(obs)
        n = len(batch)
        state = self.initial_state(n) if state is None else tuple(np.array(s, np.float32, copy=True) for s in state)
        expected = self.initial_state(n)
        if len(state) != len(expected) or any(s.shape != e.shape for s, e in zip(state, expected)):
            raise ValueError(f"{self.algo}.predict: state has shapes {[s.shape for s in state]}, expected "
                             f"{[e.shape for e in expected]} for {n} observation(s) (see initial_state)")
        if episode_start is not None:
            starts = np.asarray(episode_start, bool).reshape(-1)
            if starts.size != n:
                raise ValueError(f"{self.algo}.predict: episode_start has {starts.size} entries for {n} observations")
            for part in state:
                part[..., starts] = 0.0
        with self.on_device():
            actions, state = self._policy_with_state(batch, state, deterministic)
            actions = self._to_env_action(actions)
        if single:
            return (int(actions[0]) if self.discrete else actions[0]), state
        return actions, state
