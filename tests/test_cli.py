"""The command line: train writes a run and a model that eval reloads, plot draws the run's
curves, info lists the devices, and bad input is a one-line error with exit code 2."""

import contextlib
import dataclasses
import io
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import rlkit
from rlkit import _native
from rlkit.agents import DQN, evaluate
from rlkit.checkpoint import save_checkpoint
from rlkit.cli import UsageError, _plot_title, main, parse_hyperparams

TRAIN_ARGS = ["train", "dqn", "--env", "CartPole-v1", "--total-timesteps", "300", "--hyperparams",
              "learning_starts=100", "train_freq=4", "gradient_steps=1", "buffer_size=1000", "net_arch=16,16",
              "double=true", "log_interval=50"]
BLUE, ORANGE = (31, 119, 180), (255, 127, 14)  # matplotlib's first two line colours, C0 and C1
EVALUATION = re.compile(r"mean return (-?\d+\.\d+) \+- (\d+\.\d+)")


def _run(argv: list[str]) -> tuple[int, str]:
    """main(argv)'s exit code and stdout (for module-scoped fixtures, where capsys is not available)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()


def _printed_evaluation(text: str) -> tuple[float, float]:
    match = EVALUATION.search(text)
    assert match, text
    return float(match.group(1)), float(match.group(2))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One short DQN run: its log root, the train output and the model path it printed."""
    logdir = tmp_path_factory.mktemp("cli") / "tmp"
    code, out = _run([*TRAIN_ARGS, "--logdir", str(logdir)])
    assert code == 0, out
    model = re.search(r"^model: (.+)$", out, re.MULTILINE).group(1)
    return {"logdir": logdir, "out": out, "model": model}


def test_train_writes_a_run_folder_with_events_and_the_model(trained):
    run = trained["logdir"] / "DQN_1"
    assert trained["model"] == str(run / "model.safetensors")
    assert f"tensorboard logs: {run}" in trained["out"]
    assert any(name.startswith("events.out.tfevents.") for name in os.listdir(run))
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    steps = [event.step for event in events.Scalars("rollout/ep_rew_mean")]
    assert steps[-1] == 300 and all(step % 50 == 0 for step in steps)

    agent = DQN.load(trained["model"])
    assert agent.num_timesteps == 300
    assert agent.config.net_arch == (16, 16) and agent.config.buffer_size == 1000
    assert agent.config.double is True and agent.config.learning_starts == 100
    # train evaluates with --seed (0): the saved agent must score exactly what was printed
    mean, std = _printed_evaluation(trained["out"])
    assert (mean, std) == pytest.approx(evaluate(agent, "CartPole-v1", n_episodes=10, seed=0), abs=0.005)


def test_eval_loads_the_model_and_matches_evaluate(trained, capsys):
    assert main(["eval", trained["model"], "--episodes", "4", "--seed", "7"]) == 0  # env from the checkpoint
    mean, std = _printed_evaluation(capsys.readouterr().out)
    expected_mean, expected_std = evaluate(DQN.load(trained["model"]), "CartPole-v1", n_episodes=4, seed=7)
    assert mean == pytest.approx(expected_mean, abs=0.005)
    assert std == pytest.approx(expected_std, abs=0.005)


def test_a_second_run_gets_the_next_folder_and_save_puts_the_model_elsewhere(tmp_path, capsys):
    logdir, model = tmp_path / "runs", tmp_path / "models" / "dqn.safetensors"
    short = ["train", "DQN", "--env", "CartPole-v1", "--total-timesteps", "100", "--eval-episodes", "0",
             "--logdir", str(logdir), "--hyperparams", "buffer_size=1000", "net_arch=16"]
    assert main(short) == 0
    assert main([*short, "--save", str(model), "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert f"tensorboard logs: {logdir / 'DQN_2'}" in out and f"model: {model}" in out
    assert "evaluation" not in out
    assert DQN.load(str(model)).num_timesteps == 100
    assert not (logdir / "DQN_2" / "model.safetensors").exists()


@dataclasses.dataclass
class _Config:
    ent_coef: float | str = "auto"
    target_entropy: float | None = None
    net_arch: tuple[int, ...] = (64, 64)
    dueling: bool = False


def test_hyperparams_are_read_by_their_field_type():
    pairs = ["ent_coef=0.1", "target_entropy=none", "net_arch=32, 16", "dueling=TRUE"]
    assert parse_hyperparams(_Config, pairs) == {"ent_coef": 0.1, "target_entropy": None, "net_arch": (32, 16),
                                                 "dueling": True}
    assert parse_hyperparams(_Config, ["ent_coef=auto_0.5", "target_entropy=-2", "net_arch=", "dueling=0"]) == {
        "ent_coef": "auto_0.5", "target_entropy": -2.0, "net_arch": (), "dueling": False}
    with pytest.raises(UsageError, match=re.escape("target_entropy expects float | None, got 'high'")):
        parse_hyperparams(_Config, ["target_entropy=high"])


def _not_a_checkpoint(folder):
    path = folder / "notes.safetensors"
    path.write_text("not a checkpoint")
    return path


class _State:
    def state_dict(self):
        return {"weights": np.zeros(3, np.float32)}


def _checkpoint_of_no_agent(folder):
    path = folder / "trainer.safetensors"
    save_checkpoint(str(path), {"model": _State()})
    return path


@pytest.mark.parametrize("argv, message", [
    (["train", "dqn", "--env", ""], "train needs --env ENV"),
    (["train", "dqn", "--hyperparams", "learning_rte=0.1"], "DQNConfig has no hyperparameter 'learning_rte'"),
    (["train", "dqn", "--hyperparams", "train_freq=four"], "hyperparameter train_freq expects an int, got 'four'"),
    (["train", "dqn", "--hyperparams", "double=maybe"], "hyperparameter double expects a bool"),
    (["train", "dqn", "--hyperparams", "net_arch=64,x"], "hyperparameter net_arch expects comma-separated values"),
    (["train", "dqn", "--hyperparams", "gamma=1.5"], "bad hyperparameters: DQNConfig: gamma"),
    (["train", "dqn", "--hyperparams", "gamma"], "--hyperparams takes KEY=VALUE pairs"),
    (["train", "dqn", "--env", "NoSuchEnv-v0"], "cannot train DQN on NoSuchEnv-v0"),
    (["train", "dqn", "--env", "Pendulum-v1"], "cannot train DQN on Pendulum-v1"),  # continuous actions
])
def test_train_rejects_bad_input_before_training(tmp_path, capsys, argv, message):
    if "--env" not in argv:
        argv = [*argv, "--env", "CartPole-v1"]
    logdir = tmp_path / "runs"
    assert main([*argv, "--total-timesteps", "100", "--logdir", str(logdir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlkit: error: ") and message in err and "Traceback" not in err
    assert not logdir.exists()


def test_unknown_algorithm_lists_the_known_ones(tmp_path, capsys):
    assert main(["train", "PPO", "--env", "CartPole-v1", "--total-timesteps", "10", "--logdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlkit: error: unknown algorithm 'PPO'; known: ")
    assert "dqn" in err.split("known: ")[1].strip().split(", ")


def test_argparse_errors_return_2(capsys):
    assert main(["train", "dqn", "--env", "CartPole-v1", "--total-timesteps", "0"]) == 2
    assert "--total-timesteps: expected a positive int, got '0'" in capsys.readouterr().err
    assert main([]) == 2
    assert main(["--help"]) == 0


@pytest.mark.parametrize("make_path, message", [
    (lambda folder: folder / "missing.safetensors", "no such file: "),
    (_not_a_checkpoint, "is not an rlkit agent checkpoint ('"),
    (_checkpoint_of_no_agent, "is not an rlkit agent checkpoint (an rlkit checkpoint, but it names no algorithm)"),
])
def test_eval_rejects_what_is_not_an_agent_checkpoint(tmp_path, capsys, make_path, message):
    path = make_path(tmp_path)
    assert main(["eval", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlkit: error: ") and str(path) in err and message in err and "Traceback" not in err


def test_eval_on_an_environment_the_model_does_not_fit(trained, capsys):
    assert main(["eval", trained["model"], "--env", "Acrobot-v1"]) == 2
    assert "cannot load" in capsys.readouterr().err


_HELPER_MODULE = """
import os

import gymnasium

with open(os.path.join(os.path.dirname(__file__), "imported"), "a") as f:
    f.write("imported\\n")  # the proof that this file ran
gymnasium.register("{env}", entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv", max_episode_steps=20)
"""


@pytest.fixture
def model_naming_a_module(tmp_path, monkeypatch):
    """A DQN checkpoint whose environment id is ``<module>:<env>``, the module a file on a temporary
    sys.path that registers <env> and records that it ran in ``imported`` beside it."""
    import gymnasium

    token = os.urandom(4).hex()  # a module stays in sys.modules and an id in the registry: fresh names
    module, env = f"rlkit_test_helper_{token}", f"HelperCartPole_{token}-v0"
    (tmp_path / f"{module}.py").write_text(_HELPER_MODULE.format(env=env))
    monkeypatch.syspath_prepend(str(tmp_path))
    agent = DQN("CartPole-v1", dataclasses.replace(DQN.config_class(), buffer_size=1000, net_arch=(16, 16)))
    path = str(tmp_path / "model.safetensors")
    save_checkpoint(path, agent._state_objects(), metadata={
        "algo": "DQN", "config": dataclasses.asdict(agent.config), "env": f"{module}:{env}", "num_timesteps": 0})
    yield {"path": path, "env": f"{module}:{env}", "imported": tmp_path / "imported"}
    sys.modules.pop(module, None)
    gymnasium.registry.pop(env, None)


def test_agent_load_never_imports_the_module_its_file_names(model_naming_a_module):
    model = model_naming_a_module
    with pytest.raises(ValueError, match="would import the module 'rlkit_test_helper_.*'; pass env= .*allow_env"):
        DQN.load(model["path"])
    assert DQN.load(model["path"], env="CartPole-v1").env.spec.id == "CartPole-v1"
    assert not model["imported"].exists()
    agent = DQN.load(model["path"], allow_env_import=True)  # opted in: the module runs and makes the environment
    assert model["imported"].read_text() == "imported\n" and agent.env.spec.id == model["env"].split(":")[1]


def test_eval_needs_env_for_an_environment_id_with_a_module_prefix(model_naming_a_module, capsys):
    model = model_naming_a_module
    assert main(["eval", model["path"]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlkit: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert f"names the environment {model['env']}, which would import the module" in err
    assert f"pass --env {model['env']}" in err and not model["imported"].exists()
    assert main(["eval", model["path"], "--env", model["env"], "--episodes", "1"]) == 0  # named by the user
    assert model["imported"].read_text() == "imported\n"


def _assert_plotted_png(path, line_colour):
    """A PNG that matplotlib drew a line of ``line_colour`` (RGB) into, not just the axes."""
    import matplotlib.image

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    pixels = (matplotlib.image.imread(str(path))[..., :3] * 255).round()
    assert (np.abs(pixels - np.array(line_colour)).max(axis=-1) < 8).sum() > 200


def test_plot_draws_the_runs_of_a_folder_and_a_single_run(trained, tmp_path, capsys):
    runs = tmp_path / "runs"
    for name in ("DQN_2", "DQN_10"):  # copies of the trained run, to plot several
        shutil.copytree(trained["logdir"] / "DQN_1", runs / name)
    output = tmp_path / "curves.png"
    assert main(["plot", str(runs), "-o", str(output)]) == 0
    assert "rollout/ep_rew_mean of 2 run(s): DQN_2, DQN_10" in capsys.readouterr().out
    _assert_plotted_png(output, ORANGE)  # DQN_10's line, drawn over DQN_2's identical one

    single = tmp_path / "single.png"
    assert main(["plot", str(trained["logdir"] / "DQN_1"), "-o", str(single), "--tag", "train/loss"]) == 0
    assert "train/loss of 1 run(s): DQN_1" in capsys.readouterr().out
    _assert_plotted_png(single, BLUE)


def test_a_long_plot_title_is_cut_into_lines_that_fit_the_figure():
    """A run folder's name can be longer than the figure is wide (bench_zoo's names carry the
    environment keywords): the title comes in lines of at most 80 characters, all of it kept."""
    name = "td3_Ant-v5_contact_cost_weight=0_include_cfrc_ext_in_observation=False_880k_overlap"
    title = _plot_title("rollout/ep_rew_mean", name)
    assert len(title.splitlines()) == 2 and all(len(line) <= 80 for line in title.splitlines())
    assert title.replace("\n", "").replace(" ", "") == f"rollout/ep_rew_mean:{name}"
    assert _plot_title("rollout/ep_rew_mean", "sac_Hopper-v5_1000k") == "rollout/ep_rew_mean: sac_Hopper-v5_1000k"


def test_plot_errors_name_what_is_missing(trained, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["plot", str(tmp_path / "empty"), "-o", str(tmp_path / "x.png")]) == 2
    assert "no TensorBoard event files under" in capsys.readouterr().err
    assert main(["plot", str(trained["logdir"]), "--tag", "no/such", "-o", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "no run under" in err and "'no/such'" in err and "rollout/ep_rew_mean" in err and "train/loss" in err
    assert not (tmp_path / "x.png").exists()


def test_info_lists_the_devices(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"rlkit {rlkit.__version__}" in out
    assert re.search(r"^device cpu: \d+ threads", out, re.MULTILINE)
    build = _native.build_info()
    expected = "compiled in" if build["vulkan"] else "not compiled in"
    assert re.search(rf"^vulkan backend: {expected} \(built with RLKIT_VULKAN={build['vulkan_option']}\)$", out,
                     re.MULTILINE)
    assert build["vulkan_option"] in ("AUTO", "ON", "OFF")
    assert not (build["vulkan"] and build["vulkan_option"] == "OFF")
    # the shader compilers the build used (CMakeLists.txt): glslc for every shader, and for the
    # cooperative-matrix ones glslc too (NV) or a glslang that knows KHR cooperative matrices
    compilers = re.findall(r"^shader compilers: (.*)$", out, re.MULTILINE)
    assert compilers == ([build["shader_compilers"]] if build["vulkan"] else [])
    assert not build["vulkan"] or re.fullmatch(
        r"glslc \(.+\), (the cooperative-matrix shaders too: NV cooperative matrices, no bf16 variants"
        r"|and for the cooperative-matrix shaders .+: KHR cooperative matrices, bf16 variants (ON|OFF))",
        build["shader_compilers"])


def test_info_names_the_cpu_product_kernels(capsys):
    """rlkit info says which kernels the CPU's products take here, as the native module reports
    them (AVX2 + FMA for skinny products, AVX-512 for other small ones where the CPU has them)."""
    assert main(["info"]) == 0
    line = re.findall(r"^cpu matmul: (.*)$", capsys.readouterr().out, re.MULTILINE)
    kernels = _native.cpu_product_kernels()
    assert len(line) == 1 and line[0].endswith("; the BLAS for the rest")
    assert ("24 rows or more;" in line[0]) == kernels["strided"]
    assert ("a depth of at most 8;" in line[0]) == kernels["skinny"]
    previous = _native.set_skinny_products(False)
    try:
        assert _native.cpu_product_kernels()["skinny"] is False
    finally:
        _native.set_skinny_products(previous)


def test_python_m_rlkit_info():
    # the subprocess imports the same rlkit as the tests (the source tree or the installed one)
    package_root = os.path.dirname(os.path.dirname(rlkit.__file__))
    env = {**os.environ, "PYTHONPATH": package_root}
    result = subprocess.run([sys.executable, "-m", "rlkit", "info"], check=False, capture_output=True, text=True,
                            env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "device cpu" in result.stdout


def test_train_takes_env_kwargs_n_envs_and_eval_and_save_frequencies(tmp_path, capsys):
    code = main(["train", "dqn", "--env", "FrozenLake-v1", "--env-kwargs", "is_slippery=false", "map_name=4x4",
                 "--n-envs", "2", "--total-timesteps", "600", "--logdir", str(tmp_path), "--eval-freq", "100",
                 "--save-freq", "150", "--eval-episodes", "1", "--hyperparams", "learning_starts=100"])
    assert code == 0
    run = tmp_path / "DQN_1"
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert checkpoints == [f"rl_model_{n}_steps.safetensors" for n in (300, 600)]  # every 150 calls of 2 lanes
    assert (run / "evaluations.npz").exists() and (run / "best_model.safetensors").exists()
    assert "evaluation over 1 episodes of FrozenLake-v1" in capsys.readouterr().out


def test_train_imports_gym_packages_and_refuses_bad_ones(capsys):
    assert main(["train", "dqn", "--env", "CartPole-v1", "--total-timesteps", "10", "--gym-packages",
                 "no_such_package_xyz"]) == 2
    assert "--gym-packages: cannot import 'no_such_package_xyz'" in capsys.readouterr().err
    assert main(["train", "dqn", "--env", "CartPole-v1", "--total-timesteps", "10", "--env-kwargs", "1x=2"]) == 2
    assert "--env-kwargs takes KEY=VALUE pairs" in capsys.readouterr().err


QUICK = ["learning_starts=64", "batch_size=16", "buffer_size=500", "train_freq=8", "gradient_steps=1"]
HER = ["replay_buffer_class=HerReplayBuffer", 'replay_buffer_kwargs={"n_sampled_goal": 4}']


@pytest.mark.parametrize("algo, env, env_kwargs, hyperparams", [
    ("dqn", "rlkit/BitFlipping-v0", ["n_bits=6"], HER),                      # Dict goal space, HER
    ("sac", "rlkit/BitFlipping-v0", ["n_bits=4", "continuous=true"], HER),  # Box actions on a goal space
    ("td3", "rlkit/BitFlipping-v0", ["n_bits=4", "continuous=true"], HER),
    ("ddpg", "Pendulum-v1", [], ["net_arch=16,16"]),
    ("discrete_sac", "Taxi-v4", [], []),                                     # Discrete observations
    ("dqn", "FrozenLake-v1", ["map_name=4x4"], ["dueling=true", "n_steps=3", "prioritized=true"]),
    ("dqn", "MinAtar/Breakout-v1", [], ["features_extractor=nature",       # images (MinAtar's booleans)
                                        'features_extractor_kwargs={"conv_layers": [[4, 3, 1]], "features_dim": 16}']),
    ("recurrent_dqn", "rlkit/CartPoleNoVel-v1", [], ["learning_starts=64"]),
], ids=lambda value: value if isinstance(value, str) else None)
def test_every_algorithm_and_space_trains_from_the_command_line(tmp_path, capsys, algo, env, env_kwargs, hyperparams):
    if env.startswith("MinAtar"):
        pytest.importorskip("minatar", reason="MinAtar's games come with the minatar extra")
    argv = ["train", algo, "--env", env, "--total-timesteps", "160", "--logdir", str(tmp_path), "--eval-episodes", "1"]
    if env_kwargs:
        argv += ["--env-kwargs", *env_kwargs]
    quick = [] if algo.startswith("recurrent") else QUICK
    assert main([*argv, "--hyperparams", *quick, *hyperparams]) == 0
    out = capsys.readouterr().out
    assert f"evaluation over 1 episodes of {env}" in out
    model = re.search(r"^model: (.+)$", out, re.MULTILINE).group(1)
    assert os.path.exists(model)
    if not env_kwargs:  # (eval makes the saved id with its default kwargs)
        assert main(["eval", model, "--episodes", "1"]) == 0
