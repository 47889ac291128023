"""``megatron-rl serve``: an SGLang-compatible HTTP server on top of a local rollout engine.

The same client code that talks to SGLang servers on a GPU cluster talks to this server on a
laptop or in CI (see :mod:`megatron_rl.rollout.server`). The engine is the vLLM CPU build by
default; ``--engine hf`` is the lightest for tests. Settings come from ``--config`` (its
``rollout`` section) plus dotted overrides, as for every other command.

With ``--num-servers N`` it runs a whole node's fleet instead (:class:`launch.servers.Fleet`):
N servers, sglang-router on ``--router-port`` (or registration with ``--router-url``), the
``servers-<host>.json`` manifest in ``--run-dir``, and supervision (restart + re-add with the
current weights) until SIGTERM. The Slurm scripts run this on every rollout node, with
``--node-index`` so that every server of the job gets its own sampling seed
(:func:`launch.server_args.server_seed`).

Who may talk to it: every request but ``GET /health`` carries the fleet's API key as a Bearer
token (``$MEGATRON_RL_API_KEY``, ``--api-key-file``, else ``<run-dir>/api_key``, made 0600 on
first use: :mod:`megatron_rl.rollout.auth`). A lone server binds ``--host`` (loopback by
default); a fleet binds loopback on one node and the node's own address in a multi-node Slurm
job, never every interface unless ``--host 0.0.0.0`` asks for it (docs/security.md).

Seeds as SGLang uses them: a request's ``sampling_seed`` counts only in deterministic mode
(``rollout.sglang.deterministic``, or ``--enable-deterministic-inference`` here); otherwise each
server samples from its own seeded stream.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launch.servers import Fleet
    from megatron_rl.config import RunConfig

HELP = "serve SGLang's native HTTP API (/generate, weights, health) on a local engine"

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="HF-layout model folder to serve")
    parser.add_argument("--port", type=int, default=None, help="TCP port (single server)")
    parser.add_argument(
        "--host",
        default=None,
        help="address to bind (default: 127.0.0.1; a multi-node fleet: the node's own address; "
        "0.0.0.0 binds every interface)",
    )
    parser.add_argument(
        "--api-key-file",
        default=None,
        help="file holding the API key (default: $MEGATRON_RL_API_KEY, else <run-dir>/api_key, "
        "generated mode 0600 when missing)",
    )
    parser.add_argument(
        "--trainer-address",
        default=None,
        help="the trainer's address, the only master_address a weight-update group may name "
        "when rollout.sglang.master_addr is unset (default: this host's addresses)",
    )
    limits = parser.add_argument_group("request bounds (embedded servers)")
    limits.add_argument("--max-prompts-per-request", type=int, default=1024, help="prompts")
    limits.add_argument(
        "--max-tokens-per-request", type=int, default=1 << 22, help="prompt + n x new tokens"
    )
    limits.add_argument(
        "--max-queued", type=int, default=0, help="samples queued at once (0: 16 x max_batch)"
    )
    parser.add_argument(
        "--engine", default=None, help="engine name (default: the config's, else 'vllm')"
    )
    parser.add_argument("--config", default=None, help="run config YAML (its rollout section)")
    parser.add_argument("--seed", type=int, default=None, help="engine seed (default: config's)")
    parser.add_argument(
        "--enable-deterministic-inference",
        action="store_true",
        help="honour each request's sampling_seed (default: rollout.sglang.deterministic)",
    )
    fleet = parser.add_argument_group("fleet mode (several servers + router on this node)")
    fleet.add_argument("--num-servers", type=int, default=None, help="servers on this node")
    fleet.add_argument("--gpus-per-server", type=int, default=0, help="GPUs each (0: CPU)")
    fleet.add_argument(
        "--gpu-ids",
        default=None,
        help="positions among the step's visible GPUs to use, e.g. 4,5,6,7 (default: all)",
    )
    fleet.add_argument(
        "--node-index", type=int, default=0, help="this rollout node's index (distinct seeds)"
    )
    fleet.add_argument("--router-port", type=int, default=None, help="start the router here")
    fleet.add_argument("--router-url", default=None, help="register with this router instead")
    fleet.add_argument(
        "--run-dir", default=".", help="manifest, logs, current weights and the API key file"
    )
    fleet.add_argument("--health-timeout", type=float, default=300.0, help="seconds per server")
    fleet.add_argument(
        "--wait-workers",
        type=int,
        default=None,
        help="with --router-url only: wait until the router lists this many healthy servers",
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. rollout.dtype=float32")


def main(args: argparse.Namespace) -> int:
    from megatron_rl.config import load_config
    from megatron_rl.rollout.auth import fleet_key
    from megatron_rl.rollout.build import build_engine
    from megatron_rl.rollout.server import serve

    if args.wait_workers is not None:
        return _wait_workers(args)
    cfg = load_config(args.config, list(args.overrides))
    engine = server_engine(args.engine, cfg.rollout.engine, fleet=args.num_servers is not None)
    if not args.model or not Path(args.model).is_dir():
        raise ValueError(f"--model {args.model!r} is not a folder")
    if args.num_servers is not None:
        return _serve_fleet(args, engine, cfg)
    if args.port is None or not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535 (or use --num-servers), got {args.port}")
    for flag in ("max_prompts_per_request", "max_tokens_per_request"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.max_queued < 0:
        raise ValueError(f"--max-queued must be >= 0, got {args.max_queued}")
    key = fleet_key(args.run_dir, args.api_key_file)  # before the (slow) engine start
    seed = cfg.seed if args.seed is None else args.seed
    engine_cfg = replace(cfg.rollout, engine=engine, return_routed_experts=routed_experts(cfg))
    sg = cfg.rollout.sglang
    serve(
        build_engine(engine_cfg, args.model, seed),
        str(Path(args.model).resolve()),
        args.host or "127.0.0.1",
        args.port,
        api_key=key,
        max_batch=cfg.rollout.max_batch,
        deterministic=args.enable_deterministic_inference or sg.deterministic,
        bucket_timeout_s=sg.bucket_timeout_s,
        trainer=sg.master_addr or args.trainer_address or "",  # the address the trainer sends
        max_prompts=args.max_prompts_per_request,
        max_tokens=args.max_tokens_per_request,
        max_queued=args.max_queued,
    )
    return 0


def routed_experts(cfg: RunConfig) -> bool:
    """Servers record the experts they route to (SGLang's ``--enable-return-routed-experts``)
    when the run replays them (``rl.routing_replay=rollout``) or the config asks."""
    return bool(cfg.rollout.return_routed_experts or cfg.rl.routing_replay == "rollout")


def server_engine(flag: str | None, configured: str, fleet: bool) -> str:
    """The servers' engine: ``--engine``, else the config's local engine, else vLLM.

    ``sglang`` (the real SGLang server, GPU nodes) runs in fleet mode only; the run config's
    ``rollout.engine=sglang`` names the trainer's *client*, so it does not pick the servers.
    """
    engine = flag or (configured if configured != "sglang" else "vllm")
    if engine == "sglang":
        if not fleet:
            raise ValueError(
                "--engine sglang starts SGLang servers in fleet mode: add --num-servers"
            )
        if importlib.util.find_spec("sglang") is None:
            raise ValueError(
                f"--engine sglang: the sglang package is not installed for {sys.executable}; "
                "run launch/setup_env.sh on a GPU node (or serve with --engine vllm/hf)"
            )
    return engine


def _serve_fleet(args: argparse.Namespace, engine: str, cfg: RunConfig) -> int:
    fleet = build_fleet(args, engine, cfg)
    with fleet:
        log.info("fleet ready: %s", fleet.write_manifest())
        fleet.supervise()
    return 0


def build_fleet(args: argparse.Namespace, engine: str, cfg: RunConfig) -> Fleet:
    """The :class:`launch.servers.Fleet` that ``--num-servers`` runs (not started)."""
    from launch.server_args import sglang_server_args
    from launch.servers import Fleet
    from megatron_rl.rollout.auth import fleet_key

    if args.router_port is None and args.router_url is None:
        raise ValueError("--num-servers needs --router-port (start a router) or --router-url")
    if args.node_index < 0:
        raise ValueError(f"--node-index must be >= 0, got {args.node_index}")
    seed = cfg.seed if args.seed is None else args.seed
    embedded = [*(["--config", args.config] if args.config else []), *args.overrides]
    embedded += _bound_flags(args)
    if args.enable_deterministic_inference:
        embedded.append("--enable-deterministic-inference")
        cfg.rollout.sglang.deterministic = True
    return Fleet(
        args.run_dir,
        str(Path(args.model).resolve()),
        args.num_servers,
        engine=engine,
        gpus_per_server=args.gpus_per_server,
        router_port=args.router_port,
        router_url=args.router_url,
        host=fleet_host(args.host, args.router_url),
        bind=args.host if args.host in ("0.0.0.0", "::") else None,
        api_key=fleet_key(args.run_dir, args.api_key_file),
        health_timeout_s=args.health_timeout,
        sync_dir=cfg.rollout.sync_dir,
        gpu_ids=[int(x) for x in args.gpu_ids.split(",")] if args.gpu_ids else None,
        server_args=embedded if engine != "sglang" else [],
        sglang_args=(
            sglang_server_args(cfg.rollout, routed_experts(cfg)) if engine == "sglang" else []
        ),
        seed=seed,
        node_index=args.node_index,
        router_policy=cfg.rollout.sglang.router_policy,
        health_check_timeout_s=cfg.rollout.sglang.health_check_timeout_s,
    )


def _bound_flags(args: argparse.Namespace) -> list[str]:
    """The request bounds and trainer address, passed on to each embedded server."""
    out = ["--max-prompts-per-request", str(args.max_prompts_per_request)]
    out += ["--max-tokens-per-request", str(args.max_tokens_per_request)]
    out += ["--max-queued", str(args.max_queued)]
    return out + (["--trainer-address", args.trainer_address] if args.trainer_address else [])


def multi_node() -> bool:
    """Whether this runs in a Slurm job of more than one node."""
    return int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 1) > 1


def fleet_host(flag: str | None, router_url: str | None) -> str:
    """The address a fleet's servers and router bind and are reached at: ``--host`` when given
    (0.0.0.0 / :: bind every interface and are reached at this node's address); else the
    node's own address in a multi-node job (or when it joins another node's router), else
    loopback."""
    if flag and flag not in ("0.0.0.0", "::"):
        return flag
    if flag or multi_node() or router_url:
        return node_address()
    return "127.0.0.1"


def node_address() -> str:
    """This node's address as other nodes reach it (Slurm's node name when inside a job)."""
    import socket

    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    try:
        return socket.gethostbyname(name)
    except OSError as e:
        raise ValueError(
            f"cannot resolve this node's name {name!r} ({e}); pass --host ADDRESS"
        ) from None


def _wait_workers(args: argparse.Namespace) -> int:
    from launch.servers import Fleet
    from megatron_rl.rollout.auth import fleet_key

    if not args.router_url:
        raise ValueError("--wait-workers needs --router-url")
    fleet = Fleet(
        args.run_dir,
        "",
        0,
        router_url=args.router_url,
        health_timeout_s=args.health_timeout,
        api_key=fleet_key(args.run_dir, args.api_key_file),
    )
    fleet.wait_workers(args.wait_workers)
    log.info("router %s lists %d healthy servers", args.router_url, args.wait_workers)
    return 0
