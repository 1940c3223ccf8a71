"""Developer tools around the service: they run steward, they are not part of it.

``steward demo`` (demo.py), the load tests (loadtest.py with its parts loadtest_clients.py,
loadtest_steward.py, loadtest_report.py and loadtest_chaos.py; loadtest_thrash.py,
loadtest_real.py; overload.py with overload_scenario.py and overload_report.py; chaos.py),
``steward calibrate`` (calibrate.py) and the simulator (simulate/); commands.py holds
their flags for the command line. Only this package may import ``fakes`` (the fake
engines and the simulated GPU's writing side), and nothing of the service imports it but
the command line (tests/test_layout.py).
"""
