"""python -m flashtune <command> [options]: the flashtune CLI that the package carries (flashtune/bin/flashtune),
run as `flashtune <command>` runs in a build: tune, best, emit, report, devices, families, merge, export, ...
(`python -m flashtune --help` lists them, `python -m flashtune <command> --help` tells each). The process becomes
the CLI (exec): its exit status, output and signals are the CLI's own.

For the GPU in front of you, `python -m flashtune devices --store` prints the user's store, which the runtime reads
with no environment variable; flashtune.tune(shapes, ...) fills it from Python."""
import os
import sys

from ._cli import CliNotFoundError, cli_path


def main(argv=None):
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        exe = cli_path()
    except CliNotFoundError as e:
        print(f"python -m flashtune: {e}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(exe, ["flashtune", *args])
    except OSError as e:
        print(f"python -m flashtune: cannot run {exe}: {e.strerror or e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
