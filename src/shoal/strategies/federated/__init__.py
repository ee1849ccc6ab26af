"""`federated`: clients train on their own data; only model updates travel.

The pieces, one file each: `config.py` (the `[strategy]` section), `partition.py`
(which samples each client holds), `selection.py` (who takes part in a round),
`client.py` (one client's local work), `aggregation.py` (FedAvg, FedProx and the
server-optimizer family), `secure.py` (pairwise additive masking), `privacy.py`
(client-level differential privacy), `wire.py` (the audit of every tensor that
crosses the process group; counting is the peer layer's, `comm/links.py`) and
`strategy.py` (the round loop).
"""
