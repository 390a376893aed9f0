"""``python -m fedlib.app.chapters.logitfl [stage ...] [--shard i/n]``: the calibration (``calibration.calibrate``)."""

import sys

from .calibration import STAGES, calibrate

if __name__ == "__main__":
    args = sys.argv[1:]
    shard, shards = 0, 1
    if "--shard" in args:
        at = args.index("--shard")
        shard, shards = (int(v) for v in args[at + 1].split("/"))
        del args[at:at + 2]
    calibrate(stages=tuple(args) or STAGES, shard=shard, shards=shards)
