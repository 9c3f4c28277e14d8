"""rlkit.core.parallel: the one-rank communicator, gradient buckets, and real jobs under mpiexec
(mpich from PyPI): N ranks at batch B end with the parameters of one rank at batch N*B; a rank
that dies ends the job with an error instead of a hang; `rlkit launch`; dp_train and its demo."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import rlkit.core as rc
from rlkit import cli
from rlkit.core import nn, parallel

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "mpi"))
import equivalence  # noqa: E402  (tests/mpi/equivalence.py, also run under mpiexec)
import trainer as trainer_script  # noqa: E402  (tests/mpi/trainer.py, likewise)
from conftest import DEVICES  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RLKIT_HOME = os.path.dirname(os.path.dirname(os.path.abspath(rc.__file__)))  # the rlkit under test


def mpi_run(n: int, script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs a script as n ranks, as `rlkit launch` does, with the rlkit under test importable."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [RLKIT_HOME, os.environ.get("PYTHONPATH")])))
    # Open MPI's mpiexec refuses to start as root (a container's user) unless told; MPICH ignores these
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    command = cli.mpiexec_command(n, script, list(args))
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)


def test_a_script_run_without_mpiexec_is_one_rank():
    # in a subprocess: MPI is initialised once per process, and this one forks later tests
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [RLKIT_HOME, os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, "-c", "from rlkit.core import parallel; c = parallel.world(); "
                          "print(c.rank, c.size, c.is_root)"], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["0", "1", "True"]


def test_the_one_rank_communicator():
    comm = parallel.Communicator(None)
    values = np.arange(4.0)
    reduced = comm.all_reduce(values)
    np.testing.assert_array_equal(reduced, values)
    assert reduced is not values
    np.testing.assert_array_equal(comm.broadcast(values), values)
    assert comm.broadcast_object({"a": 1}) == {"a": 1}


def test_buckets_split_by_size_and_dtype():
    previous = rc.dtype("f64")
    try:
        wide = [rc.param(np.zeros((4, 4))) for _ in range(3)]  # 128 bytes each
    finally:
        rc.dtype(previous)
    narrow = [rc.param(np.zeros((4, 4))) for _ in range(2)]  # f32: 64 bytes each
    params = [wide[0], narrow[0], wide[1], wide[2], narrow[1]]
    buckets = parallel._buckets(params, bucket_bytes=256)
    assert [[params.index(p) for p in b] for b in buckets] == [[0, 2], [3], [1, 4]]
    assert [[params.index(p) for p in b] for b in parallel._buckets(params, bucket_bytes=1)] == [[0], [2], [1], [3], [4]]


def test_all_reduce_on_one_rank_keeps_the_gradients_and_fills_missing_ones_with_zeros():
    used, unused = rc.param(np.array([[1.0, -2.0]])), rc.param(np.ones((3, 1)))
    with rc.grad_tape():
        loss = rc.sum(rc.square(used))
    grads = rc.backward(loss)
    averaged = parallel.all_reduce_gradients(grads, [used, unused], parallel.Communicator(None))
    np.testing.assert_allclose(averaged[used], [[2.0, -4.0]])
    np.testing.assert_array_equal(averaged[unused], np.zeros((3, 1)))
    with pytest.raises(TypeError, match="expected the Gradients backward\\(\\) returned"):
        parallel.all_reduce_gradients({}, [used], parallel.Communicator(None))
    with pytest.raises(ValueError, match="bucket_bytes must be a positive int"):
        parallel.all_reduce_gradients(grads, [used], parallel.Communicator(None), bucket_bytes=0)


@pytest.mark.parametrize("n_ranks, batch_per_rank, device",
                         [(2, 4, "cpu"), (4, 2, "cpu"), pytest.param(2, 4, "gpu", marks=pytest.mark.requires_gpu)])
def test_n_ranks_at_batch_b_match_one_rank_at_batch_n_times_b(tmp_path, n_ranks, batch_per_rank, device):
    """Every rank on its own GPU where there are several (round robin), sharing one otherwise."""
    out = tmp_path / "ranks.npz"
    run = mpi_run(n_ranks, os.path.join(HERE, "mpi", "equivalence.py"), str(out), str(batch_per_rank), "6", device)
    assert run.returncode == 0, run.stderr
    saved = np.load(out)
    assert int(saved["size"]) == n_ranks
    previous = rc.device(device)
    try:
        state, losses = equivalence.train(parallel.Communicator(None), n_ranks * batch_per_rank, 6)
    finally:
        rc.device(previous)
    np.testing.assert_allclose(saved["losses"], losses, rtol=1e-5, atol=1e-6)
    for name, value in state.items():
        np.testing.assert_allclose(saved[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    assert losses[-1] < 0.5 * losses[0]  # it trained


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_a_rank_that_dies_ends_the_job_with_an_error(how):
    run = mpi_run(2, os.path.join(HERE, "mpi", "dies.py"), how, timeout=60)  # a hang fails by the timeout
    assert run.returncode != 0
    assert "rank 0 got past the all-reduce" not in run.stdout
    if how == "raise":
        assert "rank 1 of 2 failed with RuntimeError: replica 1 lost its data; aborting every rank" in run.stderr


def test_rlkit_launch_runs_the_ranks(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("from rlkit.core import parallel\n"
                      "c = parallel.world()\n"
                      "print(f'rank {c.rank} of {c.size} sum {int(c.all_reduce([c.rank])[0])}', flush=True)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [RLKIT_HOME, os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, "-m", "rlkit", "launch", "-n", "3", str(script)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert sorted(re.findall(r"rank \d+ of \d+ sum \d+", run.stdout)) == [  # the ranks' lines may interleave
        f"rank {r} of 3 sum 3" for r in range(3)]
    missing = subprocess.run([sys.executable, "-m", "rlkit", "launch", "-n", "2", str(tmp_path / "nope.py")], env=env,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "rlkit: error: no script" in missing.stderr


def regression_data(n=32, seed=3):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(2, 4))
    samples = []
    for _ in range(n):
        x = rng.normal(size=(4, 1))
        samples.append({"x": x, "y": w @ x})
    return samples


def test_dp_train_on_one_rank_is_adam_on_one_sample_at_a_time(capsys):
    data = regression_data()

    def make_model():
        rc.manual_seed(0)
        return nn.Sequential(nn.Linear(4, 8, activation="relu"), nn.Linear(8, 2))

    def forward(model, s):
        return model(rc.tensor(s["x"]))

    def loss(out, target):
        return rc.mse_loss(out, rc.tensor(target))

    result = rc.dp_train(make_model, data, loss_fn=loss, forward_fn=forward, target_fn=lambda s: s["y"],
                         n_iter=60, lr=0.01, max_norm=5.0, verbose=20, comm=parallel.Communicator(None))
    assert len(result.loss_history) == 60 and np.isfinite(result.loss_history).all()
    assert np.mean(result.loss_history[-20:]) < np.mean(result.loss_history[:20])
    printed = capsys.readouterr().out.splitlines()
    assert [line.split("  loss")[0] for line in printed] == [
        "[dp_train] iter    1 / 60", "[dp_train] iter   20 / 60", "[dp_train] iter   40 / 60", "[dp_train] iter   60 / 60"]
    # the same loop by hand: one sample per iteration, clipped, Adam
    model = make_model()
    optimizer = rc.optim.Adam(model.parameters(), lr=0.01)
    for i in range(60):
        with rc.grad_tape():
            value = loss(forward(model, data[i % len(data)]), data[i % len(data)]["y"])
        grads = rc.backward(value)
        rc.clip_grad_norm(model.parameters(), grads, 5.0)
        optimizer.step(grads)
    for (name, a), b in zip(result.params.items(), model.parameters().values()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7, err_msg=name)


def test_dp_train_refuses_bad_arguments():
    with pytest.raises(ValueError, match="n_iter must be a positive int"):
        rc.dp_train(lambda: None, [1], n_iter=0, comm=parallel.Communicator(None))
    with pytest.raises(ValueError, match="data must be a non-empty sequence"):
        rc.dp_train(lambda: None, [], comm=parallel.Communicator(None))


def test_dp_train_demo_passes_its_checks_with_1_2_and_4_replicas():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [RLKIT_HOME, os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, os.path.join(HERE, "..", "scripts", "dp_train_demo.py")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "all checks passed" in run.stdout


@pytest.mark.parametrize("device", DEVICES)
def test_distributed_trainer_on_2_ranks_matches_one_rank_at_twice_the_batch(tmp_path, device):
    """Trainer(distributed=True): shards of batch 4 on 2 ranks train as one rank on batches of 8
    (history and parameters); only rank 0 writes the TensorBoard events and the checkpoint."""
    ranks, single = tmp_path / "ranks", tmp_path / "single"
    ranks.mkdir()
    single.mkdir()
    run = mpi_run(2, os.path.join(HERE, "mpi", "trainer.py"), str(ranks), "4", device)
    assert run.returncode == 0, run.stderr
    previous = rc.device()
    try:
        trainer_script.run(str(single), 8, distributed=False, device=device)
    finally:
        rc.device(previous)
    got, expected = np.load(ranks / "result.npz"), np.load(single / "result.npz")
    assert set(got.files) == set(expected.files) and "val_mean_abs_error" in got.files
    for name in expected.files:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert len(list((ranks / "logs").iterdir())) == 1
    assert sorted(p.name for p in ranks.iterdir()) == ["last.ckpt", "logs", "result.npz"]


def test_distributed_trainer_wants_arrays_to_shard():
    from rlkit.train.trainer import _loader

    comm = parallel.Communicator(None)
    comm_of_two = type("Two", (), {"size": 2, "rank": 1})()
    loader = rc.DataLoader(np.zeros((2, 8)), np.zeros((1, 8)), batch_size=2)
    assert _loader(loader, 2, False, True, None, comm) is loader  # one rank: as it is
    with pytest.raises(TypeError, match="shards the data itself: pass an \\(x, y\\) tuple"):
        _loader(loader, 2, False, True, None, comm_of_two)
    shard = _loader((np.arange(14.0).reshape(2, 7), np.arange(7.0)), 1, False, True, None, comm_of_two)
    np.testing.assert_array_equal(shard.x.numpy(), [[1, 3, 5], [8, 10, 12]])  # columns 1, 3, 5 of the first 6


def test_apex_dqn_learner_trains_on_every_actor_transition(tmp_path):
    """learn_distributed with 2 actor ranks: the learner's buffer holds every step the actors
    took (one lane per actor), every rank ends with the learner's weights, and the policy plays
    CartPole far above a random one (about 22) after 12k steps."""
    out = tmp_path / "apex.npz"
    run = mpi_run(3, os.path.join(HERE, "mpi", "apex.py"), str(out), "12000", timeout=300)
    assert run.returncode == 0, run.stderr
    result = np.load(out)
    assert int(result["steps"]) == 12000 and int(result["stored"]) == 12000 and int(result["lanes"]) == 2
    assert len(set(result["checksums"].tolist())) == 1
    assert float(result["ret"]) > 100, float(result["ret"])


def test_learn_distributed_on_one_rank_is_learn():
    from rlkit.agents import DQN, DQNConfig
    from rlkit.agents.distributed import learn_distributed

    config = DQNConfig(learning_starts=50, train_freq=4, gradient_steps=1, net_arch=(16,), batch_size=16)
    agent = learn_distributed(lambda n_envs, seed: DQN("CartPole-v1", config, seed=seed), total_timesteps=200,
                              comm=parallel.Communicator(None))
    reference = DQN("CartPole-v1", config, seed=0).learn(200)
    assert agent.num_timesteps == reference.num_timesteps == 200
    for a, b in zip(agent._policy_parameters(), reference._policy_parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    with pytest.raises(ValueError, match="rollout_steps must be a positive int"):
        learn_distributed(lambda n_envs, seed: None, 100, rollout_steps=0, comm=parallel.Communicator(None))
