"""The autoscaler's AWS EC2 provider, in Karpenter's shape (EC2NodeClass, CreateFleet, SQS interruption).

boto3 is an optional dependency (`pip install 'kubegpu[aws]'`): nothing here imports it at module level, so the
kwok provider and the rest of the autoscaler work without it. Pure cores (NodeClass validation, label derivation,
fleet request building, event parsing) take plain dicts; the thin adapters (`clients`, `provider`) make the calls.
"""
