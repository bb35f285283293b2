"""`python -m towers.launch --workers=N script.py [args...]`: see `towers.workers.launch`."""

import sys

from towers.workers import launch

if __name__ == "__main__":
    launch.run(sys.argv)
