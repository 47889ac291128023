"""``megatron-rl submit CONFIG --nodes N [--dry-run]``: render a run's sbatch script, submit it.

The script comes from ``slurm/job.sbatch.j2`` and the ``slurm`` section of the config
(:class:`megatron_rl.slurm.config.SlurmConfig`), with ``slurm.*`` dotted overrides and
``--nodes`` on top. Other overrides are passed on to ``megatron-rl train`` in the script.
``--dry-run`` prints the script and submits nothing; otherwise it is written to
``<run_dir>/job.sbatch`` and handed to ``sbatch``. Layouts (colocated on one node,
disaggregated on several) and the preemption/requeue protocol are described in docs/slurm.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from megatron_rl.config import RunConfig
    from megatron_rl.slurm.config import SlurmConfig

HELP = "render the Slurm sbatch script for a run (--dry-run prints it) and submit it"

TEMPLATE = Path(__file__).resolve().parents[2] / "slurm" / "job.sbatch.j2"
# torchrun handles only SIGTERM/SIGINT/SIGHUP/SIGQUIT by default; USR1 (Slurm's time-limit
# warning) would kill it and its workers without a checkpoint. With it listed, torchrun forwards
# USR1 to every worker and waits --shutdown-timeout seconds for them.
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
# Per-job ports (base + SLURM_JOB_ID % 500): the torchrun rendezvous and the weight-update group's
# store, both on the first trainer node; their ranges never meet each other or router_port.
RDZV_PORT_BASE = 29400
WEIGHT_PORT_BASE = 28900
PORT_SPAN = 500


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=None, help="nodes (overrides slurm.nodes)")
    parser.add_argument("--dry-run", action="store_true", help="print the script, submit nothing")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _options(parser)
    parser.add_argument("config", help="run config YAML (its slurm section sets the layout)")
    # Options may follow CONFIG among the overrides; they are parsed in main().
    parser.add_argument(
        "overrides", nargs=argparse.REMAINDER, help="dotted overrides: slurm.* and run config"
    )


def _split_rest(args: argparse.Namespace) -> None:
    """Parse --nodes/--dry-run given after CONFIG, leaving only overrides in args.overrides."""
    rest = argparse.ArgumentParser(prog="megatron-rl submit", add_help=False)
    _options(rest)
    rest.add_argument("overrides", nargs="*")
    try:
        ns = rest.parse_intermixed_args(args.overrides)
    except SystemExit:
        raise ValueError(f"could not parse {args.overrides}; see megatron-rl submit -h") from None
    args.nodes = ns.nodes if ns.nodes is not None else args.nodes
    args.dry_run = args.dry_run or ns.dry_run
    args.overrides = ns.overrides


def load_with_slurm(config: str, overrides: list[str]) -> tuple[RunConfig, SlurmConfig]:
    """(RunConfig, SlurmConfig) from one YAML; the ``slurm`` section may or may not be part of
    RunConfig yet, so it is split off and built on its own."""
    from megatron_rl.config import RunConfig, apply_overrides, apply_renamed, from_dict, validate
    from megatron_rl.slurm.config import SlurmConfig

    path = Path(config)
    if not path.is_file():
        raise ValueError(f"config file {config!r} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {config!r} must hold a mapping at the top level")
    overrides = apply_renamed(data, overrides)
    slurm_data = {"slurm": data.pop("slurm", None) or {}}
    apply_overrides(slurm_data, [o for o in overrides if o.startswith("slurm.")])
    apply_overrides(data, [o for o in overrides if not o.startswith("slurm.")])
    slurm = from_dict(SlurmConfig, slurm_data["slurm"], prefix="slurm")
    validate(slurm, "slurm")
    if any(f.name == "slurm" for f in dataclasses.fields(RunConfig)):
        data["slurm"] = slurm_data["slurm"]
    cfg = from_dict(RunConfig, data)
    validate(cfg)
    engine_tp(cfg, slurm)
    check_ports(slurm)
    check_trainer_layout(cfg, slurm)
    return cfg, slurm


def check_trainer_layout(cfg: RunConfig, slurm: SlurmConfig) -> None:
    """``parallel.*`` (TP/PP/CP, and EP for a mixture-of-experts model) against the trainer
    world the script will start (trainer nodes x trainer ranks per node), with the model's
    ``config.json`` when ``model.hf_path`` has one: one line naming the keys, nothing written."""
    from megatron_rl.model.parallel import validate_layout

    model = cfg.model
    if cfg.model.hf_path and (Path(cfg.model.hf_path) / "config.json").is_file():
        from megatron_rl.model import hf_io

        _, model = hf_io.load_hf_config(cfg.model.hf_path)
    world = slurm.layout()[0] * slurm.trainer_procs()
    try:
        validate_layout(cfg.parallel, world, model, gpu=slurm.gpus_per_node > 0)
    except ValueError as e:
        raise ValueError(
            f"{e} (the job's trainer world: {slurm.layout()[0]} node(s) x "
            f"{slurm.trainer_procs()} rank(s))"
        ) from None


def render_sbatch(
    cfg: RunConfig, slurm: SlurmConfig, config: str, train_overrides: list[str]
) -> str:
    """The complete sbatch script for ``cfg`` laid out by ``slurm``."""
    import jinja2

    from megatron_rl.slurm.values import output_pattern, sbatch_quote

    trainer_nodes, rollout_nodes = slurm.layout()
    colocated = slurm.nodes == 1
    run_dir = Path(cfg.output_dir).resolve() / cfg.run_name
    server_model = slurm.server_model or cfg.model.hf_path
    if not server_model:
        raise ValueError(
            "the rollout servers need an HF model to start from: set model.hf_path or "
            "slurm.server_model (the trainer pushes its own weights to them at start)"
        )
    check_rendered_values(cfg, slurm, config)
    n_srv = slurm.servers() * slurm.gpus_per_server
    trainer_gpus = slurm.trainer_gpus()
    extra = " ".join(shlex.quote(o) for o in train_overrides)
    train_command = (
        slurm.train_command
        or (
            f'$MRL train "$CONFIG" output_dir={shlex.quote(str(run_dir.parent))} '
            f'rollout.engine=sglang "rollout.urls=[$ROUTER_URL]" '
            f"rollout.sglang.engine_tp={engine_tp(cfg, slurm)} "
            f'rollout.sglang.master_port="$WEIGHT_PORT" '
            f"checkpoint.preempt_grace_s={shutdown_timeout(slurm)} {extra}"
        ).strip()
    )
    if colocated:
        layout = (
            f"1 node, colocated: trainer on {trainer_gpus or 'CPU'} GPUs, "
            f"{slurm.servers()} rollout server(s) x {slurm.gpus_per_server} GPUs + router"
        )
    else:
        layout = (
            f"{slurm.nodes} nodes, disaggregated: {trainer_nodes} trainer node(s) x "
            f"{trainer_gpus} GPUs (torchrun), {rollout_nodes} rollout node(s) x "
            f"{slurm.servers()} server(s) x {slurm.gpus_per_server} GPUs, router on the "
            "first rollout node"
        )
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["q"] = lambda v: shlex.quote(str(v))  # a shell word
    env.filters["sq"] = lambda v: sbatch_quote(str(v))  # a word of an #SBATCH line
    template = env.from_string(TEMPLATE.read_text())
    return template.render(
        s=slurm,
        run_name=cfg.run_name,
        job_name=f"mrl-{cfg.run_name}",
        config=config,
        config_path=str(Path(config).resolve()),
        run_dir=str(run_dir),
        output=output_pattern(str(run_dir)),
        server_model=str(Path(server_model).resolve()),
        layout=layout,
        colocated=colocated,
        trainer_nodes=trainer_nodes,
        rollout_nodes=rollout_nodes,
        trainer_gpus=trainer_gpus,
        trainer_procs=slurm.trainer_procs(),
        torchrun=not colocated or slurm.trainer_procs() > 1,
        torchrun_signals=TORCHRUN_SIGNALS,
        server_gpu_list=",".join(str(i) for i in range(trainer_gpus, trainer_gpus + n_srv)),
        trainer_gpu_list=",".join(str(i) for i in range(trainer_gpus)),
        train_command=train_command,
        serve_overrides=extra,  # the servers read the same run config (routed experts, dtype)
        servers=slurm.servers(),
        step_cpus=slurm.cpus_per_node or '"${SLURM_CPUS_ON_NODE:-1}"',
        shutdown_timeout=shutdown_timeout(slurm),
        rdzv_port_base=RDZV_PORT_BASE,
        weight_port_base=WEIGHT_PORT_BASE,
    )


def check_rendered_values(cfg: RunConfig, slurm: SlurmConfig, config: str) -> None:
    """Every config value the template writes is one line (a newline would start a command) and
    in the format sbatch reads on ``#SBATCH`` lines; ValueError naming the key. Checked again
    here, after ``load_with_slurm``'s validation, for configs built in code, and for the model
    and config paths, which no section checks."""
    from megatron_rl.text_checks import check_line, check_path_component

    slurm.validate()
    check_path_component("run_name", cfg.run_name, "output_dir")
    check_line("output_dir", cfg.output_dir)
    check_line("model.hf_path", cfg.model.hf_path or "")
    check_line("CONFIG", config)


def shutdown_timeout(slurm: SlurmConfig) -> int:
    """Seconds between USR1 and the kill that the trainer may use to checkpoint: torchrun's
    ``--shutdown-timeout`` (the time limit comes ``signal_before_end_s`` after USR1), also
    passed to the trainer as ``checkpoint.preempt_grace_s``."""
    return max(30, slurm.signal_before_end_s - 30)


def check_ports(slurm: SlurmConfig) -> None:
    """``slurm.router_port`` must stay out of the per-job port ranges (ValueError naming it)."""
    for base, what in ((RDZV_PORT_BASE, "torchrun rendezvous"), (WEIGHT_PORT_BASE, "weight group")):
        if base <= slurm.router_port < base + PORT_SPAN:
            raise ValueError(
                f"slurm.router_port={slurm.router_port} falls in {base}-{base + PORT_SPAN - 1}, "
                f"the {what} ports of the job; pick one outside 28900-29899"
            )


def engine_tp(cfg: RunConfig, slurm: SlurmConfig) -> int:
    """Ranks each server holds in the weight-update group: one per GPU of an SGLang server,
    one for an embedded (CPU) server. ValueError naming both keys when they disagree."""
    want = slurm.gpus_per_server if slurm.server_engine == "sglang" else 1
    have = cfg.rollout.sglang.engine_tp
    if have not in (0, want):
        raise ValueError(
            f"rollout.sglang.engine_tp={have} disagrees with slurm.gpus_per_server="
            f"{slurm.gpus_per_server} (slurm.server_engine={slurm.server_engine}): each server "
            f"holds {want} rank(s) of the weight-update group; set engine_tp to {want} or 0"
        )
    return want


def main(args: argparse.Namespace) -> int:
    _split_rest(args)
    overrides = list(args.overrides)
    if args.nodes is not None:
        overrides.append(f"slurm.nodes={args.nodes}")
    cfg, slurm = load_with_slurm(args.config, overrides)
    train_overrides = [o for o in args.overrides if not o.startswith("slurm.")]
    script = render_sbatch(cfg, slurm, args.config, train_overrides)
    if args.dry_run:
        print(script, end="")
        return 0
    run_dir = Path(cfg.output_dir).resolve() / cfg.run_name
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "job.sbatch"
    path.write_text(script)
    out = subprocess.run(
        ["sbatch", "--parsable", str(path)], capture_output=True, text=True, timeout=60
    )
    if out.returncode != 0:
        raise ValueError(f"sbatch rejected {path}: {out.stderr.strip()}")
    print(f"submitted job {out.stdout.strip().split(';')[0]} ({path})")
    return 0
