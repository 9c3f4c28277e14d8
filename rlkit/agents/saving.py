"""An agent's parameters and files: ``get_parameters``/``set_parameters``, the replay buffer's
save and load, and the agent's own ``save``/``load`` (safetensors with JSON metadata, through
rlkit.checkpoint: swapped in whole, never running code a file names)."""

from __future__ import annotations

import os
from dataclasses import asdict, fields

import rlkit.core as rc
from rlkit.agents.lanes import env_module
from rlkit.buffers import HerReplayBuffer
from rlkit.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint


class Saving:
    """What an agent writes and reads (a mixin of OffPolicyAgent, which supplies ``algo``,
    ``config``, ``_state_objects`` and the replay buffer)."""

    def get_parameters(self) -> dict[str, dict]:
        """``{name: state_dict}`` of every network and optimizer (what save writes), arrays
        copied: rlkit's names ("q", "target", "optimizer" for DQN; "actor", "critic", ... for the
        actor-critic agents), not SB3's ("policy", "policy.optimizer")."""
        return {name: obj.state_dict() for name, obj in self._state_objects().items()}

    def set_parameters(self, load_path_or_dict, exact_match: bool = True, device: str = "auto") -> None:
        """Loads what ``get_parameters`` returned, or the networks and optimizers of a saved
        agent's file. ``exact_match``: every object (and, in each network, every parameter) must
        be given; False loads a subset of the objects. All are written or none (a bad entry
        restores what was loaded before it). ``device`` is accepted as SB3's and unused: the
        parameters go to the agent's device."""
        if isinstance(load_path_or_dict, (str, os.PathLike)):
            given = read_checkpoint(os.fspath(load_path_or_dict))["states"]
        elif isinstance(load_path_or_dict, dict):
            given = load_path_or_dict
        else:
            raise TypeError(f"{self.algo}.set_parameters: expected a dict from get_parameters or a path to a saved "
                            f"agent, got {type(load_path_or_dict).__name__}")
        objects = self._state_objects()
        unknown = sorted(set(given) - set(objects))
        missing = sorted(set(objects) - set(given)) if exact_match else []
        if unknown or missing:
            raise ValueError(f"{self.algo}.set_parameters: the names do not match the agent's {sorted(objects)}"
                             + (f"; unknown: {unknown}" if unknown else "") + (f"; missing: {missing}" if missing else ""))
        before = {name: objects[name].state_dict() for name in given}
        try:
            for name, state in given.items():
                self._load_state(objects[name], state, exact_match)
        except BaseException:
            for name, state in before.items():
                objects[name].load_state_dict(state)
            raise

    @staticmethod
    def _load_state(obj, state: dict, strict: bool) -> None:
        """A network's state (strict or not) or an optimizer's (always whole)."""
        if isinstance(obj, rc.nn.Module):
            obj.load_state_dict(state, strict=strict)
        else:
            obj.load_state_dict(state)

    # ---- saving -----------------------------------------------------------------------------------

    def save_replay_buffer(self, path: str) -> None:
        """Writes the replay buffer to the folder ``path`` (ReplayBuffer.save: chunked, swapped in
        whole; ``path`` must be absent or an earlier buffer save, anything else is refused)."""
        self.buffer.save(path)

    def load_replay_buffer(self, path: str) -> None:
        """Replaces the replay buffer with the one saved at ``path``, which must have the same
        layout; the captured updates are traced anew to read it."""
        loaded = type(self.buffer).load(path, device=self.device)
        mine, theirs = self.buffer._settings(), loaded._settings()
        mine.pop("state"), theirs.pop("state")
        if mine != theirs:
            raise ValueError(f"{self.algo}.load_replay_buffer: {path!r} holds a buffer laid out as {theirs}, "
                             f"this agent's is {mine}")
        if isinstance(loaded, HerReplayBuffer):  # the one thing a save cannot hold
            loaded.compute_reward = self.buffer.compute_reward
        self.buffer = loaded
        for captured in self._captured_programs():
            captured.reset()

    def _captured_programs(self) -> list:
        """Every captured program the agent holds (attributes, or values of dict attributes)."""
        found = []
        for value in vars(self).values():
            for item in value.values() if isinstance(value, dict) else (value,):
                if isinstance(item, rc.capturing.CapturedStep):
                    item = item.captured
                if isinstance(item, rc.capturing.CapturedFunction):
                    found.append(item)
        return found

    def save(self, path: str) -> None:
        """Networks and optimizers (safetensors) with the config and the algorithm (JSON)."""
        meta = {"algo": self.algo, "config": asdict(self.config), "env": self.lanes.env_id,
                "num_timesteps": self.num_timesteps}
        save_checkpoint(path, self._state_objects(), metadata=meta)

    @classmethod
    def load(cls, path: str, env=None, device: str | None = None, *, allow_env_import: bool = False):
        """An agent that acts exactly as the saved one, on ``env`` (default: the environment id
        saved in the file). A saved id with a module prefix (``"package.module:Env-v0"``) would
        make Gymnasium import that module, running code that the file names (its checksum is no
        signature): such an id is refused with a ValueError unless ``allow_env_import`` is True,
        or ``env`` is passed (the saved id is then not used)."""
        meta = read_checkpoint(path)["metadata"]
        if meta.get("algo") != cls.algo:
            raise ValueError(f"{cls.algo}.load: {path!r} holds a {meta.get('algo')!r} agent, not {cls.algo}")
        if env is None:
            env = meta.get("env")
            if not isinstance(env, str) or not env:
                raise ValueError(f"{cls.algo}.load: {path!r} names no environment id; pass env=")
            module = env_module(env)
            if module is not None and not allow_env_import:
                raise ValueError(f"{cls.algo}.load: {path!r} names the environment {env!r}, which would import the "
                                 f"module {module!r}; pass env= (that id or another), or allow_env_import=True to "
                                 "run that module's code")
        tuples = {f.name for f in fields(cls.config_class) if isinstance(f.default, tuple)}
        config = cls.config_class(**{k: tuple(v) if k in tuples and isinstance(v, list) else v
                                     for k, v in meta["config"].items()})  # JSON made the tuples lists
        agent = cls(env, config, device=device)
        load_checkpoint(path, agent._state_objects())
        agent.num_timesteps = meta["num_timesteps"]
        return agent
