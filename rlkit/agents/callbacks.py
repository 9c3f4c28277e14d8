"""Callbacks for ``learn``, as Stable-Baselines3's: :class:`BaseCallback` and its hooks,
:class:`CallbackList` (or a plain list), and the callbacks SB3 users know by name:
:class:`EvalCallback` (with :class:`StopTrainingOnRewardThreshold` and
:class:`StopTrainingOnNoModelImprovement`), :class:`StopTrainingOnMaxEpisodes`,
:class:`CheckpointCallback` and :class:`EveryNTimesteps`.

What SB3 gives a callback as ``self.locals`` (the training loop's local variables, by name)
rlkit gives as ``self.event``, a typed :class:`StepEvent` of the step just taken. A plain
function ``callback(event) -> bool | None`` works too: ``learn`` calls it after every
vector-environment step and stops training when it returns False (None and True go on).

The order of the hooks in a learn call, as SB3's off-policy loop: ``on_training_start``; then
per rollout (``train_freq`` vector-environment steps) ``on_rollout_start``, ``on_step`` after
each step (before the rollout's gradient steps), ``on_rollout_end``; ``on_training_end`` last.
A False from ``on_step`` stops training at once (no ``on_rollout_end`` for that rollout).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rlkit.agents.episodes import EpisodeStats
from rlkit.agents.evaluation import evaluate
from rlkit.agents.lanes import make_env
from rlkit.core.checks import positive_int

if TYPE_CHECKING:
    from rlkit.agents.base import OffPolicyAgent
    from rlkit.agents.recorder import Recorder
    from rlkit.logger import SummaryWriter


@dataclass(frozen=True, slots=True)
class StepEvent:
    """What ``learn`` tells its callback after each vector-environment step (every lane
    stepped once); the arrays have a row per lane."""

    agent: OffPolicyAgent
    """The agent being trained, its deferred work (DQN's target updates) applied."""
    num_timesteps: int
    """Environment steps taken so far, summed over the lanes (``agent.num_timesteps``)."""
    actions: np.ndarray
    """The actions the lanes took, in the environment's action space: [n_envs] ints for a
    Discrete space, [n_envs, *shape] for a Box."""
    rewards: np.ndarray
    """The step's rewards, [n_envs] float32."""
    new_obs: np.ndarray
    """The observations to act on next, [n_envs, *obs_shape]; where an episode ended, the
    first observation of the next one."""
    terminated: np.ndarray
    """[n_envs] bool: the lanes whose episode reached a terminal state."""
    truncated: np.ndarray
    """[n_envs] bool: the lanes whose episode was cut short (a time limit)."""
    episodes: EpisodeStats
    """The returns and lengths of the lanes' last 100 finished episodes; ``means()`` gives
    what is logged as rollout/ep_rew_mean and rollout/ep_len_mean."""
    writer: SummaryWriter | None
    """The run's TensorBoard writer, None when the agent has no logdir."""

    @property
    def dones(self) -> np.ndarray:
        """[n_envs] bool: the lanes whose episode ended (terminated or truncated)."""
        return self.terminated | self.truncated


class BaseCallback:
    """A ``learn`` callback with Stable-Baselines3's hooks and attributes. Subclasses override
    ``_on_step`` (return False to stop training) and any of ``_init_callback``,
    ``_on_training_start``, ``_on_rollout_start``, ``_on_rollout_end``, ``_on_training_end``;
    ``learn`` calls the public ``init_callback`` / ``on_*`` methods, which keep the counters."""

    def __init__(self, verbose: int = 0):
        self.verbose = verbose
        self.model: OffPolicyAgent | None = None
        """The agent being trained (set by ``init_callback``)."""
        self.n_calls = 0
        """How many times ``on_step`` ran: vector-environment steps, over every learn call."""
        self.num_timesteps = 0
        """``model.num_timesteps`` when a hook last ran."""
        self.event: StepEvent | None = None
        """The step just taken (rlkit's typed stand-in for SB3's ``self.locals``)."""
        self.parent: BaseCallback | None = None
        """The callback that runs this one (an EvalCallback, for its stop callbacks)."""

    @property
    def training_env(self):
        """The environment the model trains on (``model.get_env()``)."""
        return self.model.get_env()

    @property
    def logger(self) -> Recorder:
        """The model's logger: ``record(key, value)`` is written at the next log write."""
        return self.model.logger

    @property
    def locals(self):
        raise AttributeError(f"{type(self).__name__}: rlkit callbacks have no locals; self.event is the step "
                             "just taken, typed (self.event.rewards, .dones, .new_obs, .actions, .agent, ...)")

    # ---- what learn calls ---------------------------------------------------------------------

    def init_callback(self, model: OffPolicyAgent) -> None:
        """Binds the callback to ``model``; learn calls it at the start of every call."""
        self.model = model
        self._init_callback()

    def on_training_start(self, locals_: dict | None = None, globals_: dict | None = None) -> None:
        """Before the first step of a learn call (SB3's arguments are accepted and unused)."""
        self.num_timesteps = self.model.num_timesteps
        self._on_training_start()

    def on_rollout_start(self) -> None:
        self._on_rollout_start()

    def update_event(self, event: StepEvent) -> None:
        """Gives the callback (and those it runs) the step just taken, before ``on_step``."""
        self.event = event
        for child in self._children():
            child.update_event(event)

    def on_step(self) -> bool:
        """After every vector-environment step: counts it and runs ``_on_step``; False stops
        training."""
        self.n_calls += 1
        self.num_timesteps = self.model.num_timesteps
        return self._on_step() is not False

    def on_rollout_end(self) -> None:
        self._on_rollout_end()

    def on_training_end(self) -> None:
        self._on_training_end()

    def __call__(self, event: StepEvent) -> bool:
        """The callback as a function of the event, as rlkit's callbacks were: for use inside a
        function callback. Binds itself to the event's agent at the first call (no
        training-start hooks run), then counts the step as ``on_step``."""
        if self.model is not event.agent:
            self.init_callback(event.agent)
        self.update_event(event)
        return self.on_step()

    # ---- what a subclass overrides ------------------------------------------------------------

    def _init_callback(self) -> None:
        pass

    def _on_training_start(self) -> None:
        pass

    def _on_rollout_start(self) -> None:
        pass

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        pass

    def _on_training_end(self) -> None:
        pass

    def _children(self) -> list[BaseCallback]:
        """The callbacks this one runs (they get the event too)."""
        return []


class FunctionCallback(BaseCallback):
    """A plain function ``callback(event) -> bool | None`` as a callback: called after every
    step with the :class:`StepEvent`; False stops training."""

    def __init__(self, function: Callable[[StepEvent], bool | None]):
        super().__init__()
        self.function = function

    def _on_step(self) -> bool:
        return self.function(self.event) is not False


def convert_callback(callback) -> BaseCallback | None:
    """What ``learn`` accepts as its callback, as a BaseCallback: None, a BaseCallback, a
    function of the StepEvent, or a list (or tuple) of these (a CallbackList)."""
    if callback is None or isinstance(callback, BaseCallback):
        return callback
    if isinstance(callback, (list, tuple)):
        return CallbackList(callback)
    if callable(callback):
        return FunctionCallback(callback)
    raise TypeError(f"callback must be None, a BaseCallback, a function of the StepEvent or a list of these, "
                    f"got {type(callback).__name__}")


class CallbackList(BaseCallback):
    """Callbacks run in order at every hook. ``on_step`` runs every one of them, even after
    one asks to stop, and training stops if any returned False."""

    def __init__(self, callbacks: Iterable):
        super().__init__()
        self.callbacks: list[BaseCallback] = [convert_callback(c) for c in callbacks if c is not None]

    def _children(self) -> list[BaseCallback]:
        return self.callbacks

    def _init_callback(self) -> None:
        for callback in self.callbacks:
            callback.init_callback(self.model)

    def _on_training_start(self) -> None:
        for callback in self.callbacks:
            callback.on_training_start()

    def _on_rollout_start(self) -> None:
        for callback in self.callbacks:
            callback.on_rollout_start()

    def _on_step(self) -> bool:
        results = [callback.on_step() for callback in self.callbacks]  # all of them, as SB3
        return all(results)

    def _on_rollout_end(self) -> None:
        for callback in self.callbacks:
            callback.on_rollout_end()

    def _on_training_end(self) -> None:
        for callback in self.callbacks:
            callback.on_training_end()


class EveryNTimesteps(BaseCallback):
    """Runs ``callback``'s ``on_step`` once every ``n_steps`` environment steps (summed over the
    lanes, so with several lanes it fires at the first step at or past each multiple)."""

    def __init__(self, n_steps: int, callback: BaseCallback):
        super().__init__()
        self.n_steps = positive_int(n_steps, "EveryNTimesteps: n_steps")
        self.callback = convert_callback(callback)
        self.callback.parent = self
        self._last_fired = 0

    def _children(self) -> list[BaseCallback]:
        return [self.callback]

    def _init_callback(self) -> None:
        self.callback.init_callback(self.model)

    def _on_step(self) -> bool:
        if self.num_timesteps - self._last_fired < self.n_steps:
            return True
        self._last_fired = self.num_timesteps
        return self.callback.on_step()


# ---- stopping ----------------------------------------------------------------------------------

class StopTrainingOnMaxEpisodes(BaseCallback):
    """Stops training after ``max_episodes`` episodes per lane: ``max_episodes * n_envs``
    finished episodes over all lanes, as SB3 counts them."""

    def __init__(self, max_episodes: int, verbose: int = 0):
        super().__init__(verbose)
        self.max_episodes = positive_int(max_episodes, "StopTrainingOnMaxEpisodes: max_episodes")
        self.n_episodes = 0
        """Episodes finished so far, over all lanes."""

    def _on_step(self) -> bool:
        self.n_episodes += int(np.count_nonzero(self.event.dones))
        limit = self.max_episodes * self.model.lanes.n
        if self.n_episodes >= limit and self.verbose >= 1:
            print(f"Stopping training: {self.n_episodes} episodes reached the limit of {limit}")
        return self.n_episodes < limit


class _AfterEvaluation(BaseCallback):
    """A callback an EvalCallback runs after an evaluation (as ``callback_on_new_best`` or
    ``callback_after_eval``), reading its results through ``parent``."""

    def _init_callback(self) -> None:
        if not isinstance(self.parent, EvalCallback):
            raise ValueError(f"{type(self).__name__} runs inside an EvalCallback: pass it as "
                             "EvalCallback(..., callback_on_new_best=...) or callback_after_eval=..., not to learn")


class StopTrainingOnRewardThreshold(_AfterEvaluation):
    """Stops training once the best mean evaluation return reaches ``reward_threshold`` (as
    EvalCallback's ``callback_on_new_best``)."""

    def __init__(self, reward_threshold: float, verbose: int = 0):
        super().__init__(verbose)
        self.reward_threshold = reward_threshold

    def _on_step(self) -> bool:
        reached = self.parent.best_mean_reward >= self.reward_threshold
        if reached and self.verbose >= 1:
            print(f"Stopping training: the mean reward {self.parent.best_mean_reward:.2f} reached the threshold "
                  f"{self.reward_threshold}")
        return not reached


class StopTrainingOnNoModelImprovement(_AfterEvaluation):
    """Stops training when ``max_no_improvement_evals`` evaluations in a row after the first
    ``min_evals`` have not raised the best mean return (as EvalCallback's
    ``callback_after_eval``)."""

    def __init__(self, max_no_improvement_evals: int, min_evals: int = 0, verbose: int = 0):
        super().__init__(verbose)
        self.max_no_improvement_evals = max_no_improvement_evals
        self.min_evals = min_evals
        self.last_best_mean_reward = -math.inf
        self.no_improvement_evals = 0

    def _on_step(self) -> bool:
        best = self.parent.best_mean_reward
        improved = best > self.last_best_mean_reward
        self.last_best_mean_reward = best
        if self.n_calls <= self.min_evals:  # the first evaluations are not judged
            return True
        self.no_improvement_evals = 0 if improved else self.no_improvement_evals + 1
        if self.no_improvement_evals > self.max_no_improvement_evals:
            if self.verbose >= 1:
                print(f"Stopping training: no new best mean reward in {self.no_improvement_evals} evaluations")
            return False
        return True


# ---- saving and evaluating ---------------------------------------------------------------------

class CheckpointCallback(BaseCallback):
    """Saves the agent every ``save_freq`` calls (vector-environment steps) to
    ``<save_path>/<name_prefix>_<num_timesteps>_steps.safetensors`` (each file written
    atomically), and with ``save_replay_buffer`` its buffer to the folder
    ``<name_prefix>_replay_buffer_<num_timesteps>_steps``, as Stable-Baselines3 names them
    (SB3's model files end in .zip, its buffers in .pkl). ``saved`` lists the agent files."""

    def __init__(self, save_freq: int, save_path: str, name_prefix: str = "rl_model",
                 save_replay_buffer: bool = False, save_vecnormalize: bool = False, verbose: int = 0):
        super().__init__(verbose)
        if save_vecnormalize:
            raise ValueError("CheckpointCallback: rlkit has no VecNormalize to save; leave save_vecnormalize False")
        self.save_freq = positive_int(save_freq, "CheckpointCallback: save_freq")
        self.save_path, self.name_prefix, self.save_replay_buffer = save_path, name_prefix, save_replay_buffer
        self.saved: list[str] = []

    def _init_callback(self) -> None:
        os.makedirs(self.save_path, exist_ok=True)

    def _checkpoint_path(self, kind: str = "", extension: str = "") -> str:
        """``<save_path>/<name_prefix>_<kind><num_timesteps>_steps[.<extension>]``."""
        name = f"{self.name_prefix}_{kind}{self.num_timesteps}_steps" + (f".{extension}" if extension else "")
        return os.path.join(self.save_path, name)

    def _on_step(self) -> bool:
        if self.n_calls % self.save_freq:
            return True
        path = self._checkpoint_path(extension="safetensors")
        self.model.save(path)
        self.saved.append(path)
        if self.save_replay_buffer:
            self.model.save_replay_buffer(self._checkpoint_path("replay_buffer_"))
        if self.verbose >= 2:
            print(f"Saving model checkpoint to {path}")
        return True


class EvalCallback(BaseCallback):
    """Evaluates the agent every ``eval_freq`` calls (vector-environment steps) on
    ``n_eval_episodes`` episodes of ``eval_env`` (an environment, its id, or a vector
    environment), as Stable-Baselines3's EvalCallback: logs eval/mean_reward and
    eval/mean_ep_length (and eval/success_rate where the infos say ``is_success``), keeps the
    results (``evaluations_timesteps``, ``evaluations_results``, ``evaluations_length``, written to
    ``<log_path>/evaluations.npz`` when ``log_path`` is given), ``last_mean_reward`` and
    ``best_mean_reward``, saves each new best to ``<best_model_save_path>/best_model.safetensors``,
    runs ``callback_on_new_best`` on a new best and ``callback_after_eval`` after every
    evaluation; either stops training by returning False.

    rlkit's additions: ``seed`` resets the evaluation's episode ``i`` with ``seed + i`` (the same
    episodes at every evaluation), ``reward_threshold`` stops training once a mean return reaches
    it (StopTrainingOnRewardThreshold in one keyword), and ``evaluations`` lists every evaluation
    as (num_timesteps, mean, std). ``n_episodes`` is the older name of ``n_eval_episodes``."""

    def __init__(self, eval_env, callback_on_new_best: BaseCallback | None = None,
                 callback_after_eval: BaseCallback | None = None, n_eval_episodes: int = 5, eval_freq: int = 10000,
                 log_path: str | None = None, best_model_save_path: str | None = None, deterministic: bool = True,
                 render: bool = False, verbose: int = 1, warn: bool = True, *, n_episodes: int | None = None,
                 reward_threshold: float | None = None, seed: int | None = None):
        super().__init__(verbose)
        self.eval_env = eval_env if hasattr(eval_env, "num_envs") else make_env(eval_env)
        self.eval_freq = positive_int(eval_freq, "EvalCallback: eval_freq")
        episodes = n_eval_episodes if n_episodes is None else n_episodes
        self.n_eval_episodes = positive_int(episodes, "EvalCallback: n_eval_episodes")
        self.callback_on_new_best = convert_callback(callback_on_new_best)
        self.callback_after_eval = convert_callback(callback_after_eval)
        for child in self._children():
            child.parent = self
        self.log_path = None if log_path is None else os.path.join(log_path, "evaluations")
        self.best_model_save_path = best_model_save_path
        self.deterministic, self.render, self.warn = deterministic, render, warn
        self.reward_threshold, self.seed = reward_threshold, seed
        self.best_mean_reward = -math.inf
        self.last_mean_reward = -math.inf
        self.evaluations_timesteps: list[int] = []
        self.evaluations_results: list[list[float]] = []
        self.evaluations_length: list[list[int]] = []
        self.evaluations_successes: list[list[bool]] = []
        self.evaluations: list[tuple[int, float, float]] = []
        self._successes: list[bool] = []

    @property
    def n_episodes(self) -> int:
        """The older name of ``n_eval_episodes``."""
        return self.n_eval_episodes

    @property
    def best(self) -> float:
        """The best mean evaluation return so far (-inf before the first evaluation)."""
        return self.best_mean_reward

    def _children(self) -> list[BaseCallback]:
        return [c for c in (self.callback_on_new_best, self.callback_after_eval) if c is not None]

    def _init_callback(self) -> None:
        for folder in (self.best_model_save_path, self.log_path and os.path.dirname(self.log_path)):
            if folder:
                os.makedirs(folder, exist_ok=True)
        for child in self._children():
            child.init_callback(self.model)

    def _on_step(self) -> bool:
        if self.n_calls % self.eval_freq:
            return True
        rewards, lengths = self._evaluate()
        mean, std = float(np.mean(rewards)), float(np.std(rewards))
        self.last_mean_reward = mean
        self.evaluations.append((self.num_timesteps, mean, std))
        self._report(mean, std, lengths)
        keep_training = True
        if mean > self.best_mean_reward:
            if self.verbose >= 1:
                print("New best mean reward!")
            if self.best_model_save_path is not None:
                self.model.save(os.path.join(self.best_model_save_path, "best_model.safetensors"))
            self.best_mean_reward = mean
            if self.callback_on_new_best is not None:
                keep_training = self.callback_on_new_best.on_step()
        if self.callback_after_eval is not None:
            keep_training = keep_training and self.callback_after_eval.on_step()  # not run once stopping, as SB3
        if self.reward_threshold is not None and mean >= self.reward_threshold:
            keep_training = False
        return keep_training

    def _evaluate(self) -> tuple[list[float], list[int]]:
        """One evaluation's episode returns and lengths, kept (and written to log_path)."""
        self._successes = []
        rewards, lengths = evaluate(self.model, self.eval_env, self.n_eval_episodes, deterministic=self.deterministic,
                                    render=self.render, callback=self._record_success, return_episode_rewards=True,
                                    warn=self.warn, seed=self.seed)
        self.evaluations_timesteps.append(self.num_timesteps)
        self.evaluations_results.append(rewards)
        self.evaluations_length.append(lengths)
        if self._successes:
            self.evaluations_successes.append(self._successes)
        if self.log_path is not None:
            extra = {"successes": self.evaluations_successes} if self.evaluations_successes else {}
            np.savez(self.log_path, timesteps=self.evaluations_timesteps, results=self.evaluations_results,
                     ep_lengths=self.evaluations_length, **extra)
        return rewards, lengths

    def _record_success(self, locals_: dict, globals_: dict) -> None:
        """evaluate's per-step callback: the ``is_success`` of each finished episode's info."""
        if locals_["done"] and locals_["info"].get("is_success") is not None:
            self._successes.append(bool(locals_["info"]["is_success"]))

    def _report(self, mean: float, std: float, lengths: list[int]) -> None:
        """Prints (verbose >= 1) and logs an evaluation, written at num_timesteps at once."""
        if self.verbose >= 1:
            print(f"Eval num_timesteps={self.num_timesteps}, episode_reward={mean:.2f} +/- {std:.2f}")
            print(f"Episode length: {np.mean(lengths):.2f} +/- {np.std(lengths):.2f}")
        self.logger.record("eval/mean_reward", mean)
        self.logger.record("eval/mean_ep_length", float(np.mean(lengths)))
        if self._successes:
            self.logger.record("eval/success_rate", float(np.mean(self._successes)))
        self.logger.record("time/total_timesteps", self.num_timesteps, exclude="tensorboard")
        self.logger.dump(self.num_timesteps)


class RunFolderCallbacks(CallbackList):
    """What the command line's --eval-freq and --save-freq make: an EvalCallback (the best model and evaluations.npz in the
    run's folder) and a CheckpointCallback (the run's checkpoints/ folder), made when training
    starts, once the run's folder exists."""

    def __init__(self, make_eval_env, eval_freq: int, save_freq: int):
        super().__init__([])
        self.make_eval_env, self.eval_freq, self.save_freq = make_eval_env, eval_freq, save_freq

    def _init_callback(self) -> None:
        if not self.callbacks:
            run = self.model.log_path
            if self.eval_freq:
                self.callbacks.append(EvalCallback(self.make_eval_env(), eval_freq=self.eval_freq, verbose=0,
                                                   best_model_save_path=run, log_path=run))
            if self.save_freq:
                self.callbacks.append(CheckpointCallback(self.save_freq, os.path.join(run, "checkpoints")))
        super()._init_callback()
