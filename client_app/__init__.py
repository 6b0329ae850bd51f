"""FedOwen's ClientApp package.

Importing it leaves a working directory that holds another copy of this app's packages.
Why: in a Flower simulation the ClientApp runs in Ray workers, which import it *by module
name* with the simulation process's working directory first on their ``sys.path`` (Ray adds
the driver's current directory). That directory is the SuperLink's, e.g. the checkout where
``flwr run`` was first called; a run from a second checkout then executed the first one's
``client_app``. The simulation process imports this package (from the bundled app) before
Ray starts, so moving to the bundled app's directory here makes the workers import the
bundled code. Tests and a run started from this checkout are unaffected (nothing shadows).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

PACKAGES = ("client_app", "server_app", "fedowen_task", "fedowen_strategy", "sim")


def _leave_shadowing_cwd() -> None:
    app_root = Path(__file__).resolve().parent.parent
    try:
        cwd = Path.cwd().resolve()
    except OSError:  # the working directory was deleted
        return
    if cwd == app_root or not any((cwd / p / "__init__.py").is_file() for p in PACKAGES):
        return
    logging.getLogger("flwr").warning(
        "Working directory %s holds another copy of this app's packages; changing to the "
        "bundled app %s so that simulation workers import the bundled code", cwd, app_root)
    os.chdir(app_root)


_leave_shadowing_cwd()
