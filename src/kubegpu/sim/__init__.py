"""The simulator: a discrete-event engine on a virtual clock that runs the real scheduling fit and resource
accounting over simulated GPU nodes, with a performance model of what sharing does to a pod (docs/simulator.md).

Entry points: `kubegpu simulate` (cli.py), `run_scenario` (runner.py), `Simulation` (engine.py), strategies as
plug-ins (strategies.py).
"""
