"""Conformance cases, one module per op family (``test_<family>.py``)."""
