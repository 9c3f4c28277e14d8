"""An agent's constructor as Stable-Baselines3's: SB3's positional policy name
(``DQN("MlpPolicy", env)``), and hyperparameters as keywords (``DQN(env, learning_rate=1e-3)``),
by the config's field names and, where SB3 says it otherwise, by SB3's (``policy_kwargs``,
``tensorboard_log``, ``train_freq=(4, "step")``, ``gradient_steps=-1``, ``action_noise``)."""

from __future__ import annotations

import dataclasses

import numpy as np

POLICY_NAMES = ("MlpPolicy", "CnnPolicy", "MultiInputPolicy")
"""SB3's policy names, accepted as the first argument. The networks follow the observation
space whichever is named (rlkit has one network family per agent)."""

SB3_UNUSED = {"optimize_memory_usage": False,
              "stats_window_size": 100, "use_sde": False, "sde_sample_freq": -1, "use_sde_at_warmup": False,
              "_init_setup_model": True}
"""SB3 options rlkit does not have, accepted at the value with which SB3 does not use them
(RL Zoo and scripts pass some of them as they are)."""

AGENT_OPTIONS = ("tensorboard_log", "verbose")
"""SB3 keywords that set the agent rather than its config."""

POLICY_KWARGS = ("net_arch", "activation_fn", "n_critics")
"""The ``policy_kwargs`` entries rlkit reads."""

DEVICE_NAMES = {"auto": None, "cuda": "gpu"}
"""SB3's device names: "auto" is rlkit's default device, "cuda" the GPU."""


def is_policy_name(value) -> bool:
    """Whether ``value`` is SB3's policy argument rather than an environment. A string ending in
    "Policy" that is not one of SB3's names raises (no Gymnasium id ends so)."""
    if isinstance(value, type):
        raise TypeError(f"pass the policy by its name, one of {POLICY_NAMES}, not the class {value.__name__}: "
                        "rlkit builds its own networks")
    if not isinstance(value, str) or not value.endswith("Policy"):
        return False
    if value not in POLICY_NAMES:
        raise ValueError(f"unknown policy {value!r}: expected one of {POLICY_NAMES}")
    return True


def split_policy_and_env(algo: str, env_or_id, config, env, policy, config_class: type):
    """(policy name, environment, config) from the constructor's arguments, in either
    signature: rlkit's ``Agent(env, config)`` or SB3's ``Agent(policy, env)``, ``env=`` and
    ``policy=`` as keywords in both."""
    if is_policy_name(env_or_id):
        if policy is not None:
            raise TypeError(f"{algo}: the policy is given twice ({env_or_id!r} and policy={policy!r})")
        policy, env_or_id = env_or_id, None
        if config is not None and not isinstance(config, config_class):  # SB3's order: the env is second
            env_or_id, config = config, None
    if policy is not None and not is_policy_name(policy):
        raise ValueError(f"{algo}: policy must be one of {POLICY_NAMES}, got {policy!r}")
    if env_or_id is not None and env is not None:
        raise TypeError(f"{algo}: the environment is given twice (positionally and as env=)")
    env = env_or_id if env is None else env
    if env is None:
        raise TypeError(f"{algo} needs an environment: {algo}(env) or, as SB3, {algo}('MlpPolicy', env)")
    return policy or POLICY_NAMES[0], env, config


def config_from_keywords(algo: str, config_class: type, config, keywords: dict, n_lanes: int):
    """(config, agent options): ``config`` (or the defaults) with the hyperparameter keywords
    applied, and the keywords that set the agent (``tensorboard_log``, ``verbose``). Raises
    TypeError for a keyword that is neither a config field nor one of SB3's, listing the valid
    ones; the config's own checks judge the values."""
    fields = {f.name for f in dataclasses.fields(config_class)}
    changes, options, unknown = {}, {}, []
    for key, value in keywords.items():
        if key in fields:
            changes[key] = value
        elif key == "policy_kwargs":
            changes.update(_from_policy_kwargs(algo, value, fields))
        elif key == "action_noise":
            changes.update(_from_action_noise(algo, value, fields))
        elif key in AGENT_OPTIONS:
            options[key] = value
        elif key in SB3_UNUSED:
            if value != SB3_UNUSED[key]:
                raise ValueError(f"{algo}: {key}={value!r} is an SB3 option rlkit does not have; leave it at "
                                 f"{SB3_UNUSED[key]!r} (or out)")
        else:
            unknown.append(key)
    if unknown:
        sb3 = sorted({"policy_kwargs", "action_noise", *AGENT_OPTIONS, *SB3_UNUSED})
        raise TypeError(f"{algo}: unknown keyword{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                        f"valid: {config_class.__name__}'s fields {sorted(fields)}, and SB3's {sb3}")
    if "train_freq" in changes:
        changes["train_freq"] = _train_freq_in_steps(algo, changes["train_freq"])
    if changes.get("gradient_steps") == -1:  # SB3: as many gradient steps as environment steps collected
        train_freq = changes.get("train_freq", getattr(config, "train_freq", None) or config_class().train_freq)
        changes["gradient_steps"] = train_freq * n_lanes
    if not changes:
        return config, options
    return (config_class(**changes) if config is None else dataclasses.replace(config, **changes)), options


def _train_freq_in_steps(algo: str, train_freq):
    """SB3's ``train_freq``: an int, or ``(n, "step")``; ``(n, "episode")`` is not supported."""
    if isinstance(train_freq, (tuple, list)):
        if len(train_freq) != 2 or train_freq[1] not in ("step", "episode"):
            raise ValueError(f"{algo}: train_freq must be an int or (n, 'step'), got {train_freq!r}")
        if train_freq[1] == "episode":
            raise ValueError(f"{algo}: train_freq in episodes is not supported: give it in steps, (n, 'step') or n")
        return train_freq[0]
    return train_freq


def _from_policy_kwargs(algo: str, policy_kwargs, fields: set[str]) -> dict:
    """The config fields SB3's ``policy_kwargs`` set: net_arch (a list, or dict(pi=..., qf=...)),
    n_critics; activation_fn must be ReLU, the activation of rlkit's networks."""
    if not isinstance(policy_kwargs, dict):
        raise TypeError(f"{algo}: policy_kwargs must be a dict, got {type(policy_kwargs).__name__}")
    unknown = [key for key in policy_kwargs if key not in POLICY_KWARGS or (key == "n_critics" and key not in fields)]
    if unknown:
        readable = [key for key in POLICY_KWARGS if key != "n_critics" or key in fields]
        raise ValueError(f"{algo}: policy_kwargs {unknown} not supported; rlkit reads {readable}")
    activation = policy_kwargs.get("activation_fn")
    if activation is not None and getattr(activation, "__name__", activation) not in ("ReLU", "relu"):
        raise ValueError(f"{algo}: policy_kwargs activation_fn must be ReLU (torch.nn.ReLU or 'relu'), the activation "
                         f"of rlkit's networks; got {activation!r}")
    return {key: policy_kwargs[key] for key in ("net_arch", "n_critics") if key in policy_kwargs}


def _from_action_noise(algo: str, noise, fields: set[str]) -> dict:
    """SB3's ``action_noise``: None, or a NormalActionNoise of mean 0 and one sigma for every
    action dimension, which is rlkit's ``action_noise_std`` (both in the [-1, 1] action scale)."""
    if noise is None:
        return {}
    if "action_noise_std" not in fields:
        raise ValueError(f"{algo}: action_noise is not supported (this agent explores by its own policy)")
    mean, sigma = (np.asarray(getattr(noise, name, np.nan), np.float64) for name in ("_mu", "_sigma"))
    if type(noise).__name__ != "NormalActionNoise" or np.any(mean != 0) or np.ptp(sigma) != 0:
        raise ValueError(f"{algo}: action_noise must be a NormalActionNoise with mean 0 and the same sigma in every "
                         f"dimension (rlkit's action_noise_std), got {noise!r}; or pass action_noise_std=")
    return {"action_noise_std": float(sigma.reshape(-1)[0])}
