"""Placeholder for the `cuda-hybrid` variant (issue #5): registered so that it shows up in
`ipa-bench list` with the reason it cannot run, never as working."""

from __future__ import annotations

from variants.base import Variant


class CudaHybrid(Variant):
    name = "cuda-hybrid"
    description = "not implemented yet (issue #5)"

    def not_supported_reasons(self, config, device, precision):
        return ["not implemented yet (issue #5)"]
