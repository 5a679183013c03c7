"""The openfold reference module as a KernelBench-style ModelNew: the thinnest wrapper (no
copy of the layer), a template for a file that replaces one step of it with a kernel."""

from variants.openfold.reference import OpenFoldIPA


class ModelNew(OpenFoldIPA):
    def __init__(self, c_s, c_z, c_hidden, no_heads, no_qk_points, no_v_points):
        super().__init__(c_s, c_z, c_hidden, no_heads, no_qk_points, no_v_points)
