"""Measurement sweeps: time a layer step or a kernel over batch sizes and return ``Results``.

Below the entry points (``workbench bench``, the report, the timing dashboard all call the same sweep) and
above ``workbench.viz``. ``sweeps.replay``: one layer step eager vs replayed per bucket; ``sweeps.kernels``:
each decode kernel with its bytes and FLOPs; ``sweeps.common``: the preset vocabulary and the record of
which implementation ran.
"""
