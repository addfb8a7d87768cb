"""What serve prepares before preflight: the SmolLM2 conversion's dependencies."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from kimidflash.config import load_config
from kimidflash.cpu_reference import smollm2
from kimidflash.errors import ConversionError
from kimidflash.prepare import prepare

from ..support.helpers import CONFIGS, write_env


def test_the_project_venv_can_convert_smollm2():
    """scripts/venv.sh installs `.[test]`: the conversion serve.sh runs must find every module it needs."""
    assert smollm2.missing_modules() == []


def test_a_missing_conversion_module_is_named_with_the_command_that_installs_it(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    env = write_env(
        tmp_path / "c.env", f"INCLUDE={CONFIGS / 'cpu-reference.env'}\nMODEL_DIR={tmp_path / 'm'}\nVLLM_VENV=\n"
    )
    with pytest.raises(ConversionError) as exc:
        prepare(load_config(env, environ={}), log=lambda m: None)
    message = str(exc.value)
    assert "gguf cannot be imported" in message and "None" not in message
    assert message.endswith(
        f"{sys.executable} -m pip install -e '{smollm2.__file__.rsplit('/src/', 1)[0]}[cpu-reference]'"
    )
    assert not (tmp_path / "m").exists()  # refused before anything was written
