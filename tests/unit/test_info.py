"""``megatron-rl info``: the versions it prints are the installed ones, in text and JSON."""

from __future__ import annotations

import json
import platform
from importlib import metadata

import torch

from launch import cli
from launch.commands import info


def test_json_reports_installed_versions_and_compat(capsys):
    assert cli.main(["info", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["python"] == platform.python_version()
    assert out["packages"]["torch"] == torch.__version__
    assert out["packages"]["megatron-core"] == metadata.version("megatron-core")
    assert out["packages"]["transformers"] == metadata.version("transformers")
    assert set(out["packages"]) == set(info.PACKAGES)
    assert out["cuda"]["available"] == torch.cuda.is_available()
    assert len(out["cuda"]["devices"]) == (
        torch.cuda.device_count() if out["cuda"]["available"] else 0
    )
    expected = "inactive (CUDA present)" if torch.cuda.is_available() else "active"
    assert out["cpu_compat_layer"] == expected
    for tool in ("slurm", "bubblewrap"):
        assert isinstance(out[tool], str) and out[tool]


def test_missing_package_and_tool_are_reported_as_such():
    assert info.package_version(("surely-not-a-package-xyz",)) == info.NOT_INSTALLED
    assert info.package_version(("surely-not-a-package-xyz", "torch")) == metadata.version("torch")
    assert info._run_first_line(["surely-not-a-tool-xyz"]) == (-1, info.NOT_INSTALLED)


def test_text_output(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    rows = dict(line.split(None, 1) for line in out.splitlines())
    assert rows["torch"].strip() == torch.__version__
    assert rows["megatron-core"].strip() == metadata.version("megatron-core")
    assert rows["python"].strip() == platform.python_version()
    assert "cpu compat layer" in out and "bubblewrap" in out
