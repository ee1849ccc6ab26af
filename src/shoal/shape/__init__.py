"""The job's shape: processes, roles and resizing, computed from the config alone, without
torch (`job.py`, `roles.py`, `placement.py`, `hosts.py`; `sizing.py` for a whole config)."""
