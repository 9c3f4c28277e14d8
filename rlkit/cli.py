"""The ``rlkit`` command line: train an agent, evaluate a saved one, plot TensorBoard curves and
show what this build and machine offer.

    rlkit train dqn --env CartPole-v1 --total-timesteps 50000 [--device gpu] [--logdir runs]
    rlkit eval runs/DQN_1/model.safetensors
    rlkit plot runs -o plot.png
    rlkit info
    rlkit launch -n 4 train.py [args]     # one process per replica, under MPI

Bad input (an unknown algorithm, hyperparameter, environment or file) prints
``rlkit: error: ...`` on stderr and returns 2, argparse's convention, without a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import textwrap
import types
import typing

from rlkit import __version__

EXIT_USAGE = 2
DEFAULT_TAG = "rollout/ep_rew_mean"


class UsageError(Exception):
    """Bad input from the command line: reported as ``rlkit: error: <message>``, exit code 2."""


# ---- the parser ---------------------------------------------------------------------------------

def _positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive int, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    """argparse type: an int >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {text!r}")
    return value


def _add_train_parser(commands) -> None:
    train = commands.add_parser("train", help="train an agent on a Gymnasium environment",
                                description="Trains an agent, saves it, evaluates it and logs to TensorBoard.")
    train.add_argument("algo", metavar="ALGO", help="the algorithm, e.g. dqn (case-insensitive)")
    train.add_argument("--env", help="the Gymnasium environment id, e.g. CartPole-v1")
    train.add_argument("--total-timesteps", type=_positive_int, required=True, metavar="N",
                       help="environment steps to train for")
    train.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="where to train (default: cpu)")
    train.add_argument("--logdir", default="runs",
                       help="TensorBoard root; the run goes to LOGDIR/<ALGO>_<N> (default: runs)")
    train.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    train.add_argument("--save", metavar="PATH",
                       help="where to save the model (default: model.safetensors in the run's folder)")
    train.add_argument("--hyperparams", nargs="+", default=[], metavar="KEY=VALUE",
                       help="config overrides, e.g. learning_rate=1e-3 double=true net_arch=64,64")
    train.add_argument("--progress-bar", action="store_true", help="show a progress bar")
    train.add_argument("--eval-episodes", type=_non_negative_int, default=10, metavar="N",
                       help="episodes to evaluate after training; 0 skips it (default: 10)")
    train.add_argument("--gym-packages", nargs="+", default=[], metavar="MODULE",
                       help="modules to import first, which register environments (ale_py, minatar and minigrid "
                            "are imported for their own ids without this)")
    train.add_argument("--env-kwargs", nargs="+", default=[], metavar="KEY=VALUE",
                       help="keyword arguments of the environment (values read as JSON where they parse, e.g. "
                            "is_slippery=false, else as strings)")
    train.add_argument("--n-envs", type=_positive_int, metavar="N", help="environments stepped together")
    train.add_argument("--eval-freq", type=_non_negative_int, default=0, metavar="N",
                       help="evaluate every N steps during training (EvalCallback; the best model and "
                            "evaluations.npz go to the run's folder); 0: never (default)")
    train.add_argument("--save-freq", type=_non_negative_int, default=0, metavar="N",
                       help="save a checkpoint every N steps into the run's checkpoints/ folder "
                            "(CheckpointCallback); 0: never (default)")
    train.set_defaults(run=_train)


def _add_eval_parser(commands) -> None:
    evaluate = commands.add_parser("eval", help="evaluate a saved agent",
                                   description="Loads a saved agent and prints the mean and std of its returns.")
    evaluate.add_argument("path", metavar="PATH", help="a model saved by rlkit train (or an agent's save)")
    evaluate.add_argument("--env", help="the Gymnasium environment id (default: the one it was trained on; needed when "
                                         "that id has a module prefix, module:Env-v0, which would import the module)")
    evaluate.add_argument("--episodes", type=_positive_int, default=10, metavar="N",
                          help="episodes to run (default: 10)")
    evaluate.add_argument("--seed", type=int, default=0, help="seed of the first episode (default: 0)")
    evaluate.add_argument("--device", choices=("cpu", "gpu"), default="cpu", help="where to run (default: cpu)")
    evaluate.set_defaults(run=_eval)


def _add_plot_parser(commands) -> None:
    plot = commands.add_parser("plot", help="plot a TensorBoard scalar of one run or several",
                               description="Draws one line per run of a TensorBoard scalar into a PNG.")
    plot.add_argument("logdir", metavar="LOGDIR", help="a run folder or a folder of run folders")
    plot.add_argument("-o", "--output", default="plot.png", metavar="PNG", help="the image to write (default: plot.png)")
    plot.add_argument("--tag", default=DEFAULT_TAG, help=f"the scalar to plot (default: {DEFAULT_TAG})")
    plot.set_defaults(run=_plot)


def _add_info_parser(commands) -> None:
    info = commands.add_parser("info", help="show the version, devices and build",
                               description="Prints the version, the devices and how this rlkit was built.")
    info.set_defaults(run=_info)


def _add_launch_parser(commands) -> None:
    launch = commands.add_parser("launch", help="run a script as N MPI processes (data-parallel replicas)",
                                 description="Runs `mpiexec -n N python -m mpi4py SCRIPT ARGS`: one process per "
                                             "replica; an uncaught exception in any of them ends them all.")
    launch.add_argument("-n", "--nproc", type=_positive_int, required=True, help="number of processes (ranks)")
    launch.add_argument("script", help="the Python script each rank runs")
    launch.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    launch.set_defaults(run=_launch)


def build_parser() -> argparse.ArgumentParser:
    """The parser of all subcommands; each sets ``run``, the function that carries it out."""
    parser = argparse.ArgumentParser(prog="rlkit", description="Reinforcement-learning training kit.")
    parser.add_argument("--version", action="version", version=f"rlkit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_train_parser, _add_eval_parser, _add_plot_parser, _add_info_parser, _add_launch_parser):
        add(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the command line ``argv`` (default: sys.argv[1:]); returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_request:  # argparse exits after --help (0) and on bad usage (2)
        return int(exit_request.code or 0)
    try:
        return args.run(args)
    except UsageError as error:
        print(f"rlkit: error: {error}", file=sys.stderr)
        return EXIT_USAGE


# ---- hyperparameters ----------------------------------------------------------------------------

def _parse_bool(text: str) -> bool:
    """true/false/1/0, in any case."""
    lowered = text.strip().lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise ValueError(text)


def _is_variadic_tuple(annotation) -> bool:
    """Whether ``annotation`` is ``tuple[X, ...]``."""
    args = typing.get_args(annotation)
    return typing.get_origin(annotation) is tuple and len(args) == 2 and args[1] is Ellipsis


def _convert(text: str, annotation):
    """``text`` as a value of ``annotation``; ValueError where it is not one."""
    if annotation is bool:
        return _parse_bool(text)
    if annotation in (int, float, str):
        return annotation(text)
    if annotation is dict:  # JSON: data, never code
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError(text)
        return value
    args = typing.get_args(annotation)
    if _is_variadic_tuple(annotation):
        return tuple(_convert(item, args[0]) for item in text.split(",") if item.strip())
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        if type(None) in args and text.strip().lower() in ("none", "null"):
            return None
        # str accepts anything, so it is tried last: "0.1" of a float | str field is a float.
        for member in sorted((a for a in args if a is not type(None)), key=lambda a: a is str):
            try:
                return _convert(text, member)
            except ValueError:
                continue
    raise ValueError(text)


def _describe(annotation) -> str:
    """The type a field expects, in words."""
    if annotation is bool:
        return "a bool (true, false, 1 or 0)"
    if _is_variadic_tuple(annotation):
        return f"comma-separated values, each {_describe(typing.get_args(annotation)[0])} (e.g. 64,64)"
    if annotation in (int, float, str):
        return {int: "an int", float: "a float", str: "a str"}[annotation]
    if annotation is dict:
        return 'a JSON object (e.g. {"features_dim": 128})'
    return str(annotation)


def parse_hyperparams(config_class, pairs: list[str]) -> dict:
    """``key=value`` strings as ``{field: value}`` of ``config_class``, each value read by the
    type of its field; UsageError for an unknown field or a value of the wrong type."""
    hints = typing.get_type_hints(config_class)
    names = [f.name for f in dataclasses.fields(config_class) if f.init]
    overrides = {}
    for pair in pairs:
        key, equals, text = pair.partition("=")
        if not equals:
            raise UsageError(f"--hyperparams takes KEY=VALUE pairs, got {pair!r}")
        if key not in names:
            raise UsageError(f"{config_class.__name__} has no hyperparameter {key!r}; it has: {', '.join(names)}")
        try:
            overrides[key] = _convert(text, hints[key])
        except ValueError:
            raise UsageError(f"hyperparameter {key} expects {_describe(hints[key])}, got {text!r}") from None
    return overrides


def _make_config(agent_class, env_id: str, pairs: list[str]):
    """The agent's default config for ``env_id`` (DQN's Atari settings for an Atari id) with the
    overrides of ``pairs``; its own checks become UsageErrors."""
    overrides = parse_hyperparams(agent_class.config_class, pairs)
    try:
        return dataclasses.replace(agent_class.default_config(env_id), **overrides)
    except ImportError as error:  # the package that registers env_id is missing
        raise UsageError(str(error)) from None
    except (TypeError, ValueError) as error:
        raise UsageError(f"bad hyperparameters: {error}") from None


# ---- agents, devices, environments --------------------------------------------------------------

def _algorithms() -> dict:
    """The agent classes by command-line name (imported on use: `rlkit info` and `--help` need
    no agent)."""
    from rlkit.agents import ALGOS

    return ALGOS


def _agent_class(name: str):
    """The class of algorithm ``name`` (case-insensitive)."""
    algorithms = _algorithms()
    try:
        return algorithms[name.lower()]
    except KeyError:
        raise UsageError(f"unknown algorithm {name!r}; known: {', '.join(sorted(algorithms))}") from None


def _check_device(name: str) -> None:
    """UsageError, saying what is missing, where ``name`` cannot be used here."""
    from rlkit.core.runtime import check_device

    try:
        check_device(name)
    except RuntimeError as error:
        raise UsageError(str(error)) from None


def _agent_setup_errors() -> tuple:
    """What making or loading an agent raises for bad input: an unknown environment, one the
    agent cannot act in, a checkpoint that does not fit the environment."""
    import gymnasium

    return gymnasium.error.Error, ValueError


def _print_evaluation(agent, env, episodes: int, seed: int, env_id: str) -> None:
    """Prints the mean and std of the agent's returns over deterministic episodes of ``env``
    (an id, or an environment made from ``env_id``)."""
    from rlkit.agents import evaluate

    mean, std = evaluate(agent, env, n_episodes=episodes, seed=seed)
    print(f"evaluation over {episodes} episodes of {env_id} (seed {seed}): mean return {mean:.2f} +- {std:.2f}")


def _import_gym_packages(modules: list[str]) -> None:
    """--gym-packages: imports each module the user named (to register its environments)."""
    import importlib

    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise UsageError(f"--gym-packages: cannot import {module!r}: {error}") from None


def parse_env_kwargs(pairs: list[str]) -> dict:
    """--env-kwargs KEY=VALUE pairs: each value as JSON where it parses (numbers, true, false,
    null, lists, objects), else the string itself; UsageError for a pair without a Python name
    before its '='. (Scripts with environment keywords take them the same way.)"""
    kwargs = {}
    for pair in pairs:
        key, equals, text = pair.partition("=")
        if not equals or not key.isidentifier():
            raise UsageError(f"--env-kwargs takes KEY=VALUE pairs with KEY a Python name, got {pair!r}")
        try:
            kwargs[key] = json.loads(text)
        except ValueError:
            kwargs[key] = text
    return kwargs



# ---- train --------------------------------------------------------------------------------------

def _train(args: argparse.Namespace) -> int:
    """rlkit train: checks every input before training, then trains, saves and evaluates."""
    agent_class = _agent_class(args.algo)
    if not args.env:
        raise UsageError("train needs --env ENV, a Gymnasium environment id such as CartPole-v1")
    from rlkit.agents.callbacks import RunFolderCallbacks
    from rlkit.agents.lanes import make_env, make_vector_env

    _import_gym_packages(args.gym_packages)
    env_kwargs = parse_env_kwargs(args.env_kwargs)
    pairs = args.hyperparams + ([f"n_envs={args.n_envs}"] if args.n_envs else [])
    config = _make_config(agent_class, args.env, pairs)
    _check_device(args.device)
    try:
        env = args.env
        if env_kwargs:  # the environment made here, with them (an agent makes its own from an id alone)
            env = (make_vector_env(args.env, config.n_envs, **env_kwargs) if config.n_envs > 1
                   else make_env(args.env, **env_kwargs))
        agent = agent_class(env, config, device=args.device, seed=args.seed, logdir=args.logdir)
    except _agent_setup_errors() as error:
        raise UsageError(f"cannot train {agent_class.algo} on {args.env}: {error}") from None
    callback = None
    if args.eval_freq or args.save_freq:
        callback = RunFolderCallbacks(lambda: make_env(args.env, training=False, **env_kwargs),
                                      args.eval_freq, args.save_freq)
    agent.learn(args.total_timesteps, callback=callback, progress_bar=args.progress_bar)
    run = agent.log_path
    model_path = args.save or os.path.join(run, "model.safetensors")
    try:
        agent.save(model_path)
    except OSError as error:
        raise UsageError(f"cannot save the model to {model_path}: {error}") from None
    print(f"trained {agent_class.algo} on {args.env} for {agent.num_timesteps} timesteps on {args.device}")
    print(f"model: {model_path}")
    print(f"tensorboard logs: {run} (tensorboard --logdir {args.logdir})")
    if args.eval_episodes:
        eval_env = make_env(args.env, training=False, **env_kwargs) if env_kwargs else args.env
        _print_evaluation(agent, eval_env, args.eval_episodes, args.seed, args.env)
    return 0


# ---- eval ---------------------------------------------------------------------------------------

def _agent_metadata(path: str) -> dict:
    """The metadata of the agent checkpoint at ``path``; UsageError for anything else."""
    from rlkit.checkpoint import CheckpointError, read_checkpoint

    if not os.path.exists(path):
        raise UsageError(f"no such file: {path}")
    if not os.path.isfile(path):
        raise UsageError(f"{path} is not a file")
    try:
        metadata = read_checkpoint(path)["metadata"]
    except (CheckpointError, OSError) as error:
        raise UsageError(f"{path} is not an rlkit agent checkpoint ({error})") from None
    if "algo" not in metadata:
        raise UsageError(f"{path} is not an rlkit agent checkpoint (an rlkit checkpoint, but it names no algorithm)")
    return metadata


def _class_of_algo(algo: str):
    """The agent class whose ``algo`` attribute is ``algo`` (as checkpoints store it)."""
    classes = {agent_class.algo: agent_class for agent_class in _algorithms().values()}
    if algo not in classes:
        raise UsageError(f"the checkpoint holds a {algo} agent, which this rlkit does not know; "
                         f"known: {', '.join(sorted(classes))}")
    return classes[algo]


def _eval(args: argparse.Namespace) -> int:
    """rlkit eval: loads the agent with the class its checkpoint names and evaluates it."""
    metadata = _agent_metadata(args.path)
    agent_class = _class_of_algo(metadata["algo"])
    env_id = args.env or metadata.get("env")
    if not env_id or not isinstance(env_id, str):
        raise UsageError(f"{args.path} does not name its environment; pass --env ENV")
    if not args.env:
        from rlkit.agents.lanes import env_module

        module = env_module(env_id)
        if module is not None:  # gym.make would import it: code that the file, not the user, names
            raise UsageError(f"{args.path} names the environment {env_id}, which would import the module {module}; "
                             f"pass --env {env_id} to run that module's code, or --env with another id")
    _check_device(args.device)
    try:
        agent = agent_class.load(args.path, env=env_id, device=args.device)
    except _agent_setup_errors() as error:
        raise UsageError(f"cannot load {args.path} on {env_id}: {error}") from None
    print(f"{agent_class.algo} from {args.path}, trained for {agent.num_timesteps} timesteps")
    _print_evaluation(agent, env_id, args.episodes, args.seed, env_id)
    return 0


# ---- plot ---------------------------------------------------------------------------------------

def _natural_key(text: str) -> list:
    """Sorts DQN_2 before DQN_10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def _event_folders(logdir: str) -> dict[str, str]:
    """``{label: folder}`` of every folder under ``logdir`` (itself included) that holds
    TensorBoard event files, labelled by its path below ``logdir``."""
    found = {}
    for folder, _, files in os.walk(logdir):
        if any(name.startswith("events.out.tfevents.") for name in files):
            label = os.path.relpath(folder, logdir)
            found[os.path.basename(os.path.abspath(logdir)) if label == "." else label] = folder
    return {label: found[label] for label in sorted(found, key=_natural_key)}


def _read_curves(folders: dict[str, str], tag: str) -> tuple[dict, set[str]]:
    """``{label: (steps, values)}`` of the runs that have scalar ``tag``, and every scalar tag seen."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    curves, tags = {}, set()
    for label, folder in folders.items():
        accumulator = EventAccumulator(folder, size_guidance={"scalars": 0})  # 0: keep every point
        accumulator.Reload()
        run_tags = accumulator.Tags()["scalars"]
        tags.update(run_tags)
        if tag in run_tags:
            events = accumulator.Scalars(tag)
            curves[label] = ([event.step for event in events], [event.value for event in events])
    return curves, tags


_TITLE_WIDTH = 80  # characters of a title line: what the 8-inch figure shows at matplotlib's title size


def _plot_title(tag: str, title: str) -> str:
    """The plot's title, ``tag: title``, cut into lines of at most _TITLE_WIDTH characters (a
    long run name would run past the figure's edges)."""
    return "\n".join(textwrap.wrap(f"{tag}: {title}", _TITLE_WIDTH, break_on_hyphens=False))


def _draw(curves: dict, tag: str, title: str, output: str) -> None:
    """One line per run into the PNG ``output``, drawn by the Agg backend (no display needed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 5), dpi=100, layout="tight")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for label, (steps, values) in curves.items():
        # a run with a single point would draw no line; a marker keeps it visible
        axes.plot(steps, values, label=label, marker="o" if len(steps) == 1 else None)
    axes.set(title=_plot_title(tag, title), xlabel="step", ylabel=tag)
    axes.grid(alpha=0.3)
    axes.legend()
    try:
        figure.savefig(output, format="png")
    except OSError as error:
        raise UsageError(f"cannot write {output}: {error}") from None


def _plot(args: argparse.Namespace) -> int:
    """rlkit plot: one line per run of the scalar ``--tag``."""
    if not os.path.isdir(args.logdir):
        raise UsageError(f"no such folder: {args.logdir}")
    folders = _event_folders(args.logdir)
    if not folders:
        raise UsageError(f"no TensorBoard event files under {args.logdir}")
    curves, tags = _read_curves(folders, args.tag)
    if not curves:
        raise UsageError(f"no run under {args.logdir} has the scalar {args.tag!r}; "
                         f"scalars found: {', '.join(sorted(tags)) or 'none'}")
    _draw(curves, args.tag, os.path.basename(os.path.abspath(args.logdir)), args.output)
    print(f"wrote {args.output}: {args.tag} of {len(curves)} run(s): {', '.join(curves)}")
    return 0


# ---- info ---------------------------------------------------------------------------------------

def _gibibytes(n_bytes: int) -> str:
    """A byte count in GiB, one decimal."""
    return f"{n_bytes / 2**30:.1f} GiB"


def _device_line(row: dict) -> str:
    """One device of rc.devices() in words."""
    if row["backend"] == "cpu":
        return f"device cpu: {row['threads']} threads, {_gibibytes(row['memory'])} memory"
    return (f"device {row['device']}: {row['name']}, {row['backend']} backend, {_gibibytes(row['memory'])} memory, "
            f"subgroup size {row['subgroup_size']}")


def _gpu_kernel_lines() -> list[str]:
    """Which kernel GPU matmul uses per dtype on this device, at a small and a large output (the
    tile size follows the output's size), which kernel GPU conv2d uses per dtype, and where the
    matrix-state recurrences keep their state."""
    from rlkit import _native

    sizes = (256, 4096)
    recurrences = ("head sizes up to 64 with the state in registers, a quad of invocations per row; larger in device memory"
                   if _native.gpu_info()["subgroup_quad"] else "the state in device memory (the device has no quad operations)")
    return ([f"gpu matmul {dtype}: " + "; ".join(f"{n}x{n}: {_native.gpu_matmul_kernel(dtype, n, n)}" for n in sizes)
             for dtype in ("f32", "f16", "bf16")] + [f"gpu conv2d {dtype}: {_native.gpu_conv2d_kernel(dtype)}" for dtype in ("f32", "f16")]
            + [f"gpu rwkv_wkv6, rwkv_wkv7, gated_linear_attn: {recurrences}"])


def info_lines() -> list[str]:
    """The version, the devices and the build facts, one per line."""
    import numpy as np

    import rlkit.core as rc
    from rlkit import _native

    gpu_problem = _native.gpu_unavailable_reason()
    build = _native.build_info()
    vulkan = "compiled in" if build["vulkan"] else "not compiled in"
    blas = _native.blas_name() or "none loaded: matmul uses rlkit's built-in kernel"
    lines = [f"rlkit {__version__} (python {platform.python_version()}, numpy {np.__version__})",
             f"default device: {rc.device()}"]
    lines += [_device_line(row) for row in rc.devices()]
    lines += [f"vulkan backend: {vulkan} (built with RLKIT_VULKAN={build['vulkan_option']})"]
    if build["vulkan"]:
        lines += [f"shader compilers: {build['shader_compilers']}"]
    if gpu_problem:
        lines += [f"gpu: unavailable: {gpu_problem}"]
    else:
        lines += _gpu_kernel_lines()
    lines += [f"blas: {blas}", f"cpu matmul: {_cpu_product_line()}"]
    return lines


def _cpu_product_line() -> str:
    """Which kernels the CPU's f32 products take, in the order they are tried, by their shape."""
    from rlkit import _native

    kernels = _native.cpu_product_kernels()
    absent = {name: "" if on else " (not on this CPU)" for name, on in kernels.items()}
    return (f"AVX-512 kernels for small ones of 24 rows or more{absent['strided']}; AVX2 + FMA kernels for a "
            f"side of at most 32 or a depth of at most 8{absent['skinny']}; the BLAS for the rest")


def _info(args: argparse.Namespace) -> int:
    """rlkit info: the lines of info_lines()."""
    print("\n".join(info_lines()))
    return 0


# ---- launch -------------------------------------------------------------------------------------

def mpiexec_command(nproc: int, script: str, args: list[str]) -> list[str]:
    """The mpiexec command line of ``rlkit launch`` (mpi4py's runner aborts every rank when one
    raises). mpiexec is looked up beside this Python first: the mpich wheel installs it there."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = beside if os.access(beside, os.X_OK) else shutil.which("mpiexec")
    if mpiexec is None:
        raise UsageError("mpiexec not found: install an MPI (pip install mpich) or put mpiexec on PATH")
    return [mpiexec, "-n", str(nproc), sys.executable, "-m", "mpi4py", script, *args]


def _launch(args) -> int:
    if not os.path.isfile(args.script):
        raise UsageError(f"no script {args.script!r}")
    try:
        import mpi4py  # noqa: F401  (the ranks run the script through it)
    except ImportError:
        raise UsageError("mpi4py is not installed (pip install mpi4py mpich)") from None
    return subprocess.call(mpiexec_command(args.nproc, args.script, args.args))

