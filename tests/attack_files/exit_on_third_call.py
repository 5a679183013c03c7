"""Attack: end the process quietly (exit status 0) on the third call, before any verdict."""

import os

from variants.reference import IPAReference


class ModelNew(IPAReference):
    calls = 0

    def forward(self, *inputs):
        ModelNew.calls += 1
        if ModelNew.calls == 3:
            os._exit(0)
        return super().forward(*inputs)
