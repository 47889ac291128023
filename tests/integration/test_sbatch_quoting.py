"""Config values in the rendered job script: hostile ones refused, odd but legal ones quoted.

Every string setting of ``SlurmConfig`` (found from its fields, so a new one is covered too) and
every other value the template writes (run name, output folder, model path, config path) is
given a newline, a carriage return or another control character: ``submit`` refuses it with a
``ValueError`` naming the key, before anything is written. Legal values with blanks, quotes,
``#`` and ``%`` render so that bash (``bash -n``, and the run section executed) and the real
sbatch of a local Slurm cluster (``tests/integration/slurm_cluster.py``) read them back whole.
"""

from __future__ import annotations

import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from launch.commands.submit import load_with_slurm, render_sbatch
from megatron_rl.config import RunConfig
from megatron_rl.slurm.config import SlurmConfig
from megatron_rl.slurm.values import sbatch_words

sys.path.insert(0, str(Path(__file__).parent))
from slurm_cluster import SlurmCluster, slurm_available

HINTS = typing.get_type_hints(SlurmConfig)
STRING_KEYS = sorted(k for k, tp in HINTS.items() if tp is str or tp == list[str])
CPU = {"gpus_per_node": 0, "gpus_per_server": 0, "server_engine": "hf"}


def _render(tmp: Path, data: dict[str, Any], name: str = "run.yaml") -> str:
    """The script ``submit --dry-run`` prints for ``data`` (a run config) written to ``name``."""
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    full = {"run_name": "r", "output_dir": str(tmp / "runs"), "model": {"hf_path": str(model)}}
    full |= data
    config = tmp / name
    config.write_text(yaml.safe_dump(full))
    cfg, slurm = load_with_slurm(str(config), [])
    return render_sbatch(cfg, slurm, str(config), [])


def test_every_string_setting_is_covered() -> None:
    expected = {"partition", "account", "qos", "time_limit", "mem", "extra_sbatch", "setup", "cli"}
    expected |= {"container_image", "container_mounts", "network_interface", "train_command"}
    assert expected <= set(STRING_KEYS)


@pytest.mark.parametrize("char", ["\n", "\r", "\x00", "\x0b", "\u2028"], ids=repr)
@pytest.mark.parametrize("key", STRING_KEYS)
def test_a_control_character_in_any_slurm_setting_is_refused(
    tmp_path: Path, key: str, char: str
) -> None:
    value = f"gpu{char}#SBATCH --wrap=reboot{char}reboot"
    data = {"slurm": {**CPU, key: value if HINTS[key] is str else [value]}}
    with pytest.raises(ValueError, match=rf"slurm\.{key}(\[0\])?=.*control character"):
        _render(tmp_path, data)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"run_name": "r\nreboot"}, "run_name"),
        ({"run_name": "r\r#SBATCH --x"}, "run_name"),
        ({"output_dir": "/tmp/x\nreboot"}, "output_dir"),
        ({"model": {"hf_path": "/m\nreboot"}}, "model.hf_path"),
        ({"slurm": {**CPU, "server_model": "/m\nreboot"}}, "slurm.server_model"),
    ],
)
def test_a_newline_in_any_other_rendered_value_is_refused(
    tmp_path: Path, data: dict[str, Any], key: str
) -> None:
    with pytest.raises(ValueError, match=rf"{key}=.*control character"):
        _render(tmp_path, data)


def test_configs_built_in_code_are_checked_when_rendered(tmp_path: Path) -> None:
    cfg = RunConfig(output_dir=str(tmp_path))
    cfg.model.hf_path = str(tmp_path)
    slurm = SlurmConfig(**CPU, partition="gpu\nreboot")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="slurm.partition="):
        render_sbatch(cfg, slurm, str(tmp_path / "run.yaml"), [])
    cfg.run_name = "../x"
    with pytest.raises(ValueError, match="run_name='../x' is refused"):
        render_sbatch(cfg, SlurmConfig(**CPU), str(tmp_path / "run.yaml"), [])  # type: ignore[arg-type]


def test_a_newline_in_the_config_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="CONFIG=.*control character"):
        _render(tmp_path, {"slurm": CPU}, name="run\nreboot.yaml")


ODD_NAME = 'odd run #1 "q" it\'s 50%x $HOME'  # legal: one folder name


def _odd(tmp: Path) -> tuple[dict[str, Any], Path]:
    data = {
        "run_name": ODD_NAME,
        "output_dir": str(tmp / "out dir"),
        "slurm": {
            "partition": "a,b", "account": "proj7", "qos": "high", "mem": "512G",
            "time_limit": "1-00:00", "network_interface": "^lo,docker",
            "container_image": "/images/my image.sqsh",
            "container_mounts": "/data sets/a b:/data,/scratch:/scratch",
            "cli": f"{sys.executable} -m launch.cli", "setup": ["echo 'setup ran'"],
            "extra_sbatch": ['--comment="two words"'], "gpus_per_server": 2,
        },
    }  # fmt: skip
    return data, tmp / "out dir" / ODD_NAME


def _sbatch_line(script: str, option: str) -> list[str]:
    """The words sbatch reads from the ``#SBATCH --<option>...`` line of ``script``."""
    line = next(ln for ln in script.splitlines() if ln.startswith(f"#SBATCH --{option}"))
    return sbatch_words(line.removeprefix("#SBATCH "))


def test_odd_but_legal_values_render_quoted(tmp_path: Path) -> None:
    data, run_dir = _odd(tmp_path)
    script = _render(tmp_path, data)
    assert "#SBATCH --partition=a,b\n" in script and "#SBATCH --mem=512G\n" in script
    assert _sbatch_line(script, "job-name") == [f"--job-name=mrl-{ODD_NAME}"]
    output = str(run_dir).replace("%", "%%") + "/slurm-%j.out"  # '%%' is a literal '%'
    assert _sbatch_line(script, "output") == [f"--output={output}"]
    assert _sbatch_line(script, "comment") == ["--comment=two words"]
    assert script.splitlines()[1].startswith("# megatron-rl run 'odd run #1")
    check = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr
    # the run section, executed: every value comes back as one word, as it was given
    lines = script.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("RUN_DIR="))
    end = next(i for i, ln in enumerate(lines) if ln.startswith("SRUN_STEP="))
    show = 'printf "%s\\n" "$RUN_DIR" "$NCCL_SOCKET_IFNAME" "$GLOO_SOCKET_IFNAME" "${CONTAINER[@]}"'
    body = "\n".join([*lines[start:end], show, "echo $MRL"])
    out = subprocess.run(["bash", "-c", body], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "setup ran", str(run_dir), "^lo,docker", "^lo,docker",
        "--container-image=/images/my image.sqsh",
        "--container-mounts=/data sets/a b:/data,/scratch:/scratch",
        f"{sys.executable} -m launch.cli",
    ]  # fmt: skip


def test_train_overrides_are_one_shell_word_each(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    config = tmp_path / "run.yaml"
    data = {"output_dir": str(tmp_path), "model": {"hf_path": str(model)}}
    config.write_text(yaml.safe_dump(data))
    cfg, slurm = load_with_slurm(str(config), [f"slurm.{k}={v}" for k, v in CPU.items()])
    script = render_sbatch(cfg, slurm, str(config), ["tracking.project=a'; reboot #\nb"])
    assert "'tracking.project=a'\"'\"'; reboot #\nb'" in script
    check = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    why = slurm_available()
    if why:
        pytest.skip(why)
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as c:
        yield c


def test_real_sbatch_reads_the_quoted_header(cluster: SlurmCluster, tmp_path: Path) -> None:
    """The rendered ``#SBATCH`` header (with ``echo ok`` for a body) on a real cluster: the job
    name, the comment and the output file in the odd run directory are what was given."""
    data, run_dir = _odd(tmp_path)
    data["slurm"] = {**CPU, "partition": "debug", "time_limit": "00:05:00",
                     "extra_sbatch": data["slurm"]["extra_sbatch"]}  # fmt: skip
    script = _render(tmp_path, data)
    header = script[: script.index("set -uo pipefail")]
    job = tmp_path / "job.sbatch"
    job.write_text(header + "echo ok\n")
    run_dir.mkdir(parents=True)
    job_id = cluster.sbatch(job)
    assert cluster.wait_job(job_id, timeout_s=120) == "COMPLETED"
    shown = cluster.run(["scontrol", "show", "job", str(job_id)]).stdout
    fields = {k: v for ln in shown.splitlines() for k, _, v in [ln.strip().partition("=")]}
    assert shown.split("JobName=", 1)[1].split("\n", 1)[0] == f"mrl-{ODD_NAME}"
    assert fields["Comment"].strip() == "two words"
    assert (run_dir / f"slurm-{job_id}.out").read_text() == "ok\n"
