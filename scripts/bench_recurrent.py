"""Recurrent agents against their feed-forward counterparts on the partially observed tasks.

    python scripts/bench_recurrent.py speed [--device cpu|gpu] [--steps 3000] [--repeats 3]
    python scripts/bench_recurrent.py curves [--device cpu] [--steps 100000] [--eval-every 5000]
                                             [--logdir runs/recurrent] [--plot curves.png]

``speed``: environment steps per second of whole ``learn`` calls (acting, storing, the captured
updates at each agent's own training frequency) after the buffer holds its first windows, the
median of ``--repeats`` runs, for RecurrentDQN against DQN on rlkit/CartPoleNoVel-v1 and
RecurrentSAC against SAC on rlkit/PendulumNoVel-v1, each pair measured in the same run; and
the microseconds of one captured update and of one acting step (the median of many calls).

``curves``: trains RecurrentDQN and DQN (RL Zoo's CartPole settings) on
rlkit/CartPoleNoVel-v1 for ``--steps`` steps each with the same seed, evaluating every
``--eval-every`` steps (eval/mean_reward in each run's TensorBoard folder under ``--logdir``),
prints both learning curves and draws them with ``rlkit plot``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import rlkit.core as rc
from rlkit.agents import DQN, SAC, EvalCallback, RecurrentDQN, RecurrentSAC

CARTPOLE, PENDULUM = "rlkit/CartPoleNoVel-v1", "rlkit/PendulumNoVel-v1"
PAIRS = {"CartPoleNoVel": (CARTPOLE, RecurrentDQN, DQN), "PendulumNoVel": (PENDULUM, RecurrentSAC, SAC)}


# ---- speed ------------------------------------------------------------------------------------------

def steps_per_second(agent_class, env_id: str, device: str, steps: int, seed: int) -> float:
    """Steps per second of ``learn(steps)`` after a first call that fills the buffer past
    learning_starts (so every timed step may train) and traces the captured programs."""
    agent = agent_class(env_id, device=device, seed=seed)
    agent.learn(agent.config.learning_starts + 2 * agent.config.train_freq + 64)
    start = time.perf_counter()
    agent.learn(steps)
    return steps / (time.perf_counter() - start)


def median_micros(call, calls: int = 200, warmup: int = 10) -> float:
    """The median wall-clock microseconds of ``call()``."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def update_and_step_micros(agent_class, env_id: str, device: str) -> tuple[float, float]:
    """(one captured update, one acting step) in microseconds."""
    agent = agent_class(env_id, device=device, seed=0)
    agent.learn(agent.config.learning_starts + 64)  # a buffer that holds whole windows
    obs = np.zeros((1, agent.n_obs), np.float32)
    with agent.on_device():
        return (median_micros(lambda: agent._train(1), calls=50),
                median_micros(lambda: agent._policy(obs, deterministic=False)))


def run_speed(args) -> None:
    print(f"device: {args.device}; steps/s: median of {args.repeats} learn({args.steps}) runs; "
          f"update and acting step: median microseconds")
    print("| task | agent | steps/s | update (us) | acting step (us) | steps/s vs feed-forward |")
    print("|---|---|---:|---:|---:|---:|")
    for task, (env_id, recurrent, feed_forward) in PAIRS.items():
        rates = {}
        for agent_class in (recurrent, feed_forward):  # the pair measured in the same run
            rates[agent_class] = statistics.median(
                steps_per_second(agent_class, env_id, args.device, args.steps, seed) for seed in range(args.repeats))
        for agent_class in (recurrent, feed_forward):
            update, step = update_and_step_micros(agent_class, env_id, args.device)
            ratio = rates[agent_class] / rates[feed_forward]
            print(f"| {task} | {agent_class.algo} | {rates[agent_class]:.0f} | {update:.0f} | {step:.0f} | "
                  f"{ratio:.2f} |", flush=True)


# ---- learning curves --------------------------------------------------------------------------------

def learning_curve(agent_class, args) -> list[tuple[int, float, float]]:
    """(step, mean, std) of the evaluations of one training run on velocity-hidden CartPole."""
    agent = agent_class(CARTPOLE, device=args.device, seed=args.seed, logdir=args.logdir)
    evaluations = EvalCallback(CARTPOLE, eval_freq=args.eval_every, n_episodes=10, seed=1000, verbose=0)
    start = time.perf_counter()
    agent.learn(args.steps, callback=evaluations)
    print(f"{agent_class.algo}: {args.steps} steps in {time.perf_counter() - start:.0f} s, "
          f"TensorBoard run {agent.log_path}", flush=True)
    return evaluations.evaluations


def run_curves(args) -> None:
    curves = {agent_class.algo: learning_curve(agent_class, args) for agent_class in (RecurrentDQN, DQN)}
    print(f"\nmean evaluation return (10 episodes) on {CARTPOLE}, seed {args.seed}")
    print("| steps | " + " | ".join(curves) + " |")
    print("|---:|" + "---:|" * len(curves))
    for row in zip(*curves.values()):
        print(f"| {row[0][0]} | " + " | ".join(f"{mean:.1f} ± {std:.1f}" for _, mean, std in row) + " |")
    subprocess.run([sys.executable, "-m", "rlkit", "plot", args.logdir, "--tag", "eval/mean_reward",
                    "-o", args.plot], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("speed", "curves"))
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--steps", type=int, default=None, help="speed: 3000; curves: 100000")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--eval-every", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--logdir", default=os.path.join("runs", "recurrent"))
    parser.add_argument("--plot", default="recurrent_vs_feedforward.png")
    args = parser.parse_args()
    args.steps = args.steps or (3000 if args.what == "speed" else 100_000)
    if args.steps < 1 or args.repeats < 1 or args.eval_every < 1:
        parser.error("--steps, --repeats and --eval-every must be at least 1")
    if args.device not in {row["device"] for row in rc.devices()}:
        parser.error("no GPU here: the Vulkan backend is unavailable")
    run_speed(args) if args.what == "speed" else run_curves(args)


if __name__ == "__main__":
    main()
