"""The partition agent: the node agent that applies the partitioner's desired MIG/MPS layout on its node and reports
what it applied (`agent.py`), and the Node-annotation contract it shares with the partitioner (`annotations.py`).

A node agent like the device plugin or the MIG manager: it imports only the shared core, never the partitioner
(the controller, a layer up, imports the annotation contract from here) and never another node agent.
"""
