"""Checkpoints: everything needed to continue a run exactly, written atomically and verified.

`manager.py` writes, lists and finds them; `integrity.py` says what makes a folder
a checkpoint (checksums over every file) and loads one; `fingerprint.py` records
the data files a run was trained on; `changes.py` classifies the config changes a
resume asks for; `resume.py` is what a worker does to resume.
"""
