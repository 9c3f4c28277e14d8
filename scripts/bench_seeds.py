"""Learning on every seed: the final evaluation of full-length runs, seed by seed, with the
defaults a user gets (``Agent(env_id, seed=k)``): DQN on CartPole-v1 for 50k steps, SAC and TD3
on Pendulum-v1 for 20k (issue 27: "learning that holds on every seed").

    python scripts/bench_seeds.py [--algos dqn,sac,td3] [--seeds 0,1,2,3,4] [--zoo] [--device cpu]
                                  [--hyperparams KEY=VALUE ...] [--quick]

Each run trains its whole budget (no early stop), then evaluates its final weights with
deterministic actions: DQN on 20 episodes seeded from 1000 + seed, which is what the main job
(scripts/train_dqn.py, scripts/main.sh) prints for that seed; SAC and TD3 on 10 episodes seeded
from 100, as the learning gates in tests/test_agents.py. ``--zoo`` adds a row with RL Zoo's
settings (the config class's defaults) wherever the defaults for the environment differ from
them (DQN on CartPole-v1: ``DQN.env_defaults``). ``--hyperparams`` changes the defaults of every
run (the fields of each algorithm's config, as ``rlkit train --hyperparams``), to try another
setting on the same seeds. ``--quick`` is a smoke run: short budgets, 2 evaluation episodes,
seed 0 unless ``--seeds`` says otherwise, and no gate. Otherwise the exit status is 1 when a
run of the defaults (not of RL Zoo's settings, there to compare with) ends below its gate.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

from rlkit.agents import DQN, SAC, TD3, evaluate
from rlkit.agents.config import config_changes
from rlkit.cli import UsageError, parse_hyperparams


@dataclasses.dataclass(frozen=True)
class Case:
    """One algorithm's study: where it trains, for how long, how it is evaluated, what it must reach."""

    agent: type
    env: str
    steps: int
    gate: float
    episodes: int
    eval_seed: int | None  # the first evaluation episode's seed; None: 1000 + the training seed
    quick_steps: int

    def first_episode_seed(self, seed: int) -> int:
        return 1000 + seed if self.eval_seed is None else self.eval_seed


CASES = {
    # the main job's evaluation (20 episodes from 1000 + seed), so a row's seed k is what
    # `bash scripts/main.sh --seed k` prints; 1500 quick steps reach two rounds of updates
    "dqn": Case(DQN, "CartPole-v1", 50_000, 475.0, 20, None, 1500),
    "sac": Case(SAC, "Pendulum-v1", 20_000, -200.0, 10, 100, 300),
    "td3": Case(TD3, "Pendulum-v1", 20_000, -200.0, 10, 100, 300),
}
QUICK_EPISODES = 2


def settings_text(config, reference) -> str:
    """How ``config`` differs from ``reference`` (RL Zoo's settings, the config class's
    defaults): "RL Zoo's", or "RL Zoo's but name=value, ..."."""
    changed = config_changes(config, reference)
    return "RL Zoo's" + (f" but {', '.join(changed)}" if changed else "")


def settings_cell(label: str, text: str) -> str:
    """The table's settings column: the row's label, and how its settings differ from RL Zoo's."""
    return label if text == label else f"{label} ({text})"


def configs_to_run(case: Case, zoo: bool, pairs: list[str]) -> list[tuple[str, object]]:
    """(label, config) of each row of ``case``: the defaults for its environment with the
    ``--hyperparams`` changes, then, with ``zoo``, RL Zoo's settings where those differ."""
    overrides = parse_hyperparams(case.agent.config_class, pairs)
    defaults = dataclasses.replace(case.agent.default_config(case.env), **overrides)
    rows = [("defaults" if not overrides else "defaults, --hyperparams", defaults)]
    zoo_config = case.agent.config_class()
    if zoo and defaults != zoo_config:
        rows.append(("RL Zoo's", zoo_config))
    return rows


def run_one(case: Case, config, seed: int, device: str, steps: int, episodes: int) -> tuple[float, float]:
    """(final evaluation return, seconds of training) of one run of ``steps`` steps."""
    agent = case.agent(case.env, config, seed=seed, device=device)
    start = time.perf_counter()
    agent.learn(steps)
    seconds = time.perf_counter() - start
    mean, _ = evaluate(agent, case.env, episodes, seed=case.first_episode_seed(seed))
    return mean, seconds


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", default="dqn,sac,td3", help=f"some of {', '.join(CASES)}")
    parser.add_argument("--seeds", help="comma-separated training seeds (default: 0,1,2,3,4; --quick: 0)")
    parser.add_argument("--zoo", action="store_true",
                        help="also run RL Zoo's settings where the defaults differ from them")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--hyperparams", nargs="+", default=[], metavar="KEY=VALUE",
                        help="changes to every run's defaults, e.g. learning_starts=1000")
    parser.add_argument("--quick", action="store_true", help="a smoke run: short budgets, 2 episodes, no gate")
    args = parser.parse_args(argv)
    args.algos = [name.strip().lower() for name in args.algos.split(",")]
    unknown = [name for name in args.algos if name not in CASES]
    if unknown:
        parser.error(f"unknown algorithm(s) {unknown}; expected some of {list(CASES)}")
    try:
        args.seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1,2,3,4")).split(",")]
    except ValueError:
        parser.error(f"--seeds takes comma-separated ints, got {args.seeds!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = []  # (case, label, config, [(seed, return, seconds)])
    for name in args.algos:
        case = CASES[name]
        steps = case.quick_steps if args.quick else case.steps
        episodes = QUICK_EPISODES if args.quick else case.episodes
        try:
            configs = configs_to_run(case, args.zoo, args.hyperparams)
        except UsageError as error:
            print(f"bench_seeds: {name}: {error}", file=sys.stderr)
            return 2
        for label, config in configs:
            results = []
            for seed in args.seeds:
                mean, seconds = run_one(case, config, seed, args.device, steps, episodes)
                results.append((seed, mean, seconds))
                print(f"{name} {case.env} {label} seed {seed}: {mean:.1f} after {steps} steps ({seconds:.0f} s)",
                      flush=True)
            rows.append((case, steps, label, config, results))

    gate_note = "no gate (--quick)" if args.quick else "gate"
    print(f"\n| algorithm, env, steps | settings | {gate_note} | "
          + " | ".join(f"seed {seed}" for seed in args.seeds) + " | lowest | s per run |")
    print("|---|---|---|" + "---|" * len(args.seeds) + "---|---|")
    below = []
    for case, steps, label, config, results in rows:
        lowest = min(mean for _, mean, _ in results)
        if lowest < case.gate and label != "RL Zoo's":  # RL Zoo's rows are there to compare with
            below.append(f"{case.agent.algo} {label}")
        cells = [f"{case.agent.algo}, {case.env}, {steps / 1000:g}k",
                 settings_cell(label, settings_text(config, case.agent.config_class())),
                 "-" if args.quick else f">= {case.gate:g}",
                 *(f"{mean:.1f}" for _, mean, _ in results), f"{lowest:.1f}",
                 f"{statistics.median(s for _, _, s in results):.1f}"]
        print("| " + " | ".join(cells) + " |")
    print(f"\nfinal weights, deterministic actions; DQN: {CASES['dqn'].episodes} episodes from seed 1000 + seed, "
          f"SAC and TD3: {CASES['sac'].episodes} episodes from seed {CASES['sac'].eval_seed}"
          + (f"; {QUICK_EPISODES} episodes (--quick)" if args.quick else ""))
    if args.quick or not below:
        return 0
    print(f"below the gate on some seed: {', '.join(below)}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
