"""pykcm: a standalone kube-controller-manager in Python."""

import importlib.util
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

try:
    __version__ = version("pykcm")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"


def _map_checkout_controllers() -> None:
    """In a source checkout the built-in controllers live in the top-level controllers/ folder,
    which the wheel installs as `pykcm.controllers` (pyproject's package-dir): map it the same
    way, so `python -m pykcm...` and the tests run from a checkout as from an installed wheel."""
    package = Path(__file__).parent
    folder = package.parent / "controllers"
    if (package / "controllers").is_dir() or not (folder / "__init__.py").is_file():
        return  # installed: pykcm/controllers is a real subpackage
    name, search = f"{__name__}.controllers", [str(folder)]
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py", submodule_search_locations=search)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


_map_checkout_controllers()
