"""The formats the job script accepts for Slurm settings and run names, value by value.

What sbatch itself accepts was checked on the real Slurm 22.05 of this machine (``sbatch
--test-only``): the accepted ``--time`` / ``--mem`` values below it takes, the refused ones it
refuses (or they are undocumented forms it happens to take, such as ``--time=1-``).
``tests/integration/test_sbatch_quoting.py`` renders whole scripts and submits a header.
"""

from __future__ import annotations

import pytest

from megatron_rl.slurm.config import SlurmConfig
from megatron_rl.slurm.values import output_pattern, sbatch_quote, sbatch_words
from megatron_rl.text_checks import check_path_component


def _check(**kw: object) -> None:
    SlurmConfig(gpus_per_node=0, gpus_per_server=0, server_engine="hf", **kw).validate()  # type: ignore[arg-type]


TIMES_OK = ["10", "10:30", "1:00:00", "100:00:00", "1-2", "1-2:30", "1-2:30:15", "0", "UNLIMITED"]
TIMES_BAD = ["4h", "1:2:3:4", "1-2-3", " 10", "10 ", "1-", "-1", "", "1:00:00\n", "1;reboot"]


@pytest.mark.parametrize("value", TIMES_OK)
def test_time_limit_takes_every_sbatch_format(value: str) -> None:
    _check(time_limit=value)


@pytest.mark.parametrize("value", TIMES_BAD)
def test_time_limit_refuses_what_sbatch_does_not_document(value: str) -> None:
    with pytest.raises(ValueError, match="slurm.time_limit="):
        _check(time_limit=value)


@pytest.mark.parametrize("value", ["512G", "512g", "100", "1T", "1K", "0"])
def test_mem_takes_a_number_with_an_optional_unit(value: str) -> None:
    _check(mem=value)


@pytest.mark.parametrize("value", ["1.5G", "1P", "512 G", "10GB", "-1", "512G\n#SBATCH -x"])
def test_mem_refuses_anything_else(value: str) -> None:
    with pytest.raises(ValueError, match="slurm.mem="):
        _check(mem=value)


@pytest.mark.parametrize(
    ("key", "value"),
    [("partition", "gpu"), ("partition", "a,b"), ("partition", "gpu-h100_x.1"),
     ("account", "proj7"), ("account", "my.acct+1"), ("qos", "high")],
)  # fmt: skip
def test_names_take_slurm_names_and_partition_lists(key: str, value: str) -> None:
    _check(**{key: value})


@pytest.mark.parametrize("key", ["partition", "account", "qos"])
@pytest.mark.parametrize(
    "value", ["a b", "a;b", "a\nb", "$(reboot)", "a#b", "a'b", 'a"b', "a\\b", "a\tb", "`id`"]
)
def test_names_refuse_blanks_quotes_and_shell_characters(key: str, value: str) -> None:
    with pytest.raises(ValueError, match=f"slurm.{key}="):
        _check(**{key: value})


def test_only_the_partition_takes_a_list() -> None:
    with pytest.raises(ValueError, match="slurm.account='a,b'"):
        _check(account="a,b")


@pytest.mark.parametrize("value", ["ib0", "eth0,eth1", "^lo,docker", "=eth0", "^=docker0", "en:1"])
def test_network_interface_takes_nccl_lists(value: str) -> None:
    _check(network_interface=value)


@pytest.mark.parametrize("value", ["ib0 eth0", "ib0;reboot", "$(id)", "ib0\n", "lo^", "a,,b", ","])
def test_network_interface_refuses_other_text(value: str) -> None:
    with pytest.raises(ValueError, match="slurm.network_interface="):
        _check(network_interface=value)


@pytest.mark.parametrize(
    "line", ["--exclusive", "--constraint=h100", "-N 2", '--comment="a b"', "--x  # why"]
)
def test_extra_sbatch_takes_option_lines(line: str) -> None:
    _check(extra_sbatch=[line])


@pytest.mark.parametrize(
    "line", ["exclusive", "", "  ", "# --x", "--x\n--y", "--x\r", '--comment="a', "--x \\", "x=1"]
)
def test_extra_sbatch_refuses_what_is_no_option_line(line: str) -> None:
    with pytest.raises(ValueError, match=r"slurm.extra_sbatch\[1\]"):
        _check(extra_sbatch=["--exclusive", line])


def test_setup_lines_are_shell_but_one_line_each() -> None:
    _check(setup=["module load cuda/12.4 && echo $PATH", "export A='x y'\t# tab"])
    for bad in ("module load a\nrm -rf ~", "a\rb", "a\x00b"):
        with pytest.raises(ValueError, match=r"slurm.setup\[0\]="):
            _check(setup=[bad])


@pytest.mark.parametrize("char", ["\n", "\r", "\x00", "\x1b", "\x7f", "\x85", "\u2028", "\u202e"])
def test_every_string_setting_refuses_control_characters(char: str) -> None:
    for key in ("container_image", "container_mounts", "cli", "server_model", "train_command"):
        with pytest.raises(ValueError, match=f"slurm.{key}=.*control character"):
            _check(**{key: f"a{char}b"})


def test_sbatch_words_read_a_line_as_sbatch_does() -> None:
    # what the real sbatch made of these lines (scontrol show job: JobName=, Comment=)
    name = "mrl-a b#c\"d\\e'f$g"
    assert sbatch_words('--job-name="mrl-a b#c\\"d\\\\e\'f$g"') == [f"--job-name={name}"]
    assert sbatch_words("--comment='x y'\"z\"  # trailing comment") == ["--comment=x yz"]
    assert sbatch_words("-N 2\t--exclusive") == ["-N", "2", "--exclusive"]
    assert sbatch_words("--x=''") == ["--x="]


@pytest.mark.parametrize(
    "value", ["plain", "a b", "a#b", 'q"uote', "it's", "back\\slash", "$HOME `id`", "50%", ""]
)
def test_sbatch_quote_is_read_back_as_one_word(value: str) -> None:
    assert sbatch_words("--job-name=" + sbatch_quote(value)) == ["--job-name=" + value]


def test_output_pattern_keeps_percent_literal_and_refuses_backslash() -> None:
    assert output_pattern("/runs/r%x") == "/runs/r%%x/slurm-%j.out"
    with pytest.raises(ValueError, match="backslash"):
        output_pattern("/runs/a\\b")


@pytest.mark.parametrize("value", ["run", "run-1", "my run", "x.y", "...", "ünï", "a%b#c", "-r"])
def test_run_name_takes_one_folder_name(value: str) -> None:
    check_path_component("run_name", value, "output_dir")


@pytest.mark.parametrize(
    "value",
    ["", ".", "..", "../x", "/abs", "a/b", "a\\b", "..\\x", "a\x00b", "a\nb", "a\rb", "a\tb",
     " x", "x ", "\u202ex", "x" * 256, "é" * 128],
)  # fmt: skip
def test_run_name_refuses_what_would_leave_output_dir(value: str) -> None:
    with pytest.raises(ValueError, match="run_name=.* is refused: .*one folder inside output_dir"):
        check_path_component("run_name", value, "output_dir")
