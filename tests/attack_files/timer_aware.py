"""Attack: look up the stack for a timing loop; when timed, return the last output without
computing (correct for the inputs it saw first), otherwise compute honestly."""

import sys

from variants.reference import IPAReference

TIMING_NAMES = ("run_once", "_sample_until_quiet", "time_cuda", "time_cpu")


def _timed() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in TIMING_NAMES:
            return True
        frame = frame.f_back
    return False


class ModelNew(IPAReference):
    last = None

    def forward(self, *inputs):
        if _timed() and self.last is not None:
            return self.last
        self.last = super().forward(*inputs)
        return self.last
