"""HyperShift mode: the node side of an InPlace NodePool upgrade (agent.py) and its
pre-staging from the NodePool's upgrade ConfigMap (target.py)."""
