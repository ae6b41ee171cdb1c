"""``torchtriage demo``: profile the bundled data-starved example end to end."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from torchtriage.errors import TorchtriageError

DEMO_EXAMPLE = "data_starved"
# wait + warm-up + active steps of the default schedule; the last step() call saves the trace.
DEMO_STEPS = 8


def examples_dir() -> Path:
    """The bundled examples: inside the installed package, or the repository's ``examples/``."""
    packaged = Path(__file__).resolve().parent / "_examples"
    if packaged.is_dir():
        return packaged
    repo = Path(__file__).resolve().parents[2] / "examples"
    if repo.is_dir():
        return repo
    raise TorchtriageError("bundled examples not found (reinstall torchtriage)")


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` as a module."""
    path = examples_dir() / f"{name}.py"
    if not path.is_file():
        raise TorchtriageError(f"no example named {name!r} in {path.parent}")
    spec = importlib.util.spec_from_file_location(f"torchtriage_example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
