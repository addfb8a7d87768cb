"""Run vLLM's Triton kernels on CPU tensors under the Triton interpreter.

Shared by the kernel tests. vLLM swaps triton for placeholders when no GPU driver
is active, and importing the whole package needs its many dependencies, so the
kernel files are executed straight from a copy of a real wheel with the handful
of ``vllm`` names they import provided by stand-in modules, ``vllm.triton_utils``
pointing at the real triton.

Importing this module imports triton with ``TRITON_INTERPRET=1``: triton.language
decorates its own @jit helpers (tl.zeros, ...) when it is first imported, so the
interpreter must be on by then. The variable is restored at once so that nothing
else (e.g. servers started by other tests) inherits it.

The interpreter does not compute on bfloat16 (Triton stores it as raw uint16 and
``tl.dot`` multiplies the bit patterns; triton-lang/triton issue 11584), so tests
use float32 tensors, with bfloat16-representable values where they stand for a
bfloat16 model, and FP8 caches, which the interpreter converts correctly.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import logging
import os
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

_prev = os.environ.get("TRITON_INTERPRET")
os.environ["TRITON_INTERPRET"] = "1"
try:
    triton = pytest.importorskip("triton")
    import triton.language as tl
finally:
    if _prev is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = _prev


def assert_interpreted() -> None:
    """Fail clearly when triton was imported (compiled mode) before this module."""
    assert type(tl.zeros).__name__ == "InterpretedFunction", (
        "triton was imported before TRITON_INTERPRET=1; run this file in its own process"
    )


def stub_module(name: str, **attrs) -> types.ModuleType:
    """A stand-in module (also usable as a package) holding ``attrs``."""
    m = types.ModuleType(name)
    m.__path__ = []
    m.__dict__.update(attrs)
    return m


def init_logger(name: str):
    """Stand-in for ``vllm.logger.init_logger``: a logger with vLLM's ``*_once`` methods."""
    log = logging.getLogger(name)
    return types.SimpleNamespace(
        debug=log.debug,
        info=log.info,
        warning=log.warning,
        error=log.error,
        debug_once=log.debug,
        info_once=log.info,
        warning_once=log.warning,
    )


def common_stubs() -> dict[str, types.ModuleType]:
    """The ``vllm`` packages every kernel file needs: the package skeleton down to
    ``vllm.v1.attention.ops``, the logger, and triton_utils on the real triton."""
    return {
        "vllm": stub_module("vllm"),
        "vllm.logger": stub_module("vllm.logger", init_logger=init_logger),
        "vllm.triton_utils": stub_module("vllm.triton_utils", triton=triton, tl=tl),
        "vllm.v1": stub_module("vllm.v1"),
        "vllm.v1.attention": stub_module("vllm.v1.attention"),
        "vllm.v1.attention.ops": stub_module("vllm.v1.attention.ops"),
    }


def _exec(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def vllm_stubs_installed(stubs: dict[str, types.ModuleType]):
    """``stubs`` as the only ``vllm`` modules in ``sys.modules`` for the block (for
    loading kernel files, and around calls whose code imports vllm lazily)."""
    saved = {k: v for k, v in sys.modules.items() if k == "vllm" or k.startswith("vllm.")}
    try:
        for k in saved:
            del sys.modules[k]
        sys.modules.update(stubs)
        yield
    finally:
        for k in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def load_vllm_files(
    pkg: Path, stubs: dict[str, types.ModuleType], files: list[tuple[str, str]]
) -> dict[str, types.ModuleType]:
    """Execute ``files`` ((module name, path relative to the ``vllm`` package at
    ``pkg``), in order) with ``stubs`` standing in for the rest of vllm; returns the
    executed modules by name. ``sys.modules`` is restored afterwards; the returned
    modules keep the stand-ins they imported."""
    with vllm_stubs_installed(stubs):
        return {name: _exec(name, pkg / rel) for name, rel in files}


def function_from_source(path: Path, name: str, namespace: dict):
    """One top-level function of a vLLM source file, executed alone in ``namespace``
    without its decorators (for small decision functions whose module cannot be
    imported here)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    node.decorator_list = []
    code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec")
    exec(code, namespace)
    return namespace[name]
