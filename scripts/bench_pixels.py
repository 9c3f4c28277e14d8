"""rlkit against PyTorch and SB3 on pixels, in one run: DQN's NatureCNN update, the convolutions
of NatureCNN, and sampling Atari frame stacks from a replay buffer.

    python scripts/bench_pixels.py --device gpu --torch-device cuda [--markdown BENCHMARKS.md] [--out r.json]
    python scripts/bench_pixels.py --device cpu --torch-device cpu [--quick]
    python scripts/bench_pixels.py --device gpu --levels      # the update's GPU time, level by level

Rows (each rlkit's figure beside its reference measured in the same run, and rlkit's speed over
the reference's, above 1 where rlkit is faster):

- the DQN update on Atari shapes (stacks (4, 84, 84) bytes, NatureCNN, 4 actions, batch 32,
  Huber loss, global-norm clipping at 10, Adam), as rlkit.agents.DQN captures it (its batch
  sampled on the device from a buffer that stores each frame once and rebuilds the stacks),
  against the same update in PyTorch (cuDNN on CUDA) sampling 32 uint8 stacks held on the device,
  eager and as a CUDA graph; both read their loss on the host at every update; and the same in
  rounds of 16 updates whose losses are read once a round (rlkit's DQN training runs its updates
  16 to a program: UPDATES_PER_PROGRAM), PyTorch's kept on the device and read together;
- conv2d forward and backward (input and weight gradients) at each NatureCNN layer, batch 32,
  GFLOP/s (3 x 2 x the forward's multiply-adds), rlkit captured (the gradients kept on the device,
  their sums read) against torch.nn.functional.conv2d with autograd; in f32, and on the GPU in f16
  too (against cuDNN's f16);
- with --atari-env: environment steps per second of DQN training on that game (rlkit's make_atari
  against SB3's make_atari_env + VecFrameStack, the same settings, --n-envs each);
- sampling 32 stacks from 2000 stored Atari steps: rlkit's ReplayBuffer.sample (indices drawn on
  the host, the stacks gathered on the device) against SB3's ReplayBuffer.sample
  (optimize_memory_usage=True, the batch moved to --torch-device).

Before timing, the script checks on the CPU that its PyTorch Q-network computes what rlkit's
does (same weights and observations, Q-values within 1e-4).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the timing and table helpers of bench_gpu
from bench_gpu import (  # noqa: E402
    Row, Timer, cuda_graphed, describe_machine, level_table, markdown, not_measured, write_section,
)

import gymnasium as gym  # noqa: E402

import rlkit.core as rc  # noqa: E402
from rlkit.agents import DQN  # noqa: E402
from rlkit.agents.acting import default_device  # noqa: E402
from rlkit.agents.dqn import UPDATES_PER_PROGRAM, DQNConfig  # noqa: E402
from rlkit.envs import ATARI_DQN_DEFAULTS  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None

STACK, SIDE, ACTIONS, BATCH, STEPS = 4, 84, 4, 32, 2000
NATURE_LAYERS = ((STACK, 32, 8, 4, 84), (32, 64, 4, 2, 20), (64, 64, 3, 1, 9))  # (C_in, C_out, kernel, stride, input side)


# ---- data -------------------------------------------------------------------------------------------

def atari_steps(steps: int, episode: int = 500, seed: int = 0) -> list[tuple]:
    """(obs, action, reward, next_obs, terminated) of ``steps`` steps whose observations are frame
    stacks as FrameStackObservation gives them (reset padding: an episode starts with its first
    frame four times), random frames, episodes of ``episode`` steps."""
    rng = np.random.default_rng(seed)
    out, stack = [], None
    for t in range(steps):
        if t % episode == 0:
            stack = np.repeat(rng.integers(0, 256, (1, SIDE, SIDE), np.uint8), STACK, axis=0)
        frame = rng.integers(0, 256, (1, SIDE, SIDE), np.uint8)
        following = np.concatenate([stack[1:], frame])
        out.append((stack, int(rng.integers(ACTIONS)), float(rng.standard_normal()), following,
                    (t + 1) % episode == 0))
        stack = following
    return out


class AtariFrames(gym.Env):
    """An Atari game's spaces (84x84 frames, 4 actions), to build the agent for; its buffer is
    then filled with atari_steps' stacks."""

    observation_space = gym.spaces.Box(0, 255, (SIDE, SIDE), np.uint8)
    action_space = gym.spaces.Discrete(ACTIONS)

    def reset(self, seed=None, options=None):
        return np.zeros((SIDE, SIDE), np.uint8), {}

    def step(self, action):
        return np.zeros((SIDE, SIDE), np.uint8), 0.0, False, False, {}


def dqn_agent(device: str, steps: list[tuple]) -> DQN:
    """rlkit's DQN with RL Zoo's Atari settings on FrameStackObservation stacks (so its buffer
    stores each frame once), the buffer filled with ``steps``."""
    env = gym.wrappers.FrameStackObservation(AtariFrames(), STACK)
    agent = DQN(env, DQNConfig(**ATARI_DQN_DEFAULTS, net_arch=()), seed=0, device=device, buffer_size=10_000)
    with agent.on_device():
        for obs, action, reward, following, done in steps:
            agent.buffer.add(obs[None], np.array([[action]]), np.array([reward], np.float32), following[None],
                             np.array([done]), np.array([False]))
    return agent


# ---- PyTorch's side ----------------------------------------------------------------------------------

def torch_q_network(agent: DQN, device: str):
    """PyTorch's NatureCNN Q-network holding the agent's weights (rlkit's [KW, KH, C_in, C_out]
    weights are PyTorch's (C_out, C_in, KH, KW) transposed)."""
    layers = []
    for c_in, c_out, kernel, stride, _ in NATURE_LAYERS:
        layers += [torch.nn.Conv2d(c_in, c_out, kernel, stride), torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers, torch.nn.Flatten(), torch.nn.Linear(3136, 512), torch.nn.ReLU(),
                              torch.nn.Linear(512, ACTIONS))
    ours = list(agent.q.parameters().values())
    with torch.no_grad():
        for p, value in zip(net.parameters(), ours, strict=True):
            array = np.asarray(value.numpy(), np.float32)
            array = np.ascontiguousarray(array.T) if array.ndim == 4 else array.reshape(p.shape)
            p.copy_(torch.from_numpy(array))
    return net.to(device)


class TorchAtariDQN:
    """DQN's update in PyTorch on uint8 stacks held on the device: Huber loss of Q(s, a) against
    r + gamma (1 - done) max Q_target(s', a'), clipping, Adam."""

    def __init__(self, agent: DQN, steps: list[tuple], device: str, capturable: bool):
        self.q, self.target = torch_q_network(agent, device), torch_q_network(agent, device)
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=1e-4, capturable=capturable)
        self.obs = torch.from_numpy(np.stack([s[0] for s in steps])).to(device)  # [N, 4, 84, 84] uint8
        self.next_obs = torch.from_numpy(np.stack([s[3] for s in steps])).to(device)
        self.action = torch.tensor([[s[1]] for s in steps], device=device)
        self.reward = torch.tensor([[s[2]] for s in steps], device=device)
        self.done = torch.tensor([[float(s[4])] for s in steps], device=device)
        self.device = device

    def update(self):
        index = torch.randint(0, len(self.obs), (BATCH,), device=self.device)
        obs, next_obs = self.obs[index].float() / 255.0, self.next_obs[index].float() / 255.0
        with torch.no_grad():
            best_next = self.target(next_obs).max(dim=1, keepdim=True).values
            td_target = self.reward[index] + 0.99 * (1.0 - self.done[index]) * best_next
        loss = F.huber_loss(self.q(obs).gather(1, self.action[index]), td_target)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.q.parameters(), 10.0)
        self.optimizer.step()
        return (loss,)

    def update_round(self, update, losses):
        """UPDATES_PER_PROGRAM calls of ``update`` (this learner's, or its CUDA graph's replay),
        their losses gathered in ``losses`` on the device and read once."""
        for i in range(UPDATES_PER_PROGRAM):
            losses[i].copy_(update()[0].reshape(()))
        return losses.cpu()


def check_q_values(agent: DQN, steps: list[tuple]) -> str:
    """rlkit's and PyTorch's Q-values of 8 stored observations, on the CPU, within 1e-4."""
    obs = np.stack([s[0] for s in steps[:8]])  # (8, 4, 84, 84)
    with rc.no_grad():
        ours = agent.q(rc.tensor(obs.T, dtype="u8", device=agent.device)).numpy()  # [actions, 8]
    net = torch_q_network(agent, "cpu")
    theirs = net(torch.from_numpy(obs).float() / 255.0).detach().numpy().T
    error = float(np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-12))
    if error > 1e-4:
        raise SystemExit(f"bench_pixels: rlkit's and PyTorch's Q-values differ by {error:.2e} (relative)")
    return f"Q-values agree within {error:.1e} (relative)"


# ---- benchmarks --------------------------------------------------------------------------------------

def bench_update(args, timer: Timer, steps: list[tuple]) -> list[Row]:
    agent = dqn_agent(args.device, steps)

    def call():
        with agent.on_device():
            return agent._train(1)

    def call_round():
        with agent.on_device():
            return agent._train(UPDATES_PER_PROGRAM)

    ours = timer.rlkit(call) * 1e3
    ours_round = timer.rlkit(call_round) * 1e3 / UPDATES_PER_PROGRAM
    label = "DQN update, NatureCNN, batch 32 (4x84x84 bytes, frames stored once)"
    round_label = f"{label}, in rounds of {UPDATES_PER_PROGRAM} (losses read once a round)"
    eager = Row("Pixels", f"{label}: PyTorch eager", "ms per update", ours, None, "PyTorch eager", False, 1.5)
    graph = Row("Pixels", f"{label}: PyTorch CUDA graph", "ms per update", ours, None, "PyTorch CUDA graph",
                False, 1.0)
    graph_round = Row("Pixels", f"{round_label}: PyTorch CUDA graph", "ms per update", ours_round, None,
                      "PyTorch CUDA graph", False, None)
    if torch is None or args.no_torch:
        return [eager]
    learner = TorchAtariDQN(agent, steps, args.torch_device, capturable=False)
    eager.torch = timer.torch(lambda: learner.update()[0].item(), args.torch_device) * 1e3
    if args.torch_device != "cuda":
        graph.notes = not_measured("CUDA graphs need --torch-device cuda")
        return [eager, graph]
    graphed = TorchAtariDQN(agent, steps, "cuda", capturable=True)
    replay = cuda_graphed(graphed.update)
    graph.torch = timer.torch(lambda: replay()[0].item(), "cuda") * 1e3
    losses = torch.empty(UPDATES_PER_PROGRAM, device="cuda")
    graph_round.torch = timer.torch(lambda: graphed.update_round(replay, losses), "cuda") * 1e3 / UPDATES_PER_PROGRAM
    return [eager, graph, graph_round]


def bench_convs(args, timer: Timer) -> list[Row]:
    rows = []
    rng = np.random.default_rng(1)
    # f16 on the GPU only: rlkit's f16 kernels are cooperative-matrix ones (rlkit info names them)
    for dtype in ("f32", "f16") if args.device == "gpu" else ("f32",):
        for c_in, c_out, kernel, stride, side in NATURE_LAYERS:
            rows.append(bench_conv(args, timer, rng, dtype, c_in, c_out, kernel, stride, side))
    return rows


def bench_conv(args, timer: Timer, rng, dtype: str, c_in: int, c_out: int, kernel: int, stride: int, side: int) -> Row:
    out_side = (side - kernel) // stride + 1
    flops = 3 * 2 * BATCH * c_out * out_side ** 2 * c_in * kernel ** 2
    x_np = rng.random((side, side, c_in, BATCH), np.float32)
    w_np = rng.standard_normal((kernel, kernel, c_in, c_out)).astype(np.float32) * 0.05
    g_np = rng.standard_normal((out_side, out_side, c_out, BATCH)).astype(np.float32)
    with default_device(args.device):
        x, w, g = rc.param(x_np, dtype=dtype), rc.param(w_np, dtype=dtype), rc.tensor(g_np, dtype=dtype)

        def forward_backward():
            with rc.grad_tape():
                loss = rc.sum(rc.conv2d(x, w, stride=stride) * g)
            grads = rc.backward(loss)
            # a replay's outputs travel to the host: the sums of the gradients stand for them
            # (PyTorch's stay on its GPU), and the loss keeps the forward from being pruned
            return loss, rc.sum(grads.tensor(x)), rc.sum(grads.tensor(w))

        captured = rc.capture(forward_backward, [x, w])
        ours = flops / timer.rlkit(lambda: captured()) / 1e9
    reference = "cuDNN" if args.torch_device == "cuda" else "PyTorch CPU"
    row = Row("Pixels", f"conv2d {dtype} forward+backward {c_in}->{c_out} {kernel}x{kernel}/{stride} on "
              f"{side}x{side}, batch 32", "GFLOP/s", ours, None, reference + (" f16" if dtype == "f16" else ""),
              True, 0.5 if args.torch_device == "cuda" and dtype == "f32" else None)
    if torch is not None and not args.no_torch:
        torch_dtype = torch.float16 if dtype == "f16" else torch.float32

        def torch_tensor(a):
            return torch.from_numpy(np.ascontiguousarray(a.T)).to(args.torch_device, torch_dtype)

        tx, tw, tg = torch_tensor(x_np).requires_grad_(), torch_tensor(w_np).requires_grad_(), torch_tensor(g_np)

        def torch_call():
            return torch.autograd.grad((F.conv2d(tx, tw, stride=stride) * tg).sum(), (tx, tw))

        row.torch = flops / timer.torch(torch_call, args.torch_device) / 1e9
    return row


def bench_sampling(args, timer: Timer, steps: list[tuple]) -> list[Row]:
    agent = dqn_agent(args.device, steps)

    def ours_call():
        with agent.on_device():
            return agent.buffer.sample(BATCH)

    ours = timer.rlkit(ours_call) * 1e6
    row = Row("Pixels", "sample 32 Atari stacks (4x84x84 bytes) from 2000 steps", "us per batch", ours, None,
              f"SB3 ReplayBuffer (optimize_memory_usage), to {args.torch_device}", False, None)
    try:
        from stable_baselines3.common.buffers import ReplayBuffer as SB3Buffer
    except ImportError:
        row.notes = not_measured("stable-baselines3 is not installed")
        return [row]
    buffer = SB3Buffer(len(steps) + 1, gym.spaces.Box(0, 255, (STACK, SIDE, SIDE), np.uint8),
                       gym.spaces.Discrete(ACTIONS), device=args.torch_device, optimize_memory_usage=True,
                       handle_timeout_termination=False)
    for obs, action, reward, following, done in steps:
        buffer.add(obs[None], following[None], np.array([action]), np.array([reward]), np.array([done]), [{}])
    row.torch = timer.torch(lambda: buffer.sample(BATCH), args.torch_device) * 1e6
    return [row]


def bench_training(args) -> list[Row]:
    """Environment steps per second of DQN training on a real Atari game (--atari-env), rlkit
    (make_atari, RL Zoo's settings, learning from --atari-starts) against SB3's DQN CnnPolicy on
    SB3's make_atari_env + VecFrameStack(4) with the same settings, --n-envs environments each."""
    import time

    steps, starts, n_envs = args.atari_steps, args.atari_starts, args.n_envs
    settings = dict(learning_starts=starts, buffer_size=max(steps, 10_000))
    agent = DQN(args.atari_env, seed=0, device=args.device, n_envs=n_envs, **settings)
    began = time.perf_counter()
    agent.learn(steps)
    ours = steps / (time.perf_counter() - began)
    row = Row("Pixels", f"DQN training on {args.atari_env}, {n_envs} envs, {steps} steps (updates from step {starts})",
              "env steps/s", ours, None, "SB3 DQN CnnPolicy", True, None)
    try:
        from stable_baselines3 import DQN as SB3DQN
        from stable_baselines3.common.env_util import make_atari_env
        from stable_baselines3.common.vec_env import VecFrameStack
    except ImportError:
        row.notes = not_measured("stable-baselines3 is not installed")
        return [row]
    env = VecFrameStack(make_atari_env(args.atari_env, n_envs=n_envs, seed=0), 4)
    config = DQN.default_config(args.atari_env)
    theirs = SB3DQN("CnnPolicy", env, learning_rate=config.learning_rate, batch_size=config.batch_size,
                    train_freq=config.train_freq, gradient_steps=config.gradient_steps,
                    target_update_interval=config.target_update_interval, exploration_fraction=config.exploration_fraction,
                    exploration_final_eps=config.exploration_final_eps, device=args.torch_device, seed=0, **settings)
    began = time.perf_counter()
    theirs.learn(steps)
    row.torch = steps / (time.perf_counter() - began)
    return [row]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--torch-device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--no-torch", action="store_true", help="rlkit's figures alone")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--round-seconds", type=float, default=0.5)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 short rounds")
    parser.add_argument("--atari-env", help="also time DQN training on this Atari id (needs the atari extra)")
    parser.add_argument("--atari-steps", type=int, default=20_000)
    parser.add_argument("--atari-starts", type=int, default=5_000)
    parser.add_argument("--n-envs", type=int, default=8)
    parser.add_argument("--levels", action="store_true",
                        help="instead: where the captured NatureCNN update's GPU time goes, level by level")
    parser.add_argument("--markdown", help="write the table into this file's bench_pixels section")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.round_seconds = 2, 0.05
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.levels:
        print(level_table("DQN NatureCNN update", dqn_agent(args.device, atari_steps(STEPS))))
        return 0
    timer = Timer(args.repeats, warmup=2, round_seconds=args.round_seconds)
    steps = atari_steps(200 if args.quick else STEPS)
    if torch is not None and not args.no_torch:
        print(check_q_values(dqn_agent("cpu", steps[:64]), steps))
    rows = bench_update(args, timer, steps) + bench_convs(args, timer) + bench_sampling(args, timer, steps)
    if args.atari_env:
        rows += bench_training(args)
    table = markdown(rows, describe_machine(args), args)
    print(table)
    if args.markdown:
        write_section(args.markdown, table, marker=f"bench_pixels_{args.device}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump([row.__dict__ for row in rows], f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
