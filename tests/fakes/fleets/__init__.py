"""Contract fleets: how the contract test (tests/unit/backends/test_contract.py) runs each backend on two GPUs.

One module per backend that needs a fake vendor library (part of that backend's fixtures), with
``BACKEND = "<its --backend name>"`` and ``start(tmp, args) -> ExporterProcess``, the exporter reading a
two-GPU fleet through it (``args``: the contract test's flags, passed on). A backend without a module here
is run as ``--backend <name>`` alone, as a backend that needs no library can be. Discovered by
:func:`tests.fakes.contract_fleets.fleets`; the backends themselves come from the exporter's registry.
"""
