"""Entry point for torchrun (which needs a script path): the ``hmt`` CLI, with only
train-supernet registered so that it does not depend on the other command modules.

    torchrun --nproc-per-node 2 scripts/ddp_train.py train-supernet --preset cifar10 --data DIR --out runs/r18
"""

import commands.train_supernet  # noqa: F401  (registers the command on the app)
from commands.app import app

if __name__ == "__main__":
    app()
