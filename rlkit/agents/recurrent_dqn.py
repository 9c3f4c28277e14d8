"""Recurrent DQN (R2D2-style; Kapturowski et al., 2019) with a state-space (Mamba) or RWKV
encoder, for partially observed tasks.

Every gradient step is one captured program: windows of ``burn_in + sequence_length``
consecutive steps sampled on the device from the replay buffer, the encoder run over each
window from a zero state (the burn-in steps only warm the state up: they carry no loss), the
TD targets from the target network run over the windows' next observations, the masked Huber
loss, backward, clipping and Adam. Acting runs the encoder one step at a time with a state
carried per environment lane (see rlkit.agents.recurrent).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import rlkit.core as rc
from rlkit.agents.config import OffPolicyConfig, check_in_range, check_positive_number
from rlkit.agents.exploration import EpsilonGreedy
from rlkit.agents.networks import mlp
from rlkit.agents.polyak import DeferredPolyak, Polyak
from rlkit.agents.recurrent import (
    RecurrentAgent, SequenceEncoder, burn_in_weights, check_encoder_fields, flat_steps, learning_weights,
)
from rlkit.buffers import ReplayBuffer
from rlkit.core.checks import positive_int


@dataclass
class RecurrentDQNConfig(OffPolicyConfig):
    """Recurrent DQN's hyperparameters, the shared ones documented in OffPolicyConfig;
    ``batch_size`` counts sequences and ``net_arch`` sizes the Q head on the encoder's features.
    The defaults learn velocity-hidden CartPole (rlkit/CartPoleNoVel-v1: 500 from 20k steps on,
    seed 0): RL Zoo's CartPole DQN schedule (gradient steps, exploration, target copies) with
    R2D2's windows and n-step returns, which the learning rests on (with 1-step targets the same
    agent stays near 100-300)."""

    actor_critic: ClassVar[bool] = False  # net_arch sizes the one Q-network: a list

    learning_rate: float = 1e-3
    buffer_size: int = 100_000
    learning_starts: int = 1000
    batch_size: int = 16
    tau: float = 1.0
    train_freq: int = 256
    gradient_steps: int = 128
    net_arch: tuple[int, ...] = (64,)

    sequence_length: int = 16
    """Steps of each sequence that carry loss."""
    burn_in: int = 8
    """Steps before them that only warm the encoder's state up (R2D2's burn-in)."""
    target_update_interval: int = 10
    """Environment steps between target-network updates."""
    exploration_fraction: float = 0.16
    """Fraction of training over which epsilon falls linearly."""
    exploration_initial_eps: float = 1.0
    """Epsilon at the start."""
    exploration_final_eps: float = 0.04
    """Epsilon after the fall."""
    max_grad_norm: float = 10.0
    """Gradients are clipped to this global norm."""
    encoder: str = "mamba"
    """The sequence layer: "mamba" (a Mamba block) or "rwkv" (an RWKV-7 block)."""
    d_model: int = 32
    """The encoder's width."""
    d_state: int = 16
    """The Mamba block's state size per channel (unused by RWKV)."""
    previous_action: bool = True
    """Feed each step's previous action (one-hot) to the encoder with the observation."""
    double: bool = True
    """Double DQN: the online network chooses the next action, the target network values it."""
    n_steps: int = 3
    """Rewards summed into each target before bootstrapping (R2D2's n-step returns; the sums stop
    at episode ends). Windows grow by n_steps - 1 steps that only serve as bootstraps."""

    def __post_init__(self):
        super().__post_init__()
        positive_int(self.n_steps, "RecurrentDQNConfig: n_steps")
        check_encoder_fields(self, tail=self.n_steps - 1)
        positive_int(self.target_update_interval, "RecurrentDQNConfig: target_update_interval")
        check_in_range(self, "exploration_fraction", 0.0, 1.0, low_open=True)
        check_in_range(self, "exploration_initial_eps", 0.0, 1.0)
        check_in_range(self, "exploration_final_eps", 0.0, 1.0)
        check_positive_number(self, "max_grad_norm")

class RecurrentQNetwork(rc.nn.Module):
    """Q-values from observation histories: a sequence encoder, then an MLP head per step."""

    def __init__(self, n_inputs: int, n_actions: int, config: RecurrentDQNConfig):
        super().__init__()
        self.encoder = SequenceEncoder(n_inputs, config.d_model, config.d_state, config.encoder)
        self.head = mlp((config.d_model, *config.net_arch, n_actions), final_activation=False)

    def forward(self, inputs, state=None):
        """(Q [actions, T * B], final state) for windows of the encoder's inputs [n_inputs, T, B]."""
        features, state = self.encoder(inputs, state)  # [d_model, T, B]
        return self.head(flat_steps(features)), state  # [actions, T * B]

    def step(self, inputs, state):
        """(Q [actions, n], new state) for one step's inputs per lane [n_inputs, n]."""
        features, state = self.encoder.step(inputs, state)  # [d_model, n]
        return self.head(features), state


class RecurrentDQN(EpsilonGreedy, RecurrentAgent):
    """Recurrent DQN on ``env`` (a Gymnasium environment, its id, or a vector environment) with
    ``config`` on ``device``; TensorBoard runs go to ``<logdir>/RecurrentDQN_<N>``."""

    algo = "RecurrentDQN"
    config_class = RecurrentDQNConfig

    def _check_spaces(self) -> None:
        self._require_spaces("discrete")

    def _build(self) -> None:
        cfg = self.config
        self.n_actions = int(self.action_space.n)
        self.q = RecurrentQNetwork(self.encoder_inputs, self.n_actions, cfg)
        self.target = RecurrentQNetwork(self.encoder_inputs, self.n_actions, cfg)
        self.target.load_state_dict(self.q.state_dict())
        self.optimizer = rc.optim.Adam(self.q.parameters(), lr=cfg.learning_rate)
        self.buffer = ReplayBuffer(cfg.buffer_size, self.n_obs, 1, n_envs=self.lanes.n, device=self.device,
                                   action_dtype="i32", gamma=cfg.gamma, seed=self.seed, n_step=cfg.n_steps)
        self._window_tail = cfg.n_steps - 1  # steps after the loss steps, read as n-step bootstraps
        self._burn_in_weights = burn_in_weights(cfg.burn_in, cfg.sequence_length, self.device,
                                                tail=self._window_tail)  # [1, T, 1]
        # requested every target_update_interval environment steps, applied as one before anything
        # reads the target or writes self.q (as DQN does)
        self._target_updates = DeferredPolyak(Polyak(self.target.parameters(), self.q.parameters()), cfg.tau)
        self._train_step = rc.capture_step(self._loss, self.q.parameters(), self.optimizer,
                                           max_grad_norm=cfg.max_grad_norm)

    # ---- the update (traced once, then replayed) ----------------------------------------------

    def _loss(self, starts):
        """The masked Huber loss of Q(history, a) against the TD target over sampled windows."""
        cfg = self.config  # its `if`s below are decided once, while the update is traced
        s = self.buffer.sample_sequences_on_device(cfg.batch_size, cfg.sequence_length + self._window_tail,
                                                   cfg.burn_in, starts)
        inputs, next_inputs = self._window_inputs(s)  # [encoder_inputs, T, B] each
        with rc.no_grad():
            # the target network runs over the next observations: at step t it has seen the
            # window's history shifted by one, ending in step t's true next observation
            next_q, _ = self.target(next_inputs)  # [actions, T * B]
            online_next = self.q(next_inputs)[0] if cfg.double else None  # [actions, T * B]
            if cfg.n_steps == 1:
                returns, discount, done = flat_steps(s.reward), cfg.gamma, flat_steps(s.terminated)
            else:  # bootstrap from the step each sum ended at, later in the same window
                returns, done, discount, last = self.buffer.n_step_returns_on_device(s.index)  # [1, T * B] each
                bootstrap = self._bootstrap_columns(s.index, last)  # [1, T * B]
                next_q = rc.get_rows(next_q, bootstrap)
                online_next = None if online_next is None else rc.get_rows(online_next, bootstrap)
            best_next = rc.max(next_q) if online_next is None else rc.gather(next_q, rc.argmax(online_next))
            td_target = rc.stop_gradient(returns + discount * rc.sub(1.0, done) * best_next)  # [1, T * B]
        q, _ = self.q(inputs)  # [actions, T * B]
        q_taken = rc.gather(q, flat_steps(s.action))  # [1, T * B]
        weights, count = learning_weights(s, self._burn_in_weights)
        return rc.div(rc.sum(weights * rc.huber_loss(q_taken, td_target, reduction="none")), count)

    def _bootstrap_columns(self, index, last):
        """Where each step's n-step sum bootstraps, as columns of the flattened windows: step j's
        own column plus the steps the sum ran past it (the ring columns ``index`` and ``last`` of
        one lane lie a multiple of n_envs apart, modulo the capacity)."""
        capacity, n_envs = float(self.buffer.capacity), float(self.lanes.n)
        ahead = rc.sub(rc.cast(last, "f32"), rc.cast(index, "f32"))  # [1, T * B]
        # steps ahead; a division (exact for these multiples), not a product with 1 / n_envs
        ahead = rc.div(rc.add(ahead, rc.scale(rc.gt(0.0, ahead), capacity)), n_envs)
        n = index.shape[1]
        position = rc.reshape(rc.arange(n, device=index.device), (1, n))  # [1, T * B]: 0 .. T * B - 1
        # the tail steps carry no loss; clamping keeps the last window's tail inside the batch
        return rc.cast(rc.minimum(rc.add(position, ahead), float(n - 1)), "i32")

    def _train(self, gradient_steps: int) -> dict[str, float]:
        self._target_updates.apply()  # the update reads the target; its gradient steps change self.q
        starts = self.buffer.sequence_starts()
        if starts[1, 0] < self.config.burn_in + self.config.sequence_length + self._window_tail:
            return {}  # not a whole window stored per lane yet
        for _ in range(gradient_steps):
            loss, norm = self._train_step(starts=starts)
            self.skipped_updates += not math.isfinite(norm)
        return {"train/loss": loss, "train/learning_rate": self.optimizer.lr}

    def _after_env_step(self) -> None:
        if self._n_calls % max(self.config.target_update_interval // self.lanes.n, 1) == 0:
            self._target_updates.request()

    def _apply_deferred(self) -> None:
        super()._apply_deferred()
        self._target_updates.apply()

    # ---- acting ----------------------------------------------------------------------------------

    def _policy_encoder(self) -> SequenceEncoder:
        return self.q.encoder

    def _act_step(self, inputs, state, deterministic: bool):
        q, state = self.q.step(inputs, state)  # [actions, n]
        return rc.argmax(q), state  # [1, n] i32: greedy

    def _policy_parameters(self) -> list:
        return list(self.q.parameters().values())

    def _state_objects(self) -> dict:
        self._target_updates.apply()  # a save reads the target; a load writes self.q
        return {"q": self.q, "target": self.target, "optimizer": self.optimizer}
