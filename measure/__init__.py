"""Measurement: the benchmarks (``manage.py bench``), the spec sheet run (``manage.py specsheet``)
and the evaluation (``manage.py evaluate``), with what they share (``benchmarking``: starting the
appliance's processes and stopping them on any exit; ``intervals``: repeats and 95 % intervals).

It drives the product through its services and processes as users do; the product never imports
it (``tests/test_layers.py``).
"""
