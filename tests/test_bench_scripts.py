"""The benchmark scripts run end to end in their smoke mode, and scripts/bench_gpu.py's PyTorch
updates compute what rlkit's agents compute (the check that makes its comparison honest).
Speeds are not asserted here: the scripts measure them."""

import importlib.util
import json
import os
import math
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def load_script(name: str):
    """A script imported as a module (registered under its name: dataclasses look it up)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench_gpu():
    return load_script("bench_gpu")


def test_bench_gpu_measures_rlkit_without_torch(bench_gpu, monkeypatch, tmp_path, capsys):
    """With PyTorch absent and --no-torch, every measurement still runs on rlkit's side: each
    figure positive and finite, the PyTorch columns empty, the tables printed and written."""
    monkeypatch.setattr(bench_gpu, "torch", None)
    out = tmp_path / "rows.json"
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("before\n<!-- bench_gpu_torch begin -->\nold\n<!-- bench_gpu_torch end -->\nafter\n")
    bench_gpu.main(["--quick", "--no-torch", "--device", "cpu", "--out", str(out), "--markdown", str(doc)])
    rows = json.loads(out.read_text())["rows"]
    labels = [row["label"] for row in rows]
    for size in (64, 128):
        assert sum(label == f"n = {size}" for label in labels) == 3  # f32, f16 and bf16
    for name in ("adds of 32 x 32", "SAC update", "DQN update", "MLP 64-64-64-64"):
        assert any(name in label for label in labels), name
    for row in rows:
        assert row["rlkit"] > 0 and math.isfinite(row["rlkit"]), row
        assert row["torch"] is None and row["speed_ratio"] is None, row
    printed = capsys.readouterr().out
    for table in ("| matmul f32 |", "| matmul f16 |", "| matmul bf16 |", "| dispatch |", "| RL updates |", "| MLP |"):
        assert table in printed
    written = doc.read_text()
    assert written.startswith("before\n<!-- bench_gpu_torch begin -->\nMachine: ") and written.endswith(
        "<!-- bench_gpu_torch end -->\nafter\n")
    assert "old" not in written


def test_bench_gpu_refuses_bad_arguments(bench_gpu):
    for argv in (["--sizes", "64,x"], ["--sizes", "0"], ["--repeats", "0"], ["--check", "--no-torch"]):
        with pytest.raises(SystemExit):
            bench_gpu.parse_args(argv)


def test_bench_gpu_speed_ratio_reads_above_one_where_rlkit_is_faster(bench_gpu):
    throughput = bench_gpu.Row("t", "l", "TFLOP/s", 2.0, 4.0, "ref", higher_is_better=True)
    time = bench_gpu.Row("t", "l", "us", 2.0, 4.0, "ref", higher_is_better=False)
    assert throughput.speed_ratio == 0.5 and time.speed_ratio == 2.0
    assert bench_gpu.Row("t", "l", "us", 2.0, None, "ref", higher_is_better=False).speed_ratio is None


def test_bench_gpu_torch_updates_match_rlkit_agents(bench_gpu):
    """One DQN and one SAC update from the same weights and batch: same losses (1e-4), same
    gradient norm and weights after the step (the script raises SystemExit otherwise)."""
    pytest.importorskip("torch")
    dqn, sac = bench_gpu.check_equivalence()
    assert dqn.startswith("DQN: loss ") and "gradient norm" in dqn
    assert sac.startswith("SAC: critic_loss ") and "log alpha after the step" in sac


def test_bench_gpu_check_catches_a_different_update(bench_gpu, monkeypatch):
    """A PyTorch DQN update with another discount fails the check: it can tell."""
    pytest.importorskip("torch")
    original = bench_gpu.TorchDQN.__init__

    def other_discount(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.gamma = 0.9

    monkeypatch.setattr(bench_gpu.TorchDQN, "__init__", other_discount)
    with pytest.raises(SystemExit, match="check failed: loss"):
        bench_gpu.check_dqn()


@pytest.mark.slow
def test_bench_recurrent_runs_both_modes(tmp_path, monkeypatch, capsys):
    """Speed rows for every agent of both pairs, and learning curves drawn with rlkit plot."""
    bench = load_script("bench_recurrent")
    monkeypatch.setattr(sys, "argv", ["bench_recurrent.py", "speed", "--steps", "40", "--repeats", "1"])
    bench.main()
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row.split(" | ")[1] for row in rows[1:]] == ["RecurrentDQN", "DQN", "RecurrentSAC", "SAC"]
    for row in rows[1:]:
        rate, update, step = (float(cell) for cell in row.split(" | ")[2:5])
        assert rate > 0 and update > 0 and step > 0, row
    plot = tmp_path / "curves.png"
    monkeypatch.setattr(sys, "argv", ["bench_recurrent.py", "curves", "--steps", "400", "--eval-every", "200",
                                      "--logdir", str(tmp_path / "runs"), "--plot", str(plot)])
    bench.main()
    out = capsys.readouterr().out
    assert "| 200 |" in out and "| 400 |" in out
    assert plot.stat().st_size > 1000  # a PNG with two curves


def test_bench_seeds_quick_prints_a_row_per_setting_with_each_seeds_final_evaluation(capsys):
    """--quick --zoo: a row for the defaults a user gets for each algorithm and one for RL Zoo's
    settings where those differ (DQN on CartPole-v1), each seed's final evaluation a return the
    environment can give, the settings column naming exactly the fields the defaults change."""
    bench = load_script("bench_seeds")
    assert bench.main(["--quick", "--zoo", "--seeds", "0,1"]) == 0  # no gate in a smoke run
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    header, rows = table[0].split(" | "), [row.split(" | ") for row in table[1:]]
    assert header[3:5] == ["seed 0", "seed 1"]
    assert [(row[0], row[1].split(" (")[0]) for row in rows] == [
        ("| DQN, CartPole-v1, 1.5k", "defaults"), ("| DQN, CartPole-v1, 1.5k", "RL Zoo's"),
        ("| SAC, Pendulum-v1, 0.3k", "defaults"), ("| TD3, Pendulum-v1, 0.3k", "defaults")]
    changed = {f"{name}={value!r}" for name, value in bench.DQN.env_defaults["CartPole-v1"].items()}
    assert rows[0][1].startswith("defaults (RL Zoo's but ") and rows[0][1].endswith(")")
    assert set(rows[0][1][len("defaults (RL Zoo's but "):-1].split(", ")) == changed
    assert rows[1][1] == "RL Zoo's" and rows[2][1] == rows[3][1] == "defaults (RL Zoo's)"
    for row in rows:
        returns = [float(cell) for cell in row[3:5]]
        low, high = (0, 500) if "CartPole" in row[0] else (-16.3 * 200, 0)  # per step: 1; -16.27 at worst
        assert all(low <= r <= high for r in returns), row
        assert float(row[5]) == min(returns)


def test_bench_seeds_refuses_bad_arguments(capsys):
    bench = load_script("bench_seeds")
    for argv in (["--algos", "ppo"], ["--seeds", "0,x"]):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
    assert bench.main(["--quick", "--algos", "dqn", "--hyperparams", "no_such_field=1"]) == 2
    assert "no_such_field" in capsys.readouterr().err


@pytest.mark.parametrize("library", ["rlkit", "rlkit-overlap", "sb3"])
def test_bench_agents_speed_times_the_training_steps_after_learning_starts(library, monkeypatch):
    """--speed's run: SPEED_STARTS untimed steps, then the timed ones, on a small task here
    (HalfCheetah needs MuJoCo); the time is positive and finite."""
    if library == "sb3":
        pytest.importorskip("stable_baselines3")
    bench_agents = load_script("bench_agents")
    monkeypatch.setattr(bench_agents, "SPEED_STARTS", 200)
    seconds, _ = bench_agents.run_speed(library, "td3", "Pendulum-v1", 20, "cpu")
    assert 0 < seconds < 60 and math.isfinite(seconds)


@pytest.mark.parametrize("env, algos, message", [
    ("Pendulum-v1", "sac,dqn", "--speed-env Pendulum-v1 has Box(-2.0, 2.0, (1,), float32): dqn needs Discrete actions"),
    ("CartPole-v1", "td3,ddpg", "td3 needs Box actions, ddpg needs Box actions"),
    ("NoSuchTask-v0", "sac", "--speed-env NoSuchTask-v0: ")])
def test_bench_agents_speed_env_must_suit_each_algorithm(monkeypatch, capsys, env, algos, message):
    """--speed with an algorithm that cannot act in --speed-env's action space (DQN on
    HalfCheetah was a traceback from the first child process): a usage error before any run."""
    bench_agents = load_script("bench_agents")
    monkeypatch.setattr(sys, "argv", ["bench_agents.py", "--speed", "--no-sb3", "--algos", algos, "--speed-env", env])
    monkeypatch.setattr(bench_agents, "run_in_fresh_process", lambda *a, **k: pytest.fail("a run started"))
    with pytest.raises(SystemExit) as exit_info:
        bench_agents.main()
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_bench_agents_concurrent_runs_report_each_and_their_sum(monkeypatch, capsys):
    """--speed --concurrent 2: one run alone, then two at once in their own processes; the row
    gives each run's steps/s, their sum, and the sum over the lone run's."""
    bench_agents = load_script("bench_agents")
    monkeypatch.setattr(sys, "argv", ["bench_agents.py", "--speed", "--no-sb3", "--concurrent", "2", "--algos", "td3",
                                      "--speed-env", "Pendulum-v1", "--speed-steps", "20"])
    assert bench_agents.main() == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| TD3, Pendulum-v1")]
    assert len(row) == 1, row
    alone, each, together, ratio = [cell.strip() for cell in row[0].strip("|").split("|")][1:]
    each = [float(v) for v in each.split(",")]
    assert len(each) == 2 and all(v > 0 for v in each)
    assert abs(float(together) - sum(each)) <= 1.0  # (each printed rounded)
    assert float(ratio.rstrip("x")) == pytest.approx(float(together) / float(alone), rel=0.03)  # (rounded cells)


def test_bench_agents_overlap_times_rlkit_both_ways_in_one_row(monkeypatch, capsys):
    """--speed --overlap: rlkit's SB3-order run and its overlap_updates run side by side, and
    their ratio."""
    bench_agents = load_script("bench_agents")
    monkeypatch.setattr(sys, "argv", ["bench_agents.py", "--speed", "--no-sb3", "--overlap", "--algos", "td3",
                                      "--speed-env", "Pendulum-v1", "--speed-steps", "20"])
    assert bench_agents.main() == 0
    out = capsys.readouterr().out
    assert "rlkit, overlap_updates steps/s | overlap / SB3 order |" in out
    row = [line for line in out.splitlines() if line.startswith("| TD3, Pendulum-v1")]
    assert len(row) == 1, row
    ours, overlapped, ratio, sb3, sb3_ratio = [cell.strip() for cell in row[0].strip("|").split("|")][1:]
    assert float(ours) > 0 and float(overlapped) > 0 and (sb3, sb3_ratio) == ("-", "-")
    assert float(ratio.rstrip("x")) == pytest.approx(float(overlapped) / float(ours), rel=0.05)  # (rounded cells)


def test_bench_agents_loop_cost_splits_a_step_into_the_env_the_updates_and_the_loop(monkeypatch, capsys):
    """--loop-cost: DQN on CartPole-v1 for 300 steps after learning_starts (one round of gradient
    steps, at the 256th), in a fresh process; the environment's and the updates' times are
    positive and the loop's own is what is left of the wall time."""
    bench_agents = load_script("bench_agents")
    monkeypatch.setattr(sys, "argv", ["bench_agents.py", "--loop-cost", "--algos", "dqn", "--loop-steps", "300"])
    assert bench_agents.main() == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| DQN, CartPole-v1")]
    assert len(row) == 1, row
    wall, env, updates, own = [float(cell) for cell in row[0].strip("|").split("|")[1:]]
    assert env > 0 and updates > env and own > 0
    assert wall == pytest.approx(env + updates + own, abs=0.2)  # (each printed rounded)


def test_bench_agents_loop_cost_refuses_a_step_count_below_one(monkeypatch, capsys):
    bench_agents = load_script("bench_agents")
    monkeypatch.setattr(sys, "argv", ["bench_agents.py", "--loop-cost", "--algos", "dqn", "--loop-steps", "0"])
    with pytest.raises(SystemExit):
        bench_agents.main()
    assert "--loop-steps must be at least 1, got 0" in capsys.readouterr().err


def test_bench_zoo_resumes_a_run_stopped_by_the_clock_and_tables_the_result(tmp_path, monkeypatch, capsys):
    """A run whose deadline has passed stops after its first step, saving the agent and buffer;
    the next call resumes it to its steps (the same run: two segments, one TensorBoard folder),
    evaluates it and drops the buffer; table prints its row, with '-' where no reference exists."""
    zoo = load_script("bench_zoo")
    monkeypatch.setitem(zoo.HYPERPARAMETERS, "sac", dict(learning_starts=50, batch_size=16, net_arch=(16, 16)))
    monkeypatch.setattr(zoo, "EVAL_EPISODES", 1)
    folder = str(tmp_path / "sac_Pendulum-v1_s0")
    zoo.train_one(folder, "sac", "Pendulum-v1", 0, 250, "cpu", deadline=0.0)
    progress = json.loads((tmp_path / "sac_Pendulum-v1_s0" / "progress.json").read_text())
    assert progress["steps"] == 1 and progress["segments"] == 1
    assert (tmp_path / "sac_Pendulum-v1_s0" / progress["checkpoint"] / "replay_buffer").is_dir()
    zoo.train_one(folder, "sac", "Pendulum-v1", 0, 250, "cpu", deadline=math.inf)  # an episode ends: a curve
    result = json.loads((tmp_path / "sac_Pendulum-v1_s0" / "result.json").read_text())
    assert result["steps"] == 250 and result["segments"] == 2 and -16.3 * 200 <= result["eval_mean"] <= 0
    assert result["steps_per_second"] > 0
    assert sorted(os.listdir(tmp_path / "sac_Pendulum-v1_s0")) == ["agent.safetensors", "progress.json", "result.json",
                                                                   "tb"]  # the checkpoints' buffers are gone
    assert len(list((tmp_path / "sac_Pendulum-v1_s0" / "tb").iterdir())) == 1  # resumed in the same run folder
    assert zoo.main(["table", "--runs", str(tmp_path), "--plots", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "sac_Pendulum-v1_0k.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| SAC |")]
    assert row == [f"| SAC | Pendulum-v1, 0k | {result['eval_mean']:.0f} | - | - | - | "
                   f"{result['train_seconds'] / 60:.1f} min | {result['steps_per_second']:.0f} |"]


def test_bench_zoo_a_kill_while_saving_a_checkpoint_resumes_from_the_one_before(tmp_path, monkeypatch):
    """A run stopped twice by the clock, the second save killed after the agent and buffer were
    written but before progress.json named them (every moment before that leaves the same
    files): the next call resumes from the first checkpoint, whose agent and buffer belong
    together (it checks the agent's steps against progress.json), and finishes the run."""
    zoo = load_script("bench_zoo")
    monkeypatch.setitem(zoo.HYPERPARAMETERS, "sac", dict(learning_starts=50, batch_size=16, net_arch=(16, 16)))
    monkeypatch.setattr(zoo, "EVAL_EPISODES", 1)
    run = tmp_path / "sac_Pendulum-v1_s0"
    zoo.train_one(str(run), "sac", "Pendulum-v1", 0, 250, "cpu", deadline=0.0)
    first = json.loads((run / "progress.json").read_text())
    write_json = zoo.write_json

    def killed(path, value):
        if path.endswith("progress.json"):
            raise KeyboardInterrupt("killed")
        write_json(path, value)

    monkeypatch.setattr(zoo, "write_json", killed)
    with pytest.raises(KeyboardInterrupt):
        zoo.train_one(str(run), "sac", "Pendulum-v1", 0, 250, "cpu", deadline=0.0)
    monkeypatch.setattr(zoo, "write_json", write_json)
    assert json.loads((run / "progress.json").read_text()) == first  # still names the first checkpoint
    assert len([name for name in os.listdir(run) if name.startswith("checkpoint_")]) == 2
    zoo.train_one(str(run), "sac", "Pendulum-v1", 0, 250, "cpu", deadline=math.inf)
    result = json.loads((run / "result.json").read_text())
    assert result["steps"] == 250 and result["segments"] == 2  # the killed segment is not counted
    assert not [name for name in os.listdir(run) if name.startswith("checkpoint_")]


def test_bench_zoo_overlap_is_a_new_runs_setting_recorded_and_named(tmp_path, monkeypatch, capsys):
    """--overlap trains a new run with overlap_updates; a resumed run keeps the setting it was
    started with whatever the next call asks; result.json records it and the table and the plot
    name it, apart from a run of SB3's order."""
    zoo = load_script("bench_zoo")
    monkeypatch.setitem(zoo.HYPERPARAMETERS, "sac", dict(learning_starts=50, batch_size=16, net_arch=(16, 16)))
    monkeypatch.setattr(zoo, "EVAL_EPISODES", 1)
    overlapped, plain = str(tmp_path / "sac_Pendulum-v1_s0"), str(tmp_path / "sac_Pendulum-v1_s1")
    zoo.train_one(overlapped, "sac", "Pendulum-v1", 0, 250, "cpu", deadline=0.0, overlap=True)
    zoo.train_one(overlapped, "sac", "Pendulum-v1", 0, 250, "cpu", deadline=math.inf, overlap=False)
    zoo.train_one(plain, "sac", "Pendulum-v1", 1, 250, "cpu", deadline=math.inf)
    results = [json.loads((tmp_path / name / "result.json").read_text())
               for name in ("sac_Pendulum-v1_s0", "sac_Pendulum-v1_s1")]
    assert [r["overlap_updates"] for r in results] == [True, False]
    assert results[0]["segments"] == 2 and results[0]["steps"] == 250
    assert zoo.main(["table", "--runs", str(tmp_path), "--plots", str(tmp_path / "plots")]) == 0
    names = [line.split("|")[1].strip() for line in capsys.readouterr().out.splitlines() if line.startswith("| SAC")]
    assert sorted(names) == ["SAC", "SAC, overlap_updates"]
    assert sorted(os.listdir(tmp_path / "plots")) == ["sac_Pendulum-v1_0k.png", "sac_Pendulum-v1_0k_overlap.png"]
    assert zoo.parse_args(["train", "--overlap"]).overlap and not zoo.parse_args(["train"]).overlap


def test_bench_zoo_env_kwargs_make_the_environments_and_name_the_run(tmp_path, monkeypatch, capsys):
    """--env-kwargs (KEY=VALUE, as rlkit train takes them) reach gymnasium.make for training and evaluation;
    the run's folder, result.json, the table's task cell and the plot's name carry them, apart
    from a run of the same task without them."""
    zoo = load_script("bench_zoo")
    monkeypatch.setitem(zoo.HYPERPARAMETERS, "sac", dict(learning_starts=50, batch_size=16, net_arch=(16, 16)))
    monkeypatch.setattr(zoo, "EVAL_EPISODES", 1)
    args = zoo.parse_args(["train", "--runs", str(tmp_path), "--env-kwargs", "max_episode_steps=60", "g=9.5"])
    assert args.env_kwargs == {"max_episode_steps": 60, "g": 9.5}
    made, make = [], zoo.gym.make
    monkeypatch.setattr(zoo.gym, "make", lambda env, **kwargs: made.append((env, kwargs)) or make(env, **kwargs))
    folder = zoo.run_folder(str(tmp_path), "sac", "Pendulum-v1", 0, args.env_kwargs)
    assert os.path.basename(folder) == "sac_Pendulum-v1_g=9.5_max_episode_steps=60_s0"
    zoo.train_one(folder, "sac", "Pendulum-v1", 0, 130, "cpu", deadline=0.0, env_kwargs=args.env_kwargs)
    zoo.train_one(folder, "sac", "Pendulum-v1", 0, 130, "cpu", deadline=math.inf, env_kwargs=args.env_kwargs)
    assert made == [("Pendulum-v1", args.env_kwargs)] * 3  # the new run, the resumed one, the evaluation
    zoo.train_one(str(tmp_path / "sac_Pendulum-v1_s0"), "sac", "Pendulum-v1", 0, 250, "cpu", deadline=math.inf)
    assert made[3:] and all(kwargs == {} for _, kwargs in made[3:])  # the agent makes it from its id alone
    assert json.loads(open(os.path.join(folder, "result.json")).read())["env_kwargs"] == args.env_kwargs
    assert zoo.main(["table", "--runs", str(tmp_path), "--plots", str(tmp_path / "plots")]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| SAC")]
    tasks = sorted(row.split("|")[2].strip() for row in rows)
    assert tasks == ["Pendulum-v1 (g=9.5, max_episode_steps=60), 0k", "Pendulum-v1, 0k"]
    assert sorted(os.listdir(tmp_path / "plots")) == ["sac_Pendulum-v1_0k.png",
                                                      "sac_Pendulum-v1_g=9.5_max_episode_steps=60_0k.png"]


def test_bench_zoo_refuses_bad_arguments():
    zoo = load_script("bench_zoo")
    for argv in (["train", "--algos", "ppo"], ["train", "--seeds", "0,x"], ["train", "--parallel", "0"],
                 ["train", "--minutes", "0"], ["plot"], ["train", "--env-kwargs", "g:9"],
                 ["train", "--env-kwargs", "9=1"]):
        with pytest.raises(SystemExit):
            zoo.parse_args(argv)


def test_bench_zoo_table_compares_with_rl_zoo_only_at_its_budget(tmp_path, capsys):
    """The ratio to RL Zoo's return (published after 1M steps) is the median over the seeds, and
    only for runs of that budget; a shorter run's row says '-'."""
    zoo = load_script("bench_zoo")
    for seed, (steps, mean) in enumerate([(1_000_000, 9000.0), (1_000_000, 10000.0), (1_000_000, 8000.0)]):
        folder = tmp_path / f"sac_HalfCheetah-v5_s{seed}"
        folder.mkdir()
        (folder / "result.json").write_text(json.dumps(dict(
            algo="sac", env="HalfCheetah-v5", seed=seed, steps=steps, eval_mean=mean, train_seconds=600.0 + seed,
            steps_per_second=steps / (600.0 + seed))))
    short = tmp_path / "td3_Hopper-v5_s0"
    short.mkdir()
    (short / "result.json").write_text(json.dumps(dict(algo="td3", env="Hopper-v5", seed=0, steps=300_000,
                                                       eval_mean=3000.0, train_seconds=300.0, steps_per_second=1000.0)))
    assert zoo.main(["table", "--runs", str(tmp_path)]) == 0
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in capsys.readouterr().out.splitlines() if line.startswith("| SAC") or line.startswith("| TD3")}
    assert rows["SAC"][1:6] == ["HalfCheetah-v5, 1000k", "9000, 10000, 8000", "9535", "9635", f"{9000 / 9535:.2f}"]
    assert rows["SAC"][6] == "10.0 min"  # the median run's training time
    assert rows["TD3"][1:6] == ["Hopper-v5, 300k", "3000", "3606", "3135", "-"]


def test_bench_gpu_levels_take_another_environments_shapes(bench_gpu, monkeypatch, capsys):
    """--levels-env: SAC's and TD3's updates on that environment's shapes (MountainCarContinuous:
    2 observations and 1 action, so the critics' first layers are 3 deep), DQN's on CartPole's."""
    monkeypatch.setattr(bench_gpu, "LEVEL_UPDATES", 2)
    monkeypatch.setattr(bench_gpu, "BUFFER_STEPS", 300)
    bench_gpu.main(["--levels", "--device", "cpu", "--levels-env", "MountainCarContinuous-v0"])
    printed = capsys.readouterr().out
    titles = [line[4:] for line in printed.splitlines() if line.startswith("### ")]
    assert titles == ["SAC update (MountainCarContinuous-v0)", "DQN update",
                      "TD3 update (MountainCarContinuous-v0) (program 1 of 2)",
                      "TD3 update (MountainCarContinuous-v0) (program 2 of 2)"]
    td3 = printed.split("### TD3 update")[1]
    assert "concat_rows [3, 256]" in td3 and "concat_rows [4, 256]" not in td3  # Pendulum's would be 3 + 1


@pytest.mark.parametrize("env, message", [("CartPole-v1", "needs an environment with Box actions"),
                                          ("NoSuchTask-v0", "--levels-env NoSuchTask-v0: ")])
def test_bench_gpu_levels_env_must_have_box_actions(bench_gpu, capsys, env, message):
    with pytest.raises(SystemExit):
        bench_gpu.main(["--levels", "--device", "cpu", "--levels-env", env])
    assert message in capsys.readouterr().err


def test_bench_gpu_levels_tables_each_program_and_sums_it_by_kernel(bench_gpu, monkeypatch, capsys):
    """--levels on the CPU: a table per captured program (TD3's two: with and without the
    delayed actor update), whose "all" row is the sum of its levels, and whose by-kernel rows
    add up to the same total and name the products."""
    monkeypatch.setattr(bench_gpu, "LEVEL_UPDATES", 3)
    monkeypatch.setattr(bench_gpu, "BUFFER_STEPS", 300)
    bench_gpu.main(["--levels", "--device", "cpu"])
    printed = capsys.readouterr().out
    titles = [line[4:] for line in printed.splitlines() if line.startswith("### ")]
    assert titles == ["SAC update (Pendulum-v1)", "DQN update", "TD3 update (Pendulum-v1) (program 1 of 2)",
                      "TD3 update (Pendulum-v1) (program 2 of 2)"]
    for table in printed.split("### ")[1:]:
        rows = [line.split("|")[1:-1] for line in table.splitlines() if line.startswith("| ") and "---" not in line]
        levels = [float(row[1]) for row in rows if row[0].strip().isdigit()]
        total = next(float(row[1]) for row in rows if row[0].strip() == "all")
        kernels = [row for row in rows if len(row) == 5 and row[0].strip() != "kernels"]
        assert levels and all(us >= 0 for us in levels)
        assert total == pytest.approx(sum(levels), abs=0.05 * len(levels) + 0.05)
        assert sum(float(row[3]) for row in kernels) == pytest.approx(total, abs=0.05 * len(kernels) + 0.05)
        assert sum(int(row[1]) for row in kernels) == len(levels)  # every level counted once
        assert any(row[0].strip().startswith(("linear", "matmul")) for row in kernels)
