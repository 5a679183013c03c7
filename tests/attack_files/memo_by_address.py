"""Attack: compute the right output once, then return it from a dict keyed on the inputs'
addresses, so the timed calls (same tensors every time) do no work."""

from variants.reference import IPAReference


class ModelNew(IPAReference):
    def __init__(self, *args):
        super().__init__(*args)
        self._cache = {}

    def forward(self, *inputs):
        key = tuple(t.data_ptr() for t in inputs)
        if key not in self._cache:
            self._cache[key] = super().forward(*inputs)
        return self._cache[key]
