"""DQN (Mnih et al., 2015) on a discrete-action Gymnasium environment, with options: the
double-Q target (van Hasselt et al., 2016), dueling heads, n-step returns and prioritized replay.

Gradient steps run as captured programs, 16 steps each: per step, a batch sampled on the device
from the replay buffer, the TD target from the target network, the Huber loss, backward, gradient
clipping and Adam; nothing crosses from the host but the coefficients of the steps. Acting is one
forward of the Q-network per environment step (none where every lane explores); on a GPU, a
small Q-network acts from a copy on the host, refreshed after each round of gradient steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

import rlkit.core as rc
from rlkit.agents.acting import default_device, policy_input, policy_inputs
from rlkit.agents.base import OffPolicyAgent
from rlkit.agents.config import OffPolicyConfig, check_in_range, check_positive_number
from rlkit.agents.exploration import EpsilonGreedy
from rlkit.agents.networks import encoded_mlp, mlp
from rlkit.agents.observations import ObservationLayout
from rlkit.agents.onnx_export import emit, onnx_form
from rlkit.agents.polyak import DeferredPolyak, Polyak
from rlkit.buffers import DevicePrioritizedReplayBuffer
from rlkit.core.checks import positive_int
from rlkit.envs import ATARI_DQN_DEFAULTS, is_atari_id
from rlkit.envs.packages import register_for


@dataclass
class DQNConfig(OffPolicyConfig):
    """DQN's hyperparameters, the shared ones documented in OffPolicyConfig (the defaults are
    RL Zoo's tuned CartPole-v1 settings; an agent made on CartPole-v1 without a config gets three
    of them changed, CARTPOLE_DQN_DEFAULTS, and on an Atari id RL Zoo's Atari settings:
    ``DQN.default_config``); ``net_arch`` sizes the Q-network."""

    actor_critic: ClassVar[bool] = False  # net_arch sizes the one Q-network: a list

    learning_rate: float = 2.3e-3
    buffer_size: int = 100_000
    learning_starts: int = 1000
    batch_size: int = 64
    tau: float = 1.0
    train_freq: int = 256
    gradient_steps: int = 128

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
    double: bool = False
    """Double DQN: the online network chooses the next action, the target network values it."""
    dueling: bool = False
    """Dueling heads (Wang et al., 2016): Q = V + A - mean(A) over the actions, on a shared trunk."""
    n_steps: int = 1
    """Steps summed into each target (n-step returns, stopped at episode ends), on the device."""
    prioritized: bool = False
    """Prioritized replay (Schaul et al., 2016) on the device: sampling in proportion to
    priority^alpha, the loss weighted by the importance weights, priorities set to |TD error|."""
    prioritized_alpha: float = 0.6
    """How strongly priorities shape sampling (0: uniform)."""
    prioritized_beta: float = 0.4
    """The importance-weight exponent at the start, annealed linearly to 1 over training."""
    act_on_host: bool | None = None
    """On a GPU, choose actions with a copy of the Q-network on the host, refreshed after each
    round of gradient steps and whenever the network's weights are written (a load, a broadcast):
    a CPU forward per step instead of a round trip to the GPU. None: where the Q-network has at
    most 2^18 parameters (about half a million multiply-adds per observation, cheaper on the host
    than a GPU round trip)."""

    def __post_init__(self):
        super().__post_init__()
        if self.act_on_host is not None and not isinstance(self.act_on_host, bool):
            raise ValueError(f"DQNConfig: act_on_host must be True, False or None, got {self.act_on_host!r}")
        positive_int(self.target_update_interval, "DQNConfig: target_update_interval")
        check_in_range(self, "exploration_fraction", 0.0, 1.0, low_open=True)
        check_in_range(self, "exploration_initial_eps", 0.0, 1.0)
        check_in_range(self, "exploration_final_eps", 0.0, 1.0)
        check_positive_number(self, "max_grad_norm")
        positive_int(self.n_steps, "DQNConfig: n_steps")
        check_in_range(self, "prioritized_alpha", 0.0, 10.0)
        check_in_range(self, "prioritized_beta", 0.0, 1.0)

CARTPOLE_DQN_DEFAULTS = dict(learning_rate=6.3e-4, double=True, n_steps=3)
"""What DQN changes of DQNConfig's defaults (RL Zoo's CartPole-v1 settings) for CartPole-v1, so
that learning holds on every seed. With RL Zoo's settings the final agent of a 50k-step run
depends on the seed (seeds 0-4: 95, 500, 500, 438, 164 over 20 evaluation episodes of the final
weights, CPU, 2026-12-02; SB3 with the same settings ends its seed 0 at 19). A learning rate
near a quarter of RL Zoo's, double-Q targets (less overestimation) and 3-step returns (rewards
reach back three steps per update) end every one of those seeds at 500. The three were measured
together, not one at a time (BENCHMARKS.md, "Learning on every seed"; scripts/bench_seeds.py)."""

HOST_ACTING_MAX_PARAMETERS = 2**18  # act_on_host=None acts on the host up to this Q-network size
UPDATES_PER_PROGRAM = 16
"""Gradient steps one captured program runs. A GPU replay ends with the host waiting for its
results, which costs about as much as a small network's update: 16 updates per wait."""


class DuelingQNetwork(rc.nn.Module):
    """A shared trunk (the observation encoder, then the hidden layers), then a state value
    V [1, B] and advantages A [actions, B] combined as Q = V + A - mean(A): the mean pins V and
    A down (any constant could move between them)."""

    def __init__(self, encoder: rc.nn.Module, features: int, n_actions: int, hidden: tuple[int, ...]):
        super().__init__()
        self.encoder = encoder
        self.trunk = mlp((features, *hidden), final_activation=True) if hidden else None
        width = hidden[-1] if hidden else features
        self.value = mlp((width, 1), final_activation=False)
        self.advantage = mlp((width, n_actions), final_activation=False)

    def forward(self, obs):
        features = self.encoder(obs)  # [features, B]
        if self.trunk is not None:
            features = self.trunk(features)  # [hidden, B]
        advantage = self.advantage(features)  # [actions, B]
        centred = rc.sub(advantage, rc.mean(advantage, dim=0))  # [actions, B]
        return rc.add(self.value(features), centred)  # [actions, B]


@onnx_form(DuelingQNetwork)
def _dueling_onnx(g, m: DuelingQNetwork, x: str) -> str:
    """The dueling heads in ONNX: V + A - mean(A) over the actions (axis 1 of (N, actions))."""
    features = emit(g, m.encoder, x)
    if m.trunk is not None:
        features = emit(g, m.trunk, features)
    advantage = emit(g, m.advantage, features)
    centred = g.node("Sub", [advantage, g.node("ReduceMean", [advantage], axes=[1], keepdims=1)])
    return g.node("Add", [emit(g, m.value, features), centred])


def _q_network(layout: ObservationLayout, n_actions: int, cfg: DQNConfig) -> rc.nn.Module:
    """The Q-network: the observation encoder (a CNN for images, the observation itself for
    vectors), then an MLP, or dueling heads on the same hidden layers."""
    if cfg.dueling:
        return DuelingQNetwork(*layout.features_extractor(cfg.features_extractor_kwargs), n_actions, cfg.net_arch)
    return encoded_mlp(layout, cfg.net_arch, n_actions, cfg.features_extractor_kwargs)


class DQN(EpsilonGreedy, OffPolicyAgent):
    """DQN on ``env`` (a Gymnasium environment, its id, or a vector environment) with
    ``config`` on ``device``; TensorBoard runs go to ``<logdir>/DQN_<N>``."""

    algo = "DQN"
    config_class = DQNConfig
    env_defaults = {"CartPole-v1": CARTPOLE_DQN_DEFAULTS}

    @classmethod
    def default_config(cls, env=None) -> DQNConfig:
        """RL Zoo's Atari settings (rlkit.envs.ATARI_DQN_DEFAULTS; the head right on NatureCNN's
        features, as SB3's CnnPolicy) for an Atari id; for CartPole-v1, DQNConfig's defaults
        changed by CARTPOLE_DQN_DEFAULTS (learning on every seed); DQNConfig's defaults otherwise."""
        register_for(env)
        if is_atari_id(env):
            return DQNConfig(**ATARI_DQN_DEFAULTS, net_arch=())
        return super().default_config(env)

    def _check_spaces(self) -> None:
        self._require_spaces("discrete")

    def _build(self) -> None:
        cfg = self.config
        self.n_actions = int(self.action_space.n)
        self.q = _q_network(self.obs_layout, self.n_actions, cfg)
        self.target = _q_network(self.obs_layout, self.n_actions, cfg)
        self.target.load_state_dict(self.q.state_dict())
        self.optimizer = rc.optim.Adam(self.q.parameters(), lr=cfg.learning_rate)
        buffer_options = dict(n_envs=self.lanes.n, device=self.device, action_dtype="i32", gamma=cfg.gamma,
                              seed=self.seed, n_step=cfg.n_steps, **self.obs_layout.buffer_options(self.env))
        if cfg.prioritized and cfg.replay_buffer_class is not None:
            raise ValueError(f"DQN: prioritized replay and replay_buffer_class={cfg.replay_buffer_class!r} do not "
                             "combine; choose one")
        if cfg.prioritized:
            self.buffer = DevicePrioritizedReplayBuffer(cfg.buffer_size, action_shape=1, alpha=cfg.prioritized_alpha,
                                                        **buffer_options)
        else:
            self.buffer = self._replay_buffer(action_shape=1, **buffer_options)
        self._update_target = Polyak(self.target.parameters(), self.q.parameters())
        self._updates: dict[int, rc.capturing.CapturedFunction] = {}  # captured runs of gradient steps, by their count
        # requested every target_update_interval environment steps, applied before the next
        # round of gradient steps (the only writer of self.q within learn), a save or load,
        # a callback and the end of learn
        self._target_updates = DeferredPolyak(self._update_target, cfg.tau)
        self._host_q = self._host_copy()  # None: acting runs on self.device
        # the Q-network's parameters, whose versions say when the host copy is stale: the same
        # objects for the agent's life (weights are written into them in place, as the optimizer
        # and the captured update, which hold them too, need)
        self._q_parameters = tuple(self.q.parameters().values())
        self._on_host = default_device("cpu")
        self._host_acting: rc.capturing.CapturedFunction | None = None  # the host copy's captured forward
        self._host_q_versions: tuple[int, ...] | None = None  # self.q's versions at the last refresh

    def _host_copy(self) -> rc.nn.Module | None:
        """The Q-network's copy on the host to act with, where the config asks for one and the
        agent trains on a GPU; its weights are copied in before the first action."""
        cfg = self.config
        size = sum(int(np.prod(p.shape)) for p in self.q.parameters().values())
        wanted = cfg.act_on_host if cfg.act_on_host is not None else size <= HOST_ACTING_MAX_PARAMETERS
        if self.device == "cpu" or not wanted:
            return None
        with default_device("cpu"):
            return _q_network(self.obs_layout, self.n_actions, cfg)

    # ---- the update (traced once, then replayed) ----------------------------------------------

    def _loss(self, stored, beta=None):
        """The Huber loss of Q(s, a) against the (n-step) TD target; with prioritized replay,
        weighted by the importance weights, the batch's priorities set from its TD errors."""
        # Traced, then replayed: each Python `if` on the config here is decided while tracing and
        # frozen into the program, so a config changed after the first update would go unseen
        # (the config is fixed once the agent is built).
        cfg = self.config
        if cfg.prioritized:
            s = self.buffer.sample_on_device(cfg.batch_size, stored, beta)
        else:
            s = self.buffer.sample_on_device(cfg.batch_size, stored)
        with rc.no_grad():
            next_q = self.target(s.next_obs)  # [actions, B]
            if cfg.double:
                best_next = rc.gather(next_q, rc.argmax(self.q(s.next_obs)))
            else:
                best_next = rc.max(next_q)
            td_target = rc.stop_gradient(s.reward + s.discount * (1.0 - s.done) * best_next)  # [1, B]
        q_taken = rc.gather(self.q(s.obs), s.action)  # [1, B]
        if not cfg.prioritized:
            return rc.huber_loss(q_taken, td_target)
        self.buffer.update_priorities_on_device(s.index, q_taken - td_target)
        return rc.mean(s.weights * rc.huber_loss(q_taken, td_target, reduction="none"))  # weights [1, B]

    def _updates_program(self, steps: int) -> rc.capturing.CapturedFunction:
        """The captured program of ``steps`` gradient steps in a row (traced at its first call);
        it returns each step's loss and gradient norm."""
        program = self._updates.get(steps)
        if program is None:
            params = self.q.parameters()

            def run(**inputs):
                results = []
                for _ in range(steps):  # unrolled while tracing: hence a program per step count
                    results += rc.update_step(lambda: self._loss(**inputs), params, self.optimizer,
                                                        self.config.max_grad_norm)
                return results

            program = self._updates[steps] = rc.capture(run, params)
        return program

    def _gradient_steps(self, count: int, inputs: dict) -> list[tuple[float, float]]:
        """(loss, gradient norm) of each of ``count`` gradient steps, run UPDATES_PER_PROGRAM at
        a time (and the rest by one more program)."""
        results = []
        full, rest = divmod(count, UPDATES_PER_PROGRAM)
        for steps, replays in ((UPDATES_PER_PROGRAM, full), (rest, int(rest > 0))):
            for _ in range(replays):
                values = [value.item() for value in self._updates_program(steps)(**inputs)]
                results += zip(values[0::2], values[1::2])
        return results

    def _train(self, gradient_steps: int) -> dict[str, float]:
        self._target_updates.apply()  # the update reads the target; its gradient steps change self.q
        inputs = {"stored": np.array([[len(self.buffer)]], np.float32)}
        if self.config.prioritized:  # beta rises linearly from its start to 1 over training
            beta = self.config.prioritized_beta
            inputs["beta"] = np.array([[beta + self._progress() * (1.0 - beta)]], np.float32)
        results = self._gradient_steps(gradient_steps, inputs)
        losses = [loss for loss, _ in results]
        self.skipped_updates += sum(not math.isfinite(norm) for _, norm in results)
        self._host_q_versions = None  # replays update self.q in place without a version bump
        return {"train/loss": float(np.mean(losses)), "train/learning_rate": self.optimizer.lr}  # SB3: the round's mean

    def _after_env_step(self) -> None:
        if self._n_calls % max(self.config.target_update_interval // self.lanes.n, 1) == 0:
            self._target_updates.request()

    def _apply_deferred(self) -> None:
        super()._apply_deferred()
        self._target_updates.apply()

    # ---- acting ----------------------------------------------------------------------------------

    def _act(self, obs, deterministic: bool):
        return rc.argmax(self.q(obs))  # [1, n] i32: greedy

    def _policy_parameters(self) -> list:
        return list(self.q.parameters().values())

    def _onnx_policy(self):
        return [self.q], "argmax"

    def _policy(self, obs: np.ndarray, deterministic: bool) -> np.ndarray:
        if self._host_q is None:
            return super()._policy(obs, deterministic)
        versions = tuple([p.version for p in self._q_parameters])
        if versions != self._host_q_versions:  # gradient steps, a load or a broadcast since the last copy
            self._host_q.load_state_dict(self.q.state_dict())
            self._host_q_versions = versions
        if self._host_acting is None:
            # The copy's parameters are not listed: a capture re-traces where a listed one was written
            # from the host, and each refresh above writes them all (a trace every round of gradient
            # steps: every 4 steps with train_freq=4). The refresh writes in place, into the same
            # storages, which the replays read where they are; nothing moves the copy off the host.
            self._host_acting = rc.capture(lambda **inputs: rc.argmax(self._host_q(policy_input(inputs))))
        with self._on_host:  # the captured forward runs where the copy is
            return self._host_acting(**policy_inputs(obs)).T  # [n, 1]

    def _state_objects(self) -> dict:
        self._target_updates.apply()  # a save reads the target; a load writes self.q
        return {"q": self.q, "target": self.target, "optimizer": self.optimizer}
