"""What the recurrent agents share: a state-space (Mamba) or RWKV encoder over observation
sequences, and acting step by step with a state carried per environment lane.

Training runs the encoder over whole windows sampled from the replay buffer
(``sample_sequences_on_device``: R2D2's burn-in, from a zero state); acting runs the same encoder
one token at a time through ``step``, so the two see the same function of the history. With
``previous_action`` (R2D2's choice) each step's input is the observation with the action taken
before it (one-hot for discrete actions; zeros at an episode's start): what hidden velocities
can be recovered from. A lane's state is zeroed when its episode ends. ``predict`` follows
SB3-Contrib's recurrent policies: ``predict(obs, state, episode_start) -> (actions, state)``.
"""

from __future__ import annotations

import numpy as np

import rlkit.core as rc
from rlkit.agents.base import OffPolicyAgent
from rlkit.core.checks import positive_int
from rlkit.core.tensor import Tensor

ENCODERS = ("mamba", "rwkv")
"""The sequence layers a recurrent agent's encoder can use."""


def check_encoder_fields(config, tail: int = 0) -> None:
    """The checks the recurrent configs share: the encoder kind and sizes, and a window (burn-in,
    the loss steps and ``tail`` bootstrap steps) that fits in a lane of the buffer."""
    prefix = type(config).__name__
    if config.encoder not in ENCODERS:
        raise ValueError(f"{prefix}: encoder must be one of {ENCODERS}, got {config.encoder!r}")
    if not isinstance(config.previous_action, bool):
        raise ValueError(f"{prefix}: previous_action must be a bool, got {config.previous_action!r}")
    for name in ("d_model", "d_state", "sequence_length"):
        positive_int(getattr(config, name), f"{prefix}: {name}")
    if isinstance(config.burn_in, bool) or not isinstance(config.burn_in, int) or config.burn_in < 0:
        raise ValueError(f"{prefix}: burn_in must be an int >= 0, got {config.burn_in!r}")
    window = config.burn_in + config.sequence_length + tail
    if window > config.buffer_size // config.n_envs:
        raise ValueError(f"{prefix}: a window of {window} steps (burn_in + sequence_length"
                         f"{' + n_steps - 1' if tail else ''}) does not fit in the {config.buffer_size // config.n_envs} "
                         f"steps each lane of the buffer holds")


class SequenceEncoder(rc.nn.Module):
    """Inputs [n_inputs, T, B] to features [d_model, T, B]: a linear embedding, a Mamba (or
    RWKV-7) block with a residual connection around it, then LayerNorm (features of a bounded
    scale however long the carried state has run, which also keeps TD learning on them stable).
    ``step`` runs one token per lane."""

    def __init__(self, n_inputs: int, d_model: int, d_state: int, kind: str = "mamba"):
        super().__init__()
        self.embed = rc.nn.Linear(n_inputs, d_model, init="fan_in_uniform")
        if kind == "mamba":
            # dt starts in [0.1, 1] (decays per step of exp(-dt) .. exp(-16 dt), memories of at
            # most ~10 steps), not Mamba's language-model range [0.001, 0.1]: training sees
            # windows of a few dozen steps from a zero state, acting carries the state through
            # whole episodes, and a short memory makes the two agree after the burn-in
            self.block = rc.nn.MambaBlock(d_model, d_state, head_dim=min(16, 2 * d_model), dt_min=0.1, dt_max=1.0)
        else:
            self.block = rc.nn.RWKVBlock(d_model, head_size=min(16, d_model))
        self.norm = rc.nn.LayerNorm(d_model)

    @property
    def state_type(self) -> type:
        """The NamedTuple of the block's state."""
        return self.block.state_type

    def initial_state(self, batch_size: int = 1):
        """Zeros: the state before an episode's first step."""
        return self.block.initial_state(batch_size)

    def state_shapes(self, batch_size: int) -> tuple[tuple[int, ...], ...]:
        """The shape of each of the state's tensors for ``batch_size`` sequences."""
        return self.block.state_shapes(batch_size)

    def forward(self, obs: Tensor, state=None):
        """(features [d_model, T, B], final state) of observations [n_obs, T, B]."""
        x = self.embed(obs)  # [d_model, T, B]
        y, state = self.block(x, state)  # [d_model, T, B]
        return self.norm(rc.add(x, y)), state

    def step(self, obs: Tensor, state):
        """(features [d_model, n], new state) of one observation per lane [n_obs, n]."""
        x = self.embed(obs)  # [d_model, n]
        y, state = self.block.step(x, state)  # [d_model, n]
        return self.norm(rc.add(x, y)), state


def shifted_by_one_step(x: Tensor) -> Tensor:
    """Windows [rows, T, B] moved one step later in time: step t holds step t - 1, step 0 zeros."""
    by_time = rc.transpose(x)  # [T, rows, B]
    return rc.transpose(rc.slice_rows(rc.pad_rows(by_time, 1, 0), 0, x.shape[1]))  # [rows, T, B]


def flat_steps(x: Tensor) -> Tensor:
    """[rows, T, B] as [rows, T * B] (time fastest), for per-step heads and losses."""
    return rc.reshape(x, (x.shape[0], x.shape[1] * x.shape[2]))


def learning_weights(samples, burn_in_weights: Tensor) -> tuple[Tensor, Tensor]:
    """The per-step loss weights [1, T * B] of sampled sequences (1 on steps of the sampled
    episode after the burn-in, else 0) and their count, at least 1 (a [1, 1] divisor)."""
    weights = flat_steps(rc.mul(samples.mask, burn_in_weights))  # [1, T * B]
    return weights, rc.maximum(rc.sum(weights), 1.0)


def burn_in_weights(burn_in: int, sequence_length: int, device: str, tail: int = 0) -> Tensor:
    """[1, T, 1]: 0 on the burn-in steps (they only warm the state up), 1 on the
    ``sequence_length`` steps after, 0 on ``tail`` steps at the end (read only as the
    bootstrap of n-step targets)."""
    steps = np.concatenate([np.zeros(burn_in), np.ones(sequence_length), np.zeros(tail)]).astype(np.float32)
    return rc.tensor(steps.reshape(1, -1, 1), device=device)


class RecurrentAgent(OffPolicyAgent):
    """An off-policy agent whose policy carries a recurrent state: the encoder's state and,
    with ``previous_action``, the features of the action taken last. The training lanes'
    states live on the host between steps (uploaded and downloaded with the observations),
    zeroed where an episode ends. Subclasses supply ``_policy_encoder`` and ``_act_step``."""

    recurrent = True
    _lane_state: tuple[np.ndarray, ...] | None = None  # the training lanes' states, made at the first step

    def _policy_encoder(self) -> SequenceEncoder:
        """The encoder acting runs."""
        raise NotImplementedError

    def _act_step(self, inputs: Tensor, state, deterministic: bool):
        """(actions [action_rows, n] in the buffer's space, new encoder state) for one step of
        every lane; ``inputs`` [encoder_inputs, n] are the observations (and previous actions)."""
        raise NotImplementedError

    def _act(self, obs, deterministic: bool):
        raise TypeError(f"{self.algo} acts with a carried state: use predict(obs, state, episode_start)")

    # ---- the encoder's inputs ---------------------------------------------------------------------

    @property
    def action_features(self) -> int:
        """Rows of an action as the encoder reads it: one-hot (Discrete) or the vector (Box)."""
        return int(self.action_space.n) if self.discrete else int(np.prod(self.action_space.shape))

    @property
    def encoder_inputs(self) -> int:
        """Rows of the encoder's input per step: the observation, then the previous action."""
        return self.n_obs + (self.action_features if self.config.previous_action else 0)

    def _features_of_actions(self, actions: Tensor) -> Tensor:
        """Stored actions [action_rows, T, B] as the encoder reads them: [action_features, T, B]."""
        if not self.discrete:
            return actions
        rows, steps, batch = actions.shape
        one_hot = rc.one_hot(flat_steps(actions), self.action_features)  # [actions, T * B]
        return rc.reshape(one_hot, (self.action_features, steps, batch))

    def _window_inputs(self, samples) -> tuple[Tensor, Tensor]:
        """The encoder's inputs over sampled windows [encoder_inputs, T, B]: at each step's
        observation and at its next observation (for the targets)."""
        if not self.config.previous_action:
            return samples.obs, samples.next_obs
        taken = self._features_of_actions(samples.action)  # [action_features, T, B]
        return (rc.concat_rows(samples.obs, shifted_by_one_step(taken)),  # the action before each step
                rc.concat_rows(samples.next_obs, taken))  # before each next observation: the step's own

    def _host_action_features(self, actions: np.ndarray) -> np.ndarray:
        """Actions [n, action_rows] as the encoder reads them, [action_features, n]."""
        if not self.discrete:
            return actions.T.astype(np.float32)
        return np.eye(self.action_features, dtype=np.float32)[actions.reshape(-1).astype(np.int64)].T

    # ---- the carried state ------------------------------------------------------------------------

    def initial_state(self, n: int = 1) -> tuple[np.ndarray, ...]:
        """Zero states for ``n`` lanes (host arrays, lanes in the last dimension): the encoder's,
        then (with previous_action) the previous action's features."""
        state = tuple(np.zeros(shape, np.float32) for shape in self._policy_encoder().state_shapes(n))
        if self.config.previous_action:
            state += (np.zeros((self.action_features, n), np.float32),)
        return state

    def _stepper(self, deterministic: bool):
        """The captured acting step: observations and the state in, actions and the encoder's
        new state out."""
        act = self._acting.get(deterministic)
        if act is None:
            state_type = self._policy_encoder().state_type

            def step(obs, previous_action=None, **state):
                inputs = obs if previous_action is None else rc.concat_rows(obs, previous_action)
                actions, new_state = self._act_step(inputs, state_type(**state), deterministic)
                return (actions, *new_state)

            act = self._acting[deterministic] = rc.capture(step, self._policy_parameters())
        return act

    def _policy_with_state(self, obs: np.ndarray, state: tuple[np.ndarray, ...], deterministic: bool):
        """(actions [n, action_rows], the encoder's new state) for observations [n, n_obs]."""
        fields = self._policy_encoder().state_type._fields
        inputs = dict(zip(fields, state))
        if self.config.previous_action:
            inputs["previous_action"] = state[-1]
        outputs = self._stepper(deterministic)(obs=obs.T, **inputs)
        return outputs[0].T, tuple(outputs[1:])

    def _policy(self, obs: np.ndarray, deterministic: bool) -> np.ndarray:
        """Actions for the training lanes, advancing their encoder states."""
        if self._lane_state is None:
            self._lane_state = self.initial_state(len(obs))
        actions, encoder_state = self._policy_with_state(obs, self._lane_state, deterministic)
        self._lane_state = encoder_state + self._lane_state[len(encoder_state):]
        return actions

    def _stepped(self, actions: np.ndarray, done: np.ndarray) -> None:
        """Records the actions the lanes took and zeroes the states of the lanes whose episode
        ended (their next step starts anew)."""
        if self._lane_state is None:
            self._lane_state = self.initial_state(len(actions))
        if self.config.previous_action:
            self._lane_state[-1][...] = self._host_action_features(actions)
        for part in self._lane_state:
            part[..., np.asarray(done, bool).reshape(-1)] = 0.0

    def _restart_lanes(self) -> None:
        self._lane_state = None  # made anew, zeros, at the next step

    def _predict(self, observation, state, episode_start, deterministic: bool):
        """``(actions, state)`` for one observation or a batch [n, *obs_shape], as SB3-Contrib's
        recurrent policies: ``state`` None (or a lane with ``episode_start`` true) starts from
        zeros; pass the returned state back with the next observations (a tuple of host arrays,
        lanes in the last dimension: see ``initial_state``)."""
        batch, vectorized = self._obs_batch(observation)
        n = len(batch)
        expected = self.initial_state(n)
        state = expected if state is None else tuple(np.array(s, np.float32, copy=True) for s in state)
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
            actions, encoder_state = self._policy_with_state(batch, state, deterministic)
        if self.config.previous_action:
            encoder_state += (self._host_action_features(actions),)
        return self._shaped_actions(self._to_env_action(actions), vectorized), encoder_state
