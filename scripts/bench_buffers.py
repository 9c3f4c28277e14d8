"""Replay-buffer benchmarks against a plain numpy ring buffer and Stable-Baselines3's ReplayBuffer,
and a captured DQN update against PyTorch eager doing the same update, in one run.

    python scripts/bench_buffers.py [--device gpu] [--quick] [--markdown BENCHMARKS.md]

Stable-Baselines3 (and torch) are optional bench dependencies; their columns are left out
where they are not installed.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import rlkit.core as rc
from rlkit.buffers import ReplayBuffer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_core import gpu_seconds, write_section  # noqa: E402  (the shared timing and report helpers)

try:
    import torch
except ImportError:
    torch = None
try:
    import gymnasium
    from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer
except ImportError:
    SB3ReplayBuffer = None

CAPACITY = 100_000


def median_us(fn, iters: int, rounds: int, sync=lambda: None) -> float:
    """Median over rounds of the microseconds per call (bench_core's timing loop)."""
    return gpu_seconds(fn, sync, iters, rounds) * 1e6


class NumpyRing:
    """The plain reference: one numpy array per field, a write position, fancy-index sampling."""

    def __init__(self, capacity, obs_dim, obs_dtype):
        self.obs = np.zeros((capacity, obs_dim), obs_dtype)
        self.next_obs = np.zeros((capacity, obs_dim), obs_dtype)
        self.action = np.zeros((capacity, 1), np.float32)
        self.reward = np.zeros(capacity, np.float32)
        self.done = np.zeros(capacity, np.float32)
        self.pos, self.size, self.capacity = 0, 0, capacity
        self.rng = np.random.default_rng(0)

    def add(self, obs, action, reward, next_obs, done):
        n = obs.shape[0]
        rows = (self.pos + np.arange(n)) % self.capacity
        self.obs[rows], self.next_obs[rows], self.action[rows] = obs, next_obs, action
        self.reward[rows], self.done[rows] = reward, done
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch):
        i = self.rng.integers(0, self.size, batch)
        return self.obs[i], self.action[i], self.reward[i], self.next_obs[i], self.done[i]


def _transition(n_envs, obs_dim, obs_dtype, rng):
    obs = (rng.integers(0, 255, (n_envs, obs_dim)) if obs_dtype == np.uint8 else rng.standard_normal((n_envs, obs_dim)))
    return obs.astype(obs_dtype), rng.standard_normal((n_envs, 1)).astype(np.float32)


def bench_add(device, rounds, quick):
    rows = []
    rng = np.random.default_rng(0)
    for n_envs in (1, 16):
        obs, action = _transition(n_envs, 4, np.float32, rng)
        reward, flags = np.ones(n_envs, np.float32), np.zeros(n_envs, bool)
        ours = ReplayBuffer(CAPACITY, 4, 1, n_envs=n_envs, device=device)
        ring = NumpyRing(CAPACITY, 4, np.float32)
        iters = 500 if quick else 3000
        row = {"rlkit": median_us(lambda: ours.add(obs, action, reward, obs, flags, flags), iters, rounds),
               "numpy": median_us(lambda: ring.add(obs, action, reward, obs, flags), iters, rounds)}
        if SB3ReplayBuffer is not None:
            space = gymnasium.spaces.Box(-1, 1, (4,), np.float32)
            sb3 = SB3ReplayBuffer(CAPACITY, space, gymnasium.spaces.Box(-1, 1, (1,), np.float32), "cpu",
                                  n_envs=n_envs)
            infos = [{} for _ in range(n_envs)]
            row["sb3"] = median_us(lambda: sb3.add(obs, obs, action, reward, flags, infos), iters, rounds)
        rows.append((f"add, {n_envs} env{'s' if n_envs > 1 else ''} at once, obs 4 (us)", row))
    return rows


def bench_sample(device, rounds, quick, sync):
    rows = []
    rng = np.random.default_rng(1)
    for label, obs_dim, dtype, name in ((4, 4, np.float32, "f32"), (64, 64, np.float32, "f32"),
                                       ("84x84x4 u8", 84 * 84 * 4, np.uint8, "u8")):
        capacity = 2000 if dtype == np.uint8 else CAPACITY
        ours = ReplayBuffer(capacity, obs_dim, 1, device=device, obs_dtype=name, seed=0)
        ring = NumpyRing(capacity, obs_dim, dtype)
        for _ in range(capacity // 100):
            obs, action = _transition(100, obs_dim, dtype, rng)
            flags = np.zeros(100, bool)
            ring.add(obs, action, np.ones(100, np.float32), obs, flags)
        ours_obs = np.asfortranarray(ring.obs.T)
        ours._obs.write(ours_obs, 0)  # fill directly: the sampling cost is what is measured
        ours._next_obs.write(ours_obs, 0)
        ours.pos, ours.full = 0, True
        iters = 50 if quick else 300

        def ours_sample():
            s = ours.sample(256)
            return s.obs, s.next_obs

        row = {"rlkit": median_us(ours_sample, iters, rounds, sync),
               "numpy": median_us(lambda: ring.sample(256), iters, rounds)}
        if SB3ReplayBuffer is not None:
            space = gymnasium.spaces.Box(0, 255, (obs_dim,), dtype)
            sb3 = SB3ReplayBuffer(capacity, space, gymnasium.spaces.Box(-1, 1, (1,), np.float32), "cpu")
            sb3.observations[:, 0], sb3.next_observations[:, 0] = ring.obs, ring.next_obs
            sb3.full = True
            row["sb3"] = median_us(lambda: sb3.sample(256), iters, rounds)
        rows.append((f"sample 256, obs {label} (us)", row))
    return rows


# ---- a DQN-sized update: Q 4-64-64-2, Huber loss on r + gamma (1 - done) max Q_target, Adam ---------

def rlkit_dqn_update(device, batch):
    """Made and run with ``device`` as the default device (buffers follow the default device)."""
    rc.manual_seed(0)
    q = rc.nn.Sequential(rc.nn.Linear(4, 64, activation="relu"), rc.nn.Linear(64, 64, activation="relu"),
                         rc.nn.Linear(64, 2))
    target = rc.nn.Sequential(rc.nn.Linear(4, 64, activation="relu"), rc.nn.Linear(64, 64, activation="relu"),
                              rc.nn.Linear(64, 2))
    opt = rc.optim.Adam(q.parameters(), lr=1e-4)
    buf = ReplayBuffer(CAPACITY, 4, 1, device=device, action_dtype="i32", seed=0)
    rng = np.random.default_rng(0)
    for _ in range(100):
        obs = rng.standard_normal((1, 4)).astype(np.float32)
        buf.add(obs, rng.integers(0, 2, (1, 1)), rng.standard_normal(1), obs, rng.random(1) < 0.05, [False])

    def loss_fn(stored):
        s = buf.sample_on_device(batch, stored)
        with rc.no_grad():
            best_next = rc.stop_gradient(rc.max(target(s.next_obs)))  # [1, B]
            td_target = s.reward + s.discount * (1.0 - s.done) * best_next
        q_taken = rc.gather(q(s.obs), s.action)
        return rc.huber_loss(q_taken, td_target)

    step = rc.capture_step(loss_fn, list(q.parameters().values()), opt)
    stored = np.array([[len(buf)]], np.float32)
    return lambda: step(stored=stored)


def torch_dqn_update(device, batch):
    torch.manual_seed(0)

    def net():
        return torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                   torch.nn.Linear(64, 2)).to(device)

    q, target = net(), net()
    opt = torch.optim.Adam(q.parameters(), lr=1e-4)
    n = 100
    obs = torch.randn(CAPACITY, 4, device=device)
    action = torch.randint(0, 2, (CAPACITY,), device=device)
    reward, done = torch.randn(CAPACITY, device=device), torch.zeros(CAPACITY, device=device)

    def run():
        i = torch.randint(0, n, (batch,), device=device)
        with torch.no_grad():
            td_target = reward[i] + 0.99 * (1 - done[i]) * target(obs[i]).max(dim=1).values
        q_taken = q(obs[i]).gather(1, action[i, None])[:, 0]
        loss = torch.nn.functional.smooth_l1_loss(q_taken, td_target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()  # as the captured update reads its loss

    return run


def bench_updates(device, rounds, quick, sync):
    iters = 100 if quick else 500
    ours = median_us(rlkit_dqn_update(device, 128), iters, rounds, sync)
    row = {"rlkit": ours}
    if torch is not None and (device == "cpu" or torch.cuda.is_available()):
        torch_device = "cuda" if device == "gpu" else "cpu"
        tsync = torch.cuda.synchronize if torch_device == "cuda" else (lambda: None)
        row["torch"] = median_us(torch_dqn_update(torch_device, 128), iters, rounds, tsync)
    return [("DQN update, batch 128, Q 4-64-64-2 (us; rlkit: rc.capture_step, sampling on the device)", row)]


def bench_gather_bandwidth(rounds, sync) -> str:
    """GPU: bytes per second of gathering 4096 frames of 84x84x4 u8, against a plain device copy
    of a large tensor (both count what is read plus what is written)."""
    from rlkit.buffers import DeviceBuffer

    frames = DeviceBuffer(84 * 84 * 4, 16384, dtype="u8", device="gpu")
    index = rc.tensor(np.random.default_rng(0).integers(0, 16384, (1, 4096)).astype(np.int32), device="gpu")
    gather_us = median_us(lambda: rc.get_rows(frames, index), 50, rounds, sync)
    moved = 2 * 4096 * 84 * 84 * 4
    big = rc.full((1 << 27, 1), 0.0, dtype="f32", device="gpu")  # 512 MiB
    copy_us = median_us(lambda: rc.reshape(big, (1 << 26, 2)), 20, rounds, sync)
    gather_bw, copy_bw = moved / gather_us / 1e3, 2 * (1 << 29) / copy_us / 1e3  # GB/s
    return (f"| gather 4096 frames of 84x84x4 u8 (GB/s, read + write) | {gather_bw:.0f} | device copy of 512 MiB: "
            f"{copy_bw:.0f} GB/s | gather / copy {gather_bw / copy_bw:.2f} |")


def report(device, rows) -> str:
    columns = ["rlkit", "numpy", "sb3", "torch"]
    present = [c for c in columns if any(c in r for _, r in rows)]
    names = {"rlkit": f"rlkit ({device})", "numpy": "numpy ring", "sb3": "SB3 ReplayBuffer",
             "torch": "PyTorch eager" + (" CUDA" if device == "gpu" else "")}
    lines = [f"Machine: {rc.devices()[-1]['name'] if device == 'gpu' else 'CPU'}, rlkit on the {device}; "
             + ("SB3 present" if SB3ReplayBuffer is not None else "SB3 absent") + ".", "",
             "| | " + " | ".join(names[c] for c in present) + " | reference / rlkit |",
             "|---|" + "---|" * (len(present) + 1)]
    for label, row in rows:
        cells = [f"{row[c]:.1f}" if c in row else "-" for c in present]
        refs = [f"{c} {row[c] / row['rlkit']:.2f}x" for c in present if c != "rlkit" and c in row]
        lines.append(f"| {label} | " + " | ".join(cells) + " | " + ", ".join(refs) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    rounds = 3 if args.quick else 7
    rc.device(args.device)  # buffers follow the default device: set it once, never per call
    if torch is not None:
        torch.set_num_threads(rc.get_num_threads())
    sync = rc.synchronize
    rows = bench_add(args.device, rounds, args.quick) + bench_sample(args.device, rounds, args.quick, sync)
    rows += bench_updates(args.device, rounds, args.quick, sync)
    text = report(args.device, rows)
    if args.device == "gpu":
        text += "\n" + bench_gather_bandwidth(rounds, sync)
    print(text)
    if args.markdown:
        write_section(args.markdown, text, f"bench_buffers_{args.device}")


if __name__ == "__main__":
    main()
