"""The agents' configs: ``OffPolicyConfig``, the hyperparameters every off-policy agent has,
documented here once, and the checks the configs' ``__post_init__`` run."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import ClassVar

from rlkit.agents.observations import FEATURES_EXTRACTORS
from rlkit.core.checks import number_in_range, positive_int

REPLAY_BUFFER_CLASSES = (None, "HerReplayBuffer")
"""The values of OffPolicyConfig.replay_buffer_class."""


@dataclass
class OffPolicyConfig:
    """The hyperparameters every off-policy agent has. Each agent's config subclasses it,
    redefining only the defaults it sets otherwise (a redefined field keeps its place and its
    meaning here) and adding its own fields after these. The defaults are Stable-Baselines3's
    for its off-policy algorithms (SAC's); changing one changes every agent that does not set
    its own."""

    learning_rate: float = 3e-4
    """Adam's learning rate, for every network the agent trains (and SAC's entropy coefficient)."""
    buffer_size: int = 1_000_000
    """Transitions the replay buffer holds."""
    learning_starts: int = 100
    """Environment steps taken with uniform random actions before the first gradient step."""
    batch_size: int = 256
    """Samples per gradient step: transitions, or sequences for the recurrent agents."""
    tau: float = 0.005
    """Polyak coefficient of the target updates (1: a copy)."""
    gamma: float = 0.99
    """Discount factor."""
    train_freq: int = 1
    """Environment steps between rounds of gradient steps."""
    gradient_steps: int = 1
    """Gradient steps per round."""
    net_arch: tuple[int, ...] = (256, 256)
    """Hidden layer sizes of the agent's networks (its config's docstring says which); for the
    actor-critic agents also, as SB3's, ``dict(pi=[...], qf=[...])``: the actor's (pi) and each
    critic's (qf), kept as a dict of tuples (the annotation names the form the command line
    parses). Lists are kept as tuples."""
    n_envs: int = 1
    """Environments stepped together (a vector environment made from the id when > 1)."""
    log_interval: int = 1000
    """Environment steps between TensorBoard writes."""
    features_extractor: str = "auto"
    """What the networks see of an observation (rlkit/agents/observations.py): "auto" a CNN
    (NatureCNN) for an image space, as SB3's is_image_space decides (a 3-D uint8 Box in
    [0, 255]), the flattened observation otherwise; "nature" or "impala" (ImpalaCNN) force that
    CNN on a 3-D Box of bytes or booleans; "flatten" the flattened observation. Every network
    (actor, each critic group) has its own encoder, as SB3's off-policy CnnPolicy by default."""
    features_extractor_kwargs: dict = field(default_factory=dict)
    """Keyword arguments of the CNN (SB3's name): NatureCNN's ``features_dim`` (512) and
    ``conv_layers`` ((channels, kernel, stride) triples: ((32, 8, 4), (64, 4, 2), (64, 3, 1))),
    ImpalaCNN's ``features_dim`` (256) and ``channels`` ((16, 32, 32)). MinAtar's 10x10
    screens, for instance: ``dict(conv_layers=((16, 3, 1),), features_dim=128)``."""
    normalize_images: bool = True
    """Image bytes in [0, 255] are scaled to [0, 1] on the device (SB3's normalize_images)."""
    replay_buffer_class: str | None = None
    """SB3's replay_buffer_class: None (the agent's own buffer) or "HerReplayBuffer" (the class
    rlkit.buffers.HerReplayBuffer itself is taken too): hindsight relabelling of goal-environment
    Dict observations (rlkit/buffers/her.py)."""
    replay_buffer_kwargs: dict = field(default_factory=dict)
    """SB3's replay_buffer_kwargs, HerReplayBuffer's: ``n_sampled_goal`` (4),
    ``goal_selection_strategy`` ("future", "final", "episode"), ``reward_function`` (None: the
    environment's compute_reward, on the host; "sparse_distance" with ``distance_threshold``, or
    "bit_equal": on the device, the update one device program)."""
    overlap_updates: bool = False
    """Whether the environment steps while a round's last gradient step runs on the device
    (not SB3's order, which it otherwise keeps): the actions of each step after a round come
    from the policy as it was before that round, one round behind, and the device runs the
    update while the host steps the environment and stores the transition. Faster on a GPU,
    where the update takes as long as the environment step; on the CPU, which runs the update
    before the environment steps either way, only the order changes. For the agents that act
    in their updates (SAC, TD3, DDPG; others refuse it), in ``learn``; with environments
    stepped in other processes (SubprocVecEnv) the round runs while they step anyway."""

    actor_critic: ClassVar[bool] = True
    """Whether the agent has an actor and critics, which ``net_arch`` may size apart."""

    @property
    def pi_arch(self) -> tuple[int, ...]:
        """The actor's hidden layer sizes (SB3's ``net_arch["pi"]``; the whole net_arch when it
        is one list)."""
        return self.net_arch["pi"] if isinstance(self.net_arch, dict) else self.net_arch

    @property
    def qf_arch(self) -> tuple[int, ...]:
        """Each critic's hidden layer sizes (SB3's ``net_arch["qf"]``)."""
        return self.net_arch["qf"] if isinstance(self.net_arch, dict) else self.net_arch

    def __post_init__(self):
        """The checks of the shared fields: counts, rates, the discount, tau and the network
        widths. A subclass's ``__post_init__`` calls it first, then checks its own fields."""
        prefix = type(self).__name__
        for name in ("buffer_size", "batch_size", "train_freq", "gradient_steps", "log_interval", "n_envs"):
            positive_int(getattr(self, name), f"{prefix}: {name}")
        starts = self.learning_starts
        if isinstance(starts, bool) or not isinstance(starts, int) or starts < 0:
            raise ValueError(f"{prefix}: learning_starts must be an int >= 0, got {starts!r}")
        check_positive_number(self, "learning_rate")
        check_in_range(self, "gamma", 0.0, 1.0)
        check_in_range(self, "tau", 0.0, 1.0, low_open=True)
        self.net_arch = normalized_net_arch(prefix, self.net_arch, self.actor_critic)
        for width in (*self.pi_arch, *self.qf_arch):
            positive_int(width, f"{prefix}: each net_arch width")
        if self.features_extractor not in FEATURES_EXTRACTORS:
            raise ValueError(f"{prefix}: features_extractor must be one of {FEATURES_EXTRACTORS}, "
                             f"got {self.features_extractor!r}")
        check_keyword_dict(self, "features_extractor_kwargs")
        if not isinstance(self.normalize_images, bool):
            raise ValueError(f"{prefix}: normalize_images must be True or False, got {self.normalize_images!r}")
        self.replay_buffer_class = getattr(self.replay_buffer_class, "__name__", self.replay_buffer_class)
        if self.replay_buffer_class not in REPLAY_BUFFER_CLASSES:
            raise ValueError(f"{prefix}: replay_buffer_class must be one of {REPLAY_BUFFER_CLASSES}, "
                             f"got {self.replay_buffer_class!r}")
        check_keyword_dict(self, "replay_buffer_kwargs")
        if not isinstance(self.overlap_updates, bool):
            raise ValueError(f"{prefix}: overlap_updates must be True or False, got {self.overlap_updates!r}")
        if self.replay_buffer_kwargs and self.replay_buffer_class is None:
            raise ValueError(f"{prefix}: replay_buffer_kwargs are HerReplayBuffer's: pass "
                             "replay_buffer_class='HerReplayBuffer' too")


def config_changes(config, reference=None) -> list[str]:
    """"name=value" for each field of the config dataclass ``config`` that differs from
    ``reference`` (default: its class's defaults), in field order: what a run changed of them."""
    ours = asdict(config)
    theirs = asdict(reference if reference is not None else type(config)())
    return [f"{name}={value!r}" for name, value in ours.items() if value != theirs[name]]


def check_keyword_dict(config, name: str) -> None:
    """ValueError unless the config's field ``name`` is a dict of keyword arguments (str keys)."""
    value = getattr(config, name)
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise ValueError(f"{type(config).__name__}: {name} must be a dict of keyword arguments, got {value!r}")


def normalized_net_arch(prefix: str, net_arch, actor_critic: bool):
    """``net_arch`` as a tuple of widths, or {"pi": tuple, "qf": tuple} where the agent has an
    actor and critics to size apart (SB3's dict; both keys needed, as SB3's actor-critic agents)."""
    if isinstance(net_arch, dict):
        if not actor_critic:
            raise ValueError(f"{prefix}: net_arch must be a list of widths (one network); dict(pi=..., qf=...) is "
                             f"for the actor-critic agents, got {net_arch!r}")
        if set(net_arch) != {"pi", "qf"}:
            raise ValueError(f"{prefix}: a net_arch dict needs the keys 'pi' (the actor) and 'qf' (the critics), "
                             f"got {sorted(net_arch)}")
        return {role: normalized_net_arch(prefix, net_arch[role], False) for role in ("pi", "qf")}
    if isinstance(net_arch, (list, tuple)):
        return tuple(net_arch)
    raise ValueError(f"{prefix}: net_arch must be a list of widths"
                     f"{' or dict(pi=[...], qf=[...])' if actor_critic else ''}, got {net_arch!r}")


def check_in_range(config, name: str, low: float, high: float, low_open: bool = False) -> None:
    """``config.name`` is a number in [low, high] (or (low, high] when ``low_open``)."""
    number_in_range(getattr(config, name), f"{type(config).__name__}: {name}", low, high, low_open)


def check_positive_number(config, name: str) -> None:
    """``config.name`` is a finite number > 0."""
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
        raise ValueError(f"{type(config).__name__}: {name} must be a positive number, got {value!r}")

