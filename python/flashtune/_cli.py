"""The flashtune CLI that the package carries: flashtune/bin/flashtune and its worker flashtune/bin/flashtune-worker
(the CLI starts the worker found beside itself; the kernel templates are embedded in both), with the scripts and
spaces they read in flashtune/data/. $FLASHTUNE_CLI names another CLI binary (the tests in the build tree use it,
as $FLASHTUNE_LIBRARY names the runtime library); its data folder is then the one beside its bin/, else this
package's."""
import os

from ._lib import FlashtuneError, one_line

ENV_CLI = "FLASHTUNE_CLI"
_PACKAGE = os.path.dirname(os.path.abspath(__file__))


class CliNotFoundError(FlashtuneError, OSError):
    """The flashtune CLI is not in this installation (a package built without it, or $FLASHTUNE_CLI wrong)."""


def _executable(path):
    return os.path.isfile(path) and os.access(path, os.X_OK)


def cli_path():
    """The CLI binary: $FLASHTUNE_CLI, else flashtune/bin/flashtune in this package; one-line error if missing."""
    env = os.environ.get(ENV_CLI)
    if env:
        if not os.path.isabs(env) or not _executable(env):
            raise CliNotFoundError(one_line(f"{ENV_CLI}='{env}' is not an absolute path to an executable file"))
        return env
    path = os.path.join(_PACKAGE, "bin", "flashtune")
    if not _executable(path):
        raise CliNotFoundError(one_line(f"this flashtune package has no CLI ({path} is missing): the wheel was built "
                                        "without its tools; build one with them (pip install . "
                                        "-Ccmake.define.FLASHTUNE_PYTHON_TOOLS=ON, which needs SQLite3 and "
                                        f"nlohmann_json), or set {ENV_CLI} to a built flashtune binary"))
    return path


def data_dir():
    """The folder holding configs/spaces, configs/problems and the report scripts for cli_path()'s CLI."""
    beside = os.path.join(os.path.dirname(os.path.dirname(cli_path())), "data")
    if os.path.isdir(os.path.join(beside, "configs", "spaces")):
        return beside
    mine = os.path.join(_PACKAGE, "data")
    if os.path.isdir(os.path.join(mine, "configs", "spaces")):
        return mine
    # A CLI of a build tree ($FLASHTUNE_CLI=<build>/flashtune): the source tree's configs, when the
    # package itself is imported from it (PYTHONPATH=<repo>/python).
    source = os.path.dirname(os.path.dirname(_PACKAGE))
    if os.path.isdir(os.path.join(source, "configs", "spaces")):
        return source
    raise CliNotFoundError("no configs/spaces beside the flashtune CLI or in the package")
