"""MIG layouts: the mig-parted CLI (placement-aware, non-destructive) and the MIG manager node agent.

`parted` is the planner and executor (`plan_apply`, `execute`, `assert_mismatches`, `export_config`, `read_state`);
`manager.MigManager` the node agent's reconciler; `cli` the `kubegpu mig-parted` and `kubegpu mig-manager` commands.
"""
