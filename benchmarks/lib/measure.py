#!/usr/bin/env python3
"""Run one command and report its wall time and peak memory as one JSON line.

    measure.py --label NAME --stdout FILE --stderr FILE -- COMMAND [ARGS...]

The command's own stdout and stderr go to the given files (so its output can be parsed
afterwards); this script prints exactly one JSON object on stdout:

    {"label": NAME, "command": [...], "rc": 0, "wall_seconds": 12.3,
     "user_seconds": 20.1, "system_seconds": 1.2, "peak_rss_mb": 812.4}

Why not `/usr/bin/time -v`: the `time` package is not installed on these machines. This does
the same: `time.perf_counter()` around `subprocess.run`, and `getrusage(RUSAGE_CHILDREN)`,
whose `ru_maxrss` is the largest peak resident set of any waited-for child. One command per
invocation of this script, so that maximum is the peak of that command alone (for a command
that starts children of its own, the largest of them: each process counts separately).
"""

import argparse
import json
import resource
import subprocess
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--label", required=True)
    p.add_argument("--stdout", required=True, help="file for the command's stdout")
    p.add_argument("--stderr", required=True, help="file for the command's stderr")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        p.error("no command given (put it after --)")
    with open(args.stdout, "wb") as out, open(args.stderr, "wb") as err:
        t0 = time.perf_counter()
        try:
            rc = subprocess.run(cmd, stdout=out, stderr=err).returncode
        except OSError as e:
            print(f"measure.py: cannot run {cmd[0]}: {e}", file=sys.stderr)
            rc = 127
        wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({
        "label": args.label,
        "command": cmd,
        "rc": rc,
        "wall_seconds": round(wall, 3),
        "user_seconds": round(usage.ru_utime, 3),
        "system_seconds": round(usage.ru_stime, 3),
        # Linux reports ru_maxrss in KiB.
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
