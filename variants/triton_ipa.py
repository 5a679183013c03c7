"""Placeholder for the `triton` variant (issue #4): registered so that it shows up in
`ipa-bench list` with the reason it cannot run, never as working."""

from __future__ import annotations

from variants.base import Variant


class Triton(Variant):
    name = "triton"
    description = "not implemented yet (issue #4)"

    def not_supported_reasons(self, config, device, precision):
        return ["not implemented yet (issue #4)"]
