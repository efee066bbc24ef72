"""Dynamic MIG and MPS partitioning: a pure planner, the controller, the node agent and simulator strategies."""
