"""Attack (or a crashing kernel): the process dies of SIGSEGV on the first call."""

import os
import signal

from variants.reference import IPAReference


class ModelNew(IPAReference):
    def forward(self, *inputs):
        os.kill(os.getpid(), signal.SIGSEGV)
