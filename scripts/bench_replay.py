"""Replays of captured programs: microseconds and GPU dispatches per replay of a captured SAC
update (actor and two critics 256-256, batch 256, as rlkit.agents.SAC builds it), a captured DQN
update (4-256-256-2, batch 64) and a captured policy forward (SAC's stochastic actor, one
observation: what acting costs at every environment step).

    python scripts/bench_replay.py [--device cpu|gpu] [--replays 500] [--warmup 20] [--threads N] [--busy N]

Each figure is the median over the replays of the wall-clock time of one call, as the agents
make it (host inputs, the replay, the outputs back on the host). On a software Vulkan device
(lavapipe) the GPU figures say little; measure on real hardware. ``--busy N`` runs N processes
that only spin while measuring: rlkit's threads then compete for the cores, as they do on a
shared machine or beside other ranks.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from collections.abc import Callable

import numpy as np

import rlkit.core as rc
from rlkit.agents import DQN, SAC, DQNConfig

BUFFER_STEPS = 2000  # transitions stored before timing (the updates sample from them)


def fill_buffer(agent, steps: int, seed: int = 0) -> None:
    """Random transitions of the agent's shapes, written into its replay buffer."""
    rng = np.random.default_rng(seed)
    n_obs = agent.n_obs
    for _ in range(steps):
        action = rng.integers(0, agent.n_actions, (1, 1)) if agent.discrete else rng.uniform(-1, 1, (1, agent.n_actions))
        agent.buffer.add(rng.standard_normal((1, n_obs)).astype(np.float32), action,
                         rng.standard_normal(1).astype(np.float32), rng.standard_normal((1, n_obs)).astype(np.float32),
                         rng.random(1) < 0.05, np.zeros(1, bool))


def time_replays(call: Callable[[], object], replays: int, warmup: int, device: str) -> tuple[float, float]:
    """(median microseconds per call, GPU dispatches per call; 0 on the CPU)."""
    for _ in range(warmup):  # traces, records, and settles the allocator
        call()
    rc.gpu_stats(reset=True)
    times = []
    for _ in range(replays):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    dispatches = rc.gpu_stats().get("dispatches", 0) / replays if device == "gpu" else 0.0
    return statistics.median(times) * 1e6, dispatches


def cases(device: str) -> dict[str, Callable[[], object]]:
    """The captured calls to time, by name."""
    sac = SAC("Pendulum-v1", seed=0, device=device)  # net_arch (256, 256), batch 256, two critics
    # 4-256-256-2, batch 64; RL Zoo's settings (DQNConfig's), the update BENCHMARKS.md has timed all along
    dqn = DQN("CartPole-v1", DQNConfig(), seed=0, device=device)
    with sac.on_device():
        fill_buffer(sac, BUFFER_STEPS)
    with dqn.on_device():
        fill_buffer(dqn, BUFFER_STEPS)
    obs = np.zeros((1, sac.n_obs), np.float32)

    def on(agent, fn):
        def call():
            with agent.on_device():
                return fn()
        return call

    return {
        "SAC update (256-256, batch 256)": on(sac, lambda: sac._train(1)),
        "DQN update (4-256-256-2, batch 64)": on(dqn, lambda: dqn._train(1)),
        "policy forward (SAC actor, 1 obs)": on(sac, lambda: sac._policy(obs, deterministic=False)),
    }


def spin() -> None:
    """A busy process: competes for a core until terminated."""
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "gpu"), default="gpu")
    parser.add_argument("--replays", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0, help="rlkit's CPU threads (default: as many as cores)")
    parser.add_argument("--busy", type=int, default=0, help="busy processes running beside the measurement")
    args = parser.parse_args()
    if args.replays < 1 or args.warmup < 1:
        parser.error("--replays and --warmup must be at least 1")
    if args.threads < 0 or args.busy < 0:
        parser.error("--threads and --busy must be at least 0")
    if args.threads:
        rc.set_num_threads(args.threads)
    names = {row["device"]: row["name"] for row in rc.devices()}
    if args.device not in names:
        parser.error("no GPU here: the Vulkan backend is unavailable")
    print(f"device: {args.device} ({names[args.device]}), {rc.get_num_threads()} CPU threads, "
          f"{args.busy} busy processes beside, median of {args.replays} replays each")
    print(f"{'program':40s} {'us/replay':>10s} {'dispatches/replay':>18s}")
    busy = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for process in busy:
        process.start()
    try:
        for name, call in cases(args.device).items():
            micros, dispatches = time_replays(call, args.replays, args.warmup, args.device)
            print(f"{name:40s} {micros:10.1f} {dispatches:18.1f}")
    finally:
        for process in busy:
            process.terminate()


if __name__ == "__main__":
    main()
