"""The tests' torchrun entry point: `faulty.py SCRIPT ARGS...` runs SCRIPT with GV_FAULTS.

The script (examples/train_resilient.py, or any other) runs unchanged; `faults.patch()`
reaches it through gpuvigil.training's own classes (and the Lightning callback, when the
script uses it).
"""

import runpy
import sys
from pathlib import Path

import faults

faults.patch(lightning="gpuvigil.training.lightning" in Path(sys.argv[1]).read_text())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
