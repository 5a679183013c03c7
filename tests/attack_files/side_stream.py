"""Attack (CUDA): do the work on a side stream the timing events do not see, and return
without making the caller's stream wait for it."""

import torch

from variants.reference import IPAReference


class ModelNew(IPAReference):
    def forward(self, *inputs):
        stream = getattr(self, "_stream", None) or torch.cuda.Stream()
        self._stream = stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            return super().forward(*inputs)
