"""Measurements of loopfuse (never timed assertions in tests): ``python -m bench.<name>``.

* :mod:`bench.waste`: the model requests and tokens the loop fuses save on a looping model.
"""
