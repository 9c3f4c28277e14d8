"""Agents end to end: environment steps per second and wall-clock time to the learning gates,
rlkit against Stable-Baselines3 with RL Zoo's tuned hyperparameters, on the same machine in the
same run, the same environments and budgets, and the evaluation return each reached.

    python scripts/bench_agents.py [--algos dqn,sac,td3,ddpg] [--seeds 0,1] [--device cpu|gpu]
                                   [--sb3-device cpu|cuda] [--no-sb3]
    python scripts/bench_agents.py --speed [--algos sac,td3,ddpg] [--speed-env HalfCheetah-v5]
                                   [--speed-steps 1000] [--device cpu|gpu] [--sb3-device cpu|cuda]
                                   [--concurrent N] [--threads N] [--overlap]
    python scripts/bench_agents.py --loop-cost [--algos dqn] [--loop-steps 20000] [--device cpu|gpu]

``--speed`` times training alone, as users meet it on MuJoCo: each library first fills its buffer
for ``learning_starts`` = 1000 steps (untimed), then trains ``--speed-steps`` more steps, one
gradient step each (timed), with RL Zoo's networks (SAC 256-256, TD3 and DDPG 400-300, batch 256
and 100); steps per second beside SB3's, each in a fresh process. ``--concurrent N`` (rlkit alone)
starts N such processes at once, as several runs sharing one machine or GPU, and reports their
steps per second together beside one run's, measured alone just before. ``--threads N`` gives
each run N CPU threads (rlkit's set_num_threads, torch's for SB3; default: each library's own).
``--overlap`` times rlkit a second time with ``overlap_updates=True`` (the environment steps while
the update runs on the device, the actions one round behind) beside its SB3-order run; with
``--concurrent N``, the runs (one alone, then N at once) train with ``overlap_updates``.

``--loop-cost`` (rlkit alone) measures what the training loop itself costs per environment step:
each algorithm trains ``--loop-steps`` steps after its ``learning_starts`` on its learning-row
environment (DQN: CartPole-v1) in a fresh process, with timers around the environment's ``step``
and the agent's rounds of gradient steps; the loop's own cost is the rest of the wall time
(acting, storing the transitions, episode statistics, the checks of what the environment returned).

Stable-Baselines3 is an optional bench dependency (pip install stable-baselines3, beside
torch==2.13.0); without it only rlkit's side runs. Each (algorithm, seed) trains once per
library, each run in a fresh process (so that neither library's threads linger in the other's
run); times are medians over the seeds, and the ratio is of the medians.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import rlkit.core as rc
from rlkit.agents import DDPG, DQN, SAC, TD3, evaluate

# RL Zoo's hyperparameters (hyperparams/{dqn,sac,td3,ddpg}.yml); rlkit's config classes' defaults are the
# same (DQN made on CartPole-v1 without a config changes three of them: run_rlkit passes the config).
ZOO = {
    "dqn": dict(env="CartPole-v1", steps=50_000, gate=475.0, rlkit=DQN,
                sb3=dict(learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000,
                         gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                         exploration_fraction=0.16, exploration_final_eps=0.04,
                         policy_kwargs=dict(net_arch=[256, 256]))),
    "sac": dict(env="Pendulum-v1", steps=20_000, gate=-200.0, rlkit=SAC, sb3=dict(learning_rate=1e-3)),
    "td3": dict(env="Pendulum-v1", steps=20_000, gate=-200.0, rlkit=TD3,
                sb3=dict(gamma=0.98, buffer_size=200_000, learning_starts=10_000, gradient_steps=1, train_freq=1,
                         learning_rate=1e-3, policy_kwargs=dict(net_arch=[400, 300]))),
    "ddpg": dict(env="Pendulum-v1", steps=20_000, gate=-200.0, rlkit=DDPG,
                 sb3=dict(gamma=0.98, buffer_size=200_000, learning_starts=10_000, gradient_steps=1, train_freq=1,
                          learning_rate=1e-3, policy_kwargs=dict(net_arch=[400, 300]))),
}
EVAL_EPISODES, EVAL_SEED = 10, 100


def run_rlkit(algo: str, seed: int, device: str) -> tuple[float, float]:
    """(seconds to train, evaluation return) of rlkit's agent with RL Zoo's settings, its config
    class's defaults, given explicitly: both libraries train with the same settings even where
    the agent's defaults for the environment differ (DQN.env_defaults, scripts/bench_seeds.py)."""
    case = ZOO[algo]
    agent = case["rlkit"](case["env"], case["rlkit"].config_class(), seed=seed, device=device)
    start = time.perf_counter()
    agent.learn(case["steps"])
    seconds = time.perf_counter() - start
    return seconds, evaluate(agent, case["env"], EVAL_EPISODES, seed=EVAL_SEED)[0]


def run_sb3(algo: str, seed: int, device: str) -> tuple[float, float]:
    """(seconds to train, evaluation return) of Stable-Baselines3 with RL Zoo's settings."""
    import stable_baselines3 as sb3
    from stable_baselines3.common.noise import NormalActionNoise

    case = ZOO[algo]
    kwargs = dict(case["sb3"])
    if algo in ("td3", "ddpg"):  # RL Zoo: noise_type normal, noise_std 0.1
        kwargs["action_noise"] = NormalActionNoise(np.zeros(1), 0.1 * np.ones(1))
    model = getattr(sb3, algo.upper())("MlpPolicy", case["env"], seed=seed, device=device, **kwargs)
    start = time.perf_counter()
    model.learn(case["steps"])
    seconds = time.perf_counter() - start
    # rlkit's evaluate takes SB3 models as they are (SB3's predict), so both meet the same episodes
    return seconds, evaluate(model, case["env"], EVAL_EPISODES, seed=EVAL_SEED)[0]


SPEED_STARTS = 1000  # untimed steps before training starts, in --speed
THREADS_VARIABLE = "RLKIT_BENCH_THREADS"  # --threads, as the child processes receive it


def limit_threads() -> None:
    """In a child process: the CPU threads --threads asked for, for both libraries."""
    threads = int(os.environ.get(THREADS_VARIABLE, "0"))
    if threads:
        rc.set_num_threads(threads)
        try:
            import torch
        except ImportError:
            return
        torch.set_num_threads(threads)


def run_speed(library: str, algo: str, env: str, steps: int, device: str) -> tuple[float, float]:
    """(seconds for ``steps`` training steps after SPEED_STARTS untimed ones, 0.0): the same
    settings as the learning rows (RL Zoo's), learning_starts aside; "rlkit-overlap" is rlkit
    with overlap_updates."""
    case = ZOO[algo]
    if library.startswith("rlkit"):
        config = dataclasses.replace(case["rlkit"].config_class(), learning_starts=SPEED_STARTS,
                                     overlap_updates=library == "rlkit-overlap")
        model = case["rlkit"](env, config, seed=0, device=device)
    else:
        import gymnasium as gym
        import stable_baselines3 as sb3
        from stable_baselines3.common.noise import NormalActionNoise

        kwargs = dict(case["sb3"], learning_starts=SPEED_STARTS)
        if algo in ("td3", "ddpg"):
            n_actions = gym.make(env).action_space.shape[0]
            kwargs["action_noise"] = NormalActionNoise(np.zeros(n_actions), 0.1 * np.ones(n_actions))
        model = getattr(sb3, algo.upper())("MlpPolicy", env, seed=0, device=device, **kwargs)
    model.learn(SPEED_STARTS)
    start = time.perf_counter()
    model.learn(steps, reset_num_timesteps=False)
    return time.perf_counter() - start, 0.0


def run_loop_cost(algo: str, steps: int, device: str) -> tuple[float, float, float]:
    """(wall seconds, seconds in the environment's step, seconds in rounds of gradient steps) of
    ``steps`` training steps after ``learning_starts`` untimed ones, with RL Zoo's settings."""
    import gymnasium as gym

    class TimedStep(gym.Wrapper):
        seconds = 0.0

        def step(self, action):
            start = time.perf_counter()
            result = self.env.step(action)
            TimedStep.seconds += time.perf_counter() - start
            return result

    case = ZOO[algo]
    config = case["rlkit"].config_class()
    agent = case["rlkit"](TimedStep(gym.make(case["env"])), config, seed=0, device=device)
    agent.learn(config.learning_starts)
    train, in_updates = agent._train, [0.0]

    def timed_train(*args, **kwargs):
        start = time.perf_counter()
        result = train(*args, **kwargs)
        in_updates[0] += time.perf_counter() - start
        return result

    agent._train = timed_train
    TimedStep.seconds = 0.0
    start = time.perf_counter()
    agent.learn(steps, reset_num_timesteps=False)
    return time.perf_counter() - start, TimedStep.seconds, in_updates[0]


def run_in_fresh_process(library: str, algo: str, seed: int, device: str, speed: tuple | None = None,
                         threads: int = 0) -> tuple[float, float]:
    """One training run in a new Python process: (seconds, evaluation return); with ``speed``,
    (env, steps): run_speed's (seconds, 0.0) instead; ``threads``: its CPU threads (0: the default)."""
    return run_in_fresh_processes(1, library, algo, seed, device, speed, threads)[0]


def run_in_fresh_processes(count: int, library: str, algo: str, seed: int, device: str, speed: tuple | None = None,
                           threads: int = 0) -> list[tuple[float, float]]:
    """``count`` such runs at once, each in its own new process (seeds seed, seed + 1, ...)."""
    running = []
    for k in range(count):
        command = [sys.executable, __file__, "--one", library, algo, str(seed + k), device]
        if speed:
            command += [speed[0], str(speed[1])]
        running.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env={**os.environ, THREADS_VARIABLE: str(threads)} if threads else None))
    results = []
    for k, process in enumerate(running):
        out, err = process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"{library} {algo} seed {seed + k} failed:\n{err[-3000:]}")
        seconds, mean = json.loads(out.strip().splitlines()[-1])
        results.append((seconds, mean))
    return results


def check_speed_env(parser: argparse.ArgumentParser, env_id: str, algos: list[str]) -> None:
    """A usage error where --speed-env is unknown or its action space is not the kind an algorithm
    of --algos acts in (DQN: Discrete; SAC, TD3, DDPG: Box), before any run starts."""
    import gymnasium as gym

    try:
        space = gym.make(env_id).action_space
    except gym.error.Error as error:
        parser.error(f"--speed-env {env_id}: {error}")
    wanted = {algo: gym.spaces.Discrete if algo == "dqn" else gym.spaces.Box for algo in algos}
    wrong = [algo for algo, kind in wanted.items() if not isinstance(space, kind)]
    if wrong:
        kinds = ", ".join(f"{algo} needs {wanted[algo].__name__} actions" for algo in wrong)
        parser.error(f"--speed-env {env_id} has {space}: {kinds} (time them on another --speed-env, "
                     f"e.g. CartPole-v1 for dqn, or leave them out of --algos)")


def main() -> int:
    if len(sys.argv) in (6, 8) and sys.argv[1] == "--one":  # a child process: one run, its result as JSON
        library, algo, seed, device = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
        limit_threads()
        if len(sys.argv) == 8:
            result = run_speed(library, algo, sys.argv[6], int(sys.argv[7]), device)
        else:
            result = run_rlkit(algo, seed, device) if library == "rlkit" else run_sb3(algo, seed, device)
        print(json.dumps(result))
        return 0
    if len(sys.argv) == 5 and sys.argv[1] == "--one-loop":  # a child process: run_loop_cost's result as JSON
        limit_threads()
        print(json.dumps(run_loop_cost(sys.argv[2], int(sys.argv[3]), sys.argv[4])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", default="dqn,sac,td3,ddpg")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--device", default="cpu", help="rlkit's device")
    parser.add_argument("--sb3-device", default="cpu", help="torch's device for Stable-Baselines3")
    parser.add_argument("--no-sb3", action="store_true", help="time rlkit only")
    parser.add_argument("--speed", action="store_true",
                        help="instead: steps/s of training alone on --speed-env (after 1000 untimed steps)")
    parser.add_argument("--speed-env", default="HalfCheetah-v5")
    parser.add_argument("--speed-steps", type=int, default=1000)
    parser.add_argument("--concurrent", type=int, default=1,
                        help="with --speed: also N rlkit runs at once, their steps/s together")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads of each run (default: the libraries' own)")
    parser.add_argument("--overlap", action="store_true",
                        help="--speed: rlkit with overlap_updates too, beside its SB3-order run")
    parser.add_argument("--loop-cost", action="store_true",
                        help="instead: the training loop's own cost per step, beside the environment's and the updates'")
    parser.add_argument("--loop-steps", type=int, default=20_000, help="timed steps of --loop-cost")
    args = parser.parse_args()
    if args.concurrent < 1:
        parser.error(f"--concurrent must be at least 1, got {args.concurrent}")
    if args.threads < 0:
        parser.error(f"--threads must be positive, got {args.threads}")
    if args.loop_steps < 1:
        parser.error(f"--loop-steps must be at least 1, got {args.loop_steps}")
    algos = [a.strip().lower() for a in args.algos.split(",")]
    unknown = [a for a in algos if a not in ZOO]
    if unknown:
        parser.error(f"unknown algorithm(s) {unknown}; expected some of {sorted(ZOO)}")
    if args.speed:
        check_speed_env(parser, args.speed_env, algos)
    seeds = [int(s) for s in args.seeds.split(",")]
    with_sb3 = not args.no_sb3
    if with_sb3:
        try:
            import stable_baselines3  # noqa: F401
        except ImportError:
            print("Stable-Baselines3 is not installed (pip install stable-baselines3): timing rlkit only")
            with_sb3 = False

    if args.loop_cost:
        return loop_cost_table(args, algos)
    if args.speed:
        return speed_table(args, algos, with_sb3) if args.concurrent == 1 else concurrent_table(args, algos)
    rows = []
    for algo in algos:
        case = ZOO[algo]
        ours, theirs = [], []
        for seed in seeds:
            ours.append(run_in_fresh_process("rlkit", algo, seed, args.device))
            print(f"{algo} seed {seed} rlkit: {ours[-1][0]:.1f} s, return {ours[-1][1]:.1f}", flush=True)
            if with_sb3:
                theirs.append(run_in_fresh_process("sb3", algo, seed, args.sb3_device))
                print(f"{algo} seed {seed} SB3:   {theirs[-1][0]:.1f} s, return {theirs[-1][1]:.1f}", flush=True)
        rows.append((algo, case, ours, theirs))

    print(f"\n| algorithm, env, steps | gate | rlkit ({args.device}) s | rlkit steps/s | rlkit returns "
          f"| SB3 ({args.sb3_device}) s | SB3 steps/s | SB3 returns | steps/s ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for algo, case, ours, theirs in rows:
        ours_s = statistics.median(s for s, _ in ours)
        cells = [f"{algo.upper()}, {case['env']}, {case['steps'] // 1000}k", f">= {case['gate']:g}",
                 f"{ours_s:.1f}", f"{case['steps'] / ours_s:.0f}", ", ".join(f"{r:.0f}" for _, r in ours)]
        if theirs:
            theirs_s = statistics.median(s for s, _ in theirs)
            cells += [f"{theirs_s:.1f}", f"{case['steps'] / theirs_s:.0f}", ", ".join(f"{r:.0f}" for _, r in theirs),
                      f"{theirs_s / ours_s:.1f}x"]
        else:
            cells += ["-", "-", "-", "-"]
        print("| " + " | ".join(cells) + " |")
    return 0


def speed_table(args, algos: list[str], with_sb3: bool) -> int:
    """--speed: training steps per second of each library, one fresh process each."""
    speed = (args.speed_env, args.speed_steps)
    overlap_head = " rlkit, overlap_updates steps/s | overlap / SB3 order |" if args.overlap else ""
    print(f"\n| algorithm, env: {args.speed_steps} training steps after {SPEED_STARTS} | rlkit ({args.device}) "
          f"steps/s |{overlap_head} SB3 ({args.sb3_device}) steps/s | ratio |")
    print("|---|---|---|---|" + ("---|---|" if args.overlap else ""))
    for algo in algos:
        ours = args.speed_steps / run_in_fresh_process("rlkit", algo, 0, args.device, speed, args.threads)[0]
        cells = [f"{algo.upper()}, {args.speed_env}", f"{ours:.0f}"]
        if args.overlap:
            overlapped = args.speed_steps / run_in_fresh_process("rlkit-overlap", algo, 0, args.device, speed,
                                                                 args.threads)[0]
            cells += [f"{overlapped:.0f}", f"{overlapped / ours:.2f}x"]
        if with_sb3:
            theirs = args.speed_steps / run_in_fresh_process("sb3", algo, 0, args.sb3_device, speed, args.threads)[0]
            cells += [f"{theirs:.0f}", f"{ours / theirs:.2f}x"]
        else:
            cells += ["-", "-"]
        print("| " + " | ".join(cells) + " |", flush=True)
    return 0


def concurrent_table(args, algos: list[str]) -> int:
    """--speed --concurrent N: rlkit's steps per second of one run alone, then of N runs at once
    (each process's steps over its own time, summed); with --overlap, runs with overlap_updates."""
    speed = (args.speed_env, args.speed_steps)
    library = "rlkit-overlap" if args.overlap else "rlkit"
    runs = "overlap_updates runs" if args.overlap else "runs"
    print(f"\n| algorithm, env: {args.speed_steps} training steps after {SPEED_STARTS} | one run ({args.device}) "
          f"steps/s | {args.concurrent} {runs} at once: each | together | together / one |")
    print("|---|---|---|---|---|")
    for algo in algos:
        alone = args.speed_steps / run_in_fresh_process(library, algo, 0, args.device, speed, args.threads)[0]
        each = [args.speed_steps / seconds for seconds, _ in
                run_in_fresh_processes(args.concurrent, library, algo, 0, args.device, speed, args.threads)]
        print(f"| {algo.upper()}, {args.speed_env} | {alone:.0f} | {', '.join(f'{v:.0f}' for v in each)} "
              f"| {sum(each):.0f} | {sum(each) / alone:.2f}x |", flush=True)
    return 0


def loop_cost_table(args, algos: list[str]) -> int:
    """--loop-cost: per environment step, the wall time, the environment's step, the gradient
    steps and what is left (the loop's own cost), each algorithm in a fresh process."""
    print(f"\n| algorithm, env: {args.loop_steps} steps after learning_starts ({args.device}) | us per step "
          f"| env.step | gradient steps | the loop's own |")
    print("|---|---|---|---|---|")
    for algo in algos:
        command = [sys.executable, __file__, "--one-loop", algo, str(args.loop_steps), args.device]
        done = subprocess.run(command, capture_output=True, text=True,
                              env={**os.environ, THREADS_VARIABLE: str(args.threads)} if args.threads else None)
        if done.returncode != 0:
            raise RuntimeError(f"rlkit {algo} --loop-cost failed:\n{done.stderr[-3000:]}")
        wall, env, updates = (seconds * 1e6 / args.loop_steps for seconds in json.loads(done.stdout.splitlines()[-1]))
        print(f"| {algo.upper()}, {ZOO[algo]['env']} | {wall:.1f} | {env:.1f} | {updates:.1f} "
              f"| {wall - env - updates:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
