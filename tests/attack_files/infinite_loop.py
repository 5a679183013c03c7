"""Attack (or a deadlocked kernel): the second call never returns."""

from variants.reference import IPAReference


class ModelNew(IPAReference):
    calls = 0

    def forward(self, *inputs):
        ModelNew.calls += 1
        while ModelNew.calls >= 2:
            pass
        return super().forward(*inputs)
