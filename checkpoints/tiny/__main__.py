"""`python -m pdserve.checkpoints.tiny OUT_DIR`: writes the default tiny model into OUT_DIR."""
import sys

from pdserve.checkpoints.tiny.model import write_tiny_model

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m pdserve.checkpoints.tiny OUT_DIR")
    write_tiny_model(sys.argv[1])
