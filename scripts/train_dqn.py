"""The main job: DQN learns CartPole-v1 on the CPU, then its evaluation return is printed with
where the TensorBoard logs are. Training evaluates every 5k steps and stops once the mean
evaluation return reaches 475 (the learning gate), or after --steps.

    python scripts/train_dqn.py [--steps 50000] [--seed 0] [--logdir runs] [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from rlkit.agents import DQN, EvalCallback, evaluate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--logdir", default="runs")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    agent = DQN("CartPole-v1", seed=args.seed, logdir=args.logdir, device=args.device)
    print(f"DQN on CartPole-v1 ({args.device}), {args.steps} steps, seed {args.seed}")
    start = time.perf_counter()

    gate = EvalCallback("CartPole-v1", eval_freq=5000, n_episodes=10, reward_threshold=475, seed=args.seed + 100,
                        verbose=0)

    def report(event):
        go_on = gate(event)
        if event.num_timesteps % 5000 == 0:
            returns = event.episodes.means()
            shown = f"{returns[0]:7.1f}" if returns else "    -  "
            print(f"step {event.num_timesteps:6d}  mean episode return (last 100) {shown}  "
                  f"evaluation {gate.evaluations[-1][1]:6.1f}  "
                  f"{event.num_timesteps / (time.perf_counter() - start):6.0f} steps/s")
        return go_on

    agent.learn(args.steps, callback=report)
    if agent.num_timesteps < args.steps:
        print(f"the evaluation return reached 475 after {agent.num_timesteps} steps: training stops there")
    mean, std = evaluate(agent, "CartPole-v1", 10, seed=args.seed + 100)
    print(f"evaluation return over 10 episodes: {mean:.1f} +- {std:.1f}")
    print(f"TensorBoard logs: {os.path.abspath(agent.log_path)}  "
          f"(tensorboard --logdir {args.logdir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
