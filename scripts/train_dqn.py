"""The main job: DQN learns CartPole-v1 on the CPU for --steps steps, evaluating every 5k, then
prints the final evaluation of the full run (the final weights, 20 episodes) with where the
TensorBoard logs are. --early-stop stops training at the first evaluation of at least 475
instead (the output says so). The settings are the defaults a user gets for CartPole-v1
(DQN.default_config: RL Zoo's with the changes that make every seed learn, which it names).

    python scripts/train_dqn.py [--steps 50000] [--seed 0] [--logdir runs] [--device cpu] [--early-stop]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from rlkit.agents import DQN, DQNConfig, EvalCallback, evaluate
from rlkit.agents.config import config_changes

THRESHOLD = 475  # CartPole-v1's reward threshold


def settings_text(config: DQNConfig) -> str:
    """How ``config`` differs from RL Zoo's CartPole-v1 settings (DQNConfig's defaults)."""
    changed = config_changes(config)
    return "RL Zoo's CartPole-v1 settings" + (f" but {', '.join(changed)}" if changed else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--logdir", default="runs")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--early-stop", action="store_true",
                        help=f"stop at the first evaluation of at least {THRESHOLD}")
    args = parser.parse_args()

    agent = DQN("CartPole-v1", seed=args.seed, logdir=args.logdir, device=args.device)
    stop = f"early stop at an evaluation of {THRESHOLD}" if args.early_stop else "no early stop"
    print(f"DQN on CartPole-v1 ({args.device}), {args.steps} steps, seed {args.seed}, {stop}")
    print(f"settings: {settings_text(agent.config)}")
    start = time.perf_counter()

    gate = EvalCallback("CartPole-v1", eval_freq=5000, n_episodes=10, seed=args.seed + 100, verbose=0,
                        reward_threshold=THRESHOLD if args.early_stop else None)

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
        print(f"early stop: the evaluation return reached {THRESHOLD} after {agent.num_timesteps} steps")
    mean, std = evaluate(agent, "CartPole-v1", 20, seed=args.seed + 1000)
    print(f"final evaluation after {agent.num_timesteps} steps, 20 episodes: {mean:.1f} +- {std:.1f}")
    print(f"TensorBoard logs: {os.path.abspath(agent.log_path)}  "
          f"(tensorboard --logdir {args.logdir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
