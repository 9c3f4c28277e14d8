"""rlkit against PyTorch on one machine, in one run: matmul throughput, the cost of one dispatch,
the agents' captured SAC and DQN updates, and a wide MLP's training step.

    python scripts/bench_gpu.py --device gpu --torch-device cuda [--markdown BENCHMARKS.md] [--out r.json]
    python scripts/bench_gpu.py --device cpu --torch-device cpu --quick     # a smoke run
    python scripts/bench_gpu.py --check                                     # the equivalence check alone
    python scripts/bench_gpu.py --levels        # where the updates' GPU time goes, level by level

Figures (every row: rlkit's figure, PyTorch's measured in the same run, and rlkit's speed over
PyTorch's, above 1 where rlkit is faster):

- matmul n x n @ n x n, f32, f16 and bf16, TFLOP/s = 2 n^3 / time; PyTorch's f32 is cuBLAS FP32
  (TF32 off), with an extra row against TF32 on CUDA; with --transposes f16 and bf16 also with
  either operand, or both, transposed (torch.mm on the transposed views).
- dispatch: a chain of adds on a 256 x 256 tensor, then a sum read on the host; microseconds
  per add, eager and captured (rc.capture) against eager and a CUDA graph.
- the SAC update (actor and two critics 256-256, batch 256, automatic entropy) and the DQN update
  (4-256-256-2, batch 64, Huber, clipping), as rlkit.agents.SAC / DQN capture them with their RL
  Zoo settings, against the same update written in PyTorch here, eager and as a CUDA graph. Both
  sample their batch on the device from 2000 stored transitions and read their losses on the
  host at every update, as the agents do.
- an MLP of width 4096 (4096-4096-4096-4096, ReLU, MSE, Adam) at batch 4096, one training step
  on data held on the device, the loss read on the host: rlkit captured against PyTorch eager and
  a CUDA graph; on the GPU the same step in mixed precision, f16 (with dynamic loss scaling) and
  bf16: rlkit's half parameters with f32 master weights against PyTorch's autocast (GradScaler
  for f16), eager.

Each figure is the median over --repeats rounds after warm-up; a round is as many calls as fill
about --round-seconds, timed by the wall clock with the device drained at its end for rlkit
(rc.synchronize) and by CUDA events with torch.cuda.synchronize for PyTorch. Before measuring,
the script checks on the CPU that its PyTorch DQN and SAC updates compute what rlkit's agents
compute (same weights and batch, same losses within 1e-4): the comparison is of the same work.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

import rlkit.core as rc
from rlkit import _native
from rlkit.agents import DQN, SAC, TD3, DQNConfig

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None

MAX_CALLS_PER_ROUND = 1000  # bounds what a round queues on a device before it is drained
BUFFER_STEPS = 2000  # transitions stored before the updates are timed (both sides sample from them)
CHECK_TOLERANCE = 1e-4


# ---- timing ---------------------------------------------------------------------------------------

@dataclass
class Timer:
    """Median seconds per call over ``repeats`` rounds, after ``warmup`` calls; a round is as
    many calls as fill about ``round_seconds`` (at least one)."""

    repeats: int
    warmup: int
    round_seconds: float

    def rlkit(self, call: Callable[[], object]) -> float:
        """Wall-clock time of rlkit calls, the GPU drained at the end of each round."""
        return self._median(call, rc.synchronize, self._wall_clock_round)

    def torch(self, call: Callable[[], object], device: str) -> float:
        """Time of PyTorch calls: CUDA events around each round on CUDA, the wall clock on the CPU."""
        if device == "cuda":
            return self._median(call, torch.cuda.synchronize, self._cuda_event_round)
        return self._median(call, lambda: None, self._wall_clock_round)

    def _median(self, call, sync, timed_round) -> float:
        for _ in range(self.warmup):
            call()
        sync()
        start = time.perf_counter()
        call()
        sync()
        iters = min(MAX_CALLS_PER_ROUND, max(1, int(self.round_seconds / max(time.perf_counter() - start, 1e-9))))
        return statistics.median(timed_round(call, sync, iters) for _ in range(self.repeats))

    @staticmethod
    def _wall_clock_round(call, sync, iters: int) -> float:
        sync()
        start = time.perf_counter()
        for _ in range(iters):
            call()
        sync()
        return (time.perf_counter() - start) / iters

    @staticmethod
    def _cuda_event_round(call, sync, iters: int) -> float:
        sync()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            call()
        end.record()
        sync()
        return start.elapsed_time(end) / 1e3 / iters


def cuda_graphed(step: Callable[[], tuple]) -> Callable[[], tuple]:
    """``step`` (returning its output tensors) recorded as one CUDA graph after three warm-up
    calls on a side stream (PyTorch's recipe); the result replays it and returns the outputs."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = step()

    def replay():
        graph.replay()
        return outputs

    return replay


# ---- rows -----------------------------------------------------------------------------------------

@dataclass
class Row:
    """One comparison: rlkit's figure against PyTorch's (None where not measured)."""

    table: str
    label: str
    unit: str
    rlkit: float
    torch: float | None
    reference: str  # what the PyTorch figure is
    higher_is_better: bool
    target: float | None = None  # the least rlkit-over-PyTorch speed ratio the issue asks for
    notes: dict = field(default_factory=dict)

    @property
    def speed_ratio(self) -> float | None:
        """rlkit's speed over PyTorch's (above 1: rlkit is faster)."""
        if self.torch is None:
            return None
        return self.rlkit / self.torch if self.higher_is_better else self.torch / self.rlkit


def not_measured(reason: str) -> dict:
    """A row's note saying why its PyTorch figure is absent."""
    return {"not measured": reason}


# ---- matmul ---------------------------------------------------------------------------------------

ORDERS = {(False, False): "", (True, False): ", A^T B", (False, True): ", A B^T", (True, True): ", A^T B^T"}


def bench_matmul(n: int, dtype: str, args, timer: Timer) -> list[Row]:
    """TFLOP/s of n x n @ n x n in ``dtype`` ("f32", "f16" or "bf16") on both sides; with
    --transposes, for f16 and bf16 also A^T B, A B^T and A^T B^T (the operands' layouts matter to
    the cooperative-matrix kernel)."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal((n, n)).astype(np.float32)
    y = rng.standard_normal((n, n)).astype(np.float32)
    a, b = rc.tensor(x, dtype=dtype, device=args.device), rc.tensor(y, dtype=dtype, device=args.device)
    flops = 2.0 * n**3
    orders = list(ORDERS) if args.transposes and dtype != "f32" else [(False, False)]
    table = f"matmul {dtype}"
    target = 0.5 if dtype == "f32" or (dtype == "f16" and n == 4096) else None  # f16's target is set at 4096
    with_torch = torch is not None and not args.no_torch
    if with_torch:
        torch_dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]
        ta = torch.from_numpy(x).to(args.torch_device, torch_dtype)
        tb = torch.from_numpy(y).to(args.torch_device, torch_dtype)
        library = "cuBLAS" if args.torch_device == "cuda" else "PyTorch CPU"
    rows = []
    for transpose_a, transpose_b in orders:
        ours = flops / timer.rlkit(lambda: rc.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)) / 1e12
        label = f"n = {n}{ORDERS[transpose_a, transpose_b]}"
        if not with_torch:
            rows.append(Row(table, label, "TFLOP/s", ours, None, "PyTorch", True, target))
            continue
        theirs = flops / timer.torch(lambda: torch.mm(ta.T if transpose_a else ta, tb.T if transpose_b else tb),
                                     args.torch_device) / 1e12
        rows.append(Row(table, label, "TFLOP/s", ours, theirs, f"{library} {dtype.upper()}", True, target))
        target = None  # the target is the plain order's
    if dtype == "f32" and with_torch and args.torch_device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # the tensor-core f32 path, for reference only
        tf32 = flops / timer.torch(lambda: torch.mm(ta, tb), args.torch_device) / 1e12
        torch.backends.cuda.matmul.allow_tf32 = False
        rows.append(Row(table, f"n = {n}, against TF32", "TFLOP/s", rows[0].rlkit, tf32, "cuBLAS TF32", True))
    return rows


# ---- per-dispatch cost ----------------------------------------------------------------------------

def bench_dispatch(n_ops: int, size: int, args, timer: Timer) -> list[Row]:
    """Microseconds per op of a chain of ``n_ops`` adds on a size x size tensor, ending in a sum
    read on the host: eager and captured against eager and a CUDA graph."""
    x_np = np.full((size, size), 1e-3, np.float32)
    x = rc.tensor(x_np, device=args.device)

    def chain(add, start):
        y = start
        for _ in range(n_ops):
            y = add(y, start)
        return y

    captured = rc.capture(lambda: rc.sum(chain(rc.add, x)))
    eager = timer.rlkit(lambda: rc.sum(chain(rc.add, x)).numpy()) / n_ops * 1e6
    replayed = timer.rlkit(captured) / n_ops * 1e6
    label = f"{n_ops} adds of {size} x {size}, then a sum read on the host"
    rows = {"eager": Row("dispatch", f"{label}: eager", "us per op", eager, None, "PyTorch eager", False),
            "captured": Row("dispatch", f"{label}: rlkit captured, PyTorch CUDA graph", "us per op", replayed, None,
                            "PyTorch CUDA graph", False)}
    if torch is None or args.no_torch:
        return list(rows.values())
    tx = torch.from_numpy(x_np).to(args.torch_device)
    rows["eager"].torch = timer.torch(lambda: torch.sum(chain(torch.add, tx)).item(), args.torch_device) / n_ops * 1e6
    if args.torch_device == "cuda":
        graph = cuda_graphed(lambda: (torch.sum(chain(torch.add, tx)),))
        rows["captured"].torch = timer.torch(lambda: graph()[0].item(), "cuda") / n_ops * 1e6
    else:
        rows["captured"].notes = not_measured("CUDA graphs need --torch-device cuda")
    return list(rows.values())


# ---- the PyTorch side of the RL updates ---------------------------------------------------------

TorchModule = torch.nn.Module if torch is not None else object  # the classes below are built only with torch


class TorchMLP(TorchModule):
    """Linear layers between ``sizes``, ReLU between them (and after the last when asked): the
    same layers as rlkit.agents.networks.mlp, listed in the same order."""

    def __init__(self, sizes: tuple[int, ...], final_activation: bool):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in itertools.pairwise(sizes))
        self.final_activation = final_activation

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if self.final_activation or i < len(self.layers) - 1:
                x = torch.relu(x)
        return x


class TorchGaussianActor(TorchModule):
    """rlkit.agents.sac.GaussianActor in PyTorch: a trunk, then mean and clamped log std of a
    Gaussian squashed by tanh."""

    def __init__(self, n_obs: int, n_actions: int, hidden: tuple[int, ...]):
        super().__init__()
        self.trunk = TorchMLP((n_obs, *hidden), final_activation=True)
        self.mu = TorchMLP((hidden[-1], n_actions), final_activation=False)
        self.log_std = TorchMLP((hidden[-1], n_actions), final_activation=False)

    def sample(self, obs, eps):
        """(action [B, actions], log-probability [B, 1]) for the standard normal noise ``eps``."""
        from rlkit.agents.sac import HALF_LOG_TWO_PI, LOG_STD_MAX, LOG_STD_MIN

        features = self.trunk(obs)
        mu = self.mu(features)
        log_std = torch.clamp(self.log_std(features), LOG_STD_MIN, LOG_STD_MAX)
        u = mu + torch.exp(log_std) * eps
        gaussian = -0.5 * eps.square() - log_std - HALF_LOG_TWO_PI
        squash = 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))  # log(1 - tanh(u)^2), stably
        return torch.tanh(u), torch.sum(gaussian - squash, dim=1, keepdim=True)


class TorchCritics(TorchModule):
    """rlkit.agents.td3.Critics in PyTorch: ``n`` MLPs on the observation and action side by side."""

    def __init__(self, n: int, n_obs: int, n_actions: int, hidden: tuple[int, ...]):
        super().__init__()
        self.critics = torch.nn.ModuleList(TorchMLP((n_obs + n_actions, *hidden, 1), False) for _ in range(n))

    def forward(self, obs, action) -> list:
        stacked = torch.cat([obs, action], dim=1)
        return [critic(stacked) for critic in self.critics]

    def min(self, obs, action):
        return torch.stack(self(obs, action)).min(dim=0).values


class TorchReplay:
    """Transitions held on the device as [capacity, features] tensors, sampled uniformly there."""

    def __init__(self, transitions: dict[str, np.ndarray], device: str):
        self.data = {k: torch.from_numpy(v).to(device) for k, v in transitions.items()}
        self.stored = len(transitions["obs"])
        self.device = device

    def sample(self, batch_size: int) -> dict:
        index = torch.randint(0, self.stored, (batch_size,), device=self.device)
        return {k: v[index] for k, v in self.data.items()}


def random_transitions(n_obs: int, n_actions: int, discrete: bool, steps: int, seed: int = 0) -> dict:
    """Random transitions of an agent's shapes, rows of [steps, features]."""
    rng = np.random.default_rng(seed)
    if discrete:
        action = rng.integers(0, n_actions, (steps, 1)).astype(np.int64)
    else:
        action = rng.uniform(-1, 1, (steps, n_actions)).astype(np.float32)
    return {"obs": rng.standard_normal((steps, n_obs)).astype(np.float32), "action": action,
            "reward": rng.standard_normal((steps, 1)).astype(np.float32),
            "next_obs": rng.standard_normal((steps, n_obs)).astype(np.float32),
            "done": (rng.random((steps, 1)) < 0.05).astype(np.float32)}


def fill_agent_buffer(agent, transitions: dict) -> None:
    """The transitions written into an rlkit agent's replay buffer, one step at a time."""
    with agent.on_device():
        for t in range(len(transitions["obs"])):
            agent.buffer.add(transitions["obs"][t:t + 1], transitions["action"][t:t + 1],
                             transitions["reward"][t], transitions["next_obs"][t:t + 1],
                             transitions["done"][t] > 0, np.zeros(1, bool))


def copy_weights(target, source: rc.nn.Module) -> None:
    """An rlkit module's weights into the PyTorch module built to mirror it (same layer order)."""
    ours = list(source.parameters().values())
    theirs = list(target.parameters())
    if len(ours) != len(theirs):
        raise ValueError(f"copy_weights: {len(ours)} rlkit parameters against {len(theirs)} PyTorch ones")
    with torch.no_grad():
        for p, value in zip(theirs, ours):
            array = np.asarray(value.numpy(), np.float32).reshape(p.shape)  # a bias is [out, 1] in rlkit
            p.copy_(torch.from_numpy(array))


class TorchDQN:
    """DQN's gradient step in PyTorch: Huber loss of Q(s, a) against r + discount (1 - done)
    max_a' Q_target(s', a'), global-norm clipping, Adam."""

    def __init__(self, agent: DQN, device: str, capturable: bool):
        cfg = agent.config
        sizes = (agent.n_obs, *cfg.net_arch, agent.n_actions)
        self.q, self.target = TorchMLP(sizes, False), TorchMLP(sizes, False)
        copy_weights(self.q, agent.q)
        copy_weights(self.target, agent.target)
        self.q.to(device)
        self.target.to(device)
        self.gamma, self.max_grad_norm, self.batch_size = cfg.gamma, cfg.max_grad_norm, cfg.batch_size
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=cfg.learning_rate, capturable=capturable)

    def update(self, batch: dict) -> tuple:
        """(loss, gradient norm before clipping) of one step on ``batch``."""
        with torch.no_grad():
            next_q = self.target(batch["next_obs"]).max(dim=1, keepdim=True).values
            td_target = batch["reward"] + self.gamma * (1.0 - batch["done"]) * next_q
        q_taken = self.q(batch["obs"]).gather(1, batch["action"])
        loss = F.huber_loss(q_taken, td_target, delta=1.0)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.q.parameters(), self.max_grad_norm)
        self.optimizer.step()
        return loss, norm


class TorchSAC:
    """SAC's gradient step in PyTorch, in rlkit's order: alpha read, the critics' update
    against the soft target, the actor's update against the updated critics, the entropy
    coefficient's update, the polyak update of the target critics."""

    def __init__(self, agent: SAC, device: str, capturable: bool):
        cfg = agent.config
        n_obs, n_actions, hidden = agent.n_obs, agent.n_actions, cfg.net_arch
        self.actor = TorchGaussianActor(n_obs, n_actions, hidden)
        self.critic = TorchCritics(cfg.n_critics, n_obs, n_actions, hidden)
        self.critic_target = TorchCritics(cfg.n_critics, n_obs, n_actions, hidden)
        copy_weights(self.actor, agent.actor)
        copy_weights(self.critic, agent.critic)
        copy_weights(self.critic_target, agent.critic_target)
        for module in (self.actor, self.critic, self.critic_target):
            module.to(device)
        self.log_alpha = torch.tensor(float(agent.ent_coef.log_alpha.numpy().reshape(-1)[0]), device=device,
                                      requires_grad=True)
        self.gamma, self.tau, self.target_entropy = cfg.gamma, cfg.tau, agent.target_entropy
        self.batch_size, self.n_actions = cfg.batch_size, n_actions
        adam = {"lr": cfg.learning_rate, "capturable": capturable}
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), **adam)
        self.critic_optimizer = torch.optim.Adam(self.critic.parameters(), **adam)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], **adam)
        self.critic_params, self.target_params = list(self.critic.parameters()), list(self.critic_target.parameters())

    def update(self, batch: dict, next_eps, eps) -> tuple:
        """(critic loss, actor loss, alpha, entropy-coefficient loss) of one step on ``batch``,
        with the policy's noise ``next_eps`` (for the target) and ``eps`` (for the actor loss)."""
        alpha = self.log_alpha.detach().exp()
        with torch.no_grad():
            next_action, next_log_prob = self.actor.sample(batch["next_obs"], next_eps)
            next_q = self.critic_target.min(batch["next_obs"], next_action) - alpha * next_log_prob
            target = batch["reward"] + self.gamma * (1.0 - batch["done"]) * next_q
        critic_loss = 0.5 * sum(F.mse_loss(q, target) for q in self.critic(batch["obs"], batch["action"]))
        self.critic_optimizer.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_optimizer.step()

        action, log_prob = self.actor.sample(batch["obs"], eps)
        actor_loss = torch.mean(alpha * log_prob - self.critic.min(batch["obs"], action))
        self.actor_optimizer.zero_grad(set_to_none=True)
        actor_loss.backward(inputs=list(self.actor.parameters()))  # the critics keep their own gradients
        self.actor_optimizer.step()

        alpha_loss = -torch.mean(self.log_alpha * (log_prob.detach() + self.target_entropy))
        self.alpha_optimizer.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.alpha_optimizer.step()
        with torch.no_grad():
            torch._foreach_lerp_(self.target_params, self.critic_params, self.tau)
        return critic_loss, actor_loss, alpha, alpha_loss


def torch_update_calls(make, sample_and_update, args, timer: Timer, row_eager: Row, row_graph: Row) -> None:
    """Fills the PyTorch figures of an update's two rows: eager, and as a CUDA graph on CUDA."""
    eager = sample_and_update(make(capturable=False))
    row_eager.torch = timer.torch(lambda: eager()[0].item(), args.torch_device) * 1e6
    if args.torch_device != "cuda":
        row_graph.notes = not_measured("CUDA graphs need --torch-device cuda")
        return
    graph = cuda_graphed(sample_and_update(make(capturable=True)))
    row_graph.torch = timer.torch(lambda: graph()[0].item(), "cuda") * 1e6


def rlkit_update_rows(name: str, agent, args, timer: Timer) -> tuple[Row, Row]:
    """The agent's captured update timed as it runs in training (outputs read each call), as
    two rows for the two PyTorch references."""
    def call():
        with agent.on_device():
            return agent._train(1)

    ours = timer.rlkit(call) * 1e6
    notes = {}
    if args.device == "gpu":
        rc.gpu_stats(reset=True)
        call()
        notes["dispatches per update"] = rc.gpu_stats().get("dispatches", 0)
    return (Row("RL updates", f"{name}: rlkit captured, PyTorch eager", "us per update", ours, None,
                "PyTorch eager", False, 3.0, dict(notes)),
            Row("RL updates", f"{name}: rlkit captured, PyTorch CUDA graph", "us per update", ours, None,
                "PyTorch CUDA graph", False, 1.0, dict(notes)))


def bench_sac(args, timer: Timer) -> list[Row]:
    """SAC's update on Pendulum-v1 shapes (obs 3, action 1), as the agent captures it."""
    agent = SAC("Pendulum-v1", seed=0, device=args.device)
    transitions = random_transitions(agent.n_obs, agent.n_actions, False, BUFFER_STEPS)
    fill_agent_buffer(agent, transitions)
    rows = rlkit_update_rows("SAC update, actor + 2 critics 256-256, batch 256", agent, args, timer)
    if torch is not None and not args.no_torch:
        replay = TorchReplay(transitions, args.torch_device)

        def sample_and_update(learner: TorchSAC):
            shape = (learner.batch_size, learner.n_actions)
            return lambda: learner.update(replay.sample(learner.batch_size),
                                          torch.randn(shape, device=args.torch_device),
                                          torch.randn(shape, device=args.torch_device))

        torch_update_calls(lambda capturable: TorchSAC(agent, args.torch_device, capturable), sample_and_update,
                           args, timer, *rows)
    return list(rows)


def bench_dqn(args, timer: Timer) -> list[Row]:
    """DQN's update on CartPole-v1 shapes (obs 4, 2 actions), as the agent captures it, with RL
    Zoo's settings (DQNConfig's defaults: the 1-step max target TorchDQN computes)."""
    agent = DQN("CartPole-v1", DQNConfig(), seed=0, device=args.device)
    transitions = random_transitions(agent.n_obs, agent.n_actions, True, BUFFER_STEPS)
    fill_agent_buffer(agent, transitions)
    rows = rlkit_update_rows("DQN update, 4-256-256-2, batch 64", agent, args, timer)
    if torch is not None and not args.no_torch:
        replay = TorchReplay(transitions, args.torch_device)

        def sample_and_update(learner: TorchDQN):
            return lambda: learner.update(replay.sample(learner.batch_size))

        torch_update_calls(lambda capturable: TorchDQN(agent, args.torch_device, capturable), sample_and_update,
                           args, timer, *rows)
    return list(rows)


# ---- a wide MLP -----------------------------------------------------------------------------------

def bench_mlp(width: int, batch: int, args, timer: Timer) -> list[Row]:
    """One training step (forward, backward, Adam, the loss read on the host) of a
    width-``width`` MLP with three layers on device-held data: rlkit captured against PyTorch
    eager and a CUDA graph."""
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((width, batch)).astype(np.float32)  # rlkit's [features, batch]
    y_np = rng.standard_normal((width, batch)).astype(np.float32)
    previous = rc.device(args.device)
    model = mlp_of_width(width)
    optimizer = rc.optim.Adam(model.parameters(), lr=1e-4)
    x, y = rc.tensor(x_np), rc.tensor(y_np)
    step = rc.capture_step(lambda: rc.mse_loss(model(x), y), model.parameters(), optimizer)
    rc.device(previous)
    ours = timer.rlkit(on_device(step, args.device)) * 1e3
    label = f"MLP {width}-{width}-{width}-{width}, batch {batch}, Adam step"
    rows = [Row("MLP", f"{label}: rlkit captured, PyTorch eager", "ms per step", ours, None, "PyTorch eager", False),
            Row("MLP", f"{label}: rlkit captured, PyTorch CUDA graph", "ms per step", ours, None,
                "PyTorch CUDA graph", False)]
    if torch is None or args.no_torch:
        return rows
    tx = torch.from_numpy(np.ascontiguousarray(x_np.T)).to(args.torch_device)
    ty = torch.from_numpy(np.ascontiguousarray(y_np.T)).to(args.torch_device)

    def make_step(capturable: bool):
        net = torch_mlp_of_width(width, args.torch_device)
        opt = torch.optim.Adam(net.parameters(), lr=1e-4, capturable=capturable)

        def train_step():
            loss = F.mse_loss(net(tx), ty)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return (loss,)

        return train_step

    eager = make_step(capturable=False)
    rows[0].torch = timer.torch(lambda: eager()[0].item(), args.torch_device) * 1e3
    if args.torch_device == "cuda":
        graph = cuda_graphed(make_step(capturable=True))
        rows[1].torch = timer.torch(lambda: graph()[0].item(), "cuda") * 1e3
    else:
        rows[1].notes = not_measured("CUDA graphs need --torch-device cuda")
    return rows


def bench_mixed_mlp(width: int, batch: int, dtype: str, args, timer: Timer) -> list[Row]:
    """bench_mlp's step in mixed precision, each library its own way: rlkit's parameters and
    activations in ``dtype`` (f16 or bf16) with f32 master weights in Adam, the loss in f32;
    PyTorch's f32 parameters under ``torch.autocast`` to ``dtype``. For f16 both scale the loss
    dynamically (rlkit's ``loss_scale="dynamic"``, PyTorch's GradScaler, as its AMP recipe); bf16
    needs no scaling. PyTorch eager only: GradScaler's step reads its inf check on the host."""
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((width, batch)).astype(np.float32)
    y_np = rng.standard_normal((width, batch)).astype(np.float32)
    scaled = dtype == "f16"
    previous_device, previous_dtype = rc.device(args.device), rc.dtype(dtype)
    model = mlp_of_width(width)
    rc.dtype(previous_dtype)
    optimizer = rc.optim.Adam(model.parameters(), lr=1e-4, master_weights=True,
                              loss_scale="dynamic" if scaled else None)
    x, y = rc.tensor(x_np, dtype=dtype), rc.tensor(y_np)
    step = rc.capture_step(lambda: rc.mse_loss(rc.cast(model(x), "f32"), y), model.parameters(), optimizer)
    rc.device(previous_device)
    ours = timer.rlkit(on_device(step, args.device)) * 1e3
    scaling = ", dynamic loss scale" if scaled else ""
    row = Row("MLP", f"MLP {width}-{width}-{width}-{width}, batch {batch}, Adam step, mixed precision {dtype}"
                     f"{scaling}: rlkit f32 master weights, PyTorch autocast", "ms per step", ours, None,
              f"PyTorch autocast {dtype}", False)
    if torch is None or args.no_torch:
        return [row]
    tx = torch.from_numpy(np.ascontiguousarray(x_np.T)).to(args.torch_device)
    ty = torch.from_numpy(np.ascontiguousarray(y_np.T)).to(args.torch_device)
    net = torch_mlp_of_width(width, args.torch_device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler(args.torch_device, enabled=scaled)
    torch_dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]

    def train_step():
        with torch.autocast(args.torch_device, dtype=torch_dtype):
            loss = F.mse_loss(net(tx).float(), ty)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    row.torch = timer.torch(lambda: train_step().item(), args.torch_device) * 1e3
    return [row]


def mlp_of_width(width: int) -> rc.nn.Module:
    """bench_mlp's network in rlkit (its parameters in the current default dtype)."""
    return rc.nn.Sequential(rc.nn.Linear(width, width, activation="relu"),
                            rc.nn.Linear(width, width, activation="relu"), rc.nn.Linear(width, width))


def torch_mlp_of_width(width: int, device: str):
    """The same network in PyTorch, f32 parameters on ``device``."""
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, width)).to(device)


def on_device(fn, device: str):
    """``fn`` called with ``device`` as rlkit's default device."""
    def call():
        previous = rc.device(device)
        try:
            return fn()
        finally:
            rc.device(previous)

    return call


# ---- the equivalence check ------------------------------------------------------------------------

def eager_draws(agent, n_noise: int) -> tuple[dict, list[np.ndarray]]:
    """The batch and the policy noise the agent's next captured update will draw: its random
    ops replayed eagerly in the program's order (one fresh stream per random op), the engine's
    generator state restored afterwards so that the update draws the same streams."""
    state = rc.get_rng_state()
    with agent.on_device():
        s = agent.buffer.sample_on_device(agent.config.batch_size, len(agent.buffer))
        batch = {name: getattr(s, name).numpy().T.copy() for name in ("obs", "action", "reward", "next_obs", "done")}
        noise = [rc.randn((agent.n_actions, agent.config.batch_size)).numpy().T.copy() for _ in range(n_noise)]
    rc.set_rng_state(state)
    return batch, noise


def require_close(name: str, ours: float, theirs: float) -> str:
    """``name``'s two values, or SystemExit when they differ by more than the tolerance."""
    if not abs(ours - theirs) <= CHECK_TOLERANCE * max(1.0, abs(theirs)):
        raise SystemExit(f"check failed: {name} is {ours:.7g} in rlkit and {theirs:.7g} in PyTorch "
                         f"(tolerance {CHECK_TOLERANCE}): the PyTorch update no longer computes rlkit's")
    return f"{name} {ours:.6g} / {theirs:.6g}"


def largest_difference(ours: rc.nn.Module, theirs) -> float:
    """The largest absolute difference between an rlkit module's weights and its PyTorch mirror's."""
    return max(float(np.abs(np.asarray(w.numpy(), np.float32).reshape(p.shape) - p.detach().numpy()).max())
               for w, p in zip(ours.parameters().values(), theirs.parameters()))


def check_dqn() -> str:
    """One DQN update from the same weights and batch in rlkit (the agent's captured step) and
    in PyTorch, on the CPU: the losses, gradient norms and updated weights agree. RL Zoo's
    settings (DQNConfig's defaults), whose 1-step max target TorchDQN computes; DQN made on
    CartPole-v1 without a config would take double-Q 3-step targets (DQN.env_defaults)."""
    agent = DQN("CartPole-v1", DQNConfig(), seed=0, device="cpu")
    fill_agent_buffer(agent, random_transitions(agent.n_obs, agent.n_actions, True, BUFFER_STEPS))
    learner = TorchDQN(agent, "cpu", capturable=False)
    batch, _ = eager_draws(agent, 0)
    batch["action"] = batch["action"].astype(np.int64)
    with agent.on_device():
        ((loss, norm),) = agent._gradient_steps(1, {"stored": np.array([[len(agent.buffer)]], np.float32)})
    their_loss, their_norm = learner.update({k: torch.from_numpy(v) for k, v in batch.items()})
    parts = [require_close("loss", loss, their_loss.item()), require_close("gradient norm", norm, their_norm.item()),
             require_close("largest weight difference after the step", largest_difference(agent.q, learner.q), 0.0)]
    return "DQN: " + ", ".join(parts)


def check_sac() -> str:
    """One SAC update from the same weights, batch and policy noise in rlkit and PyTorch, on
    the CPU: the critic, actor and entropy-coefficient losses and the updated weights agree."""
    agent = SAC("Pendulum-v1", seed=0, device="cpu")
    fill_agent_buffer(agent, random_transitions(agent.n_obs, agent.n_actions, False, BUFFER_STEPS))
    learner = TorchSAC(agent, "cpu", capturable=False)
    batch, (next_eps, eps) = eager_draws(agent, 2)
    with agent.on_device():
        ours = agent._train(1)
    theirs = learner.update({k: torch.from_numpy(v) for k, v in batch.items()}, torch.from_numpy(next_eps),
                            torch.from_numpy(eps))
    names = ("train/critic_loss", "train/actor_loss", "train/ent_coef", "train/ent_coef_loss")
    parts = [require_close(name.split("/")[1], ours[name], value.item()) for name, value in zip(names, theirs)]
    parts.append(require_close("log alpha after the step", float(agent.ent_coef.log_alpha.numpy().reshape(-1)[0]),
                               learner.log_alpha.item()))
    for name, module, mirror in (("actor", agent.actor, learner.actor), ("critics", agent.critic, learner.critic),
                                 ("target critics", agent.critic_target, learner.critic_target)):
        parts.append(require_close(f"largest {name} weight difference after the step",
                                   largest_difference(module, mirror), 0.0))
    return "SAC: " + ", ".join(parts)


def check_equivalence() -> list[str]:
    """Both checks, on the CPU (where both libraries compute in f32 without tensor cores)."""
    torch.manual_seed(0)
    return [check_dqn(), check_sac()]


# ---- report ---------------------------------------------------------------------------------------

def describe_machine(args) -> dict:
    rlkit_device = next(d["name"] for d in rc.devices() if d["device"] == args.device)
    info = {"rlkit device": f"{args.device} ({rlkit_device})", "host": platform.node(),
            "numpy": np.__version__}
    if torch is not None and not args.no_torch:
        name = torch.cuda.get_device_name() if args.torch_device == "cuda" else platform.processor() or "cpu"
        info["torch"] = f"{torch.__version__} on {args.torch_device} ({name})"
    return info


def format_value(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def markdown(rows: list[Row], machine: dict, args) -> str:
    lines = ["Machine: " + "; ".join(f"{k} {v}" for k, v in machine.items()) + ".",
             f"Median of {args.repeats} rounds; speed ratio = rlkit's speed over PyTorch's (above 1: rlkit faster)."]
    for table in dict.fromkeys(row.table for row in rows):
        lines += ["", f"| {table} | unit | rlkit | PyTorch | reference | speed ratio | target |",
                  "|---|---|---|---|---|---|---|"]
        for row in (r for r in rows if r.table == table):
            ratio = row.speed_ratio
            target = "-" if row.target is None else f">= {row.target:g}x"
            if ratio is not None and row.target is not None:
                target += " (met)" if ratio >= row.target else " (not met)"
            extra = "; ".join(f"{k}: {v}" for k, v in row.notes.items())
            label = row.label + (f" ({extra})" if extra else "")
            lines.append(f"| {label} | {row.unit} | {format_value(row.rlkit)} | {format_value(row.torch)} | "
                         f"{row.reference} | {'-' if ratio is None else f'{ratio:.2f}x'} | {target} |")
    return "\n".join(lines)


def write_section(path: str, text: str, marker: str = "bench_gpu_torch") -> None:
    """``text`` between the ``marker`` comments of the markdown file at ``path``."""
    begin, end = f"<!-- {marker} begin -->", f"<!-- {marker} end -->"
    with open(path) as f:
        doc = f.read()
    if begin not in doc or end not in doc:
        raise SystemExit(f"{path} has no {begin} ... {end} section to fill")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w") as f:
        f.write(f"{head}{begin}\n{text}\n{end}{tail}")


# ---- where an update's GPU time goes ---------------------------------------------------------------

LEVEL_UPDATES = 300  # updates a level table averages over


def level_table(name: str, agent) -> str:
    """The agent's captured update recorded with GPU timestamps after every dependency level (on
    the CPU: timed node by node), run LEVEL_UPDATES times: for each of its programs (TD3's: with
    and without the delayed actor update), each level's mean microseconds and its kernels
    (shader[workgroups]; on the CPU, the op and its output's shape), then the same times summed
    by kernel, the costliest first."""
    set_profiling = _native.set_cpu_profiling if agent.device == "cpu" else _native.set_gpu_profiling
    if set_profiling(True) is False:
        return f"{name}: this GPU cannot time its queue"
    try:
        for captured in agent._captured_programs():
            captured.reset()  # re-recorded with timestamps at the next call
        with agent.on_device():
            for _ in range(LEVEL_UPDATES):
                agent._train(1)
    finally:
        set_profiling(False)
    programs = [program for captured in agent._captured_programs() for program in captured._programs.values()]
    return "\n".join(program_tables(name if len(programs) == 1 else f"{name} (program {k + 1} of {len(programs)})",
                                     program.native.level_times()) for k, program in enumerate(programs))


def program_tables(title: str, levels: list[tuple[float, str]]) -> str:
    """The level table and the by-kernel table of one program's (microseconds, kernels) levels."""
    lines = [f"### {title}", "", "| level | us | kernels |", "|---|---|---|"]
    by_kernel: dict[str, list[float]] = {}
    for level, (us, label) in enumerate(levels):
        lines.append(f"| {level} | {us:.1f} | {label} |")
        by_kernel.setdefault(label, []).append(us)
    total = sum(us for us, _ in levels)
    lines += [f"| all | {total:.1f} | |", "",
              "| kernels | levels | us each | us in all | share |", "|---|---|---|---|---|"]
    spent = {label: sum(times) for label, times in by_kernel.items()}
    for label in sorted(spent, key=lambda label: -spent[label]):
        lines.append(f"| {label} | {len(by_kernel[label])} | {spent[label] / len(by_kernel[label]):.1f} | "
                     f"{spent[label]:.1f} | {spent[label] / max(total, 1e-9):.0%} |")
    return "\n".join(lines) + "\n"


def level_tables(args) -> str:
    """Level tables of the captured SAC, DQN and TD3 updates (timestamps cost a little: these
    figures are for finding where the time goes, not for the tables above)."""
    tables = []
    continuous = args.levels_env
    for name, agent_class, env in ((f"SAC update ({continuous})", SAC, continuous), ("DQN update", DQN, "CartPole-v1"),
                                   (f"TD3 update ({continuous})", TD3, continuous)):
        agent = agent_class(env, seed=0, device=args.device)
        discrete = agent_class is DQN
        fill_agent_buffer(agent, random_transitions(agent.n_obs, agent.n_actions, discrete, BUFFER_STEPS))
        tables.append(level_table(name, agent))
    return "\n".join(tables)


# ---- main -----------------------------------------------------------------------------------------

def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "gpu"), default="gpu", help="rlkit's device")
    parser.add_argument("--torch-device", choices=("cpu", "cuda"), default="cuda", help="PyTorch's device")
    parser.add_argument("--sizes", default="1024,2048,4096,8192", help="matmul sizes n, comma separated")
    parser.add_argument("--repeats", type=int, default=9, help="rounds per figure (the median is reported)")
    parser.add_argument("--warmup", type=int, default=10, help="calls before each figure's rounds")
    parser.add_argument("--round-seconds", type=float, default=0.2, help="about how long one round lasts")
    parser.add_argument("--transposes", action="store_true",
                        help="also time f16 and bf16 matmul with transposed operands (A^T B, A B^T, A^T B^T)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: tiny sizes (matmul 64 and 128, 50 adds, an MLP of width 64), 3 rounds")
    parser.add_argument("--no-torch", action="store_true", help="rlkit's figures only (the PyTorch columns empty)")
    parser.add_argument("--check", action="store_true", help="only check that the PyTorch updates compute rlkit's")
    parser.add_argument("--levels", action="store_true",
                        help="only print where the captured updates' time goes (SAC, DQN, TD3), per dependency level "
                             "(on the CPU: per node) and per kernel")
    parser.add_argument("--levels-env", default="Pendulum-v1",
                        help="with --levels: the environment whose shapes SAC's and TD3's updates take "
                             "(HalfCheetah-v5: RL Zoo's MuJoCo benchmark; DQN's stays CartPole-v1)")
    parser.add_argument("--out", help="also write the rows as JSON to this path")
    parser.add_argument("--markdown", help="also write the tables into this file, between the bench_gpu_torch markers")
    args = parser.parse_args(argv)
    try:
        args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if not args.sizes or min(args.sizes) < 1:
        parser.error("--sizes needs at least one positive size")
    if args.repeats < 1 or args.warmup < 1 or not args.round_seconds > 0:
        parser.error("--repeats and --warmup must be at least 1, --round-seconds positive")
    if args.quick:
        args.sizes, args.repeats, args.warmup, args.round_seconds = [64, 128], 3, 2, 0.02
    if args.device not in {d["device"] for d in rc.devices()}:
        parser.error("--device gpu: no GPU here (the Vulkan backend is unavailable)")
    if args.levels:
        import gymnasium as gym

        try:
            action_space = gym.make(args.levels_env).action_space
        except gym.error.Error as error:
            parser.error(f"--levels-env {args.levels_env}: {error}")
        if not isinstance(action_space, gym.spaces.Box):
            parser.error(f"--levels-env needs an environment with Box actions (SAC and TD3 train on it), "
                         f"got {args.levels_env} with {action_space}")
    if args.check and args.no_torch:
        parser.error("--check compares with PyTorch: it cannot go with --no-torch")
    needs_torch = (args.check or not args.no_torch) and not args.levels
    if needs_torch and torch is None:
        parser.error("PyTorch is not installed: install it, or pass --no-torch for rlkit's figures alone")
    if needs_torch and args.torch_device == "cuda" and not args.check and not torch.cuda.is_available():
        parser.error("--torch-device cuda: PyTorch sees no CUDA device")
    return args


def run(args) -> tuple[list[Row], dict]:
    """Every measurement, in the order of the tables."""
    if torch is not None and not args.no_torch:
        torch.backends.cuda.matmul.allow_tf32 = False  # f32 means f32 on both sides
        torch.set_num_threads(rc.get_num_threads())
    timer = Timer(args.repeats, args.warmup, args.round_seconds)
    rows = []
    for dtype in ("f32", "f16", "bf16"):
        for n in args.sizes:
            rows += bench_matmul(n, dtype, args, timer)
    rows += bench_dispatch(50 if args.quick else 1000, 32 if args.quick else 256, args, timer)
    rows += bench_sac(args, timer)
    rows += bench_dqn(args, timer)
    width = 64 if args.quick else 4096
    rows += bench_mlp(width, width, args, timer)
    if args.device == "gpu":  # (the CPU has no f16 or bf16 products of its own: they are widened)
        for dtype in ("f16", "bf16"):
            rows += bench_mixed_mlp(width, width, dtype, args, timer)
    return rows, describe_machine(args)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.levels:
        print(level_tables(args))
        return
    checks = [] if args.no_torch else check_equivalence()
    for line in checks:
        print("check passed:", line)
    if args.check:
        return
    rows, machine = run(args)
    text = markdown(rows, machine, args)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": machine, "checks": checks, "args": {k: v for k, v in vars(args).items()},
                       "rows": [dict(asdict(row), speed_ratio=row.speed_ratio) for row in rows]}, f, indent=1)
    if args.markdown:
        write_section(args.markdown, text)


if __name__ == "__main__":
    main()
