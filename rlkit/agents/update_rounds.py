"""The rounds of gradient steps of the agents that act in their updates (SAC, TD3, DDPG): each
variant of the update captured once, with an acting twin that also computes the next actions,
and under ``overlap_updates`` the round's last step launched to run while the environment
steps, read when the next round (or a reader of the agent) needs it."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

import rlkit.core as rc
from rlkit.agents.acting import policy_input, policy_inputs


class LaunchedUpdate(NamedTuple):
    """A gradient step that ``overlap_updates`` launched and has not read yet."""

    pending: rc.capturing.PendingReplay  # its replay, running or done
    variant: object  # the variant of the update it runs
    scalars: dict  # the scalars of its round's earlier steps, logged with its own
    update: rc.capturing.CapturedFunction  # the captured update launched: busy until read


class UpdateRounds:
    """Gradient steps for an agent that ``acts_in_updates`` (a mixin of OffPolicyAgent, which
    supplies ``_update``, ``_act``, the buffer, the config and the acting functions). Such an agent
    calls ``_capture_updates`` in its ``_build`` and defines ``_next_variant`` and
    ``_update_scalars``; an agent that does not act in its updates supplies its own ``_train``."""

    def _train(self, gradient_steps: int, act_on=None) -> dict[str, float]:
        """Runs gradient steps; returns the scalars to log (SB3's train/ tags). Here, for an agent
        that ``acts_in_updates``: each step the replay of ``self._steps[self._next_variant()]``,
        the last one's acting twin where ``act_on`` is given (see ``acts_in_updates``). Other
        agents supply their own."""
        stored = self._stored_count()
        scalars = {}
        for step in range(gradient_steps):
            variant = self._next_variant()
            outputs = self._replay_update(variant, stored, act_on if step == gradient_steps - 1 else None)
            scalars.update(self._update_scalars(outputs, variant))
        return scalars

    def _next_variant(self):
        """For an agent that ``acts_in_updates``: counts one more gradient step and returns the
        variant of the captured update it takes (a key of ``self._steps``)."""
        raise NotImplementedError

    def _update_scalars(self, outputs: list[np.ndarray], variant) -> dict[str, float]:
        """For an agent that ``acts_in_updates``: the scalars to log of one gradient step, from its
        program's outputs (counting its skipped updates)."""
        raise NotImplementedError

    def _stored_count(self) -> np.ndarray:
        """The transitions the replay buffer holds, as the captured updates' ``stored`` input."""
        return np.array([[len(self.buffer)]], np.float32)

    acts_in_updates = False
    """Whether ``_train(gradient_steps, act_on=batch)`` also computes, in the program of its last
    gradient step, the policy's exploring actions for ``batch`` (the lanes' next observations)
    with the updated weights, and keeps them (``_replay_update``) for the ``_policy`` call that
    acts on that batch next: one replay per environment step instead of two, and on the GPU one
    wait for the device instead of two. The actions are those a separate call would compute
    (the same weights; SAC's noise is drawn on the device either way)."""

    def _capture_updates(self, variants: tuple, params: list, deterministic: bool) -> None:
        """For an agent that ``acts_in_updates``: ``self._steps[v]``, the captured ``_update(stored,
        v)`` of each variant v, and ``self._acting_steps[v]``, the same update followed by the
        policy's ``deterministic`` (or sampled) actions for observations given as inputs: the
        actions the agent's ``_explore`` asks ``_policy`` for."""
        self._explore_deterministic = deterministic

        def captured_update(v):
            return rc.capture(lambda stored: self._update(stored, v), params)

        self._steps = {v: captured_update(v) for v in variants}
        # the same updates again, for overlap_updates: one is launched while the other still runs
        self._twin_steps = {v: captured_update(v) for v in variants}
        self._acting_steps = {v: rc.capture(lambda stored, v=v, **obs: (
            *self._update(stored, v), self._act(policy_input(obs), deterministic)), params) for v in variants}

        # overlap_updates, one gradient step a round: the actions from the policy as it is, then
        # the update, in one program that hands the actions over as soon as it has them (the
        # update's first levels run beside the policy's); a twin of each, launched in turn
        def acting_then_update(v):
            return rc.capture(lambda stored, **obs: (self._act(policy_input(obs), deterministic),
                                                     *self._update(stored, v)), params, early_outputs=1)

        self._overlap_steps = {v: acting_then_update(v) for v in variants}
        self._overlap_twins = {v: acting_then_update(v) for v in variants}

    def _replay_update(self, variant, stored: np.ndarray, act_on) -> list:
        """One gradient step: the outputs of ``self._steps[variant]``, or where ``act_on`` (an
        observation batch) is given, of its acting twin, whose actions are kept for the
        ``_policy(act_on, ...)`` call that comes next."""
        if act_on is None:
            return list(self._steps[variant](stored=stored))
        *outputs, actions = self._acting_steps[variant](stored=stored, **policy_inputs(act_on))
        self._actions_ready = (act_on, self._explore_deterministic, actions.T)  # [n, actions]
        return outputs

    def _launch_round(self, act_on) -> None:
        """A round of gradient steps under ``overlap_updates`` (see ``_launch_acting_update`` for a
        round of one step, the defaults'): first the actions for ``act_on``
        from the policy as it is (queued after the round before, which may still run), kept for
        the ``_policy`` call that comes next; then the round, its last step launched: it runs on
        the device while the environment steps, and ``_finish_round`` reads it. The round is
        queued before the actions are read, and a round of one step before the round before is
        read, so that the device goes from that round to the actions and on to this round
        without waiting for the host (each program opens with a barrier, so the round's writes
        still come after the actions' reads and the round before's)."""
        if self.config.gradient_steps == 1:
            self._launch_acting_update(act_on)
            return
        deterministic = self._explore_deterministic
        acting = self._acting_function(deterministic).launch(**policy_inputs(act_on))  # the weights before this round
        try:
            scalars = {}
            if self.config.gradient_steps > 1:
                self._finish_round()  # the round before ran ahead of those actions
                scalars = self._train(self.config.gradient_steps - 1)  # the round's steps before its last
            before, self._pending_round = self._pending_round, None
            try:
                self._pending_round = self._launch_update(scalars, running=before)
            finally:
                self._finish(before)
        finally:
            actions = acting.result()  # read even where the round failed: the policy can run again
        self._actions_ready = (act_on, deterministic, actions.T)  # [n, actions]

    def _launch_acting_update(self, act_on) -> None:
        """A round of one gradient step under ``overlap_updates``: one program computes the actions
        for ``act_on`` from the policy as it is, then the update. It is queued behind the round
        before (which may still run), that round is read, then the actions, which the program
        hands over while its update runs on (``early_result``): the device goes from update to
        update without the host between them, and without a program of its own for the actions.
        The program's random streams are drawn in the order of ``_launch_round``'s two programs
        (the actions' first), so the actions and updates are theirs."""
        before, self._pending_round = self._pending_round, None
        try:
            self._pending_round = self._launch_update({}, running=before, act_on=act_on)
        finally:
            self._finish(before)
        (actions,) = self._pending_round.pending.early_result()
        self._actions_ready = (act_on, self._explore_deterministic, actions.T)  # [n, actions]

    def _launch_update(self, scalars: dict[str, float], running: LaunchedUpdate | None,
                       act_on=None) -> LaunchedUpdate:
        """Launches the next gradient step: the captured update of its variant (with ``act_on``,
        the form that first computes the actions for those observations, ``_overlap_steps``), or
        that update's twin where the ``running`` round (launched, not read) is that update, since
        a captured function runs one launch at a time."""
        variant = self._next_variant()
        steps, twins = (self._steps, self._twin_steps) if act_on is None else (self._overlap_steps, self._overlap_twins)
        update = steps[variant]
        if running is not None and running.update is update:
            update = twins[variant]
        observations = {} if act_on is None else policy_inputs(act_on)
        return LaunchedUpdate(update.launch(stored=self._stored_count(), **observations), variant, scalars, update)

    def _finish_round(self) -> None:
        """Waits for a launched round's last gradient step and logs the round's scalars."""
        pending, self._pending_round = self._pending_round, None
        self._finish(pending)

    def _finish(self, round_: LaunchedUpdate | None) -> None:
        """Waits for ``round_`` (None: nothing to wait for) and logs its scalars."""
        if round_ is None:
            return
        outputs = list(round_.pending.result())[round_.update.early_outputs:]  # the actions, if any, were read
        round_.scalars.update(self._update_scalars(outputs, round_.variant))
        self._train_scalars.update(round_.scalars)
