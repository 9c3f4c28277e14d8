"""DQN on an Atari game with RL Zoo's settings, in as many runs as it takes: each run resumes
the last one's checkpoint (networks, optimizer, replay buffer) from --run-dir and stops within
--time-limit seconds, saving again. The Pong learning gate of issue 25: a mean evaluation return
of at least 18 within 3M environment steps.

    python scripts/train_atari.py --env PongNoFrameskip-v4 --device gpu --time-limit 540   # again until done
    python scripts/train_atari.py --run-dir runs/atari --final-only --sb3-steps 10000      # the gate, SB3 beside

Settings: RL Zoo's Atari DQN (rlkit.envs.ATARI_DQN_DEFAULTS: Adam 1e-4, batch 32, a 100k buffer,
learning from 100k steps, the target copied every 1000 steps, epsilon falling to 0.01 over the
first 10% of --total-timesteps) with its ratio of one gradient step per 4 environment steps
(--n-envs environments stepped in their own processes, n_envs / 4 gradient steps per vector
step, run while the environments step). --hyperparams changes any field (KEY=VALUE, as
`rlkit train`). Every --eval-freq steps the greedy policy plays --eval-episodes whole games
(unclipped rewards); --stop-at ends training once such an evaluation reaches it. The final
evaluation (--final-episodes games of the final weights, other seeds) is what the gate reads.
progress.json in --run-dir keeps every run's steps and wall time, the evaluations and the
result; TensorBoard logs go to <run-dir>/tb (`rlkit plot <run-dir>/tb --tag eval/mean_reward`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np

from rlkit.agents import DQN, BaseCallback, CallbackList, EvalCallback, evaluate
from rlkit.cli import parse_hyperparams
from rlkit.envs import make_atari

MODEL, REPLAY, PROGRESS = "model.safetensors", "replay", "progress.json"


class StopAfterSeconds(BaseCallback):
    """Stops training once ``seconds`` of wall time have passed since training started."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def _on_training_start(self) -> None:
        self.deadline = time.perf_counter() + self.seconds

    def _on_step(self) -> bool:
        return time.perf_counter() < self.deadline


class StopAtReturn(BaseCallback):
    """Called after each evaluation: stops training once the evaluation's mean reaches ``target``."""

    def __init__(self, target: float):
        super().__init__()
        self.target = target

    def _on_step(self) -> bool:
        return self.parent.last_mean_reward < self.target


def read_progress(run_dir: str) -> dict:
    path = os.path.join(run_dir, PROGRESS)
    if not os.path.exists(path):
        return {"runs": [], "evaluations": []}
    with open(path) as file:
        return json.load(file)


def write_progress(run_dir: str, progress: dict) -> None:
    """progress.json, replaced whole (written beside it, then renamed over it)."""
    path = os.path.join(run_dir, PROGRESS)
    with open(path + ".tmp", "w") as file:
        json.dump(progress, file, indent=1)
    os.replace(path + ".tmp", path)


def make_agent(args, env) -> DQN:
    """The run folder's agent, with its replay buffer, or a new one."""
    model = os.path.join(args.run_dir, MODEL)
    if os.path.exists(model):
        agent = DQN.load(model, env=env, device=args.device)
        replay = os.path.join(args.run_dir, REPLAY)
        if os.path.exists(replay):
            agent.load_replay_buffer(replay)
        print(f"resumed at {agent.num_timesteps} steps ({len(agent.buffer)} transitions in the buffer)")
    else:
        config = DQN.default_config(args.env)
        config = dataclasses.replace(config, n_envs=args.n_envs, train_freq=1, gradient_steps=max(args.n_envs // 4, 1))
        config = dataclasses.replace(config, **parse_hyperparams(type(config), args.hyperparams))
        agent = DQN(env, config, seed=args.seed, device=args.device)
    agent.logdir = os.path.join(args.run_dir, "tb")
    return agent


def train(args, progress: dict) -> DQN:
    env = make_atari(args.env, n_envs=args.n_envs, vectorization_mode="async")
    eval_env = make_atari(args.env, n_envs=args.n_envs, training=False, vectorization_mode="async")
    try:
        agent = make_agent(args, env)
        remaining = args.total_timesteps - agent.num_timesteps
        if remaining <= 0 or progress.get("stopped_at_return"):
            return agent
        evaluation = EvalCallback(eval_env, n_eval_episodes=args.eval_episodes,
                                  eval_freq=max(args.eval_freq // args.n_envs, 1), seed=args.seed + 1000,
                                  callback_after_eval=StopAtReturn(args.stop_at) if args.stop_at is not None else None)
        began, start_steps = time.perf_counter(), agent.num_timesteps
        agent.learn(remaining, callback=CallbackList([evaluation, StopAfterSeconds(args.time_limit)]),
                    reset_num_timesteps=False, tb_log_name="DQN")
        wall = time.perf_counter() - began
        steps = agent.num_timesteps - start_steps
        progress["runs"].append({"from": start_steps, "to": agent.num_timesteps, "wall_s": round(wall, 1),
                                 "steps_per_s": round(steps / wall, 1)})
        progress["evaluations"] += [[int(t), float(m), float(s)] for t, m, s in evaluation.evaluations]
        progress["config"] = dataclasses.asdict(agent.config)
        if args.stop_at is not None and evaluation.evaluations and evaluation.last_mean_reward >= args.stop_at:
            progress["stopped_at_return"] = agent.num_timesteps
        print(f"trained {steps} steps in {wall:.0f} s ({steps / wall:.0f} steps/s), now at {agent.num_timesteps}; "
              f"evaluations: {[(t, round(m, 1)) for t, m, _ in evaluation.evaluations]}")
        saving = time.perf_counter()
        agent.save(os.path.join(args.run_dir, MODEL))
        agent.save_replay_buffer(os.path.join(args.run_dir, REPLAY))
        print(f"saved the agent and its buffer in {time.perf_counter() - saving:.0f} s")
        return agent
    finally:
        env.close()
        eval_env.close()


def final_evaluation(args, agent: DQN, progress: dict) -> None:
    eval_env = make_atari(args.env, n_envs=args.n_envs, training=False, vectorization_mode="async")
    try:
        returns, lengths = evaluate(agent, eval_env, n_eval_episodes=args.final_episodes, deterministic=True,
                                    return_episode_rewards=True, seed=args.seed + 5000)
    finally:
        eval_env.close()
    mean = float(np.mean(returns))
    progress["final"] = {"steps": agent.num_timesteps, "episodes": len(returns), "mean": mean,
                         "std": float(np.std(returns)), "returns": [float(r) for r in returns]}
    print(f"final evaluation at {agent.num_timesteps} steps: {mean:.2f} +- {np.std(returns):.2f} over "
          f"{len(returns)} games (gate: >= {args.gate} within {args.total_timesteps} steps: "
          f"{'passed' if mean >= args.gate and agent.num_timesteps <= args.total_timesteps else 'not passed'})")


def sb3_speed(args, progress: dict) -> None:
    """Environment steps/s of SB3's DQN CnnPolicy and of rlkit with the same settings over the
    same --sb3-steps (learning from a fifth of them), each in --n-envs processes."""
    from stable_baselines3 import DQN as SB3DQN
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import SubprocVecEnv, VecFrameStack

    steps = args.sb3_steps
    config = dataclasses.replace(DQN.default_config(args.env), n_envs=args.n_envs, train_freq=1,
                                 gradient_steps=max(args.n_envs // 4, 1), learning_starts=steps // 5,
                                 buffer_size=max(steps, 10_000))
    env = make_atari(args.env, n_envs=args.n_envs, vectorization_mode="async")
    try:
        ours = DQN(env, config, seed=0, device=args.device)
        began = time.perf_counter()
        ours.learn(steps)
        rlkit_rate = steps / (time.perf_counter() - began)
    finally:
        env.close()
    env = VecFrameStack(make_atari_env(args.env, n_envs=args.n_envs, seed=0, vec_env_cls=SubprocVecEnv,
                                       vec_env_kwargs=dict(start_method="fork")), 4)
    theirs = SB3DQN("CnnPolicy", env, learning_rate=config.learning_rate, batch_size=config.batch_size,
                    buffer_size=config.buffer_size, learning_starts=config.learning_starts,
                    train_freq=config.train_freq, gradient_steps=config.gradient_steps,
                    target_update_interval=config.target_update_interval,
                    exploration_fraction=config.exploration_fraction,
                    exploration_final_eps=config.exploration_final_eps, device=args.torch_device, seed=0)
    began = time.perf_counter()
    theirs.learn(steps)
    sb3_rate = steps / (time.perf_counter() - began)
    env.close()
    progress["speed"] = {"steps": steps, "rlkit_steps_per_s": round(rlkit_rate, 1),
                         "sb3_steps_per_s": round(sb3_rate, 1), "ratio": round(rlkit_rate / sb3_rate, 2)}
    print(f"{steps} steps, {args.n_envs} envs in subprocesses, one gradient step per 4 env steps: rlkit "
          f"{rlkit_rate:.0f} steps/s, SB3 DQN CnnPolicy ({args.torch_device}) {sb3_rate:.0f}: "
          f"{rlkit_rate / sb3_rate:.2f}x")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="PongNoFrameskip-v4")
    parser.add_argument("--run-dir", default="runs/atari")
    parser.add_argument("--device", default="gpu")
    parser.add_argument("--torch-device", default="cuda")
    parser.add_argument("--total-timesteps", type=int, default=3_000_000)
    parser.add_argument("--n-envs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=540.0, help="seconds of training in this run")
    parser.add_argument("--eval-freq", type=int, default=250_000, help="environment steps between evaluations")
    parser.add_argument("--eval-episodes", type=int, default=8)
    parser.add_argument("--stop-at", type=float, default=None, help="stop once an evaluation's mean reaches this")
    parser.add_argument("--final-episodes", type=int, default=16)
    parser.add_argument("--gate", type=float, default=18.0)
    parser.add_argument("--final-only", action="store_true", help="no training: the final evaluation")
    parser.add_argument("--final", action="store_true", help="the final evaluation after this run's training")
    parser.add_argument("--sb3-steps", type=int, default=0, help="also time SB3 and rlkit over this many steps")
    parser.add_argument("--hyperparams", nargs="+", default=[], metavar="KEY=VALUE")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(args.run_dir, exist_ok=True)
    progress = read_progress(args.run_dir)
    if args.final_only:
        env = make_atari(args.env, n_envs=args.n_envs, vectorization_mode="async")
        try:
            agent = make_agent(args, env)
        finally:
            env.close()
    else:
        agent = train(args, progress)
        write_progress(args.run_dir, progress)
    done = agent.num_timesteps >= args.total_timesteps or progress.get("stopped_at_return")
    if args.final or args.final_only or done:
        final_evaluation(args, agent, progress)
    if args.sb3_steps:
        sb3_speed(args, progress)
    write_progress(args.run_dir, progress)
    return 0


if __name__ == "__main__":
    sys.exit(main())
