"""Regression with mean-squared error on a CSV file, as a shoal task plugin (an example).

`config.py` is its `[task]` table, `data.py` reads and checks the CSV file,
`task.py` the task shoal finds through the `shoal.tasks` entry point.
"""
