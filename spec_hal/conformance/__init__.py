"""The conformance suite: a pytest plugin (``spec_hal.conformance.plugin``) and its cases
(``spec_hal.conformance.cases``, one module per op family). Run it with
``spec-hal conformance --backend NAME``. Every case compares the backend under test with the
pure-PyTorch reference on fresh seeded inputs (integers exactly, floats within the tolerances in
``tolerances.py``), checks the op's invariants, and guards every output with poison and canaries.
"""
SUITE_VERSION = "0.1.0"
