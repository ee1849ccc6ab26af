"""What strategies and tasks agree on: the task contract (`task.py`) and the capabilities a
task may offer beyond it (`capabilities.py`)."""
