"""Every error this package raises on purpose, and the exit statuses they map to.

One leaf module (it imports nothing of ours), so any module can name any error
without importing the code that raises it. The command table (`commands.py`) is
the one place that turns an error into an exit status; a command's ``main``
lets them propagate.

    KimidflashError
    ├── RecipeError                 bad input or an unusable environment: one line, exit 2 (EXIT_USAGE)
    │   ├── ConfigError             an env file or --set the recipe refuses (names the key and the file)
    │   ├── LayoutError             a checkpoint whose language model cannot be found
    │   ├── Eagle3Error             an EAGLE-3 head that does not fit its target (names the config field)
    │   ├── PreflightError          host checks that failed before a launch
    │   ├── UsageError              a command-line option that cannot be used
    │   ├── DownloadError           a wheel or package whose download or checksum failed
    │   ├── BenchError              benchmark options or a server that is not there
    │   ├── ResultError             a result file that cannot be read
    │   ├── ReportError             inputs `compare` cannot use
    │   ├── PromptError             a prompt source that cannot be used (names file and line)
    │   ├── EngineUnavailable       no Docker engine to talk to
    │   ├── ContainerError          a container or image that cannot serve as asked
    │   ├── FleetError              a fleet file that cannot be used
    │   ├── SafetensorsError        a safetensors file that cannot be read as one
    │   ├── CheckpointError         an FP8 checkpoint or overlay that cannot be used
    │   ├── ScaleFileError          an FP8 KV scales file that is missing or inconsistent
    │   ├── CalibrationError        calibration input that cannot be used
    │   ├── InputError              validator input that cannot be used
    │   ├── PreshardError           a source or pre-sharded checkpoint the tool cannot use
    │   ├── RealPromptsError        a prompt-set spec or archive that is not the expected one
    │   ├── AdviceError             input the advisor cannot use
    │   ├── SweepError              a grid, base config or run folder the sweep cannot use
    │   ├── ConversionError         SmolLM2 that cannot be converted here, or a converted one not as expected
    │   ├── VenvPatchError          a managed vLLM venv that could not be patched
    │   ├── TrainConfigError        a training config, drafter shape or run folder that cannot be used
    │   │   └── SpeculatorsCheckpointError  a speculators checkpoint of another shape
    │   ├── DataError               a prompt set or regen record that cannot be read
    │   ├── RegenError              a target server that answered no usable completion
    │   ├── CaptureError            a served target that gave no usable hidden states
    │   └── SpeculatorsError        a speculators command that failed
    ├── LaunchError                 the launcher refuses to start vLLM on this runtime: exit 3 (EXIT_REFUSED)
    ├── ExecError                   the launcher could not exec vLLM: exit 127 (EXIT_NOT_RUNNABLE)
    ├── RunFailed                   the command ran and what it ran failed: exit 1 (EXIT_FAILED)
    │   ├── CheckFailed             a check that could not pass (validate-fp8's FAIL)
    │   ├── BuildFailed             an image build that stopped (the builder's last lines)
    │   ├── CpuBaseError            the CPU base image could not be made
    │   ├── ServeError              a server that did not come up, or died
    │   ├── KvCaptureError          a model that could not be instrumented, or wrote a non-finite KV value
    │   └── ServerRequestError      a request the server did not answer usefully
    └── (caught where raised, never reaching the command table)
        ├── MetricsError            /metrics that is not Prometheus text: the run goes on without counters
        └── PointFailed             one sweep point that failed: the sweep records it and goes on

The bad-input errors keep ``ValueError`` or ``RuntimeError`` as a second base
where callers caught those before the tree existed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

EXIT_OK = 0
EXIT_FAILED = 1  # the command ran and its check failed (config-docs --check, validate-fp8, a build)
EXIT_USAGE = 2  # bad input or an unusable environment, named in one line
EXIT_REFUSED = 3  # the launcher refuses to start vLLM: the runtime does not match the rendered command
EXIT_PARTIAL = 3  # bench run: a result written but partial (the server died), not an error; launch never returns it
EXIT_NOT_RUNNABLE = 127  # the launcher could not exec vLLM (a shell's status for a command it cannot run)
EXIT_INTERRUPTED = 130  # Ctrl-C; whatever partial result the command keeps is written first
EXIT_TERMINATED = 143  # SIGTERM (128 + 15): serve stopped by a signal before its server was ready


class KimidflashError(Exception):
    """The root: every error this package raises on purpose."""


class RecipeError(KimidflashError):
    """Bad input or an unusable environment: one line that names the culprit (exit 2)."""


class RunFailed(KimidflashError):
    """The command ran and what it ran failed: one line saying what (exit 1)."""


# --- config, checkpoints, host ---------------------------------------------------------------


class ConfigError(RecipeError):
    """A config the recipe refuses; the message names the key, the file that set it and the fix."""

    def __init__(self, key: str, message: str, source: str = ""):
        self.key, self.source = key, source
        where = f" ({source})" if source else ""
        super().__init__(f"{key}{where}: {message}")


class LayoutError(RecipeError, ValueError):
    """A checkpoint whose language model cannot be located: names the folder and the names searched for."""


class Eagle3Error(RecipeError, ValueError):
    """An EAGLE-3 head that does not fit its target: `field` is the config field to change."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class _Check(Protocol):  # preflight.Check, which this leaf module cannot import
    @property
    def name(self) -> str: ...
    @property
    def detail(self) -> str: ...
    @property
    def fix(self) -> str: ...


class PreflightError(RecipeError):
    """Host checks that failed before a launch; `failed` holds them, the message names each."""

    def __init__(self, failed: Sequence[_Check]):
        self.failed = list(failed)
        super().__init__("; ".join(f"{c.name}: {c.detail}" for c in failed))


class UsageError(RecipeError):
    """A command-line option that cannot be used: names the option and why."""


class LaunchError(KimidflashError):
    """The launcher refuses to start vLLM: the runtime does not match the rendered command (a vLLM
    of another version, a patch missing or drifted). Names the fix (exit 3, EXIT_REFUSED)."""

    def __init__(self, message: str):
        super().__init__(f"refusing to start: {message}")


class ExecError(KimidflashError):
    """The launcher could not exec the server's command (exit 127, EXIT_NOT_RUNNABLE)."""


class DownloadError(RecipeError, RuntimeError):
    """A download that failed or does not match its checksum: names the file and what was wrong."""


# --- benchmark, sweep, advisor -----------------------------------------------------------------


class BenchError(RecipeError, ValueError):
    """Bad benchmark input or an unusable server: one line naming the culprit."""


class ResultError(RecipeError, ValueError):
    """A result file we cannot read; the message names the file."""


class ReportError(RecipeError, ValueError):
    """Inputs compare cannot use; the message names the file or label."""


class PromptError(RecipeError, ValueError):
    """A prompt source we cannot use; the message names the file and the line."""


class AdviceError(RecipeError, ValueError):
    """Input the advisor cannot use (rates, costs, result files); the message names it."""


class SweepError(RecipeError, ValueError):
    """A grid, a base config or a run folder the sweep cannot use; the message names it."""


class MetricsError(KimidflashError, ValueError):
    """The server's /metrics text is not Prometheus exposition format. Not bad user input: the run
    records it and goes on without server counters."""


class PointFailed(KimidflashError):
    """One sweep point whose server or benchmark failed: the sweep records it and goes on."""


# --- docker, fleet -----------------------------------------------------------------------------


class EngineUnavailable(RecipeError, RuntimeError):
    """No daemon answered; the message is the one line a user sees."""


class ContainerError(RecipeError, RuntimeError):
    """One line naming the container or image problem and the fix."""


class BuildFailed(RunFailed, RuntimeError):
    """The build stopped; the message is the builder's (or patcher's) own last error lines."""


class CpuBaseError(RunFailed, RuntimeError):
    """The CPU base image could not be made; the message says which step and why."""


class FleetError(RecipeError, ValueError):
    """A fleet file that cannot be used: one line naming the file and the field."""


class ServeError(RunFailed, RuntimeError):
    """A server that did not become healthy, or died: the message carries its log's last lines."""


# --- FP8 KV, pre-sharding, prompts -------------------------------------------------------------


class SafetensorsError(RecipeError, ValueError):
    """A safetensors file that cannot be read as one (the message names the file)."""


class CheckpointError(RecipeError, ValueError):
    """A checkpoint or overlay that cannot be used; the message names file, layer and tensor."""


class ScaleFileError(RecipeError, ValueError):
    """A scales file that is missing, unreadable or inconsistent (the message names it)."""


class CalibrationError(RecipeError, ValueError):
    """Bad calibration input; the message names the culprit."""


class InputError(RecipeError, ValueError):
    """Bad input to the FP8 validator: the message names the culprit."""


class KvCaptureError(RunFailed, RuntimeError):
    """The model could not be instrumented, or produced a non-finite KV value."""


class ServerRequestError(RunFailed, RuntimeError):
    """A request the server did not answer usefully; the message names the prompt."""


class CheckFailed(RunFailed, RuntimeError):
    """The check could not pass, e.g. a server that would not start."""


class PreshardError(RecipeError, ValueError):
    """A source, an output folder or a pre-sharded checkpoint the tool cannot use; the message names it."""


class RealPromptsError(RecipeError, ValueError):
    """A prompt-set spec, or an archive that is not the expected one: names the file or spec."""


# --- models and training -----------------------------------------------------------------------


class ConversionError(RecipeError, RuntimeError):
    """SmolLM2 cannot be converted here (transformers missing), or the converted checkpoint is not
    the one we expect (its mask token moved)."""


class VenvPatchError(RecipeError):
    """A managed vLLM venv that could not be patched: names the patch and the venv."""


class TrainConfigError(RecipeError, ValueError):
    """A training config, a drafter shape or a run folder that cannot be used: names the file and key."""


class SpeculatorsCheckpointError(TrainConfigError):
    """A speculators checkpoint that is not a drafter of the given shape: names the checkpoint and the key."""


class DataError(RecipeError, ValueError):
    """A prompt set or a regen record that cannot be read: names the file and line."""


class RegenError(RecipeError, RuntimeError):
    """The target server answered no usable completion."""


class CaptureError(RecipeError, RuntimeError):
    """The served target gave no usable hidden states (capture.source=vllm)."""


class SpeculatorsError(RecipeError, RuntimeError):
    """A speculators command (train.engine=speculators) failed: names the command and its log."""


# The command table's map, first match wins; an error not listed here is a bug and keeps its traceback.
EXIT_STATUS: tuple[tuple[type[KimidflashError], int], ...] = (
    (RecipeError, EXIT_USAGE),
    (RunFailed, EXIT_FAILED),
    (LaunchError, EXIT_REFUSED),
    (ExecError, EXIT_NOT_RUNNABLE),
)


def exit_status(exc: KimidflashError) -> int | None:
    """The exit status `exc` ends a command with, or None for an error that should never get that far."""
    return next((status for kind, status in EXIT_STATUS if isinstance(exc, kind)), None)
