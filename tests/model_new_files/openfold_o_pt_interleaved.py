"""A ModelNew for SPEC-openfold's IPA with the SPEC's reshape trap planted: X, Y and Z are cut
as three blocks from o_pt flattened in (head, point, xyz) order, instead of o_pt viewed
(B, N, H*Pv, 3) and split on its last axis (SPEC step 10). Everything else is the standalone
file beside it; `diagnose --problem openfold` names the o_pt layout.
"""

from openfold_standalone import ModelNew as Correct


class ModelNew(Correct):
    def split_xyz(self, o_pt):
        B, N, H, Pv, _ = o_pt.shape
        return o_pt.reshape(B, N, H * Pv * 3).split(H * Pv, dim=-1)
