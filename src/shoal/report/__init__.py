"""`shoal report RUN_DIR [RUN_DIR ...] [-o FILE]`: one self-contained HTML page of runs.

Choices, and why:

- **Inline SVG drawn by matplotlib** (already a dependency, for population's plot).
  The page holds every chart as SVG text: it opens offline, from a file, on a
  machine with no network (no CDN, no script at all), prints, and survives being
  mailed. A vendored JavaScript chart library would add hover and zoom but also
  a copy of someone else's code to keep current; a run's figures are read, not
  explored, and TensorBoard (`[monitor] tensorboard = true`) is there for that.
- **Read from the run directory only** (`runs.py`): the page of a run still going
  is the page of what is on disk; re-run the command to refresh it.
- **One page for several runs**: every chart overlays the runs (one colour per
  run) and a table lists the config fields and results that differ.
- **Panels built from the records every strategy writes through the one driver**
  (`panels.py`), plus each strategy's own panels when its records are there
  (`strategy_panels.py`): a new strategy's figures show up without a change here
  when they use the same record names (`rank<r>_<name>` for per-rank figures).
- **Bounded cost**: series are thinned to at most `figures.MAX_POINTS` points, so a
  100k-line metrics.jsonl renders in seconds.
"""

from shoal.report.page import write_report

__all__ = ["write_report"]
