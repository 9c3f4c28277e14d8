"""RL Zoo's MuJoCo table, reproduced: SAC and TD3 on HalfCheetah, Hopper, Walker2d and Ant (v5)
with RL Zoo's hyperparameters for 1M steps, the final evaluation returns beside those RL Zoo and
CleanRL publish, with each run's wall time and steps per second and its learning curve.

    python scripts/bench_zoo.py train [--runs zoo_runs] [--algos sac,td3]
                                      [--envs HalfCheetah-v5,Hopper-v5,Walker2d-v5,Ant-v5]
                                      [--seeds 0] [--steps 1000000] [--device gpu]
                                      [--parallel 4] [--minutes 9] [--overlap]
                                      [--env-kwargs KEY=VALUE ...]
    python scripts/bench_zoo.py table [--runs zoo_runs] [--plots docs/zoo]

``train`` runs every (algorithm, environment, seed) of the lists that has not finished, up to
``--parallel`` at once, each in its own process, until it reaches ``--steps`` or ``--minutes``
have passed. A run stopped by the clock saves its agent and replay buffer, together, in a
checkpoint folder of its folder (``<runs>/<algo>_<env>_s<seed>``) that ``progress.json`` names
once both are written, and the next ``train`` resumes it there (its episodes start
anew; the folder must survive between calls: on a lent GPU machine, calls that follow each other
while it is still held). A run that reaches its steps is evaluated (10 episodes, deterministic,
as RL Zoo's table) and writes ``result.json``: the returns, the training's wall time (the
saves, loads and evaluation not counted) and steps per second. ``table`` prints the markdown
table of the finished runs and, with ``--plots``, writes the ``rollout/ep_rew_mean`` curves of
each algorithm and task, a line per seed, as a PNG (``rlkit plot``).

``--overlap`` trains new runs with ``overlap_updates=True`` (acting on the weights of one update
before, the update in flight while the environment steps: about twice the steps per second of
SB3's order on the H200, so that one 1M-step run fits one device command). It changes SB3's
order of acting and updating, so ``result.json`` records it and the table names it in the
algorithm's cell; a resumed run keeps the setting it was started with.

``--env-kwargs`` (as ``rlkit train`` takes them: ``KEY=VALUE``, the value JSON where it parses)
makes the environments with ``gymnasium.make(env, **kwargs)``, for training and evaluation: e.g.
``include_cfrc_ext_in_observation=false contact_cost_weight=0`` gives Ant-v5 the task RL Zoo's
Ant-v3 was under mujoco-py 2, whose contact forces read zero. The runs' folders, ``result.json``,
the table's task cell and the plots' names carry the keywords.

The references (MuJoCo v3 for RL Zoo, v2 and v4 for CleanRL; rlkit trains on v5, the version
Gymnasium ships): RL Zoo's ``benchmark.md`` (one run each) and CleanRL's docs (training episodic
return over seeds; no Ant rows).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import gymnasium as gym

from rlkit.agents import SAC, TD3, evaluate
from rlkit.cli import UsageError, parse_env_kwargs

# RL Zoo's hyperparams/{sac,td3}.yml for the MuJoCo tasks (SB3's defaults elsewhere: buffer 1M,
# batch 256, tau 0.005, gamma 0.99, one gradient step per environment step).
HYPERPARAMETERS = {
    "sac": dict(learning_rate=3e-4, learning_starts=10_000, buffer_size=1_000_000, batch_size=256, gamma=0.99,
                tau=0.005, net_arch=(256, 256)),
    "td3": dict(learning_rate=1e-3, learning_starts=10_000, buffer_size=1_000_000, batch_size=256, gamma=0.99,
                tau=0.005, net_arch=(400, 300), action_noise_std=0.1),
}
AGENTS = {"sac": SAC, "td3": TD3}
TASKS = ("HalfCheetah", "Hopper", "Walker2d", "Ant")
RL_ZOO = {"sac": dict(HalfCheetah=9535, Hopper=2326, Walker2d=3863, Ant=4616),
          "td3": dict(HalfCheetah=9656, Hopper=3606, Walker2d=4718, Ant=5813)}
CLEANRL = {"sac": dict(HalfCheetah=9634.89, Hopper=2310.46, Walker2d=3591.45),
           "td3": dict(HalfCheetah=9583.22, Hopper=3134.61, Walker2d=4057.59)}
REFERENCE_STEPS = 1_000_000  # the references' training budget
EVAL_EPISODES, EVAL_SEED = 10, 1000
LOG_INTERVAL = 5000  # steps between TensorBoard points


def keywords_text(env_kwargs: dict, separator: str) -> str:
    """The environment keywords as ``key=value`` pairs (values as Python writes them), sorted."""
    return separator.join(f"{key}={value!r}" for key, value in sorted(env_kwargs.items()))


def env_variant(env_kwargs: dict) -> str:
    """The environment keywords as a name's part: "" without any, else "_key=value_key=value"."""
    return "_" + keywords_text(env_kwargs, "_") if env_kwargs else ""


def run_folder(runs: str, algo: str, env: str, seed: int, env_kwargs: dict | None = None) -> str:
    return os.path.join(runs, f"{algo}_{env}{env_variant(env_kwargs or {})}_s{seed}")


def make_env(env: str, env_kwargs: dict):
    """The environment id itself (the agent makes it) or, with keywords, the environment made with them."""
    return gym.make(env, **env_kwargs) if env_kwargs else env


def read_json(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def write_json(path: str, value: dict) -> None:
    """Writes ``value`` to ``path`` through a temporary file and a rename (a kill leaves either file)."""
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


# ---- one run (a child process) ---------------------------------------------------------------------

def train_one(folder: str, algo: str, env: str, seed: int, steps: int, device: str, deadline: float,
              overlap: bool = False, env_kwargs: dict | None = None) -> None:
    """Trains (or resumes) the run in ``folder`` until ``steps`` or the ``deadline`` (a time.time()),
    saving a checkpoint when stopped early and its result when done. ``overlap`` sets a new run's
    ``overlap_updates``; a resumed run keeps its own. ``env_kwargs`` go to ``gymnasium.make``."""
    env_kwargs = env_kwargs or {}
    os.makedirs(folder, exist_ok=True)
    progress_path = os.path.join(folder, "progress.json")
    progress = read_json(progress_path) or {"steps": 0, "train_seconds": 0.0, "segments": 0}
    cls = AGENTS[algo]
    if progress["steps"]:
        saved = os.path.join(folder, progress["checkpoint"])
        agent = cls.load(os.path.join(saved, "agent.safetensors"), env=make_env(env, env_kwargs), device=device)
        if agent.num_timesteps != progress["steps"]:
            raise RuntimeError(f"{saved}: the agent has {agent.num_timesteps} steps, progress.json {progress['steps']}")
        agent.logdir = os.path.join(folder, "tb")
        agent.load_replay_buffer(os.path.join(saved, "replay_buffer"))
    else:
        agent = cls(make_env(env, env_kwargs), seed=seed, device=device, logdir=os.path.join(folder, "tb"),
                    log_interval=LOG_INTERVAL, overlap_updates=overlap, **HYPERPARAMETERS[algo])
    start = time.perf_counter()
    agent.learn(steps - agent.num_timesteps, callback=lambda event: time.time() < deadline,
                reset_num_timesteps=progress["steps"] == 0, tb_log_name=algo.upper())
    progress["train_seconds"] += time.perf_counter() - start
    progress["steps"], progress["segments"] = agent.num_timesteps, progress["segments"] + 1
    if agent.num_timesteps < steps:  # stopped by the clock: keep everything for the next call
        save_checkpoint(folder, agent, progress)
        return
    mean, std = evaluate(agent, make_env(env, env_kwargs), n_eval_episodes=EVAL_EPISODES, deterministic=True,
                         seed=EVAL_SEED)
    write_json(os.path.join(folder, "result.json"), {
        "algo": algo, "env": env, "env_kwargs": env_kwargs, "seed": seed, "steps": agent.num_timesteps,
        "eval_mean": mean, "eval_std": std,
        "train_seconds": progress["train_seconds"], "segments": progress["segments"], "device": device,
        "steps_per_second": agent.num_timesteps / progress["train_seconds"], "hyperparameters": HYPERPARAMETERS[algo],
        "overlap_updates": agent.config.overlap_updates})
    remove_checkpoints(folder)  # a 1M-step buffer is hundreds of MB; the result is what stays
    agent.save(os.path.join(folder, "agent.safetensors"))
    write_json(progress_path, {key: value for key, value in progress.items() if key != "checkpoint"})


CHECKPOINT_PREFIX = "checkpoint_"


def save_checkpoint(folder: str, agent, progress: dict) -> None:
    """The agent and its replay buffer into a new folder of ``folder``, then progress.json naming
    it (written through a rename), then the older checkpoints removed: a kill at any moment
    leaves progress.json naming a whole checkpoint, an agent with its own buffer."""
    name = f"{CHECKPOINT_PREFIX}{progress['segments']}"
    path = os.path.join(folder, name)
    shutil.rmtree(path, ignore_errors=True)  # what a kill during this segment's save left
    agent.save(os.path.join(path, "agent.safetensors"))
    agent.save_replay_buffer(os.path.join(path, "replay_buffer"))
    write_json(os.path.join(folder, "progress.json"), {**progress, "checkpoint": name})
    remove_checkpoints(folder, keep=name)


def remove_checkpoints(folder: str, keep: str | None = None) -> None:
    """Removes the checkpoint folders save_checkpoint wrote in ``folder``, all but ``keep``."""
    for name in os.listdir(folder):
        if name.startswith(CHECKPOINT_PREFIX) and name != keep:
            shutil.rmtree(os.path.join(folder, name))


# ---- train: every unfinished run, a few at a time -----------------------------------------------------

def train(args) -> int:
    deadline = time.time() + 60.0 * args.minutes
    pending = [(algo, env, seed) for algo in args.algos for env in args.envs for seed in args.seeds
               if not os.path.exists(os.path.join(run_folder(args.runs, algo, env, seed, args.env_kwargs),
                                                  "result.json"))]
    running: list[tuple[subprocess.Popen, str]] = []
    failed = 0
    while pending or running:
        while pending and len(running) < args.parallel:
            algo, env, seed = pending.pop(0)
            folder = run_folder(args.runs, algo, env, seed, args.env_kwargs)
            command = [sys.executable, __file__, "_run", folder, algo, env, str(seed), str(args.steps), args.device,
                       repr(deadline), str(args.overlap), json.dumps(args.env_kwargs)]
            running.append((subprocess.Popen(command, stderr=subprocess.PIPE, text=True), folder))
        time.sleep(1.0)
        for process, folder in list(running):
            if process.poll() is None:
                continue
            running.remove((process, folder))
            if process.returncode != 0:
                failed += 1
                print(f"{folder}: failed\n{process.stderr.read()[-3000:]}", flush=True)
                continue
            result = read_json(os.path.join(folder, "result.json"))
            progress = read_json(os.path.join(folder, "progress.json"))
            state = (f"done, return {result['eval_mean']:.0f}" if result else "stopped by the clock") if progress else "?"
            print(f"{folder}: {progress['steps'] if progress else 0} steps, {state}", flush=True)
    return 1 if failed else 0


# ---- table -------------------------------------------------------------------------------------------

def overlapped(result: dict) -> bool:
    """Whether a run trained with overlap_updates (results written before the option lack the
    key: those runs trained in SB3's order)."""
    return result.get("overlap_updates", False)


def task_name(result: dict) -> str:
    """The run's environment id, with its keywords after it where it has some."""
    env_kwargs = result.get("env_kwargs") or {}
    return f"{result['env']} ({keywords_text(env_kwargs, ', ')})" if env_kwargs else result["env"]


def table(args) -> int:
    results = [read_json(os.path.join(args.runs, name, "result.json")) for name in sorted(os.listdir(args.runs))]
    results = [r for r in results if r is not None]
    if not results:
        print(f"no finished runs under {args.runs}")
        return 1
    groups: dict[tuple[str, str, bool], list[dict]] = {}
    for r in results:
        groups.setdefault((r["algo"], task_name(r), overlapped(r)), []).append(r)
    print("| algorithm | task, steps | rlkit final return (per seed) | RL Zoo (v3, 1M) | CleanRL (1M) "
          "| rlkit / RL Zoo (median, at 1M) | wall time per run | steps/s |")
    print("|---|---|---|---|---|---|---|---|")
    for (algo, env, overlap), runs in sorted(groups.items()):
        task = env.split("-")[0]  # the references' task, whatever the keywords
        returns = [r["eval_mean"] for r in sorted(runs, key=lambda r: r["seed"])]
        median = statistics.median(returns)
        zoo, cleanrl = RL_ZOO[algo].get(task), CLEANRL[algo].get(task)
        at_zoo_budget = runs[0]["steps"] >= REFERENCE_STEPS  # the references are returns after 1M steps
        minutes = statistics.median(r["train_seconds"] for r in runs) / 60.0
        name = f"{algo.upper()}, overlap_updates" if overlap else algo.upper()
        print(f"| {name} | {env}, {runs[0]['steps'] // 1000}k | "
              f"{', '.join(f'{v:.0f}' for v in returns)} | {zoo if zoo else '-'} | {f'{cleanrl:.0f}' if cleanrl else '-'} | "
              f"{f'{median / zoo:.2f}' if zoo and at_zoo_budget else '-'} | {minutes:.1f} min | "
              f"{statistics.median(r['steps_per_second'] for r in runs):.0f} |")
    if args.plots:
        plot(args, results)
    return 0


def plot(args, results: list[dict]) -> None:
    """The rollout/ep_rew_mean curves of each (algorithm, task), a line per seed, as
    <plots>/<algo>_<env>_<steps>[_overlap].png (rlkit plot over copies of the runs' small event folders,
    gathered under one folder named after the group)."""
    from rlkit.cli import main as rlkit_main

    os.makedirs(args.plots, exist_ok=True)
    groups: dict[tuple[str, str, str, int, bool], list[dict]] = {}
    for r in results:
        variant = env_variant(r.get("env_kwargs") or {})
        groups.setdefault((r["algo"], r["env"], variant, r["steps"], overlapped(r)), []).append(r)
    for (algo, env, variant, steps, overlap), runs in sorted(groups.items()):
        name = f"{algo}_{env}{variant}_{steps // 1000}k" + ("_overlap" if overlap else "")
        with tempfile.TemporaryDirectory() as scratch:
            for r in runs:
                shutil.copytree(os.path.join(run_folder(args.runs, algo, env, r["seed"], r.get("env_kwargs")), "tb"),
                                os.path.join(scratch, name, f"seed_{r['seed']}"))
            if rlkit_main(["plot", os.path.join(scratch, name), "-o", os.path.join(args.plots, f"{name}.png")]) != 0:
                print(f"{name}: no curve drawn (rlkit plot said why, above)")


# ---- main --------------------------------------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("train", help="train (or resume) every unfinished run")
    run.add_argument("--runs", default="zoo_runs", help="the folder of the runs' folders")
    run.add_argument("--algos", default="sac,td3")
    run.add_argument("--envs", default=",".join(f"{task}-v5" for task in TASKS))
    run.add_argument("--seeds", default="0")
    run.add_argument("--steps", type=int, default=1_000_000)
    run.add_argument("--device", default="gpu")
    run.add_argument("--parallel", type=int, default=4, help="runs at once, each its own process")
    run.add_argument("--minutes", type=float, default=9.0, help="stop (saving) after this long")
    run.add_argument("--overlap", action="store_true", help="new runs train with overlap_updates=True")
    run.add_argument("--env-kwargs", nargs="+", default=[], metavar="KEY=VALUE",
                     help="keywords of gymnasium.make (as rlkit train takes them)")
    show = commands.add_parser("table", help="the markdown table of the finished runs")
    show.add_argument("--runs", default="zoo_runs")
    show.add_argument("--plots", help="also write the learning curves here, as PNG (one per algorithm and task)")
    args = parser.parse_args(argv)
    if args.command == "train":
        args.algos = [a.strip().lower() for a in args.algos.split(",")]
        unknown = [a for a in args.algos if a not in AGENTS]
        if unknown:
            parser.error(f"unknown algorithm(s) {unknown}; expected some of {sorted(AGENTS)}")
        args.envs = [e.strip() for e in args.envs.split(",")]
        try:
            args.seeds = [int(s) for s in args.seeds.split(",")]
        except ValueError:
            parser.error(f"--seeds must be integers separated by commas, got {args.seeds!r}")
        for name in ("steps", "parallel"):
            if getattr(args, name) < 1:
                parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
        if not args.minutes > 0:
            parser.error(f"--minutes must be positive, got {args.minutes}")
        try:
            args.env_kwargs = parse_env_kwargs(args.env_kwargs)
        except UsageError as error:
            parser.error(str(error))
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_run":  # a child process: one run
        folder, algo, env, seed, steps, device, deadline, overlap, env_kwargs = argv[1:10]
        train_one(folder, algo, env, int(seed), int(steps), device, float(deadline), overlap == "True",
                  json.loads(env_kwargs))
        return 0
    args = parse_args(argv)
    return train(args) if args.command == "train" else table(args)


if __name__ == "__main__":
    sys.exit(main())
